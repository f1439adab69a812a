// A checkpoint that fails and kills the sandbox: it is restored from its last good snapshot,
// and the loss recorded. Hibernated sandboxes wake after a daemon restart. (A daemon killed
// in the middle of an operation: crash-lifecycle.test.mjs.)
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { leftovers, removeDataDir, startSpaced } from './helpers.mjs';

describe('sessions across daemon crashes', () => {
  const dataDir = mkdtempSync('/tmp/spx-');
  const ids = [];
  let d;
  after(async () => {
    if (d) {
      for (const id of ids) await Sandbox.kill(id, d.conn).catch(() => {});
      d.child.kill('SIGTERM');
      await d.exited;
    }
    assert.deepEqual(leftovers(dataDir, ids), []);
    removeDataDir(dataDir);
  });

  async function restartWith(env = {}) {
    if (d && d.child.exitCode === null && d.child.signalCode === null) {
      d.child.kill('SIGTERM');
      await d.exited;
    }
    d = await startSpaced(dataDir, env);
    return d;
  }

  it('a checkpoint that fails and kills the sandbox: restored from the last good snapshot, the loss recorded, the daemon goes on', async () => {
    await restartWith();
    const created = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    ids.push(created.id);
    const sb = await Sandbox.connect(created.id, d.conn);
    await sb.files.write('/tmp/v', 'good-state');
    const good = await sb.snapshot();
    await sb.files.write('/tmp/v', 'lost-state');
    await restartWith({ SPACE_FAULT_INJECT: 'snapshot:checkpoint-fails' });
    const a = await Sandbox.connect(ids[0], d.conn);
    await assert.rejects(a.snapshot(), (e) => e.code === 'SNAPSHOT_FAILED');
    assert.equal((await a.refresh()).state, 'running');
    assert.equal(await a.files.read('/tmp/v'), 'good-state', 'back at the last good snapshot');
    const ev = await a.events();
    assert.ok(ev.some((e) => e.type === 'recovered' && e.message.includes(good.id) && /losing the last \d+ s/.test(e.message)));
    assert.equal((await a.snapshots()).at(-1).id, good.id, 'the failed snapshot is not listed');
    await restartWith();
  });

  it('a hibernated sandbox wakes after a daemon restart with its memory and files', async () => {
    const sb = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    ids.push(sb.id);
    const h = await sb.commands.run('i=0; trap \'echo $i > /tmp/count\' USR1; while true; do i=$((i+1)); sleep 0.05; done', { background: true });
    await sb.files.write('/tmp/state', 'asleep');
    await sb.hibernate();
    await restartWith();
    const b = await Sandbox.connect(sb.id, d.conn);
    assert.equal(b.info.state, 'hibernated');
    await b.wake();
    assert.equal(await b.files.read('/tmp/state'), 'asleep');
    assert.ok((await b.commands.list()).some((p) => p.pid === h.pid && p.running), 'the process survived hibernation and the restart');
  });
});
