#!/usr/bin/env node
// The snapshot store's two chunk shapes side by side, in one process: the same incompressible
// bytes stored as an image's attachment (a disk's stream: 64 KiB chunks) and as an image (a
// sandbox's memory: 4 KiB chunks), alternating; then each again with a few bytes changed (what
// a disk's next snapshot stores when little changed). Reports the time of each, the manifest's
// stored size, and the entries and memory of the tenant's chunk index that the daemon keeps.
//   node --expose-gc scripts/bench-chunks.mjs [--mb 512] [--iterations 3] [--write]
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { parseArgs } from 'node:util';
import { openKeys, quantile, writeSection } from './bench-lib.mjs';
import { DedupBlobStore, EncryptedBlobStore } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';

const { values } = parseArgs({ options: { mb: { type: 'string', default: '512' }, iterations: { type: 'string', default: '3' }, write: { type: 'boolean', default: false } } });
const MB = Number(values.mb);
const ROUNDS = Number(values.iterations);
if (!global.gc) throw new Error('run with node --expose-gc (the index memory is measured after a collection)');

const dir = mkdtempSync('/tmp/space-bench-chunks-');
const { store, keys } = await openKeys(dir);
const inner = new EncryptedBlobStore(new LocalBlobStore(path.join(dir, 'blobs')), keys, store);
const blobs = new DedupBlobStore(inner, keys);
/** 64 KiB pieces, as `btrfs send` writes into a pipe. */
const pieces = (buf) => Readable.from((function* () {
  for (let i = 0; i < buf.length; i += 65536) yield buf.subarray(i, i + 65536);
})());
const readAll = async (r) => {
  const parts = [];
  for await (const c of r) parts.push(c);
  return Buffer.concat(parts);
};
// Each shape in a tenant of its own: each has its own chunk index.
const shapes = { attachment: (i, v) => `snapshots/ta/r${i}${v}.disk`, image: (i, v) => `snapshots/ti/r${i}${v}` };
const res = { attachment: { first: [], again: [], manifest: [] }, image: { first: [], again: [], manifest: [] } };
try {
  // A first put of each kind sets up what later ones reuse (the tenant's secret and index, code warmed up).
  for (const key of [shapes.attachment('w', ''), shapes.image('w', '')]) await blobs.put(key, pieces(randomBytes(4 << 20)));
  for (let i = 0; i < ROUNDS; i++) {
    const a = randomBytes(MB << 20);
    const b = Buffer.from(a);
    b.write('a few changed bytes', a.length >> 1);
    for (const shape of i % 2 ? ['image', 'attachment'] : ['attachment', 'image']) {
      const key = shapes[shape];
      let t = performance.now();
      await blobs.put(key(i, 'a'), pieces(a));
      res[shape].first.push(performance.now() - t);
      t = performance.now();
      await blobs.put(key(i, 'b'), pieces(b));
      res[shape].again.push(performance.now() - t);
      res[shape].manifest.push((await readAll(await inner.get(key(i, 'a')))).length);
    }
  }
  // The index of a tenant (a private cache of the store), as a daemon builds it from the
  // tenant's manifests after a restart: a fresh store's, measured across its building.
  for (const [shape, tenant] of [['attachment', 'ta'], ['image', 'ti']]) {
    const fresh = new DedupBlobStore(inner, keys);
    global.gc();
    const before = process.memoryUsage().heapUsed;
    const index = await fresh['index'](tenant);
    global.gc();
    res[shape].indexMiB = (process.memoryUsage().heapUsed - before) / 1048576;
    res[shape].entries = index.size;
  }
} finally {
  await store.close();
  rmSync(dir, { recursive: true, force: true });
}

const med = (xs) => quantile(xs, 50);
const ratio = (x, y) => `${(x / y).toFixed(2)}x`;
const A = res.attachment;
const I = res.image;
const stored = ROUNDS * 2 * MB;
const rows = [
  [`store ${MB} MiB of new bytes, ms (median of ${ROUNDS})`, Math.round(med(A.first)), Math.round(med(I.first)), ratio(med(A.first), med(I.first))],
  [`store them again with a few bytes changed, ms (median of ${ROUNDS})`, Math.round(med(A.again)), Math.round(med(I.again)), ratio(med(A.again), med(I.again))],
  [`manifest of ${MB} MiB as stored (compressed, encrypted), KiB`, Math.round(med(A.manifest) / 1024), Math.round(med(I.manifest) / 1024), ratio(med(A.manifest), med(I.manifest))],
  [`the tenant's chunk index after ${stored} MiB stored: entries`, A.entries, I.entries, ratio(A.entries, I.entries)],
  ["the same index: the daemon's memory, MiB", A.indexMiB.toFixed(1), I.indexMiB.toFixed(1), ratio(A.indexMiB, I.indexMiB)],
];
const table = ['| measurement | as an attachment (64 KiB chunks) | as an image (4 KiB chunks) | ratio |', '|---|---:|---:|---:|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
console.log(table);
if (values.write) {
  writeSection('chunks', "The snapshot store's chunk sizes", `Measured with \`node --expose-gc scripts/bench-chunks.mjs --mb ${MB} --iterations ${ROUNDS} --write\` (part of \`./space bench\`): ${MB} MiB of random bytes (nothing compresses or repeats) put through the snapshot store (content-defined chunks, keyed hashes, brotli packs, AES-GCM, a local directory) as an image's attachment — the key a disk's \`btrfs send\` stream is stored under — and as an image, in one process, alternating; then the same bytes with 19 changed in the middle under a new key of each kind. Each kind in a tenant of its own, whose chunk index (every stored chunk's id and place, kept in the daemon's memory) is measured after a garbage collection.\n\n${table}`);
}
