// The SQLite metadata store (real SQLite in WAL mode on disk): the shared store suite, and what
// is SQLite's own.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import Database from 'better-sqlite3';
import { MIGRATIONS, SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { sandbox, storeSuite } from './store-suite.mjs';

const dir = mkdtempSync('/tmp/sps-');
after(() => rmSync(dir, { recursive: true, force: true }));

storeSuite('sqlite', {
  open: async (tag) => SqliteStore.open(`${dir}/${tag}.db`),
  rawApiKeys: async (tag) => {
    const raw = new Database(`${dir}/${tag}.db`);
    try {
      return raw.prepare('SELECT * FROM api_keys').all();
    } finally {
      raw.close();
    }
  },
});

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

  it('an upgrade fills the owning-node column from the records it finds (a cluster node\'s own queries see old sandboxes)', async () => {
    const file = `${dir}/upgrade.db`;
    const raw = new Database(file);
    for (const m of MIGRATIONS.slice(0, -1)) raw.exec(m);
    raw.pragma(`user_version = ${MIGRATIONS.length - 1}`);
    const old = { ...sandbox('old1', 't'), node: 'n1' };
    raw.prepare('INSERT INTO sandboxes (id, tenant_id, state, created_at, doc) VALUES (?, ?, ?, ?, ?)').run(old.id, old.tenantId, old.state, old.createdAt, JSON.stringify(old));
    raw.close();
    const s = SqliteStore.open(file);
    assert.deepEqual((await s.sandboxesInStates(['running'], { node: 'n1' })).map((x) => x.id), ['old1']);
    assert.deepEqual(await s.sandboxLoadByNode(['running']), { n1: { sandboxes: 1, memoryMb: 256 } });
    await s.close();
  });
});
