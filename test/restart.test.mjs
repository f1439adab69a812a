// The daemon as a separate process: SIGKILL it while sandboxes run, start it again, and
// nothing is lost — running sandboxes are re-adopted, ones that died meanwhile are marked dead.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync } from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { eventually, leftovers, removeDataDir, startSpaced } from './helpers.mjs';

describe('daemon restart', () => {
  const dataDir = mkdtempSync('/tmp/spr-');
  const ids = [];
  let current;
  after(async () => {
    if (current) {
      for (const id of ids) await Sandbox.kill(id, current.conn).catch(() => {});
      current.child.kill('SIGTERM');
      await current.exited;
    }
    assert.deepEqual(leftovers(dataDir, ids), []);
    removeDataDir(dataDir);
  });

  it('SIGKILL while sandboxes run loses nothing: running ones are re-adopted with their processes, dead ones are marked', async () => {
    current = await startSpaced(dataDir);
    const a = await Sandbox.create({ ...current.conn, memoryMb: 256 });
    const b = await Sandbox.create({ ...current.conn, memoryMb: 256 });
    ids.push(a.id, b.id);
    await a.files.write('/tmp/state', 'kept');
    const bg = await a.commands.run('i=0; while true; do i=$((i+1)); echo $i > /tmp/counter; sleep 0.1; done', { background: true, tag: 'counter' });

    current.child.kill('SIGKILL');
    await current.exited;
    // While the daemon is down, b's sandbox dies.
    execFileSync('runsc', ['--root', path.join(dataDir, 'runsc'), 'kill', b.id, 'KILL']);
    await eventually(() => JSON.parse(execFileSync('runsc', ['--root', path.join(dataDir, 'runsc'), 'state', b.id], { encoding: 'utf8' })).status === 'stopped');

    current = await startSpaced(dataDir);
    const running = await Sandbox.list({ ...current.conn, state: ['running'] });
    assert.deepEqual(running.items.map((s) => s.id), [a.id]);
    const a2 = await Sandbox.connect(a.id, current.conn);
    assert.equal(await a2.files.read('/tmp/state'), 'kept');
    const procs = await a2.commands.list();
    assert.ok(procs.find((p) => p.pid === bg.pid && p.running && p.tag === 'counter'), 'the background process survived the daemon');
    const c1 = Number(await a2.files.read('/tmp/counter'));
    await eventually(async () => Number(await a2.files.read('/tmp/counter')) > c1);
    assert.equal((await a2.commands.run('echo works')).stdout, 'works\n');

    const b2 = await Sandbox.connect(b.id, current.conn);
    assert.equal(b2.info.state, 'dead');
    assert.ok(['crashed', 'lost'].includes(b2.info.endReason), b2.info.endReason);
    // Only b's: the daemon may be taking the template's snapshot in a sandbox of its own meanwhile
    // (it does after a SIGKILL interrupted the last one), and that container is not a leak.
    assert.deepEqual(leftovers(dataDir, [b.id]).filter((l) => !l.startsWith('runsc container ') || l.startsWith(`runsc container ${b.id}`)), [], 'the dead sandbox\'s resources were released');
  });

  it('SIGTERM stops the daemon gracefully: exit 0, state file removed, sandboxes keep running', async () => {
    const a = ids[0];
    current.child.kill('SIGTERM');
    const { code } = await current.exited;
    assert.equal(code, 0);
    assert.equal(existsSync(path.join(dataDir, 'spaced.json')), false);
    const st = JSON.parse(execFileSync('runsc', ['--root', path.join(dataDir, 'runsc'), 'state', a], { encoding: 'utf8' }));
    assert.equal(st.status, 'running');
    current = await startSpaced(dataDir);
    const sb = await Sandbox.connect(a, current.conn);
    assert.equal((await sb.commands.run('echo back')).stdout, 'back\n');
  });
});
