// The metadata store suite: every MetadataStore implementation (SQLite, PostgreSQL) runs these
// same tests against a real database, like the driver conformance suite does for drivers:
//   storeSuite('sqlite', { open, rawApiKeys })
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { ApiKeys, Journal } from '../packages/core/dist/index.js';

/** A sandbox record as core stores it. */
export function sandbox(id, tenantId, state = 'running', metadata = {}, template = 'minimal') {
  return { id, tenantId, template, driver: 'gvisor', state, cpu: 1, memoryMb: 256, timeoutMs: 0, env: {}, metadata, createdAt: new Date().toISOString() };
}

/**
 * @param {string} name
 * @param {{
 *   open: (tag: string) => Promise<object>,   // the store at `tag` (same tag: same database, reopened)
 *   rawApiKeys: (tag: string) => Promise<object[]>, // the api_keys rows as the database holds them
 * }} h
 */
export function storeSuite(name, h) {
  describe(`metadata store: ${name}`, () => {
    it('updates fields, filters by tenant, state, labels and template, and pages both ways', async () => {
      const s = await h.open('list');
      for (let i = 0; i < 5; i++) await s.insertSandbox(sandbox(`sb${i}`, 't1', 'running', { n: String(i % 2) }, i === 3 ? 'base' : 'minimal'));
      await s.insertSandbox(sandbox('other', 't2'));
      const u = await s.updateSandbox('sb0', { state: 'killed', endReason: 'killed' });
      assert.equal(u.state, 'killed');
      assert.equal((await s.getSandbox('sb0')).endReason, 'killed');
      await assert.rejects(s.updateSandbox('nope', { state: 'killed' }), (e) => e.code === 'SANDBOX_NOT_FOUND');
      const p1 = await s.listSandboxes({ tenantId: 't1', limit: 2 });
      assert.deepEqual(p1.items.map((x) => x.id), ['sb4', 'sb3']);
      const p2 = await s.listSandboxes({ tenantId: 't1', limit: 2, cursor: p1.nextCursor });
      assert.deepEqual(p2.items.map((x) => x.id), ['sb2', 'sb1']);
      const p3 = await s.listSandboxes({ tenantId: 't1', limit: 2, cursor: p2.nextCursor });
      assert.deepEqual([p3.items.map((x) => x.id), p3.nextCursor], [['sb0'], undefined]);
      const a1 = await s.listSandboxes({ tenantId: 't1', limit: 3, order: 'asc' });
      const a2 = await s.listSandboxes({ tenantId: 't1', limit: 3, order: 'asc', cursor: a1.nextCursor });
      assert.deepEqual([...a1.items, ...a2.items].map((x) => x.id), ['sb0', 'sb1', 'sb2', 'sb3', 'sb4']);
      await assert.rejects(s.listSandboxes({ tenantId: 't1', limit: 3, cursor: a1.nextCursor }), (e) => e.code === 'BAD_REQUEST', 'an ascending cursor is not a descending one');
      const labelled = await s.listSandboxes({ tenantId: 't1', limit: 10, metadata: { n: '0' }, states: ['running'] });
      assert.deepEqual(labelled.items.map((x) => x.id), ['sb4', 'sb2']);
      assert.deepEqual((await s.listSandboxes({ tenantId: 't1', limit: 10, template: 'base' })).items.map((x) => x.id), ['sb3']);
      assert.deepEqual((await s.sandboxesInStates(['running'])).map((x) => x.id).sort(), ['other', 'sb1', 'sb2', 'sb3', 'sb4']);
      await assert.rejects(s.listSandboxes({ tenantId: 't1', limit: 2, cursor: '!!' }), (e) => e.code === 'BAD_REQUEST');
      await s.close();
    });

    it('read-modify-writes do not lose each other: 40 concurrent patches of one sandbox all land', async () => {
      const s = await h.open('concurrent');
      await s.insertSandbox(sandbox('hot', 't'));
      await Promise.all(Array.from({ length: 40 }, (_, i) => s.updateSandbox('hot', { [`f${i}`]: i })));
      const got = await s.getSandbox('hot');
      assert.deepEqual(Array.from({ length: 40 }, (_, i) => got[`f${i}`]), Array.from({ length: 40 }, (_, i) => i));
      await s.close();
    });

    it('conditional updates (fencing): of two nodes taking one sandbox at once exactly one wins; a node it left cannot write', async () => {
      const s = await h.open('fencing');
      await s.insertSandbox({ ...sandbox('moving', 't'), state: 'hibernated', node: 'a' });
      const take = (node) => s.updateSandbox('moving', { node, generation: 1 }, { node: 'a', state: 'hibernated' }).then(() => node, (e) => e.code);
      const results = await Promise.all(['b', 'c', 'b2', 'c2'].map(take));
      const winners = results.filter((r) => !r.endsWith?.('_NODE'));
      assert.equal(winners.length, 1, JSON.stringify(results));
      assert.deepEqual(results.filter((r) => r !== winners[0]), Array(3).fill('SANDBOX_ON_OTHER_NODE'));
      const now = await s.getSandbox('moving');
      assert.equal(now.node, winners[0]);
      assert.equal(now.generation, 1);
      // The node it left writes with its name: refused, nothing changed.
      await assert.rejects(s.updateSandbox('moving', { state: 'running' }, { node: 'a' }), (e) => e.code === 'SANDBOX_ON_OTHER_NODE' && e.message.includes(winners[0]));
      await assert.rejects(s.updateSandbox('moving', { state: 'running' }, { node: winners[0], state: 'running' }), (e) => e.code === 'SANDBOX_INVALID_STATE');
      assert.equal((await s.getSandbox('moving')).state, 'hibernated');
      // An update answers with the record as stored: fields replaced whole (not merged), a field
      // set to undefined gone, the state and node columns following (a listing by state sees it).
      await s.updateSandbox('moving', { wakeOnArrival: true, egress: { allow: ['a.example'] } });
      const after = await s.updateSandbox('moving', { wakeOnArrival: undefined, egress: { deny: ['b.example'] }, state: 'running', node: 'z' }, { node: winners[0] });
      assert.deepEqual([after.wakeOnArrival, after.egress, after.state, after.node, after.generation], [undefined, { deny: ['b.example'] }, 'running', 'z', 1]);
      assert.ok(!('wakeOnArrival' in (await s.getSandbox('moving'))));
      assert.deepEqual((await s.sandboxesInStates(['running'], { node: 'z' })).map((x) => x.id), ['moving']);
      await assert.rejects(s.updateSandbox('nowhere', { state: 'running' }), (e) => e.code === 'SANDBOX_NOT_FOUND');
      await s.close();
    });

    it('a node\'s own sandboxes, the count per node (following moves) and the silent nodes', async () => {
      const s = await h.open('by-node');
      await s.insertSandbox({ ...sandbox('a1', 't'), node: 'a' });
      await s.insertSandbox({ ...sandbox('a2', 't', 'paused'), node: 'a' });
      await s.insertSandbox({ ...sandbox('a3', 't', 'hibernated'), node: 'a' });
      await s.insertSandbox({ ...sandbox('b1', 't'), node: 'b', memoryMb: 1024 });
      await s.insertSandbox(sandbox('none', 't'));
      const ids = async (states, opts) => (await s.sandboxesInStates(states, opts)).map((x) => x.id).sort();
      assert.deepEqual(await ids(['running', 'paused'], { node: 'a' }), ['a1', 'a2']);
      assert.deepEqual(await ids(['running'], { node: 'c' }), []);
      assert.deepEqual(await ids(['running']), ['a1', 'b1', 'none']);
      assert.deepEqual(await s.sandboxLoadByNode(['running', 'paused']), { a: { sandboxes: 2, memoryMb: 512 }, b: { sandboxes: 1, memoryMb: 1024 } });
      // A move changes the owner in the document and in the query's column together.
      await s.updateSandbox('a3', { node: 'b', state: 'running' });
      assert.deepEqual(await ids(['running'], { node: 'b' }), ['a3', 'b1']);
      assert.deepEqual(await s.sandboxLoadByNode(['running', 'paused']), { a: { sandboxes: 2, memoryMb: 512 }, b: { sandboxes: 2, memoryMb: 1280 } });
      assert.deepEqual(await s.sandboxLoadByNode(['killed']), {});
      // Nodes by their last heartbeat: the silent ones alone, by name.
      const node = (name, heartbeatAt) => ({ name, url: `http://${name}`, version: 'x', drivers: ['gvisor'], cpus: 1, memoryMb: 1, maxSandboxes: 1, startedAt: heartbeatAt, heartbeatAt });
      await s.putNode(node('n2', '2026-12-01T10:00:00.000Z'));
      await s.putNode(node('n1', '2026-12-01T09:00:00.000Z'));
      await s.putNode(node('n3', '2026-12-01T11:00:00.000Z'));
      await s.putNode(node('n3', '2026-12-01T08:00:00.000Z')); // a heartbeat replaces the time
      assert.deepEqual((await s.listNodes()).map((n) => n.name), ['n1', 'n2', 'n3']);
      assert.deepEqual((await s.listNodes({ heartbeatBefore: '2026-12-01T10:00:00.000Z' })).map((n) => n.name), ['n1', 'n3']);
      await s.close();
    });

    it('keeps lifecycle intents across reopening until they are done', async () => {
      const s = await h.open('intents');
      const journal = new Journal(s);
      const a = await journal.begin('sb1', 'snapshot', { step: 'checkpoint', snapshotId: 'sn1', imageDir: '/w/sn1', trigger: 'manual', keepRunning: true });
      const b = await journal.begin('sb2', 'wake', { step: 'restore', snapshotId: 'sn2' });
      await journal.step(a, 'checkpointed');
      await s.close();
      const s2 = await h.open('intents');
      // Begun in the same millisecond they may list either way (oldest first, then by id).
      const left = (await new Journal(s2).list()).sort((x, y) => x.sandboxId.localeCompare(y.sandboxId));
      assert.deepEqual(left.map((i) => [i.sandboxId, i.op, i.step, i.snapshotId]), [['sb1', 'snapshot', 'checkpointed', 'sn1'], ['sb2', 'wake', 'restore', 'sn2']]);
      await new Journal(s2).done(left[0]);
      assert.deepEqual((await s2.listIntents()).map((i) => i.id), [b.id]);
      await s2.close();
    });

    it('stores only hashes of API keys; revoked keys no longer verify', async () => {
      const s = await h.open('keys');
      const keys = new ApiKeys(s);
      const { key, record } = await keys.create({ tenantId: 'acme', name: 'k' });
      const rows = await h.rawApiKeys('keys');
      assert.equal(rows.length, 1);
      assert.notEqual(rows[0].hash, key);
      assert.ok(!JSON.stringify(rows).includes(key));
      assert.equal((await keys.verify(key)).tenantId, 'acme');
      assert.equal(await s.countApiKeys(), 1);
      await keys.revoke({ tenantId: 'acme', keyId: record.id, admin: false }, record.id);
      await assert.rejects(keys.verify(key), (e) => e.code === 'UNAUTHENTICATED');
      await assert.rejects(keys.create({ tenantId: 'Bad Tenant!' }), (e) => e.code === 'BAD_REQUEST');
      assert.equal((await s.listApiKeys('acme'))[0].admin, false);
      await s.close();
    });

    it('secrets (sealed bytes kept as they are), audit log pages and pruning, one CA per tenant, data keys', async () => {
      const s = await h.open('secrets');
      const sealed = Buffer.from([0, 1, 2, 255]);
      await s.putSecret({ tenantId: 't1', name: 'B', hosts: ['b.example'], createdAt: 'x', updatedAt: 'x', sealed });
      await s.putSecret({ tenantId: 't1', name: 'A', hosts: ['a.example'], createdAt: 'x', updatedAt: 'x', sealed });
      await s.putSecret({ tenantId: 't2', name: 'A', hosts: ['other'], createdAt: 'x', updatedAt: 'x', sealed });
      await s.putSecret({ tenantId: 't1', name: 'B', hosts: ['b2.example'], createdAt: 'x', updatedAt: 'y', sealed });
      assert.deepEqual((await s.listSecrets('t1')).map((x) => [x.name, x.hosts[0]]), [['A', 'a.example'], ['B', 'b2.example']]);
      assert.deepEqual((await s.getSecret('t1', 'A')).sealed, sealed);
      assert.deepEqual((await s.getSecret('t2', 'A')).hosts, ['other']);
      await s.deleteSecret('t1', 'A');
      assert.equal(await s.getSecret('t1', 'A'), undefined);

      const entry = (i, at) => ({ sandboxId: 'sb1', tenantId: 't1', at, method: 'GET', scheme: 'https', host: 'h', port: 443, path: `/${i}`, status: 200, bytesOut: 0, bytesIn: i, secrets: [], decision: 'allowed', durationMs: 1 });
      for (let i = 0; i < 5; i++) await s.insertEgressLog(entry(i, `2026-01-0${i + 1}T00:00:00.000Z`));
      await s.insertEgressLog({ ...entry(9, '2026-01-09T00:00:00.000Z'), sandboxId: 'sb2' });
      const p1 = await s.listEgressLog('sb1', 3);
      assert.deepEqual(p1.items.map((e) => e.path), ['/4', '/3', '/2']);
      assert.equal(typeof p1.items[0].seq, 'number');
      const p2 = await s.listEgressLog('sb1', 3, p1.nextCursor);
      assert.deepEqual([p2.items.map((e) => e.path), p2.nextCursor], [['/1', '/0'], undefined]);
      assert.equal(await s.pruneEgressLog('2026-01-03T00:00:00.000Z'), 2);
      assert.equal((await s.listEgressLog('sb1', 10)).items.length, 3);
      await assert.rejects(s.listEgressLog('sb1', 3, '!!'), (e) => e.code === 'BAD_REQUEST');
      // The ingress log is a log of its own: same paging and pruning, nothing shared with egress.
      const hit = (i, at) => ({ sandboxId: 'sb1', tenantId: 't1', at, port: 8000, method: 'GET', path: `/in${i}`, status: 200, bytesIn: 1, bytesOut: i, durationMs: 1, client: '127.0.0.1', access: 'token', websocket: false });
      for (let i = 0; i < 3; i++) await s.insertIngressLog(hit(i, `2026-01-0${i + 1}T00:00:00.000Z`));
      const i1 = await s.listIngressLog('sb1', 2);
      assert.deepEqual([i1.items.map((e) => e.path), (await s.listIngressLog('sb1', 2, i1.nextCursor)).items.map((e) => e.path)], [['/in2', '/in1'], ['/in0']]);
      assert.equal((await s.listEgressLog('sb1', 10)).items.length, 3, 'egress untouched');
      assert.equal(await s.pruneIngressLog('2026-01-02T00:00:00.000Z'), 1);
      assert.deepEqual((await s.listIngressLog('sb1', 10)).items.map((e) => e.path), ['/in2', '/in1']);

      const first = await s.putTenantCaIfAbsent({ tenantId: 't1', certPem: 'one', sealedKey: sealed, createdAt: 'x' });
      const second = await s.putTenantCaIfAbsent({ tenantId: 't1', certPem: 'two', sealedKey: sealed, createdAt: 'y' });
      assert.deepEqual([first.certPem, second.certPem], ['one', 'one'], 'the first CA stays');
      assert.deepEqual((await s.getTenantCa('t1')).sealedKey, sealed);

      for (const [o, t, k] of [['a', 't1', 'k1'], ['b', 't1', 'k1'], ['c', 't1', 'k2'], ['d', 't2', 'k1']]) await s.putDataKey({ objectKey: o, tenantId: t, keyId: k, wrapped: sealed });
      assert.deepEqual([await s.countDataKeys('t1', 'k1'), await s.countDataKeys('t1', 'k2'), await s.countDataKeys('t1', 'k3')], [2, 1, 0]);
      await s.putDataKey({ objectKey: 'a', tenantId: 't1', keyId: 'k2', wrapped: Buffer.from([9]) });
      assert.deepEqual((await s.listDataKeys('t1', 10, 'k2')).map((d) => d.objectKey), ['b']);
      assert.deepEqual((await s.getDataKey('a')).wrapped, Buffer.from([9]));
      await s.deleteDataKey('a');
      assert.equal(await s.getDataKey('a'), undefined);
      await s.close();
    });

    it('snapshots, events, exposures, templates and tenant keys keep their order and replace in place', async () => {
      const s = await h.open('misc');
      for (const [id, at] of [['sn2', '2026-01-02T00:00:00.000Z'], ['sn1', '2026-01-01T00:00:00.000Z'], ['sn3', '2026-01-02T00:00:00.000Z']]) await s.insertSnapshot({ id, sandboxId: 'sb', createdAt: at, trigger: 'manual' });
      assert.deepEqual((await s.listSnapshots('sb')).map((x) => x.id), ['sn1', 'sn2', 'sn3']);
      await s.insertSnapshot({ id: 'sn9', sandboxId: 'other', createdAt: '2026-01-03T00:00:00.000Z', trigger: 'manual' });
      assert.deepEqual((await s.listAllSnapshots()).map((x) => x.id).sort(), ['sn1', 'sn2', 'sn3', 'sn9']);
      await s.deleteSnapshot('sn9');
      await s.deleteSnapshot('sn2');
      assert.equal(await s.getSnapshot('sn2'), undefined);
      for (let i = 0; i < 5; i++) await s.insertEvent({ sandboxId: 'sb', at: `t${i}`, type: 'e', message: `m${i}` });
      assert.deepEqual((await s.listEvents('sb', 3)).map((e) => e.message), ['m2', 'm3', 'm4']);
      await s.putExposure({ sandboxId: 'sb', port: 8080, public: false, tokenHash: 'a', createdAt: 'x' });
      await s.putExposure({ sandboxId: 'sb', port: 80, public: false, tokenHash: 'b', createdAt: 'x' });
      await s.putExposure({ sandboxId: 'sb', port: 8080, public: true, tokenHash: 'c', createdAt: 'x' });
      assert.deepEqual((await s.listExposures('sb')).map((e) => [e.port, e.public]), [[80, false], [8080, true]]);
      await s.deleteExposures('sb', 80);
      assert.deepEqual((await s.listExposures('sb')).map((e) => e.port), [8080]);
      await s.deleteExposures('sb');
      assert.equal(await s.getExposure('sb', 8080), undefined);
      await s.putTemplate({ name: 'b', tenantId: '', state: 'ready', source: { kind: 'builtin' } });
      await s.putTemplate({ name: 'a', tenantId: 't', state: 'building', source: { kind: 'builtin' } });
      await s.putTemplate({ name: 'a', tenantId: 't', state: 'ready', source: { kind: 'builtin' } });
      assert.deepEqual((await s.listTemplates()).map((t) => [t.name, t.state]), [['a', 'ready'], ['b', 'ready']]);
      await s.deleteTemplate('t', 'a');
      assert.equal(await s.getTemplate('t', 'a'), undefined);
      const key = (id, at) => ({ id, tenantId: 't', provider: 'local', ref: id, state: 'active', description: '', createdAt: at });
      await s.putTenantKey(key('k1', '2026-01-01'));
      await s.switchTenantKey(key('k2', '2026-01-02'), 'k1');
      assert.deepEqual((await s.listTenantKeys('t')).map((k) => [k.id, k.state]), [['k1', 'rotating'], ['k2', 'active']]);
      await assert.rejects(s.switchTenantKey(key('k2', '2026-01-03'), 'k1'), 'a key id is not inserted twice');
      assert.equal((await s.getTenantKey('k1')).state, 'rotating', 'a failed switch changes nothing');
      await s.close();
    });

    it('deployment settings: the first value stored stays', async () => {
      const s = await h.open('meta');
      assert.equal(await s.getMeta('deployment-id'), undefined);
      assert.deepEqual(await Promise.all([s.putMetaIfAbsent('deployment-id', 'a'), s.putMetaIfAbsent('deployment-id', 'b')]).then((r) => new Set(r).size), 1, 'racing writers agree');
      const first = await s.getMeta('deployment-id');
      assert.equal(await s.putMetaIfAbsent('deployment-id', 'c'), first);
      await s.close();
    });

    it('volumes: names unique per tenant (VOLUME_EXISTS), snapshots by volume, unknown ids refused', async () => {
      const s = await h.open('volumes');
      await s.insertVolume({ id: 'v1', tenantId: 't1', name: 'data', sizeMb: 64, createdAt: 'x', state: 'ready' });
      await s.insertVolume({ id: 'v2', tenantId: 't2', name: 'data', sizeMb: 64, createdAt: 'x', state: 'ready' });
      await assert.rejects(s.insertVolume({ id: 'v3', tenantId: 't1', name: 'data', sizeMb: 64, createdAt: 'x', state: 'creating' }), (e) => e.code === 'VOLUME_EXISTS');
      assert.deepEqual((await s.listVolumes()).map((v) => v.id), ['v1', 'v2']);
      assert.deepEqual((await s.listVolumes('t2')).map((v) => v.id), ['v2']);
      assert.equal((await s.getVolume('t1', 'data')).id, 'v1');
      await assert.rejects(s.updateVolume('v9', { state: 'ready' }), (e) => e.code === 'VOLUME_NOT_FOUND');
      await s.insertVolumeSnapshot({ id: 'vs2', volumeId: 'v1', createdAt: '2', state: 'creating' });
      await s.insertVolumeSnapshot({ id: 'vs1', volumeId: 'v1', createdAt: '1', state: 'ready' });
      await s.insertVolumeSnapshot({ id: 'vs3', volumeId: 'v2', createdAt: '0', state: 'ready' });
      assert.equal((await s.updateVolumeSnapshot('vs2', { state: 'ready' })).state, 'ready');
      await assert.rejects(s.updateVolumeSnapshot('vs9', { state: 'ready' }), (e) => e.code === 'SNAPSHOT_NOT_FOUND');
      assert.deepEqual((await s.listVolumeSnapshots('v1')).map((x) => x.id), ['vs1', 'vs2']);
      assert.deepEqual((await s.listVolumeSnapshots()).map((x) => x.id), ['vs3', 'vs1', 'vs2']);
      await s.deleteVolumeSnapshot('vs1');
      await s.deleteVolume('v2');
      assert.equal(await s.getVolumeById('v2'), undefined);
      assert.deepEqual((await s.listVolumeSnapshots('v1')).map((x) => x.id), ['vs2']);
      await s.close();
    });
  });
}
