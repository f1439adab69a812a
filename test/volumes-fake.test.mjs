// Who may use a volume (core's Volumes) on the fake driver, in seconds (fast lane): one writer
// or many readers, holders kept through forks, a restart and hibernation, the mounts each boot
// and restore is given, removal racing a create, interrupted intents undone at start. The
// volume store is an in-memory stand-in; the real one is tested in volume-host.test.mjs and
// volumes.test.mjs.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { KeyService, LocalKeyProvider, Volumes } from '../packages/core/dist/index.js';
import { FakeDriver } from '../packages/driver-fake/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { T, fakeHarness, quiet, until } from './fake-harness.mjs';
import { rejectionCode } from './helpers.mjs';
import { sandbox } from './store-suite.mjs';

/** A volume store in memory: what is open, with which key. */
class MemVolumes {
  vols = new Map();
  open_ = new Set();
  snaps = new Map();
  constructor(dir) {
    this.dir = dir;
  }
  async doctor() {
    return { available: true, detail: 'memory' };
  }
  async create(id, sizeMb, key) {
    this.vols.set(id, { sizeMb, key: Buffer.from(key) });
  }
  async open(id, key) {
    const v = this.vols.get(id);
    assert.ok(v && v.key.equals(key), `volume ${id} opened with its own key`);
    this.open_.add(id);
    const d = path.join(this.dir, id);
    mkdirSync(d, { recursive: true });
    return d;
  }
  async close(id) {
    this.open_.delete(id);
  }
  async openIds() {
    return [...this.open_];
  }
  async usedBytes(id) {
    return this.open_.has(id) ? 0 : undefined;
  }
  async remove(id) {
    this.open_.delete(id);
    this.vols.delete(id);
  }
  async snapshot(id, s) {
    this.snaps.set(s, id);
  }
  async restore() {}
  async removeSnapshot(_id, s) {
    this.snaps.delete(s);
  }
  async recover() {}
}


describe('volumes on the fake driver (fast lane)', () => {
  const dir = mkdtempSync('/tmp/space-fakevol-');
  const driver = new FakeDriver();
  const host = new MemVolumes(path.join(dir, 'volumes'));
  let store;
  let keys;
  let h;
  let svc;
  const volumesFor = () => new Volumes({ store, keys, logger: quiet, host });
  const start = async () => {
    svc = h.service({ volumes: volumesFor() });
    await svc.start();
  };

  before(async () => {
    store = SqliteStore.open(path.join(dir, 'space.db'));
    mkdirSync(path.join(dir, 'keys'));
    writeFileSync(path.join(dir, 'keys', 'node.key'), randomBytes(32), { mode: 0o600 });
    keys = new KeyService({ store, providers: [new LocalKeyProvider(path.join(dir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger: quiet });
    await keys.start();
    h = fakeHarness(dir, store, driver);
    await start();
  });
  after(async () => {
    await svc.shutdown();
    for (const sb of (await svc.list(T, { limit: 200 })).items) if (!['killed', 'dead'].includes(sb.state)) await svc.kill(T, sb.id);
    store.close?.();
    rmSync(dir, { recursive: true, force: true });
  });

  it('one writer or many readers; the mounts reach every boot and restore; a volume nobody holds is closed', async () => {
    const v = await svc.volumes.create(T, { name: 'data', sizeMb: 128 });
    const w = await svc.create(T, { volumes: [{ volume: 'data', path: '/data' }] });
    assert.deepEqual(driver.mountsOf(w.id), [`/data:${path.join(dir, 'volumes', v.id)}`]);
    assert.equal(w.createTimings.source, 'boot', 'a sandbox with volumes boots (a template image has no mounts)');
    assert.equal(await rejectionCode(svc.create(T, { volumes: [{ volume: 'data', path: '/x' }] })), 'VOLUME_IN_USE');
    assert.equal(await rejectionCode(svc.create(T, { volumes: [{ volume: 'data', path: '/x', readOnly: true }] })), 'VOLUME_IN_USE');
    await svc.hibernate(T, w.id);
    await until(async () => (await host.openIds()).length === 0, 'the hibernated sandbox\'s volume closed');
    assert.equal(await rejectionCode(svc.create(T, { volumes: [{ volume: 'data', path: '/x', readOnly: true }] })), 'VOLUME_IN_USE', 'a hibernated sandbox still holds its volume (closed: ciphertext at rest)');
    assert.deepEqual((await svc.volumes.get(T, 'data')).mountedBy.map((m) => m.sandboxId), [w.id]);
    // A restart while it sleeps keeps it held and closed.
    await svc.shutdown();
    await start();
    assert.deepEqual([await host.openIds(), (await svc.volumes.get(T, 'data')).mountedBy.map((m) => m.sandboxId)], [[], [w.id]]);
    await svc.wake(T, w.id);
    assert.deepEqual(await host.openIds(), [v.id], 'the wake opened it again');
    assert.deepEqual(driver.mountsOf(w.id), [`/data:${path.join(dir, 'volumes', v.id)}`], 'the wake got the same mounts');
    assert.equal(await rejectionCode(svc.fork(T, w.id, { count: 1 })), 'VOLUME_IN_USE', 'a writer is not forked');
    await svc.kill(T, w.id);
    assert.deepEqual(await host.openIds(), []);
    const r = await svc.create(T, { volumes: [{ volume: 'data', path: '/data', readOnly: true }] });
    const forks = await svc.fork(T, r.id, { count: 2 });
    for (const f of forks) assert.deepEqual(driver.mountsOf(f.sandbox.id), [`/data:${path.join(dir, 'volumes', v.id)}:ro`]);
    assert.equal((await svc.volumes.get(T, 'data')).mountedBy.length, 3);
    for (const x of [r, ...forks.map((f) => f.sandbox)]) await svc.kill(T, x.id);
    assert.deepEqual((await svc.volumes.get(T, 'data')).mountedBy, []);
    assert.deepEqual(await host.openIds(), []);
  });

  it('a restart knows who holds each volume; only then can it be removed', async () => {
    const w = await svc.create(T, { volumes: [{ volume: 'data', path: '/data' }] });
    await svc.shutdown();
    await start();
    assert.deepEqual((await svc.volumes.get(T, 'data')).mountedBy.map((m) => m.sandboxId), [w.id]);
    assert.equal(await rejectionCode(svc.volumes.remove(T, 'data')), 'VOLUME_IN_USE');
    assert.equal(await rejectionCode(svc.create(T, { volumes: [{ volume: 'data', path: '/data' }] })), 'VOLUME_IN_USE');
    await svc.kill(T, w.id);
    await svc.volumes.remove(T, 'data');
    assert.equal(await rejectionCode(svc.volumes.get(T, 'data')), 'VOLUME_NOT_FOUND');
  });

  it('a removal and a create racing for one volume never both win', async () => {
    for (let i = 0; i < 10; i++) {
      await svc.volumes.create(T, { name: `race${i}` });
      const [rm, cr] = await Promise.allSettled([svc.volumes.remove(T, `race${i}`), svc.create(T, { volumes: [{ volume: `race${i}`, path: '/data' }] })]);
      assert.ok(rm.status === 'rejected' || cr.status === 'rejected', `round ${i}: the volume was removed under a sandbox`);
      if (cr.status === 'fulfilled') {
        await svc.kill(T, cr.value.id);
        await svc.volumes.remove(T, `race${i}`);
      }
    }
    assert.deepEqual(await svc.volumes.list(T), []);
    assert.deepEqual(await host.openIds(), []);
  });

  it('a create or snapshot interrupted by a crash is undone at the next start', async () => {
    await store.insertVolume({ id: 'vol-interrupted0001', tenantId: T, name: 'half', sizeMb: 64, createdAt: new Date().toISOString(), state: 'creating' });
    const v = await svc.volumes.create(T, { name: 'whole' });
    await store.insertVolumeSnapshot({ id: 'vs-interrupted00001', volumeId: v.id, createdAt: new Date().toISOString(), state: 'creating' });
    await svc.shutdown();
    await start();
    assert.deepEqual((await svc.volumes.list(T)).map((x) => x.name), ['whole']);
    assert.equal(await store.getVolume(T, 'half'), undefined, 'nothing half-made is listed, or kept');
    assert.deepEqual(await svc.volumes.snapshots(T, 'whole'), []);
    assert.equal(await store.getVolumeSnapshot('vs-interrupted00001'), undefined);
    await svc.volumes.remove(T, 'whole');
  });
});

// In a cluster (nodes sharing the store) a volume is kept on the node that made it: the other
// nodes list it with its node and who mounts it, act on it never (VOLUME_ON_OTHER_NODE, which the
// API forwards by), refuse mounts of two nodes' volumes together, and leave its intents alone.
describe('volumes of nodes sharing a store (fast lane)', () => {
  const dir = mkdtempSync('/tmp/space-fakevol-');
  let store;
  let nodes;
  before(async () => {
    store = SqliteStore.open(path.join(dir, 'space.db'));
    mkdirSync(path.join(dir, 'keys'));
    writeFileSync(path.join(dir, 'keys', 'node.key'), randomBytes(32), { mode: 0o600 });
    const keys = new KeyService({ store, providers: [new LocalKeyProvider(path.join(dir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger: quiet });
    await keys.start();
    nodes = Object.fromEntries(['a', 'b'].map((n) => [n, new Volumes({ store, keys, logger: quiet, host: new MemVolumes(path.join(dir, n)), node: n })]));
  });
  after(() => {
    store.close?.();
    rmSync(dir, { recursive: true, force: true });
  });

  it('kept by its maker: listed everywhere with its node, acted on only there; mounts of one node only', async () => {
    const onB = await nodes.b.create(T, { name: 'on-b', sizeMb: 64 });
    await nodes.a.create(T, { name: 'on-a', sizeMb: 64 });
    assert.equal(onB.node, 'b');
    // A sandbox of b's mounts it: a lists the holder from the records.
    await store.insertSandbox({ ...sandbox('sbvolb', T), node: 'b', volumes: [{ volume: 'on-b', path: '/data' }] });
    assert.deepEqual((await nodes.a.list(T)).map((v) => [v.name, v.node, v.mountedBy.map((m) => m.sandboxId)]), [['on-a', 'a', []], ['on-b', 'b', ['sbvolb']]]);
    for (const act of [() => nodes.a.get(T, 'on-b'), () => nodes.a.remove(T, 'on-b'), () => nodes.a.snapshot(T, 'on-b'), () => nodes.a.files(T, 'on-b', false), () => nodes.a.check(T, [{ volume: 'on-b', path: '/data' }], true)]) {
      assert.equal(await rejectionCode(act()), 'VOLUME_ON_OTHER_NODE');
    }
    assert.equal(await nodes.a.nodeOf(T, 'on-b'), 'b');
    assert.equal(await nodes.a.nodeOf(T, onB.id), 'b', 'by id too (E2B names volumes so)');
    assert.equal(await nodes.a.nodeOf(T, 'on-a'), undefined, 'its own');
    assert.equal(await nodes.a.nodeOfMounts(T, [{ volume: 'on-b', path: '/data' }]), 'b');
    assert.equal(await nodes.b.nodeOfMounts(T, [{ volume: 'on-b', path: '/data' }]), undefined);
    assert.equal(await nodes.a.nodeOfMounts(T, [{ volume: 'nosuch', path: '/x' }]), undefined, 'unknown: the create says so');
    assert.equal(await rejectionCode(nodes.a.nodeOfMounts(T, [{ volume: 'on-a', path: '/a' }, { volume: 'on-b', path: '/b' }])), 'VOLUMES_ON_DIFFERENT_NODES');
    assert.equal(await rejectionCode(nodes.b.check(T, [{ volume: 'on-a', path: '/a' }, { volume: 'on-b', path: '/b' }], true)), 'VOLUMES_ON_DIFFERENT_NODES');
    assert.equal((await nodes.b.check(T, [{ volume: 'on-b', path: '/data' }], true)).length, 1);
    // A's restart leaves b's interrupted create alone (b undoes it at its own start).
    await store.insertVolume({ id: 'vol-bhalfmade000001', tenantId: T, name: 'b-half', sizeMb: 64, createdAt: new Date().toISOString(), state: 'creating', node: 'b' });
    await nodes.a.recover();
    assert.equal((await store.getVolume(T, 'b-half'))?.state, 'creating');
    await nodes.b.recover();
    assert.equal(await store.getVolume(T, 'b-half'), undefined);
  });
});
