// The snapshot store (DedupBlobStore over EncryptedBlobStore over a local directory), on its
// own: deduplication between objects, collection of what nothing references without ever
// losing what a write under way needs, and objects of the first (one object per chunk) format.
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { DedupBlobStore, EncryptedBlobStore, KeyService, LocalKeyProvider } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';

const silent = { info() {}, warn() {}, error() {}, debug() {} };
const readAll = async (r) => {
  const parts = [];
  for await (const c of r) parts.push(c);
  return Buffer.concat(parts);
};

describe('snapshot store', () => {
  let dir, store, keys, encrypted, blobs;
  const packs = (tenant) => {
    const d = path.join(dir, 'blobs', 'chunks', tenant);
    try {
      return readdirSync(d).map((f) => path.join(d, f));
    } catch {
      return [];
    }
  };
  const packBytes = (tenant) => packs(tenant).reduce((n, f) => n + statSync(f).size, 0);

  before(async () => {
    dir = mkdtempSync('/tmp/spt-store-');
    mkdirSync(path.join(dir, 'keys'));
    writeFileSync(path.join(dir, 'keys', 'node.key'), randomBytes(32));
    store = SqliteStore.open(path.join(dir, 'space.db'));
    keys = new KeyService({ store, providers: [new LocalKeyProvider(path.join(dir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger: silent });
    await keys.start();
    encrypted = new EncryptedBlobStore(new LocalBlobStore(path.join(dir, 'blobs')), keys, store);
    blobs = new DedupBlobStore(encrypted, keys);
  });
  after(async () => {
    await store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('an object that differs from a stored one in a few bytes stores only the chunks around them', async () => {
    const a = randomBytes(2 << 20);
    await blobs.put('snapshots/t1/a', Readable.from([a]));
    const first = packBytes('t1');
    const b = Buffer.from(a);
    b.write('a few changed bytes', 1 << 20);
    await blobs.put('snapshots/t1/b', Readable.from([b.subarray(0, 700_000), b.subarray(700_000)]));
    const added = packBytes('t1') - first;
    assert.ok(first >= a.length, `random bytes do not compress: ${first}`);
    assert.ok(added < 64 * 1024, `the second object added ${added} bytes`);
    assert.ok((await readAll(await blobs.get('snapshots/t1/a'))).equals(a));
    assert.ok((await readAll(await blobs.get('snapshots/t1/b'))).equals(b));
    // Another tenant stores its own copy: chunks are never shared across tenants.
    await blobs.put('snapshots/t2/a', Readable.from([a]));
    assert.ok(packBytes('t2') >= a.length);
  });

  it('a collection asked for while a write is under way keeps what that write stores', async () => {
    let release;
    const gate = new Promise((r) => (release = r));
    const data = randomBytes(12 << 20);
    let waiting;
    const atGate = new Promise((r) => (waiting = r));
    const source = Readable.from((async function* () {
      yield data.subarray(0, 10 << 20); // a full segment: its packs are stored before the gate
      waiting();
      await gate;
      yield data.subarray(10 << 20);
    })());
    const writing = blobs.put('snapshots/t3/new', source);
    await atGate;
    while (packs('t3').length === 0) await new Promise((r) => setTimeout(r, 10)); // the first segment's packs get stored
    // The caller's list of live objects does not have the new one yet (it records it after put).
    const collecting = blobs.gc(async () => ['snapshots/t1/a', 'snapshots/t1/b', 'snapshots/t2/a']);
    release();
    await writing;
    assert.equal(await collecting, 0, 'nothing was deleted');
    assert.ok((await readAll(await blobs.get('snapshots/t3/new'))).equals(data));
    // Once the object is deleted, its packs go.
    const n = packs('t3').length;
    await blobs.delete('snapshots/t3/new');
    assert.equal(await blobs.gc(async () => ['snapshots/t1/a', 'snapshots/t1/b', 'snapshots/t2/a']), n);
    assert.deepEqual(packs('t3'), []);
    assert.ok((await readAll(await blobs.get('snapshots/t1/b'))).length > 0, 'the others still read');
  });

  it('a long history of small changes does not make reads touch a pack per earlier version', async () => {
    // Reads through a wrapper that counts the packs fetched.
    let fetched = 0;
    const counting = { ...encrypted, put: (k, d) => encrypted.put(k, d), get: (k) => (k.startsWith('chunks/') && fetched++, encrypted.get(k)), stat: (k) => encrypted.stat(k), delete: (k) => encrypted.delete(k), list: (p) => encrypted.list(p), assertWritable: (k) => encrypted.assertWritable(k) };
    const store5 = new DedupBlobStore(counting, keys);
    let cur = randomBytes(2 << 20);
    for (let v = 1; v <= 12; v++) {
      cur = Buffer.from(cur);
      for (let j = 0; j < 20; j++) randomBytes(64).copy(cur, ((v * 7919 + j * 104729) * 13) % (cur.length - 64));
      await store5.put(`snapshots/t5/v${v}`, Readable.from([cur]));
    }
    fetched = 0;
    assert.ok((await readAll(await store5.get('snapshots/t5/v12'))).equals(cur));
    // 4 packs of earlier versions at most for its one segment, plus its own.
    assert.ok(fetched <= 5, `reading the 12th version fetched ${fetched} packs`);
    for (let v = 1; v <= 12; v++) await store5.delete(`snapshots/t5/v${v}`);
    assert.ok((await blobs.gc(async () => ['snapshots/t1/a', 'snapshots/t1/b', 'snapshots/t2/a'])) > 0);
    assert.deepEqual(packs('t5'), []);
  });

  it('reads and collects objects of the first format (one object per chunk)', async () => {
    const secret = await keys.daemonSecret('chunk-id/t4');
    const parts = [randomBytes(30_000), randomBytes(50_000)];
    const ids = parts.map((p) => createHmac('sha256', secret).update(p).digest('hex').slice(0, 40));
    for (const [i, p] of parts.entries()) await encrypted.put(`chunks/t4/${ids[i]}`, Readable.from([p]));
    const whole = Buffer.concat(parts);
    const manifest = { v: 1, size: whole.length, sha256: (await import('node:crypto')).createHash('sha256').update(whole).digest('hex'), chunks: ids.map((id, i) => [id, parts[i].length]) };
    await encrypted.put('snapshots/t4/old', Readable.from([Buffer.from(JSON.stringify(manifest))]));
    assert.ok((await readAll(await blobs.get('snapshots/t4/old'))).equals(whole));
    const live = ['snapshots/t1/a', 'snapshots/t1/b', 'snapshots/t2/a', 'snapshots/t4/old'];
    assert.equal(await blobs.gc(async () => live), 0);
    assert.equal(packs('t4').length, 2, 'referenced first-format chunks stay');
    // A chunk of it changed: refused, naming the object.
    await encrypted.put(`chunks/t4/${ids[1]}`, Readable.from([randomBytes(50_000)]));
    await assert.rejects(readAll(await blobs.get('snapshots/t4/old')), (e) => e.code === 'SNAPSHOT_CORRUPT' && /snapshots\/t4\/old/.test(e.message));
    await blobs.delete('snapshots/t4/old');
    assert.equal(await blobs.gc(async () => live.slice(0, 3)), 2);
  });
});
