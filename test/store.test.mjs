// The SQLite metadata store (real SQLite in WAL mode on disk).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { ApiKeys, Journal } from '../packages/core/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';

const dir = mkdtempSync('/tmp/sps-');
after(() => rmSync(dir, { recursive: true, force: true }));

function sandbox(id, tenantId, state = 'running', metadata = {}) {
  return { id, tenantId, template: 'minimal', driver: 'gvisor', state, cpu: 1, memoryMb: 256, timeoutMs: 0, env: {}, metadata, createdAt: new Date().toISOString() };
}

describe('SqliteStore', () => {
  it('runs in WAL mode and survives reopening', async () => {
    const file = `${dir}/a.db`;
    const s = SqliteStore.open(file);
    await s.insertSandbox(sandbox('sb1', 't'));
    await s.close();
    const raw = new Database(file);
    assert.equal(raw.pragma('journal_mode', { simple: true }), 'wal');
    raw.close();
    const s2 = SqliteStore.open(file);
    assert.equal((await s2.getSandbox('sb1')).tenantId, 't');
    await s2.close();
  });

  it('updates fields, filters by tenant, state and labels, and pages newest first', async () => {
    const s = SqliteStore.open(`${dir}/b.db`);
    for (let i = 0; i < 5; i++) await s.insertSandbox(sandbox(`sb${i}`, 't1', 'running', { n: String(i % 2) }));
    await s.insertSandbox(sandbox('other', 't2'));
    const u = await s.updateSandbox('sb0', { state: 'killed', endReason: 'killed' });
    assert.equal(u.state, 'killed');
    assert.equal((await s.getSandbox('sb0')).endReason, 'killed');
    const p1 = await s.listSandboxes({ tenantId: 't1', limit: 2 });
    assert.deepEqual(p1.items.map((x) => x.id), ['sb4', 'sb3']);
    const p2 = await s.listSandboxes({ tenantId: 't1', limit: 2, cursor: p1.nextCursor });
    assert.deepEqual(p2.items.map((x) => x.id), ['sb2', 'sb1']);
    const p3 = await s.listSandboxes({ tenantId: 't1', limit: 2, cursor: p2.nextCursor });
    assert.deepEqual(p3.items.map((x) => x.id), ['sb0']);
    assert.equal(p3.nextCursor, undefined);
    const labelled = await s.listSandboxes({ tenantId: 't1', limit: 10, metadata: { n: '0' }, states: ['running'] });
    assert.deepEqual(labelled.items.map((x) => x.id), ['sb4', 'sb2']);
    assert.deepEqual((await s.sandboxesInStates(['running'])).map((x) => x.id).sort(), ['other', 'sb1', 'sb2', 'sb3', 'sb4']);
    await assert.rejects(s.listSandboxes({ tenantId: 't1', limit: 2, cursor: '!!' }), (e) => e.code === 'BAD_REQUEST');
    await s.close();
  });

  it('keeps lifecycle intents across reopening until they are done', async () => {
    const file = `${dir}/intents.db`;
    const s = SqliteStore.open(file);
    const journal = new Journal(s);
    const a = await journal.begin('sb1', 'snapshot', { step: 'checkpoint', snapshotId: 'sn1', imageDir: '/w/sn1', trigger: 'manual', keepRunning: true });
    const b = await journal.begin('sb2', 'wake', { step: 'restore', snapshotId: 'sn2' });
    await journal.step(a, 'checkpointed');
    await s.close();
    const s2 = SqliteStore.open(file);
    const left = await new Journal(s2).list();
    assert.deepEqual(left.map((i) => [i.sandboxId, i.op, i.step, i.snapshotId]), [['sb1', 'snapshot', 'checkpointed', 'sn1'], ['sb2', 'wake', 'restore', 'sn2']]);
    await new Journal(s2).done(left[0]);
    assert.deepEqual((await s2.listIntents()).map((i) => i.id), [b.id]);
    await s2.close();
  });

  it('stores only hashes of API keys; revoked keys no longer verify', async () => {
    const s = SqliteStore.open(`${dir}/c.db`);
    const keys = new ApiKeys(s);
    const { key, record } = await keys.create({ tenantId: 'acme', name: 'k' });
    const raw = new Database(`${dir}/c.db`);
    const row = raw.prepare('SELECT * FROM api_keys').get();
    raw.close();
    assert.notEqual(row.hash, key);
    assert.ok(!JSON.stringify(row).includes(key));
    assert.equal((await keys.verify(key)).tenantId, 'acme');
    await keys.revoke({ tenantId: 'acme', keyId: record.id, admin: false }, record.id);
    await assert.rejects(keys.verify(key), (e) => e.code === 'UNAUTHENTICATED');
    await assert.rejects(keys.create({ tenantId: 'Bad Tenant!' }), (e) => e.code === 'BAD_REQUEST');
    await s.close();
  });

  it('secrets (sealed bytes kept as they are), egress log pages and pruning, one CA per tenant, data key counts', async () => {
    const s = SqliteStore.open(`${dir}/d.db`);
    const sealed = Buffer.from([0, 1, 2, 255]);
    await s.putSecret({ tenantId: 't1', name: 'B', hosts: ['b.example'], createdAt: 'x', updatedAt: 'x', sealed });
    await s.putSecret({ tenantId: 't1', name: 'A', hosts: ['a.example'], createdAt: 'x', updatedAt: 'x', sealed });
    await s.putSecret({ tenantId: 't2', name: 'A', hosts: ['other'], createdAt: 'x', updatedAt: 'x', sealed });
    assert.deepEqual((await s.listSecrets('t1')).map((x) => x.name), ['A', 'B']);
    assert.deepEqual((await s.getSecret('t1', 'A')).sealed, sealed);
    assert.deepEqual((await s.getSecret('t2', 'A')).hosts, ['other']);
    await s.deleteSecret('t1', 'A');
    assert.equal(await s.getSecret('t1', 'A'), undefined);

    const entry = (i, at) => ({ sandboxId: 'sb1', tenantId: 't1', at, method: 'GET', scheme: 'https', host: 'h', port: 443, path: `/${i}`, status: 200, bytesOut: 0, bytesIn: i, secrets: [], decision: 'allowed', durationMs: 1 });
    for (let i = 0; i < 5; i++) await s.insertEgressLog(entry(i, `2026-01-0${i + 1}T00:00:00.000Z`));
    await s.insertEgressLog({ ...entry(9, '2026-01-09T00:00:00.000Z'), sandboxId: 'sb2' });
    const p1 = await s.listEgressLog('sb1', 3);
    assert.deepEqual(p1.items.map((e) => e.path), ['/4', '/3', '/2']);
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

    for (const [o, t, k] of [['a', 't1', 'k1'], ['b', 't1', 'k1'], ['c', 't1', 'k2'], ['d', 't2', 'k1']]) await s.putDataKey({ objectKey: o, tenantId: t, keyId: k, wrapped: sealed });
    assert.deepEqual([await s.countDataKeys('t1', 'k1'), await s.countDataKeys('t1', 'k2'), await s.countDataKeys('t1', 'k3')], [2, 1, 0]);
    await s.close();
  });
});
