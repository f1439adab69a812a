// Never lose a session: SIGKILL the daemon in the middle of a snapshot (fault injection at
// exact points), restart, and the sandbox is running or restorable, no partial snapshot is
// listed, and a new snapshot succeeds. Hibernated sandboxes wake after a daemon restart.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { leftovers, startSpaced } from './helpers.mjs';

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
    rmSync(dataDir, { recursive: true, force: true });
  });

  async function restartWith(env = {}) {
    if (d && d.child.exitCode === null && d.child.signalCode === null) {
      d.child.kill('SIGTERM');
      await d.exited;
    }
    d = await startSpaced(dataDir, env);
    return d;
  }

  it('SIGKILL after the checkpoint: on restart the sandbox is restored from its last good snapshot', async () => {
    await restartWith();
    const sb = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    ids.push(sb.id);
    await sb.files.write('/tmp/v', 'v1');
    const s1 = await sb.snapshot({ name: 'good' });

    await restartWith({ SPACE_FAULT_INJECT: 'snapshot:after-checkpoint' });
    const a = await Sandbox.connect(sb.id, d.conn);
    await a.files.write('/tmp/v', 'v2');
    await assert.rejects(a.snapshot(), 'the daemon died mid-snapshot');
    const { sig } = await d.exited;
    assert.equal(sig, 'SIGKILL');

    await restartWith();
    const b = await Sandbox.connect(sb.id, d.conn);
    assert.equal(b.info.state, 'running');
    assert.deepEqual((await b.snapshots()).map((s) => s.id), [s1.id], 'no partial snapshot is listed');
    assert.equal(await b.files.read('/tmp/v'), 'v1', 'restored from the last good snapshot');
    const ev = await b.events();
    assert.ok(ev.some((e) => e.type === 'recovered' && e.message.includes(s1.id)), 'the loss is recorded in the events');
    const s2 = await b.snapshot();
    assert.deepEqual((await b.snapshots()).map((s) => s.id), [s1.id, s2.id], 'a new snapshot succeeds');
  });

  it('SIGKILL after the bytes are stored but before the snapshot is recorded: it is not listed, the sandbox runs on', async () => {
    const sb = await Sandbox.connect(ids[0], d.conn);
    const before = (await sb.snapshots()).map((s) => s.id);
    await restartWith({ SPACE_FAULT_INJECT: 'snapshot:after-blob' });
    await sb.files.write('/tmp/v', 'v3').catch(() => {});
    const a = await Sandbox.connect(ids[0], d.conn);
    await a.files.write('/tmp/v', 'v3');
    await assert.rejects(a.snapshot());
    await d.exited;
    await restartWith();
    const b = await Sandbox.connect(ids[0], d.conn);
    assert.equal(b.info.state, 'running');
    assert.deepEqual((await b.snapshots()).map((s) => s.id), before);
    assert.equal(await b.files.read('/tmp/v'), 'v3', 'the restore had completed: nothing was lost');
  });

  it('a checkpoint that fails and kills the sandbox: restored from the last good snapshot, the loss recorded, the daemon goes on', async () => {
    const sb = await Sandbox.connect(ids[0], d.conn);
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
