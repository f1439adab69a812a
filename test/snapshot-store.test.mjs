// The snapshot store (DedupBlobStore over EncryptedBlobStore over a local directory), on its
// own: deduplication between objects, collection of what nothing references without ever
// losing what a write under way needs, and objects of the first (one object per chunk) format.
import assert from 'node:assert/strict';
import { createHmac, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { after, before, describe, it } from 'node:test';
import { COARSE_CHUNKS, DedupBlobStore, EncryptedBlobStore, FINE_CHUNKS, KeyService, LocalKeyProvider, MAX_ATTACHMENT_PARTS, PACK_TARGET, cutPoint, deleteImage, getImage, putImage } from '../packages/core/dist/index.js';
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

  it("an image's attachment (a disk's stream) is cut in 64 KiB chunks, an image in 4 KiB ones; an edit of either stores only what is around it", async () => {
    const sizes = (shape) => {
      const out = [];
      for (let buf = randomBytes(8 << 20), n = cutPoint(buf, true, shape); buf.length; buf = buf.subarray(n), n = cutPoint(buf, true, shape)) out.push(n);
      return out;
    };
    const mean = (a) => a.reduce((x, y) => x + y, 0) / a.length;
    const fine = sizes(FINE_CHUNKS);
    const coarse = sizes(COARSE_CHUNKS);
    assert.ok(mean(fine) > 3000 && mean(fine) < 6000, `image chunks average ${mean(fine)} bytes`);
    assert.ok(mean(coarse) > 48 << 10 && mean(coarse) < 96 << 10, `attachment chunks average ${mean(coarse)} bytes`);
    assert.ok(Math.min(...coarse.slice(0, -1)) >= 16 << 10 && Math.max(...coarse) <= 256 << 10);
    // The store picks the shape by key: `<object>.<suffix>` is an attachment.
    const a = randomBytes(4 << 20);
    await blobs.put('snapshots/t9/sn1.disk', Readable.from([a]));
    const first = packBytes('t9');
    const b = Buffer.from(a);
    b.write('a few changed bytes', 2 << 20);
    await blobs.put('snapshots/t9/sn2.disk', Readable.from([b]));
    const added = packBytes('t9') - first;
    assert.ok(added >= 16 << 10 && added < 1 << 20, `the edited attachment added ${added} bytes: one coarse chunk or a few`);
    assert.ok((await readAll(await blobs.get('snapshots/t9/sn2.disk'))).equals(b));
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

  it("an image's attachment is stored beside it, read back only when a restore needs it, deleted with it, and collected once its object is gone", async () => {
    // What a disk's stream is to a snapshot (driver-gvisor's DiskStream): bytes a mark file stands for.
    const img = mkdtempSync(path.join(dir, 'img-'));
    writeFileSync(path.join(img, 'state.bin'), randomBytes(10_000));
    writeFileSync(path.join(img, 'mark.json'), '{"copy":"c1"}');
    const attached = randomBytes(300_000);
    let needed = false;
    const applied = [];
    const att = {
      name: 'test-attachment-v1',
      suffix: 'att',
      open: async (src) => (path.basename(src) === 'mark.json' ? Readable.from([attached]) : undefined),
      needed: async () => needed,
      apply: async (src, bytes) => void applied.push([readFileSync(src, 'utf8'), await readAll(bytes)]),
    };
    const readers = { codecNamed: () => undefined, attachmentNamed: (n) => (n === att.name ? att : undefined) };
    const meta = (id) => ({ id, sandboxId: 'sb1', tenantId: 't5', template: 'x', driver: 'fake', driverVersion: '1', createdAt: new Date().toISOString() });
    const put = await putImage(blobs, 'snapshots/t5/sn1', img, meta('sn1'), { codecs: [], attachments: [att] });
    assert.deepEqual(put.meta.attachments, [{ file: 'mark.json', name: 'test-attachment-v1', key: 'att', size: attached.length }]);
    assert.ok(put.sizeBytes > attached.length + 10_000, 'the size counts the object and its attachment');
    assert.ok((await readAll(await blobs.get('snapshots/t5/sn1.att'))).equals(attached), 'stored apart, under the object key and its suffix');
    const unpack = async (readWith = readers) => {
      const out = mkdtempSync(path.join(dir, 'out-'));
      await getImage(blobs, 'snapshots/t5/sn1', 'sn1', out, 2 ** 30, readWith);
      return out;
    };
    const out = await unpack();
    assert.equal(readFileSync(path.join(out, 'mark.json'), 'utf8'), '{"copy":"c1"}', 'the mark is stored as written');
    assert.deepEqual(applied, [], 'what it stands for is here: the attachment is not read');
    needed = true;
    await unpack();
    assert.equal(applied.length, 1);
    assert.equal(applied[0][0], '{"copy":"c1"}');
    assert.ok(applied[0][1].equals(attached), 'a restore that needs it gets the bytes as stored');
    await assert.rejects(unpack({ codecNamed: () => undefined, attachmentNamed: () => undefined }), (e) => e.code === 'DRIVER_UNAVAILABLE' && /test-attachment-v1/.test(e.message));
    // Bytes that fail half-way (btrfs send exiting badly) fail the snapshot and leave nothing.
    const failing = { ...att, open: async (src) => (path.basename(src) === 'mark.json' ? Readable.from((async function* () { yield randomBytes(5000); throw new Error('btrfs send failed'); })()) : undefined) };
    await assert.rejects(putImage(blobs, 'snapshots/t5/sn2', img, meta('sn2'), { codecs: [], attachments: [failing] }), /btrfs send failed/);
    assert.equal(await blobs.stat('snapshots/t5/sn2'), undefined);
    assert.equal(await blobs.stat('snapshots/t5/sn2.att'), undefined);
    // Collection, by a daemon that did not write them (after a restart), of objects older than a
    // minute: the attachment of a named object stays; one whose object is gone (a crash between
    // the two writes) goes.
    await blobs.put('snapshots/t5/sn3.att', Readable.from([randomBytes(50_000)]));
    const old = new Date(Date.now() - 10 * 60_000);
    for (const k of ['sn1', 'sn1.att', 'sn3.att']) utimesSync(path.join(dir, 'blobs', 'snapshots', 't5', k), old, old);
    const restarted = new DedupBlobStore(encrypted, keys);
    await restarted.gc(async () => ['snapshots/t1/a', 'snapshots/t1/b', 'snapshots/t2/a', 'snapshots/t5/sn1']);
    assert.equal(await blobs.stat('snapshots/t5/sn3.att'), undefined, 'an attachment without its object is collected');
    assert.ok((await readAll(await restarted.get('snapshots/t5/sn1.att'))).equals(attached), "a named object's attachment and its packs stay");
    await deleteImage(blobs, 'snapshots/t5/sn1', ['att', 'other']);
    assert.equal(await blobs.stat('snapshots/t5/sn1'), undefined);
    assert.equal(await blobs.stat('snapshots/t5/sn1.att'), undefined, 'deleted with its object');
  });

  it('an attachment is stored as the earlier image\'s parts and the change since: no pass over those bytes, restored in order, each stands alone, and a chain ends', async () => {
    const img = mkdtempSync(path.join(dir, 'img-'));
    writeFileSync(path.join(img, 'state.bin'), randomBytes(10_000));
    writeFileSync(path.join(img, 'mark.json'), '{"copy":"c3"}');
    const whole = randomBytes(300_000);
    let opened = 0;
    let changeSize = 1000;
    let failChange = false;
    const changes = [];
    const applied = [];
    const att = {
      name: 'test-attachment-v1',
      suffix: 'att',
      open: async (src) => (path.basename(src) === 'mark.json' ? (opened++, Readable.from([whole])) : undefined),
      openSince: async (src, earlier) => {
        if (path.basename(src) !== 'mark.json' || earlier === 'gone') return undefined;
        if (failChange) return Readable.from((async function* () { yield randomBytes(500); throw new Error('btrfs send failed'); })());
        changes.push(randomBytes(changeSize++));
        return Readable.from([changes.at(-1)]);
      },
      needed: async () => true,
      apply: async (_src, bytes) => void applied.push(await readAll(bytes)),
    };
    const readers = { codecNamed: () => undefined, attachmentNamed: (n) => (n === att.name ? att : undefined) };
    const forms = { codecs: [], attachments: [att] };
    const meta = (id) => ({ id, sandboxId: 'sb1', tenantId: 't9', template: 'x', driver: 'fake', driverVersion: '1', createdAt: new Date().toISOString() });
    const key = (n) => `snapshots/t9/sn${n}`;
    // Each image's own bytes differ (as a runtime's do), so that no image shares a chunk with
    // another and what a collection may take is known.
    const put = (n, earlier) => {
      writeFileSync(path.join(img, 'state.bin'), randomBytes(10_000));
      return putImage(blobs, key(n), img, meta(`sn${n}`), forms, earlier ? { earlier: { id: `sn${earlier}`, key: key(earlier) } } : {});
    };
    const keys = (p) => p.meta.attachments.map((a) => a.key);
    const restore = async (n) => {
      applied.length = 0;
      await getImage(blobs, key(n), `sn${n}`, mkdtempSync(path.join(dir, 'out-')), 2 ** 30, readers);
      assert.equal(applied.length, 1, 'the parts go to the attachment as one stream');
      return applied[0];
    };
    const first = await put(1);
    assert.deepEqual([keys(first), first.since], [['att'], []]);
    const packsBefore = packs('t9').length;
    const second = await put(2, 1);
    assert.deepEqual([opened, second.since], [1, [{ suffix: 'att', size: changes[0].length }]], 'the change, not the whole again');
    assert.deepEqual(second.meta.attachments.map((a) => [a.key, a.size]), [['att', whole.length], ['att-p2', changes[0].length]]);
    assert.equal(packs('t9').length, packsBefore + 2, 'two new packs: the image and the change; the whole is a copy');
    assert.ok(second.sizeBytes > whole.length + changes[0].length + 10_000, 'the snapshot counts every part');
    const third = await put(3, 2);
    assert.deepEqual(keys(third), ['att', 'att-p2', 'att-p3']);
    assert.ok((await restore(3)).equals(Buffer.concat([whole, changes[0], changes[1]])), 'the whole, then each change, in order');
    // The earlier images go, and a collection by a daemon that did not write them: the third stands alone.
    await deleteImage(blobs, key(1), ['att']);
    await deleteImage(blobs, key(2), ['att']);
    for (const k of ['sn2.att', 'sn2.att-p2']) assert.equal(await blobs.stat(`snapshots/t9/${k}`), undefined, `${k} went with its object`);
    const old = new Date(Date.now() - 10 * 60_000);
    for (const k of ['sn3', 'sn3.att', 'sn3.att-p2', 'sn3.att-p3']) utimesSync(path.join(dir, 'blobs', 'snapshots', 't9', k), old, old);
    const packsThen = packs('t9').length;
    await new DedupBlobStore(encrypted, keys).gc(async () => ['snapshots/t1/a', 'snapshots/t1/b', 'snapshots/t2/a', 'snapshots/t5/sn1', 'snapshots/t9/sn3']);
    assert.equal(packs('t9').length, packsThen - 2, "the earlier images' own packs went; the parts sn3 copied stayed");
    assert.ok((await restore(3)).equals(Buffer.concat([whole, changes[0], changes[1]])));
    // The earlier image is gone: the whole is stored anew; and so when the attachment cannot make the change.
    assert.deepEqual(keys(await put(4, 2)), ['att']);
    assert.equal(opened, 2);
    assert.deepEqual(keys(await put(5, 'gone')), ['att']);
    // A change that fails half-way (btrfs send exiting badly): the whole, and nothing of the change left.
    failChange = true;
    assert.deepEqual(keys(await put(50, 3)), ['att']);
    for (const k of ['sn50.att-p2', 'sn50.att-p3', 'sn50.att-p4']) assert.equal(await blobs.stat(`snapshots/t9/${k}`), undefined, k);
    failChange = false;
    // A chain ends at MAX_ATTACHMENT_PARTS parts: the next snapshot stores the whole again.
    let n = 5;
    for (; n < 4 + MAX_ATTACHMENT_PARTS; n++) assert.equal(keys(await put(n + 1, n)).length, n - 3);
    const longest = await restore(n);
    assert.equal(longest.length, whole.length + changes.slice(-(MAX_ATTACHMENT_PARTS - 1)).reduce((a, c) => a + c.length, 0));
    assert.deepEqual(keys(await put(n + 1, n)), ['att'], 'the whole again after the longest chain');
    // ...and once the changes add up to more than the whole.
    changeSize = whole.length / 2 + 1;
    assert.equal(keys(await put(n + 2, n + 1)).length, 2);
    assert.equal(keys(await put(n + 3, n + 2)).length, 3);
    assert.deepEqual(keys(await put(n + 4, n + 3)), ['att'], 'the changes stored since the whole passed it');
    // A part missing from the store: refused as corrupt.
    await blobs.delete(`${key(3)}.att-p2`);
    await assert.rejects(getImage(blobs, key(3), 'sn3', mkdtempSync(path.join(dir, 'out-')), 2 ** 30, readers), (e) => e.code === 'SNAPSHOT_CORRUPT');
    await assert.rejects(blobs.copy('snapshots/t9/sn3.att', 'snapshots/t7/sn3.att'), (e) => e.code === 'INTERNAL', 'copies stay within a tenant');
    await assert.rejects(blobs.copy('snapshots/t9/nope.att', 'snapshots/t9/sn99.att'), (e) => e.code === 'SNAPSHOT_NOT_FOUND');
    await blobs.gc(async () => []); // (the part deleted above: the next test counts what a collection takes)
  });
  it("a portable image (a cluster's) stores what its attachment is made against beside it, a copy after the first; a restore lacking it applies it first; it goes with its object", async () => {
    const img = mkdtempSync(path.join(dir, 'img-'));
    writeFileSync(path.join(img, 'state.bin'), randomBytes(10_000));
    writeFileSync(path.join(img, 'mark.json'), '{"copy":"c4"}');
    const template = randomBytes(200_000);
    let baseOpened = 0;
    let haveBase = true;
    const done = [];
    const att = {
      name: 'test-attachment-v1',
      suffix: 'att',
      open: async (src) => (path.basename(src) === 'mark.json' ? Readable.from([randomBytes(1000)]) : undefined),
      base: async (src) => (path.basename(src) === 'mark.json' ? { id: 'tpl-1', open: () => (baseOpened++, Readable.from([template])) } : undefined),
      needed: async () => true,
      needsBase: async () => !haveBase,
      applyBase: async (_src, bytes) => void done.push(['base', await readAll(bytes)]),
      apply: async (_src, bytes) => void done.push(['apply', (await readAll(bytes)).length]),
    };
    const readers = { codecNamed: () => undefined, attachmentNamed: (n) => (n === att.name ? att : undefined) };
    const meta = (id) => ({ id, sandboxId: 'sb1', tenantId: 't11', template: 'x', driver: 'fake', driverVersion: '1', createdAt: new Date().toISOString() });
    const forms = { codecs: [], attachments: [att] };
    await putImage(blobs, 'snapshots/t11/sn1', img, meta('sn1'), forms);
    assert.equal(await blobs.stat('snapshots/t11/sn1.att-base'), undefined, 'not portable: no base');
    await putImage(blobs, 'snapshots/t11/sn2', img, meta('sn2'), forms, { portable: true });
    await putImage(blobs, 'snapshots/t11/sn3', img, meta('sn3'), forms, { portable: true });
    assert.equal(baseOpened, 1, 'the second is a copy of the first: the template is not read again');
    for (const k of ['sn2', 'sn3']) assert.ok((await readAll(await blobs.get(`snapshots/t11/${k}.att-base`))).equals(template), k);
    // The image the store last copied it from deleted: the next stores it anew.
    await deleteImage(blobs, 'snapshots/t11/sn3', ['att']);
    assert.equal(await blobs.stat('snapshots/t11/sn3.att-base'), undefined, 'deleted with its object');
    await putImage(blobs, 'snapshots/t11/sn4', img, meta('sn4'), forms, { portable: true });
    assert.equal(baseOpened, 2, 'the last holder went: stored anew');
    // An image after an earlier one (its disk grew from the same template) copies the earlier's.
    await deleteImage(blobs, 'snapshots/t11/sn4', ['att']);
    await putImage(blobs, 'snapshots/t11/sn5', img, meta('sn5'), forms, { portable: true, earlier: { id: 'sn2', key: 'snapshots/t11/sn2' } });
    assert.equal(baseOpened, 2, "a copy of sn2's");
    assert.ok((await readAll(await blobs.get('snapshots/t11/sn5.att-base'))).equals(template));
    const restore = async (k) => {
      done.length = 0;
      await getImage(blobs, `snapshots/t11/${k}`, k, mkdtempSync(path.join(dir, 'out-')), 2 ** 30, readers);
      return done.map(([what, x]) => (what === 'base' ? [what, x.equals(template)] : [what, x]));
    };
    assert.deepEqual(await restore('sn2'), [['apply', 1000]], 'a node that has it: not read');
    haveBase = false;
    assert.deepEqual(await restore('sn2'), [['base', true], ['apply', 1000]], 'a node that lacks it: first');
    await assert.rejects(restore('sn1'), (e) => e.code === 'TEMPLATE_NOT_ON_NODE' && /another node/.test(e.message), 'one stored without it cannot restore there');
    for (const k of ['sn1', 'sn2', 'sn5']) await deleteImage(blobs, `snapshots/t11/${k}`, ['att']);
    await blobs.gc(async () => []); // (the next test counts what a collection takes)
  });

  it('an object stored whole is cut into pack-sized pieces without looking for chunks to share, reads back, and is collected like any', async () => {
    const data = randomBytes(PACK_TARGET * 2 + 12_345);
    assert.equal(await blobs.putWhole('snapshots/t8/w1', Readable.from([data.subarray(0, 1000), data.subarray(1000)])), data.length);
    assert.equal(packs('t8').length, 3, 'three pieces, a pack each');
    assert.ok((await readAll(await blobs.get('snapshots/t8/w1'))).equals(data));
    // The same bytes again are stored again (nothing is looked up), and what is stored whole
    // is not offered to later puts either: a put of the same bytes stores them all.
    await blobs.putWhole('snapshots/t8/w2', Readable.from([data]));
    assert.equal(packs('t8').length, 6);
    const before = packBytes('t8');
    await blobs.put('snapshots/t8/p1', Readable.from([data]));
    assert.ok(packBytes('t8') - before >= data.length, 'the put found nothing to share with the whole objects');
    // A copy names the same packs; deleting the original and collecting keeps the copy whole.
    await blobs.copy('snapshots/t8/w2', 'snapshots/t8/w3');
    await blobs.delete('snapshots/t8/w1');
    await blobs.delete('snapshots/t8/w2');
    assert.equal(await blobs.gc(async () => []), 3, "w1's three packs, and only them (the rest was written just now, or is w3's)");
    assert.ok((await readAll(await blobs.get('snapshots/t8/w3'))).equals(data));
    assert.equal(await blobs.putWhole('snapshots/t8/empty', Readable.from([])), 0);
    assert.equal((await readAll(await blobs.get('snapshots/t8/empty'))).length, 0);
  });
});
