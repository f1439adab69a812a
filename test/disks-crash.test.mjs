// Sandbox disks when the daemon is SIGKILLed (issue 23): during a write to a disk, and at the
// step boundaries of the operations that copy or replace a disk (checkpoint, restore of a
// snapshot, wake, rollback, fork). After each restart the session runs (or stays hibernated)
// with the files of the moment, and the pool holds no disk or copy that nothing owns.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { crashableSpaced, eventually } from './helpers.mjs';

const DISKS = { SPACE_DISKS: 'on' };

describe('sandbox disks: SIGKILL of the daemon', { timeout: 20 * 60_000 }, () => {
  const h = crashableSpaced('/tmp/spkd-', DISKS);
  const mnt = path.join(h.dataDir, 'disks', 'mnt');
  const ids = h.ids;
  let d;

  const start = async (env = {}) => (d = await h.start(env));
  const kill = () => h.kill();
  /** What the pool holds beyond what the daemon's sandboxes and snapshots account for. */
  const strays = async () => {
    const running = new Set();
    const snaps = new Set();
    for (const sb of (await Sandbox.list({ ...d.conn, limit: 1000 })).items) {
      if (sb.state === 'killed' || sb.state === 'dead') continue;
      if (sb.state === 'running') running.add(sb.id);
      for (const s of await (await Sandbox.connect(sb.id, d.conn)).snapshots()) snaps.add(s.id);
    }
    // A running sandbox has one disk (its incarnation's; older ones are released in the background), a hibernated one none.
    const extraDisks = () => {
      const seen = new Set();
      return readdirSync(path.join(mnt, 'disks')).filter((n) => {
        const id = n.split('-')[0];
        if (running.has(id) && !seen.has(id)) return !seen.add(id);
        return true;
      });
    };
    const disks = await eventually(() => extraDisks().length === 0 && [], { tries: 150 }).catch(() => extraDisks());
    // Copies of template images are named by the image key (not a snapshot id).
    const copies = readdirSync(path.join(mnt, 'copies')).filter((n) => /^sn[a-z0-9]+$/.test(n) && !snaps.has(n));
    const partial = readdirSync(path.join(mnt, 'copies')).filter((n) => n.startsWith('.recv-'));
    return [...disks.map((x) => `disk ${x}`), ...copies.map((x) => `copy ${x}`), ...partial.map((x) => `partial ${x}`)];
  };

  before(async () => {
    await start();
  });
  after(async () => assert.deepEqual(await h.finish(), []));

  it('a writer keeps writing to its disk through a daemon crash; the file is whole afterwards', async () => {
    const sb = await Sandbox.create({ ...d.conn, template: 'minimal', diskMb: 1024 });
    ids.add(sb.id);
    await sb.commands.run('i=0; while [ $i -lt 400 ]; do dd if=/dev/zero of=/tmp/w bs=1M count=1 seek=$i conv=notrunc 2>/dev/null; i=$((i+1)); done; echo done > /tmp/w.done', { background: true });
    await eventually(async () => Number((await sb.commands.run('wc -c < /tmp/w')).stdout) > 20 * 1048576);
    await kill();
    await start();
    const again = await Sandbox.connect(sb.id, d.conn);
    assert.equal(again.info.state, 'running');
    await eventually(() => again.files.exists('/tmp/w.done'), { tries: 600 });
    assert.equal((await again.commands.run('wc -c < /tmp/w')).stdout.trim(), String(400 * 1048576));
    assert.deepEqual(await strays(), []);
  });

  for (const [op, point] of [
    ['snapshot', 'snapshot:during-checkpoint'],
    ['snapshot', 'snapshot:after-checkpoint'],
    ['snapshot', 'snapshot:during-restore'],
    ['snapshot', 'snapshot:during-store'],
    ['hibernate', 'snapshot:during-store'],
    ['hibernate', 'snapshot:during-checkpoint'],
    ['wake', 'wake:during-restore'],
    ['rollback', 'rollback:during-restore'],
    ['fork', 'fork:during-restore'],
  ]) {
    it(`${op} killed at ${point}: the session has its files, the pool nothing stray`, async () => {
      let sb = await Sandbox.create({ ...d.conn, template: 'minimal', diskMb: 1024 });
      ids.add(sb.id);
      await sb.files.write('/tmp/a', 'a');
      // Enough on the disk that the store of its stream is under way when the daemon dies.
      if (point === 'snapshot:during-store') await sb.commands.run('head -c 67108864 /dev/urandom > /tmp/big', { timeoutMs: 120_000 });
      let snap;
      if (op === 'rollback') {
        snap = await sb.snapshot();
        await sb.files.write('/tmp/b', 'b');
      }
      if (op === 'wake') await sb.hibernate();
      await kill();
      await start({ SPACE_FAULT_INJECT: point });
      sb = await Sandbox.connect(sb.id, d.conn);
      const doing = op === 'snapshot' ? sb.snapshot() : op === 'hibernate' ? sb.hibernate() : op === 'wake' ? sb.wake() : op === 'rollback' ? sb.rollback(snap.id) : sb.fork({ count: 1 });
      await doing.catch(() => {});
      assert.equal((await d.exited).sig ?? (await d.exited), 'SIGKILL', `${point} was reached`);
      await start();
      for (const x of (await Sandbox.list({ ...d.conn, limit: 1000 })).items) if (x.state !== 'killed' && x.state !== 'dead') ids.add(x.id);
      sb = await Sandbox.connect(sb.id, d.conn);
      assert.ok(['running', 'hibernated'].includes(sb.info.state), `${sb.id} is ${sb.info.state}: ${sb.info.endReason} ${sb.info.endDetail}`);
      if (sb.info.state === 'hibernated') await sb.wake();
      assert.equal(await sb.files.read('/tmp/a'), 'a');
      // A rollback either happened or did not: /tmp/b is there only if it did not.
      if (op !== 'rollback') assert.equal(await sb.files.exists('/tmp/b'), false);
      for (const c of (await Sandbox.list({ ...d.conn, limit: 1000 })).items.filter((x) => x.parentId === sb.id && x.state === 'running')) {
        assert.equal(await (await Sandbox.connect(c.id, d.conn)).files.read('/tmp/a'), 'a', 'a fork the restart finished has the files');
      }
      assert.deepEqual(await strays(), []);
    });
  }

  it('a snapshot killed while it stores its change since the previous one is rolled forward at restart, and it and the next restore from the store', async () => {
    let sb = await Sandbox.create({ ...d.conn, template: 'minimal', diskMb: 1024 });
    ids.add(sb.id);
    await sb.commands.run('head -c 67108864 /dev/urandom > /tmp/big', { timeoutMs: 120_000 });
    const first = await sb.snapshot();
    // A change big enough that its store is under way when the daemon dies.
    await sb.commands.run('head -c 33554432 /dev/urandom > /tmp/a', { timeoutMs: 120_000 });
    await kill();
    await start({ SPACE_FAULT_INJECT: 'snapshot:during-store' });
    sb = await Sandbox.connect(sb.id, d.conn);
    await sb.snapshot().catch(() => {});
    assert.equal((await d.exited).sig ?? (await d.exited), 'SIGKILL', 'snapshot:during-store was reached');
    await start();
    sb = await Sandbox.connect(sb.id, d.conn);
    assert.equal(sb.info.state, 'running');
    // Its checkpoint was complete: the restart stores it as the snapshot it was meant to be.
    const listed = (await sb.snapshots()).map((s) => s.id);
    assert.equal(listed.length, 2, `rolled forward: ${listed}`);
    assert.equal(listed[0], first.id);
    const cut = listed[1];
    const sums = 'md5sum /tmp/big /tmp/a | cut -d" " -f1';
    const then = (await sb.commands.run(sums)).stdout;
    await sb.files.write('/tmp/b', 'b');
    const next = await sb.snapshot();
    const said = (await sb.events()).filter((e) => e.type === 'snapshot').map((e) => e.message).find((m) => m.includes(`snapshot ${next.id} `));
    assert.match(said, new RegExp(`disk stored as its changes since ${cut}`));
    // Both from the store, without the node's copies.
    execFileSync('btrfs', ['subvolume', 'delete', path.join(mnt, 'copies', cut), path.join(mnt, 'copies', next.id)]);
    await sb.rollback(cut);
    assert.deepEqual([(await sb.commands.run(sums)).stdout, await sb.files.exists('/tmp/b')], [then, false]);
    await sb.rollback(next.id);
    assert.deepEqual([(await sb.commands.run(sums)).stdout, await sb.files.read('/tmp/b')], [then, 'b']);
    assert.deepEqual(await strays(), []);
  });
});
