// The fast lane: two nodes' SandboxServices over one shared store (`shared: true`), each with a
// runtime of its own (the fake driver) — each acts on its own sandboxes only: requests for the
// other's are SANDBOX_ON_OTHER_NODE, a restart's recovery, its journal replay and its admission
// leave the other's alone; and a store's only daemon (not shared) takes every sandbox for its own,
// one recorded under an old node name included. Real SQLite, real wire protocol, seconds.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import path from 'node:path';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { FakeDriver } from '../packages/driver-fake/dist/index.js';
import { T, fakeHarness } from './fake-harness.mjs';

describe('nodes sharing a store, on the fake driver (fast lane)', () => {
  const dir = mkdtempSync('/tmp/space-fake-');
  const drivers = { a: new FakeDriver(), b: new FakeDriver() };
  let store;
  let h;
  const svcs = {};
  const node = async (name, opts = {}) => {
    const s = h[name].service({ nodeName: name, shared: true, ...opts });
    await s.start();
    svcs[name] = s;
    return s;
  };

  before(async () => {
    store = SqliteStore.open(path.join(dir, 'space.db'));
    // Each node its own directory (template images, work) and runtime; one store, one blob store.
    const blobsDir = path.join(dir, 'blobs');
    h = { a: fakeHarness(path.join(dir, 'a'), store, drivers.a, { blobsDir }), b: fakeHarness(path.join(dir, 'b'), store, drivers.b, { blobsDir }) };
    await node('a');
    await node('b');
  });
  after(async () => {
    for (const s of Object.values(svcs)) await s.shutdown();
    store.close?.();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a sandbox is its node\'s: the other node reads its record but acts on it never (SANDBOX_ON_OTHER_NODE)', async () => {
    const sb = await svcs.a.create(T, {});
    assert.equal(sb.node, 'a');
    assert.equal((await svcs.b.find(T, sb.id)).id, sb.id);
    await assert.rejects(svcs.b.get(T, sb.id), (e) => e.code === 'SANDBOX_ON_OTHER_NODE' && /runs on node a/.test(e.message) && e.details.node === 'a');
    await assert.rejects(svcs.b.kill(T, sb.id), (e) => e.code === 'SANDBOX_ON_OTHER_NODE');
    await assert.rejects(svcs.b.hibernate(T, sb.id), (e) => e.code === 'SANDBOX_ON_OTHER_NODE');
    assert.equal((await h.a.run(svcs.a, sb.id, 'echo here')).stdout, 'here\n');
    assert.equal((await svcs.a.kill(T, sb.id)).state, 'killed');
  });

  it('a node\'s restart leaves the other\'s sandboxes and their journal alone, and re-adopts its own', async () => {
    const onA = await svcs.a.create(T, {});
    const onB = await svcs.b.create(T, {});
    // An operation of node a's under way, as its journal records it.
    const intent = { id: 'in-a-1', sandboxId: onA.id, op: 'snapshot', step: 'checkpoint', startedAt: new Date().toISOString(), updatedAt: new Date().toISOString(), keepRunning: true };
    await store.putIntent(intent);
    await svcs.b.shutdown();
    await node('b');
    assert.deepEqual((await store.listIntents()).map((i) => i.id), ['in-a-1'], 'node b left node a\'s intent');
    await store.deleteIntent('in-a-1');
    assert.equal((await svcs.a.get(T, onA.id)).state, 'running');
    assert.ok(!(await svcs.a.events(T, onA.id)).some((e) => e.type === 'recovered' || e.type === 'recovery-failed'));
    assert.equal((await h.a.run(svcs.a, onA.id, 'echo a')).stdout, 'a\n');
    assert.equal((await h.b.run(svcs.b, onB.id, 'echo b')).stdout, 'b\n', 'node b re-adopted its own');
    await svcs.a.kill(T, onA.id);
    await svcs.b.kill(T, onB.id);
  });

  it('admission counts a node\'s own sandboxes only', async () => {
    await svcs.b.shutdown();
    await node('b', { maxSandboxes: 1 });
    const onA = await svcs.a.create(T, {});
    const onB = await svcs.b.create(T, {});
    await assert.rejects(svcs.b.create(T, {}), (e) => e.code === 'CAPACITY_EXHAUSTED');
    await svcs.a.kill(T, onA.id);
    await svcs.b.kill(T, onB.id);
    await svcs.b.shutdown();
    await node('b');
  });

  it('a move hibernates the sandbox on its node and hands it over (generation 1); the new node wakes it with its files', async () => {
    const sb = await svcs.a.create(T, {});
    await h.a.run(svcs.a, sb.id, 'write /tmp/f kept');
    const { sandbox, wasRunning } = await svcs.a.move(T, sb.id, 'b');
    assert.equal(wasRunning, true);
    assert.deepEqual([sandbox.node, sandbox.state, sandbox.generation], ['b', 'hibernated', 1]);
    assert.equal(drivers.a.machine(sb.id), undefined, 'nothing of it is left on node a');
    await assert.rejects(svcs.a.wake(T, sb.id), (e) => e.code === 'SANDBOX_ON_OTHER_NODE');
    const woke = await svcs.b.wake(T, sb.id);
    assert.deepEqual([woke.node, woke.state], ['b', 'running']);
    assert.equal((await h.b.run(svcs.b, sb.id, 'cat /tmp/f')).stdout, 'kept\n');
    assert.ok((await svcs.b.events(T, sb.id)).some((e) => e.type === 'moved' && /from node a to node b/.test(e.message)));
    await assert.rejects(svcs.b.move(T, sb.id, 'b'), (e) => e.code === 'BAD_REQUEST');
    await svcs.b.kill(T, sb.id);
  });

  it('a hibernated sandbox of a node that is down is taken over by the node asked; one that is up is not', async () => {
    const sb = await svcs.b.create(T, {});
    await h.b.run(svcs.b, sb.id, 'write /tmp/g asleep');
    await svcs.b.hibernate(T, sb.id);
    // Node a believes b is up: still b's.
    await svcs.a.shutdown();
    let bUp = true;
    await node('a', { nodeUp: async (n) => n !== 'b' || bUp });
    await assert.rejects(svcs.a.get(T, sb.id), (e) => e.code === 'SANDBOX_ON_OTHER_NODE');
    // Node b goes down: node a takes it (a conditional write: b cannot write over it after).
    await svcs.b.shutdown();
    bUp = false;
    const taken = await svcs.a.get(T, sb.id);
    assert.deepEqual([taken.node, taken.state, taken.generation], ['a', 'hibernated', 1]);
    await assert.rejects(store.updateSandbox(sb.id, { state: 'running' }, { node: 'b' }), (e) => e.code === 'SANDBOX_ON_OTHER_NODE');
    await svcs.a.wake(T, sb.id);
    assert.equal((await h.a.run(svcs.a, sb.id, 'cat /tmp/g')).stdout, 'asleep\n');
    assert.ok((await svcs.a.events(T, sb.id)).some((e) => e.type === 'moved' && /taken over from node b by node a/.test(e.message)));
    await svcs.a.kill(T, sb.id);
    await node('b');
  });

  it('fencing: a node waking a sandbox that another node took over meanwhile removes its copy and says so', async () => {
    const sb = await svcs.a.create(T, {});
    await svcs.a.hibernate(T, sb.id);
    // Node a again, its restores held at a gate the test opens.
    let open;
    const gate = new Promise((r) => (open = r));
    let restoring;
    const reached = new Promise((r) => (restoring = r));
    const held = new Proxy(drivers.a, {
      get(t, k) {
        if (k === 'restore') return async (...args) => (restoring(), await gate, t.restore(...args));
        const v = t[k];
        return typeof v === 'function' ? v.bind(t) : v;
      },
    });
    await svcs.a.shutdown();
    const s = fakeHarness(path.join(dir, 'a'), store, held, { blobsDir: path.join(dir, 'blobs') }).service({ nodeName: 'a', shared: true });
    await s.start();
    svcs.a = s;
    const waking = svcs.a.wake(T, sb.id).then(() => 'woke', (e) => e.code);
    await reached;
    // Meanwhile node b, believing a down, takes the sandbox over.
    await svcs.b.shutdown();
    await node('b', { nodeUp: async (n) => n !== 'a' });
    assert.equal((await svcs.b.get(T, sb.id)).node, 'b');
    open();
    assert.equal(await waking, 'SANDBOX_ON_OTHER_NODE', 'node a\'s wake is fenced out');
    assert.equal(drivers.a.machine(sb.id), undefined, 'and its copy removed');
    await svcs.b.wake(T, sb.id);
    assert.equal((await h.b.run(svcs.b, sb.id, 'echo one copy')).stdout, 'one copy\n');
    await svcs.b.kill(T, sb.id);
    await svcs.b.shutdown();
    await node('b');
  });

  it('a node that cannot heartbeat pauses its sandboxes; back, it resumes its own and removes those taken over meanwhile', async () => {
    const mine = await svcs.a.create(T, {});
    const taken = await svcs.a.create(T, {});
    assert.equal(await svcs.a.leaseLost(), 2);
    assert.equal(drivers.a.isPaused(mine.id), true);
    assert.equal(drivers.a.isPaused(taken.id), true);
    assert.equal(await svcs.a.leaseLost(), 0, 'once');
    // Meanwhile node b took one over (node a was counted lost): the record is b's.
    await store.updateSandbox(taken.id, { node: 'b', generation: 1 }, { node: 'a' });
    assert.deepEqual(await svcs.a.leaseRenewed(), { resumed: 1, removed: 1 });
    assert.equal(drivers.a.isPaused(mine.id), false, 'its own runs again');
    assert.equal(drivers.a.machine(taken.id), undefined, 'the one taken over is gone from node a');
    assert.equal((await h.a.run(svcs.a, mine.id, 'echo on')).stdout, 'on\n');
    await svcs.a.kill(T, mine.id);
    await store.updateSandbox(taken.id, { state: 'killed' });
  });

  it('a lost node\'s sandboxes: restored here from a snapshot, or dead (node-lost) without one; adopting twice at once restores each once', async () => {
    const kept = await svcs.a.create(T, {});
    await h.a.run(svcs.a, kept.id, 'write /tmp/s snap');
    await svcs.a.snapshot(T, kept.id);
    const bare = await svcs.a.create(T, {});
    // Node a dies (its service is cut off, its runtime gone with the host).
    await svcs.a.shutdown();
    for (const id of [kept.id, bare.id]) await drivers.a.destroy(id);
    const [r1, r2] = await Promise.all([svcs.b.adoptLost('a'), svcs.b.adoptLost('a')]);
    assert.deepEqual({ restored: r1.restored + r2.restored, ended: r1.ended + r2.ended }, { restored: 1, ended: 1 });
    const back = await svcs.b.get(T, kept.id);
    assert.deepEqual([back.node, back.state, back.generation], ['b', 'running', 1]);
    assert.equal((await h.b.run(svcs.b, kept.id, 'cat /tmp/s')).stdout, 'snap\n');
    const ev = await svcs.b.events(T, kept.id);
    assert.ok(ev.some((e) => e.type === 'recovered' && /node a was lost/.test(e.message)), ev.map((e) => e.message).join('\n'));
    const dead = await svcs.b.find(T, bare.id);
    assert.deepEqual([dead.state, dead.endReason], ['dead', 'node-lost']);
    await svcs.b.kill(T, kept.id);
    await node('a');
  });

  it('the store\'s only daemon takes every sandbox for its own: one recorded under an old node name is adopted and renamed', async () => {
    const sb = await svcs.a.create(T, {});
    await svcs.a.shutdown();
    await svcs.b.shutdown();
    // The host was renamed: same runtime (node a's), another name, and no one shares the store.
    const solo = h.a.service({ nodeName: 'renamed' });
    await solo.start();
    svcs.a = solo;
    delete svcs.b;
    const now = await solo.get(T, sb.id);
    assert.equal(now.node, 'renamed');
    assert.equal(now.state, 'running');
    assert.equal((await h.a.run(solo, sb.id, 'echo mine')).stdout, 'mine\n');
    await solo.kill(T, sb.id);
  });
});
