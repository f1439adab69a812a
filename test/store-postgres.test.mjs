// The PostgreSQL metadata store on a real, throwaway PostgreSQL (test/postgres.mjs): the shared
// store suite, then what is PostgreSQL's own — migrations under concurrent starts, one daemon
// per database, the server going away and coming back, and start-up errors that say why.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { PostgresStore, MIGRATIONS } from '../packages/store-postgres/dist/index.js';
import { startPostgres } from './postgres.mjs';
import { sandbox, storeSuite } from './store-suite.mjs';

const server = await startPostgres();
after(() => server.stop());

/** One database per tag, made on first use (so reopening a tag finds its rows). */
const databases = new Map();
function urlOf(tag) {
  if (!databases.has(tag)) databases.set(tag, server.freshDatabase());
  return databases.get(tag);
}

async function query(url, text, params = []) {
  const c = new pg.Client({ connectionString: url });
  await c.connect();
  try {
    return (await c.query(text, params)).rows;
  } finally {
    await c.end();
  }
}

storeSuite('postgres', {
  open: (tag) => PostgresStore.open(urlOf(tag)),
  rawApiKeys: (tag) => query(urlOf(tag), 'SELECT * FROM api_keys'),
});

describe('PostgresStore', () => {
  it('migrates once when several nodes start on an empty database at the same moment', async () => {
    const url = server.freshDatabase();
    const stores = await Promise.all(Array.from({ length: 4 }, () => PostgresStore.open(url, { exclusive: false })));
    assert.deepEqual(await query(url, 'SELECT version FROM space_schema'), [{ version: MIGRATIONS.length }]);
    await stores[0].insertSandbox(sandbox('a', 't'));
    assert.equal((await stores[3].getSandbox('a')).id, 'a', 'every node sees the same rows');
    await Promise.all(stores.map((s) => s.close()));
  });

  it('refuses a database newer than this SPACE, changing nothing', async () => {
    const url = server.freshDatabase();
    await (await PostgresStore.open(url)).close();
    await query(url, 'UPDATE space_schema SET version = $1', [MIGRATIONS.length + 1]);
    await assert.rejects(PostgresStore.open(url), (e) => e.code === 'CONFIG_INVALID' && /newer than this SPACE/.test(e.message));
    assert.deepEqual(await query(url, 'SELECT version FROM space_schema'), [{ version: MIGRATIONS.length + 1 }]);
  });

  it('one daemon per node name: a second as the same node is refused with DATABASE_IN_USE until the first closes; other nodes share the database', async () => {
    const url = server.freshDatabase();
    const first = await PostgresStore.open(url, { node: 'n1' });
    await assert.rejects(PostgresStore.open(url, { node: 'n1' }), (e) => e.code === 'DATABASE_IN_USE' && /node "n1"/.test(e.message) && /--node-name/.test(e.message));
    const other = await PostgresStore.open(url, { node: 'n2' });
    await first.close();
    const again = await PostgresStore.open(url, { node: 'n1' });
    await Promise.all([again.close(), other.close()]);
  });

  it('start-up errors say which and why: unreachable, wrong password, no such database', async () => {
    const closed = `postgres://space:pw@127.0.0.1:${server.port + 1 === 65536 ? 1 : server.port + 1}/space`;
    await assert.rejects(PostgresStore.open(closed, { connectTimeoutMs: 2000 }), (e) => e.code === 'METADATA_UNAVAILABLE' && /Cannot reach PostgreSQL at 127\.0\.0\.1:\d+\/space/.test(e.message));
    const wrong = server.url.replace(':pw@', ':nope@');
    await assert.rejects(PostgresStore.open(wrong), (e) => e.code === 'METADATA_UNAVAILABLE' && /refused the credentials/.test(e.message) && !e.message.includes('nope'));
    await assert.rejects(PostgresStore.open(server.url.replace(/\/space$/, '/absent')), (e) => e.code === 'METADATA_UNAVAILABLE' && /does not exist/.test(e.message));
  });

  describe('the server goes away and comes back', () => {
    let store;
    let url;
    before(async () => {
      url = server.freshDatabase();
      store = await PostgresStore.open(url);
      await store.insertSandbox(sandbox('keep', 't'));
    });
    after(() => store.close());

    it('answers METADATA_UNAVAILABLE while it is down, works again when it is back, and retakes its lock', async () => {
      server.halt();
      try {
        await assert.rejects(store.getSandbox('keep'), (e) => e.code === 'METADATA_UNAVAILABLE' && /Cannot reach PostgreSQL/.test(e.message));
        await assert.rejects(store.insertSandbox(sandbox('lost', 't')), (e) => e.code === 'METADATA_UNAVAILABLE');
      } finally {
        server.resume();
      }
      // The pool reconnects on the next query; the lock's own connection is retaken in the background.
      assert.equal((await store.getSandbox('keep')).id, 'keep');
      assert.equal(await store.getSandbox('lost'), undefined, 'a write that failed left nothing');
      await store.whenLocked();
      await assert.rejects(PostgresStore.open(url), (e) => e.code === 'DATABASE_IN_USE', 'the lock is held again after the restart');
    });
  });
});
