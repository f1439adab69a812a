// The PostgreSQL metadata store on a real, throwaway PostgreSQL (test/postgres.mjs): the shared
// store suite, then what is PostgreSQL's own — migrations under concurrent starts, one daemon
// per database, the server going away and coming back, start-up errors that say why, and the
// lock that keeps the nodes' blob writes and collections apart.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import pg from 'pg';
import { DedupBlobStore, KeyService, LocalKeyProvider } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
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

describe('the blob collection lock: nodes sharing one blob store', () => {
  const silent = { info() {}, warn() {}, error() {}, debug() {}, child() { return silent; } };
  const readAll = async (r) => Buffer.concat(await r.toArray());
  /** Rows of advisory locks some session waits for. */
  const waiting = async (url) => (await query(url, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")).length;

  it('writes share it, a collection waits for them and holds off new ones; it moves the generation before deleting', async () => {
    const url = server.freshDatabase();
    const [n1, n2] = await Promise.all([PostgresStore.open(url, { node: 'n1' }), PostgresStore.open(url, { node: 'n2' })]);
    const [a, b] = [n1.blobCollectionLock(), n2.blobCollectionLock()];
    const log = [];
    let open;
    const gate = new Promise((r) => (open = r));
    let started;
    const first = new Promise((r) => (started = r));
    const w1 = a.writing(async (g) => {
      log.push(`w1 in generation ${g}`);
      started();
      await gate;
      log.push('w1 done');
    });
    await first;
    // A second writer on another node shares the lock with the first.
    await b.writing(async () => log.push('w0 beside w1'));
    const collected = b.collecting(async (deleting) => {
      log.push('collecting');
      await deleting();
      await deleting();
      return 7;
    });
    while ((await waiting(url)) === 0) await new Promise((r) => setImmediate(r));
    // The collection waits in the server: a writer arriving now waits behind it.
    const w2 = a.writing(async (g) => log.push(`w2 in generation ${g}`));
    open();
    assert.deepEqual(await collected, { value: 7, generation: '1' });
    await Promise.all([w1, w2]);
    assert.deepEqual(log, ['w1 in generation 0', 'w0 beside w1', 'w1 done', 'collecting', 'w2 in generation 1']);
    // Another node collected just now: a scheduled collection is left out.
    let ran = false;
    assert.equal(await a.collecting(async () => (ran = true), { minIntervalMs: 60_000 }), undefined);
    assert.equal(ran, false);
    // A collection that deleted nothing leaves the generation.
    assert.deepEqual(await a.collecting(async () => 0), { value: 0, generation: '1' });
    // At most four writes of a node hold a connection of its pool (they read through it too).
    let inside = 0;
    let most = 0;
    const release = [];
    const six = Array.from({ length: 6 }, () =>
      a.writing(async () => {
        most = Math.max(most, ++inside);
        await new Promise((r) => release.push(r));
        inside--;
      }),
    );
    const waitFor = async (n) => {
      while (release.length < n) await new Promise((r) => setTimeout(r, 5));
    };
    await waitFor(4);
    const held = async () => (await query(url, "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = 2 AND granted"))[0].n;
    assert.equal(await held(), 4, 'four shared holds, the other two writes wait in the process');
    for (const r of release.splice(0)) r();
    await waitFor(2);
    for (const r of release.splice(0)) r();
    await Promise.all(six);
    assert.equal(most, 4);
    await Promise.all([n1.close(), n2.close()]);
  });

  it('a node that knew a pack another node collected stores its chunks again, and its object reads back whole', async () => {
    const url = server.freshDatabase();
    const dir = mkdtempSync('/tmp/spt-bloblock-');
    mkdirSync(path.join(dir, 'keys'));
    writeFileSync(path.join(dir, 'keys', 'node.key'), randomBytes(32));
    const [n1, n2] = await Promise.all([PostgresStore.open(url, { node: 'n1' }), PostgresStore.open(url, { node: 'n2' })]);
    const keys = new KeyService({ store: n1, providers: [new LocalKeyProvider(path.join(dir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger: silent });
    await keys.start();
    try {
      const inner = new LocalBlobStore(path.join(dir, 'blobs'));
      const a = new DedupBlobStore(inner, keys, undefined, n1.blobCollectionLock());
      const b = new DedupBlobStore(inner, keys, undefined, n2.blobCollectionLock());
      const data = randomBytes(1 << 20);
      // Node a stores an object (and learns its packs), which is then deleted; node b collects.
      await a.put('snapshots/t1/one', Readable.from([data]));
      await a.delete('snapshots/t1/one');
      assert.ok((await b.gc([])) >= 1, 'node b deleted the unreferenced packs');
      // Node a stores the same bytes again: with the packs it knew gone, it must not name them.
      await a.put('snapshots/t1/two', Readable.from([data]));
      assert.ok((await readAll(await a.get('snapshots/t1/two'))).equals(data));
      // Node b's collection keeps what node a's object names, and node a's object written a
      // moment ago whose record is not in yet (b's database does not name it).
      const fresh = randomBytes(300_000);
      await a.put('snapshots/t1/fresh', Readable.from([fresh]));
      await b.gc(['snapshots/t1/two']);
      assert.ok((await readAll(await b.get('snapshots/t1/two'))).equals(data));
      assert.ok((await readAll(await b.get('snapshots/t1/fresh'))).equals(fresh));
    } finally {
      await Promise.all([n1.close(), n2.close()]);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
