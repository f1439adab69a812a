// The fast lane: core's lifecycle — state machine, admission, pools, snapshots bookkeeping,
// timers, recovery after a restart — on the in-memory fake driver (@space/driver-fake), with the
// real SandboxService, real SQLite, real blob store and the real wire protocol. Seconds, no
// runsc, no QEMU; the same behaviour on the real drivers is tested by the conformance and
// session suites.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { FakeDriver } from '../packages/driver-fake/dist/index.js';
import { FORK_PARALLEL, SpaceError } from '../packages/core/dist/index.js';
import { T, fakeHarness, until } from './fake-harness.mjs';

describe('lifecycle on the fake driver (fast lane)', () => {
  const dir = mkdtempSync('/tmp/space-fake-');
  const driver = new FakeDriver();
  let store;
  let svc;
  let h;
  const service = (opts) => h.service(opts);
  const run = (id, line) => h.run(svc, id, line);
  const out = (id, line) => h.out(svc, id, line);

  before(async () => {
    store = SqliteStore.open(path.join(dir, 'space.db'));
    h = fakeHarness(dir, store, driver);
    svc = service();
    await svc.start();
  });
  after(async () => {
    await svc.shutdown();
    for (const sb of (await svc.list(T, { limit: 200 })).items) if (!['killed', 'dead'].includes(sb.state)) await svc.kill(T, sb.id);
    assert.deepEqual(await driver.list(), [], 'every fake sandbox is gone');
    store.close?.();
    rmSync(dir, { recursive: true, force: true });
  });

  it('create runs a sandbox whose agent answers with its identity and env; kill ends it', async () => {
    const sb = await svc.create(T, { env: { GREETING: 'hello' } });
    assert.equal(sb.state, 'running');
    assert.equal(await out(sb.id, 'hostname'), `${sb.id}\n`, 'a template restore takes the new identity');
    assert.equal(await out(sb.id, 'printenv GREETING'), 'hello\n');
    assert.deepEqual(await run(sb.id, 'exit 7'), { exitCode: 7, stdout: '', stderr: '' });
    const killed = await svc.kill(T, sb.id);
    assert.equal(killed.state, 'killed');
    await assert.rejects(run(sb.id, 'true'), (e) => e.code === 'SANDBOX_NOT_RUNNING');
    assert.equal(driver.machine(sb.id), undefined, 'the runtime is destroyed');
  });

  it('a disk size on a driver without disks is DISKS_UNAVAILABLE and leaves nothing', async () => {
    const before = (await svc.list(T, { limit: 200 })).items.length;
    await assert.rejects(svc.create(T, { diskMb: 4096 }), (e) => e.code === 'DISKS_UNAVAILABLE' && /--disks/.test(e.message));
    assert.equal((await svc.list(T, { limit: 200 })).items.length, before);
    const sb = await svc.create(T, {});
    assert.equal(sb.diskMb, undefined, 'without disks a sandbox records none');
    await svc.kill(T, sb.id);
  });

  it('pause refuses calls until resume; the machine is untouched', async () => {
    const sb = await svc.create(T, {});
    assert.equal(await out(sb.id, 'tick'), '1\n');
    assert.equal((await svc.pause(T, sb.id)).state, 'paused');
    await assert.rejects(run(sb.id, 'tick'), (e) => e.code === 'SANDBOX_INVALID_STATE' && /is paused/.test(e.message));
    assert.equal((await svc.resume(T, sb.id)).state, 'running');
    assert.equal(await out(sb.id, 'tick'), '2\n');
    await svc.kill(T, sb.id);
  });

  it('snapshot, then rollback restores files and memory of that moment; bad ids change nothing', async () => {
    const sb = await svc.create(T, {});
    await run(sb.id, 'write /tmp/a.txt first');
    await out(sb.id, 'tick');
    const snap = await svc.snapshot(T, sb.id, { name: 'one' });
    assert.equal(snap.sandboxId, sb.id);
    assert.equal(await out(sb.id, 'tick'), '2\n', 'the sandbox runs on after its snapshot');
    await run(sb.id, 'write /tmp/b.txt later');
    await assert.rejects(svc.rollback(T, sb.id, 'snnope00000000000000'), (e) => e.code === 'SNAPSHOT_NOT_FOUND');
    assert.equal(await out(sb.id, 'cat /tmp/b.txt'), 'later\n', 'a refused rollback changed nothing');
    const back = await svc.rollback(T, sb.id, snap.id);
    assert.equal(back.state, 'running');
    assert.equal(await out(sb.id, 'cat /tmp/a.txt'), 'first\n');
    assert.equal((await run(sb.id, 'cat /tmp/b.txt')).exitCode, 1, 'files written after the snapshot are gone');
    assert.equal(await out(sb.id, 'tick'), '2\n', 'memory is that of the snapshot (the counter was 1)');
    assert.deepEqual((await svc.snapshots(T, sb.id)).map((s) => s.name), ['one']);
    await svc.kill(T, sb.id);
    assert.deepEqual(await svc.snapshots(T, sb.id).catch(() => []), [], 'killing deletes its snapshots');
  });

  it('calls made while a snapshot is being stored are answered: they wait out the downtime, not the store', async () => {
    // A blob store whose snapshot writes hold until released: the store step of a snapshot of a
    // disk holding a GiB takes seconds, and calls used to wait for all of it.
    let storing;
    let release;
    const held = new Promise((r) => (release = r));
    const blobs = Object.create(h.blobs);
    blobs.put = async (key, data) => {
      if (key.startsWith(`snapshots/${T}/`)) {
        storing?.();
        await held;
      }
      return h.blobs.put(key, data);
    };
    const slow = service({ blobs });
    await svc.shutdown();
    await slow.start();
    try {
      const sb = await slow.create(T, {});
      await h.run(slow, sb.id, 'write /tmp/a.txt one');
      const stored = new Promise((r) => (storing = r));
      const snap = slow.snapshot(T, sb.id);
      await stored; // checkpointed, restored, and now storing
      // (Bounded, so that the old behaviour fails rather than hangs: the call takes milliseconds.)
      let timer;
      const waited = new Promise((r) => (timer = setTimeout(() => r('still waiting after 15 s'), 15_000)));
      assert.equal(await Promise.race([h.out(slow, sb.id, 'cat /tmp/a.txt'), waited]), 'one\n', 'a call during the store is answered');
      clearTimeout(timer);
      await h.run(slow, sb.id, 'write /tmp/b.txt two');
      release();
      assert.equal((await snap).sandboxId, sb.id);
      assert.equal(await h.out(slow, sb.id, 'cat /tmp/b.txt'), 'two\n', 'what the call wrote is there');
      await slow.kill(T, sb.id);
    } finally {
      release();
      await slow.shutdown();
      svc = service();
      await svc.start();
    }
  });

  it('a snapshot the work directory has no room for is refused before the sandbox is touched (CAPACITY_EXHAUSTED)', { skip: process.getuid?.() !== 0 && 'mounting a small tmpfs needs root' }, async () => {
    const sb = await svc.create(T, {});
    await out(sb.id, 'tick');
    // The work directory (RAM in the daemon) with 16 MiB: a 256 MiB sandbox's image may not fit.
    const work = path.join(dir, 'work');
    mkdirSync(work, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=16m', 'tmpfs', work]);
    try {
      await assert.rejects(svc.snapshot(T, sb.id, {}), (e) => e.code === 'CAPACITY_EXHAUSTED' && /has 16 MiB free; the sandbox is untouched/.test(e.message));
      await assert.rejects(svc.hibernate(T, sb.id), (e) => e.code === 'CAPACITY_EXHAUSTED');
      await svc.pause(T, sb.id);
      await assert.rejects(svc.snapshot(T, sb.id, {}), (e) => e.code === 'CAPACITY_EXHAUSTED');
      assert.equal((await svc.get(T, sb.id)).state, 'paused', 'a paused sandbox stays paused');
      await svc.resume(T, sb.id);
    } finally {
      execFileSync('umount', [work]);
    }
    assert.equal(await out(sb.id, 'tick'), '2\n', 'the sandbox ran on with its memory, untouched');
    assert.deepEqual(await svc.snapshots(T, sb.id), [], 'nothing listed');
    assert.deepEqual(await store.listIntents(), [], 'nothing left in the journal');
    await svc.snapshot(T, sb.id, {});
    assert.equal((await svc.snapshots(T, sb.id)).length, 1, 'with room again, snapshots work');
    await svc.kill(T, sb.id);
  });

  it('hibernate frees the runtime; wake restores memory and files', async () => {
    const sb = await svc.create(T, {});
    await out(sb.id, 'tick');
    await run(sb.id, 'write /tmp/h.txt kept');
    assert.equal((await svc.hibernate(T, sb.id)).state, 'hibernated');
    assert.equal((await driver.status(sb.id)).running, false, 'no runtime while hibernated');
    assert.equal((await svc.wake(T, sb.id)).state, 'running');
    assert.equal(await out(sb.id, 'tick'), '2\n');
    assert.equal(await out(sb.id, 'cat /tmp/h.txt'), 'kept\n');
    // Where the time went, step by step, in the events (the profile of issue 17, from any daemon).
    const evs = await svc.events(T, sb.id);
    const snap = evs.find((e) => e.type === 'snapshot')?.message ?? '';
    assert.match(snap, /\(ms: checks \d+, quiesce \d+, checkpoint \d+, store \d+\)$/, snap);
    const woken = evs.find((e) => e.type === 'woken')?.message ?? '';
    assert.match(woken, /^woken from snapshot \S+ in \d+ ms \(ms: fetch \d+, spec \d+, (restore \d+, )?agent \d+\)$/, woken);
    await svc.kill(T, sb.id);
  });

  it('fork copies a sandbox into N that diverge; each gets its own identity; the parent runs on', async () => {
    const sb = await svc.create(T, {});
    await out(sb.id, 'tick');
    const forks = await svc.fork(T, sb.id, { count: 2 });
    assert.equal(forks.length, 2);
    const [a, b] = forks.map((f) => f.sandbox);
    assert.ok(a && b, JSON.stringify(forks));
    assert.equal(await out(a.id, 'hostname'), `${a.id}\n`);
    assert.equal(await out(a.id, 'tick'), '2\n');
    assert.equal(await out(a.id, 'tick'), '3\n');
    assert.equal(await out(b.id, 'tick'), '2\n', 'forks diverge');
    assert.equal(await out(sb.id, 'tick'), '2\n', 'the parent is unaffected');
    for (const id of [sb.id, a.id, b.id]) await svc.kill(T, id);
  });

  it('fork into 7 restores a few copies at once, and a copy that fails leaves the others running', async () => {
    const sb = await svc.create(T, {});
    const restore = driver.restore;
    let inFlight = 0;
    let most = 0;
    let failing;
    const order = [];
    driver.restore = async function (spec, imageDir) {
      if (spec.id === sb.id) return restore.call(this, spec, imageDir); // the parent, after its snapshot
      order.push(spec.id);
      if (order.length === 4) failing = spec.id;
      inFlight++;
      most = Math.max(most, inFlight);
      try {
        await new Promise((r) => setImmediate(r)); // the others start meanwhile
        if (spec.id === failing) throw new Error('this copy\'s restore fails');
        return await restore.call(this, spec, imageDir);
      } finally {
        inFlight--;
      }
    };
    let forks;
    try {
      forks = await svc.fork(T, sb.id, { count: 7 });
    } finally {
      driver.restore = restore;
    }
    assert.ok(FORK_PARALLEL >= 3);
    assert.equal(most, Math.min(7, FORK_PARALLEL), 'copies restore at once, as many as FORK_PARALLEL');
    assert.equal(forks.length, 7);
    assert.deepEqual(forks.filter((f) => f.error).map((f) => f.error.code), ['DRIVER_FAILED'], JSON.stringify(forks));
    const copies = forks.filter((f) => f.sandbox).map((f) => f.sandbox);
    assert.deepEqual(copies.map((c) => c.id).sort(), [...new Set(order)].filter((id) => id !== failing).sort(), 'every other copy runs');
    for (const c of copies) assert.equal(await out(c.id, 'hostname'), `${c.id}\n`);
    assert.equal((await svc.get(T, failing)).state, 'dead', 'the failed copy is recorded dead');
    for (const id of [sb.id, ...copies.map((c) => c.id)]) await svc.kill(T, id);
  });

  it('a fork\'s copies restore beside the parent\'s own restore from the checkpoint image', async () => {
    const sb = await svc.create(T, {});
    const restore = driver.restore;
    let copyStarted;
    const started = new Promise((r) => (copyStarted = r));
    const order = [];
    driver.restore = async function (spec, imageDir) {
      if (spec.id !== sb.id) {
        order.push('copy starts');
        copyStarted();
        return restore.call(this, spec, imageDir);
      }
      order.push('parent starts');
      // The parent's restore ends only once a copy's has begun; were they one after the other,
      // the wait would give up and the order below would say so.
      await until(() => Promise.race([started.then(() => true), new Promise((r) => setImmediate(() => r(false)))]), 'a copy\'s restore while the parent\'s runs').catch(() => {});
      order.push('parent ends');
      return restore.call(this, spec, imageDir);
    };
    let forks;
    try {
      forks = await svc.fork(T, sb.id, { count: 1 });
    } finally {
      driver.restore = restore;
    }
    assert.deepEqual(order, ['parent starts', 'copy starts', 'parent ends']);
    const [copy] = forks.map((f) => f.sandbox);
    assert.ok(copy, JSON.stringify(forks));
    assert.equal(await out(copy.id, 'hostname'), `${copy.id}\n`);
    assert.equal((await run(sb.id, 'true')).exitCode, 0, 'the parent runs on');
    assert.equal((await svc.snapshots(T, sb.id)).filter((s) => s.trigger === 'fork').length, 1, 'the fork\'s snapshot is stored');
    for (const id of [sb.id, copy.id]) await svc.kill(T, id);
  });

  it('a fork whose parent cannot come back from the image ends the copies it started and fails', async () => {
    const sb = await svc.create(T, {});
    const restore = driver.restore;
    let copyDone;
    const copied = new Promise((r) => (copyDone = r));
    driver.restore = async function (spec, imageDir) {
      if (spec.id !== sb.id) {
        try {
          return await restore.call(this, spec, imageDir);
        } finally {
          copyDone();
        }
      }
      await copied; // the copy is up before the parent's restore fails
      throw new Error('the parent\'s restore fails');
    };
    const before = new Set((await svc.list(T, { limit: 200 })).items.map((s) => s.id));
    try {
      await assert.rejects(svc.fork(T, sb.id, { count: 1 }), /the parent's restore fails/);
    } finally {
      driver.restore = restore;
    }
    const added = (await svc.list(T, { limit: 200 })).items.filter((s) => !before.has(s.id));
    assert.equal(added.length, 1, 'one copy was made');
    assert.equal(added[0].state, 'dead');
    assert.match(added[0].endDetail, /the fork's snapshot failed after the copies started/);
    assert.equal(driver.machine(added[0].id), undefined, 'its runtime is gone');
    await svc.kill(T, sb.id).catch(() => {});
  });

  it('a timeout kills; an idle timeout hibernates and the next call wakes it', async () => {
    const short = await svc.create(T, { timeoutMs: 1000 });
    const ended = await until(async () => {
      const s = await svc.get(T, short.id);
      return s.state === 'killed' ? s : undefined;
    }, 'the timeout');
    assert.equal(ended.endReason, 'timeout');
    const idle = await svc.create(T, { idleTimeoutMs: 1000 });
    await out(idle.id, 'tick');
    await until(async () => (await svc.get(T, idle.id)).state === 'hibernated', 'idle hibernation');
    assert.equal(await out(idle.id, 'tick'), '2\n', 'a call wakes it, memory intact');
    await svc.kill(T, idle.id);
  });

  it('idle hibernation never cuts an open call, and a wake slower than the idle timeout is not followed by a hibernation at once', async (t) => {
    // (The fake's sleep and core's timers keep nothing alive; this test waits on them.)
    const alive = setInterval(() => {}, 1000);
    t.after(() => clearInterval(alive));
    const sb = await svc.create(T, { idleTimeoutMs: 1000 });
    // A command open for several idle periods: the sandbox is busy, and the command runs to its end.
    const long = await run(sb.id, 'sleep 2');
    assert.equal(long.exitCode, 0, 'the open command was not cut by a checkpoint');
    const evs = await svc.events(T, sb.id);
    assert.ok(!evs.some((e) => e.type === 'hibernated'), `no hibernation while the command was open: ${evs.map((e) => e.type)}`);
    await until(async () => (await svc.get(T, sb.id)).state === 'hibernated', 'idle hibernation once the command ended');
    // A wake that takes longer than the idle timeout (as under load): the call that woke it
    // must be served, not cut by an idle hibernation that counts the wake as idle time.
    const restore = driver.restore.bind(driver);
    driver.restore = async (...a) => {
      await new Promise((r) => setTimeout(r, 1500));
      return restore(...a);
    };
    try {
      assert.equal(await out(sb.id, 'tick'), '1\n');
      assert.equal((await svc.get(T, sb.id)).state, 'running');
    } finally {
      driver.restore = restore;
    }
    await svc.kill(T, sb.id);
  });

  it('a sandbox that dies of OOM ends dead with reason oom; a crash with a snapshot recovers from it', async () => {
    const oom = await svc.create(T, {});
    await run(oom.id, 'die oom').catch(() => {});
    const dead = await until(async () => {
      const s = await svc.get(T, oom.id);
      return s.state === 'dead' ? s : undefined;
    }, 'the OOM end');
    assert.equal(dead.endReason, 'oom');
    const crash = await svc.create(T, {});
    await out(crash.id, 'tick');
    await svc.snapshot(T, crash.id, {});
    await out(crash.id, 'tick');
    await run(crash.id, 'die crash').catch(() => {});
    await until(async () => (await svc.events(T, crash.id)).some((e) => e.type === 'recovered'), 'the recovery');
    assert.equal((await svc.get(T, crash.id)).state, 'running');
    assert.equal(await out(crash.id, 'tick'), '2\n', 'back at the snapshot (counter 1)');
    await svc.kill(T, crash.id);
  });

  it('admission: beyond maxSandboxes a create gets CAPACITY_EXHAUSTED and leaves nothing', async () => {
    const small = service({ maxSandboxes: 1 });
    await svc.shutdown();
    await small.start();
    try {
      const alive = await store.sandboxesInStates(['starting', 'running', 'paused']);
      assert.deepEqual(alive.map((x) => `${x.id} ${x.state}`), [], 'nothing else runs');
      const one = await small.create(T, {});
      const before = (await driver.list()).length;
      await assert.rejects(small.create(T, {}), (e) => e.code === 'CAPACITY_EXHAUSTED');
      assert.equal((await driver.list()).length, before, 'no half-made sandbox');
      await small.kill(T, one.id);
    } finally {
      await small.shutdown();
      svc = service();
      await svc.start();
    }
  });

  it('a restarted service adopts running sandboxes with their state, and hibernated ones stay hibernated', async () => {
    const runningSb = await svc.create(T, {});
    await out(runningSb.id, 'tick');
    const sleeping = await svc.create(T, {});
    await out(sleeping.id, 'tick');
    await svc.hibernate(T, sleeping.id);
    await svc.shutdown();
    await driver.close();
    svc = service();
    await svc.start();
    assert.equal((await svc.get(T, runningSb.id)).state, 'running');
    assert.equal(await out(runningSb.id, 'tick'), '2\n', 'the same machine, adopted');
    assert.equal((await svc.get(T, sleeping.id)).state, 'hibernated');
    assert.equal(await out(sleeping.id, 'tick'), '2\n', 'and wakes on a call');
    for (const id of [runningSb.id, sleeping.id]) await svc.kill(T, id);
  });

  it('a warm pool serves creates from booted sandboxes; what it has ready is told to placement', async () => {
    // No pool: a pool-shaped create is short here (placement in a cluster looks elsewhere).
    assert.equal(await svc.poolShortHere(T, {}), '/minimal');
    assert.deepEqual(svc.pool.readyCounts(), {});
    await svc.shutdown();
    svc = service({ builtinPools: { minimal: 1 } });
    await svc.start();
    await until(async () => (await driver.list()).length >= 1, 'the pool to fill');
    assert.deepEqual(svc.pool.readyCounts(), { '/minimal': 1 });
    assert.equal(await svc.poolShortHere(T, { template: 'minimal', memoryMb: 512, cpu: 1 }), undefined, 'one ready here');
    // Not the pool's shape, or no such template: placement leaves those alone.
    for (const opts of [{ memoryMb: 1024 }, { cpu: 2 }, { volumes: [{ volume: 'v', path: '/data' }] }, { template: 'nosuch' }]) assert.equal(await svc.poolShortHere(T, opts), undefined, JSON.stringify(opts));
    const sb = await svc.create(T, {});
    assert.equal(await out(sb.id, 'hostname'), `${sb.id}\n`, 'a pooled sandbox takes the new identity');
    assert.equal(sb.createTimings?.source, 'pool', JSON.stringify(sb.createTimings));
    await svc.kill(T, sb.id);
    await svc.shutdown();
    svc = service();
    await svc.start();
  });
});

/**
 * Runs `fn` against a started service over a fresh directory whose `minimal` template image is
 * taken (its first create boots and has it taken; later creates restore it), then shuts it down
 * and removes the directory. `opts` are the service's.
 */
async function withTemplateImage(driver, opts, fn) {
  const dir = mkdtempSync('/tmp/space-fake-');
  const store = SqliteStore.open(path.join(dir, 'space.db'));
  const h = fakeHarness(dir, store, driver);
  const svc = h.service(opts);
  try {
    await svc.start();
    await svc.kill(T, (await svc.create(T, {})).id);
    await until(async () => (await store.getTemplate('', 'minimal'))?.image, "minimal's image");
    await fn(svc, h);
  } finally {
    await svc.shutdown();
    store.close?.();
    rmSync(dir, { recursive: true, force: true });
  }
}

describe('disk sizes at a template restore (fast lane)', () => {
  it('a driver whose agent grows its disk gets the size in the identity; another driver\'s agent is not told', async () => {
    for (const grownByAgent of [true, false]) {
      const driver = new FakeDriver({ disks: { defaultMb: 1024, maxMb: 4096, ...(grownByAgent ? { grownByAgent } : {}) } });
      await withTemplateImage(driver, {}, async (svc) => {
        const sb = await svc.create(T, { diskMb: 2048 });
        assert.equal(sb.createTimings?.source, 'snapshot', 'restored from the template image');
        assert.equal(sb.diskMb, 2048);
        assert.equal(driver.machine(sb.id).diskBytes, grownByAgent ? 2048 * 1048576 : undefined);
        await svc.kill(T, sb.id);
      });
    }
  });
});

describe('an agent that refuses its identity (fast lane)', () => {
  it('a restore waiting for it fails at once with the agent\'s reason, not at the boot timeout: a template create boots instead, a fork fails and its parent runs on', async () => {
    const driver = new FakeDriver({ disks: { defaultMb: 1024, maxMb: 4096, grownByAgent: true } });
    const warned = [];
    const logger = { info() {}, debug() {}, error() {}, warn: (o, msg) => warned.push({ ...o, msg }) };
    logger.child = () => logger;
    // Without the failure passed on, each wait below ends with TIMEOUT after this long instead.
    await withTemplateImage(driver, { logger, startTimeoutMs: 20_000 }, async (svc, h) => {
      // As a microVM's agent whose disk the guest kernel never sees grown.
      driver.refuseIdentity = (r) => (r.request.diskBytes ? 'the guest kernel did not see the disk grow' : undefined);
      const sb = await svc.create(T, { diskMb: 2048 });
      assert.equal(sb.createTimings?.source, 'boot', 'booted after the restore failed');
      const fellBack = warned.find((w) => w.msg === 'restoring the template image failed; booting instead');
      assert.equal(fellBack?.err?.code, 'DRIVER_FAILED', 'the agent\'s reason, not a TIMEOUT');
      assert.match(fellBack.err.message, /did not take the sandbox's identity: the guest kernel did not see the disk grow/);
      // A fork's copies are given their identity too.
      driver.refuseIdentity = () => 'refused by the test';
      const [copy] = await svc.fork(T, sb.id, { count: 1 });
      assert.equal(copy.error?.code, 'DRIVER_FAILED', 'the agent\'s reason, not a TIMEOUT');
      assert.match(copy.error.message, /refused by the test/);
      driver.refuseIdentity = undefined;
      assert.equal((await h.run(svc, sb.id, 'true')).exitCode, 0, 'the parent answers');
      assert.deepEqual(await driver.list(), [sb.id], 'no copy is left running');
      await svc.kill(T, sb.id);
    });
  });
});

describe('an agent whose connection drops while it takes its identity (fast lane)', () => {
  it('is asked again when it reconnects: the create restores from the image, it does not boot', async () => {
    const driver = new FakeDriver();
    // (The fake agent's reconnect timer is unref'd, as the daemon's listeners keep a real one's loop alive.)
    const keepAlive = setInterval(() => {}, 1000);
    try {
      await withTemplateImage(driver, { startTimeoutMs: 20_000 }, async (svc, h) => {
        let asked = 0;
        driver.refuseIdentity = () => (++asked === 1 ? 'drop' : undefined);
        const sb = await svc.create(T, {});
        assert.equal(asked, 2, 'asked again after the reconnect');
        assert.equal(sb.createTimings?.source, 'snapshot', 'restored from the image, not booted');
        assert.equal(await h.out(svc, sb.id, 'hostname'), `${sb.id}\n`, 'with its own identity');
        await svc.kill(T, sb.id);
      });
    } finally {
      clearInterval(keepAlive);
    }
  });
});

describe('the metadata store away for a while (fast lane)', () => {
  it('usage sampling and the rolling-snapshot timer carry on; nothing is left unhandled', async () => {
    const dir = mkdtempSync('/tmp/space-fake-');
    const driver = new FakeDriver();
    const real = SqliteStore.open(path.join(dir, 'space.db'));
    let down = false;
    // PostgreSQL stopped, as the daemon sees it: every call fails with METADATA_UNAVAILABLE.
    const store = new Proxy(real, {
      get(t, k) {
        const v = t[k];
        if (typeof v !== 'function') return v;
        return (...a) => (down ? Promise.reject(new SpaceError('METADATA_UNAVAILABLE', 'the test stopped the store')) : v.apply(t, a));
      },
    });
    const unhandled = [];
    const onUnhandled = (e) => unhandled.push(e);
    process.on('unhandledRejection', onUnhandled);
    const svc = fakeHarness(dir, store, driver).service({ usageSampleMs: 10 });
    try {
      await svc.start();
      const sb = await svc.create(T, {});
      await svc.setSnapshotPolicy(T, sb.id, { intervalMs: 1000, keep: 5 });
      down = true;
      // Usage ticks every 10 ms and a policy tick (1 s) fall while it is away.
      await new Promise((r) => setTimeout(r, 1500));
      down = false;
      await until(async () => (await svc.snapshots(T, sb.id)).length >= 1, 'a scheduled snapshot once the store is back');
      await svc.kill(T, sb.id);
      assert.deepEqual(unhandled.map(String), []);
    } finally {
      process.off('unhandledRejection', onUnhandled);
      down = false;
      await svc.shutdown();
      real.close?.();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('shutdown while the template image is loaded (fast lane)', () => {
  it('waits for the load in the background and leaves nothing: no call to the store or blobs after it returns, no sandbox', async () => {
    const dir = mkdtempSync('/tmp/space-fake-');
    const driver = new FakeDriver();
    const store = SqliteStore.open(path.join(dir, 'space.db'));
    const h = fakeHarness(dir, store, driver);
    let release;
    const gate = new Promise((r) => (release = r));
    let armed = false;
    let held = false;
    let closed = false;
    const late = [];
    const watch = (target, name) =>
      new Proxy(target, {
        get(t, k) {
          const v = t[k];
          if (typeof v !== 'function') return v;
          return (...a) => {
            if (closed) late.push(`${name}.${String(k)}`);
            // The first read of the stored image after the restart: held.
            if (name === 'blobs' && armed && !held) {
              held = true;
              return gate.then(() => v.apply(t, a));
            }
            return v.apply(t, a);
          };
        },
      });
    try {
      // A first life takes minimal's image and stores it.
      const first = h.service();
      await first.start();
      await until(async () => (await store.getTemplate('', 'minimal'))?.image, "minimal's image");
      await first.shutdown();
      // As the daemon does: the working copies in RAM go when it stops; the next start reloads them.
      rmSync(path.join(dir, 'images'), { recursive: true, force: true });
      armed = true;
      const svc = h.service({ store: watch(store, 'store'), blobs: watch(h.blobs, 'blobs') });
      await svc.start();
      await until(() => held, 'the reload of the image to read the blob store');
      const stopped = svc.shutdown();
      release();
      await stopped;
      closed = true;
      await new Promise((r) => setTimeout(r, 50));
      assert.deepEqual(late, [], 'the reload went on after shutdown returned');
      assert.deepEqual(await driver.list(), [], 'no sandbox is left');
    } finally {
      release();
      store.close?.();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
