#!/usr/bin/env node
// Encryption at rest, side by side in one run: the codec's AES-256-GCM throughput, and writing
// and reading a snapshot-sized object through the blob store with and without encryption.
//   node scripts/bench-encryption.mjs [--iterations 5] [--write]
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { parseArgs } from 'node:util';
import { openKeys, quantile, writeSection } from './bench-lib.mjs';
import { DedupBlobStore, EncryptedBlobStore } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { startSpaced, stopSpaced } from '../test/helpers.mjs';
import { unpackSnapshot } from '../test/statefile.mjs';
import { StatefileCodec } from '../packages/driver-gvisor/dist/index.js';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '5' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const SIZE = 256 * 1048576;
const q = quantile;

const dir = mkdtempSync('/tmp/spbenc-');
try {
  let realImage;
  // Stored bytes of 10 consecutive snapshots of an idle sandbox, chunked and deduplicated, on
  // each driver: runsc's image is stored decompressed (space-statefile), QEMU's migration stream is not compressed.
  const dedupRows = [];
  for (const driver of ['gvisor', 'microvm']) {
  const dataDir = mkdtempSync('/tmp/spbenc-d-');
  // Files in memory (`--disks off`), as when these numbers were first recorded; a disk's stream is bench-disks.mjs's.
  const d = await startSpaced(dataDir, { SPACE_DISKS: 'off', SPACE_DRIVER: driver, SPACE_MICROVM_CACHE_DIR: process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm' });
  try {
    const sb = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    const du = (p) => {
      let n = 0;
      if (!existsSync(p)) return 0;
      for (const e of readdirSync(p, { withFileTypes: true })) n += e.isDirectory() ? du(path.join(p, e.name)) : statSync(path.join(p, e.name)).size;
      return n;
    };
    // The sandbox's tenant only: the daemon also stores its built-in template images (under _builtin).
    const stored = () => du(path.join(dataDir, 'blobs', 'snapshots', 'default')) + du(path.join(dataDir, 'blobs', 'chunks', 'default'));
    const base = stored();
    const after = [];
    const logical = [];
    for (let i = 0; i < 10; i++) {
      const snap = await sb.snapshot();
      logical.push(snap.sizeBytes);
      after.push(stored() - base);
      if (driver === 'gvisor' && i === 0) {
        // What the snapshot store is given for a gVisor snapshot: runsc's image in its stored (decompressed) form.
        const img = mkdtempSync('/tmp/spbenc-img-');
        await unpackSnapshot(dataDir, snap.id, img);
        await new StatefileCodec().encode(path.join(img, 'checkpoint.img'), path.join(img, 'stored'));
        realImage = readFileSync(path.join(img, 'stored'));
        rmSync(img, { recursive: true, force: true });
      }
    }
    const first = after[0];
    const next9 = after[9] - first;
    dedupRows.push(`| ${driver}: 10 consecutive snapshots of an idle sandbox, stored bytes (logical ${(logical[0] / 1048576).toFixed(1)} MiB each) | ${(after[9] / 1048576).toFixed(2)} MiB | 10 × the first (${(first / 1048576).toFixed(2)} MiB) | ${(after[9] / (10 * first)).toFixed(2)}x | the next 9 add ≤ 10% of the first: they add ${Math.round((next9 / first) * 100)}% |`);
  } finally {
    await stopSpaced(d);
    rmSync(dataDir, { recursive: true, force: true });
  }
  }
  const { store, keys } = await openKeys(dir);
  /** Blobs in memory: the codec's own throughput, without a disk. */
  class MemoryBlobs {
    m = new Map();
    async put(k, r) { const parts = []; for await (const c of r) parts.push(c); const b = Buffer.concat(parts); this.m.set(k, b); return b.length; }
    async get(k) { return Readable.from([this.m.get(k)]); }
    async stat() { return undefined; }
    async delete(k) { this.m.delete(k); }
  }
  const plainStore = new LocalBlobStore(path.join(dir, 'plain'));
  const encStore = new EncryptedBlobStore(new LocalBlobStore(path.join(dir, 'enc')), keys, store);
  const memStore = new EncryptedBlobStore(new MemoryBlobs(), keys, store);
  const plainDedup = new DedupBlobStore(new LocalBlobStore(path.join(dir, 'plain-dedup')), keys);
  const encDedup = new DedupBlobStore(new EncryptedBlobStore(new LocalBlobStore(path.join(dir, 'enc-dedup')), keys, store), keys);
  const data = randomBytes(SIZE);
  const source = () => Readable.from((function* () {
    for (let o = 0; o < SIZE; o += 1 << 20) yield data.subarray(o, o + (1 << 20));
  })());
  const sink = () => new Writable({ write(_c, _e, cb) { cb(); } });
  const stores = { plain: plainStore, enc: encStore, mem: memStore, plainDedup, encDedup };
  /** Writes `src()` (`bytes` long) to `s` and reads it back, each timed into `into` (GB/s), then deletes it. */
  const roundTrip = async (s, key, src, bytes, into) => {
    const rate = (t0) => bytes / 1e9 / ((performance.now() - t0) / 1000);
    let t = performance.now();
    await s.put(key, src());
    into.put.push(rate(t));
    t = performance.now();
    await pipeline(await s.get(key), sink());
    into.get.push(rate(t));
    await s.delete(key);
  };
  const rows = Object.fromEntries(Object.keys(stores).map((k) => [k, { put: [], get: [] }]));
  for (let i = 0; i < N; i++) {
    for (const [name, s] of Object.entries(stores)) await roundTrip(s, `snapshots/t1/o${i}`, source, SIZE, rows[name]);
    await plainDedup.gc([]);
    await encDedup.gc([]);
  }
  // A real checkpoint image through the snapshot store: what snapshots actually write and read.
  const real = { plainDedup: { put: [], get: [] }, encDedup: { put: [], get: [] } };
  for (let i = 0; i < 5 * N; i++) {
    for (const name of ['plainDedup', 'encDedup']) {
      await roundTrip(stores[name], `snapshots/t1/r${i}`, () => Readable.from([realImage]), realImage.length, real[name]);
      await stores[name].gc([]);
    }
  }
  const f = (x) => x.toFixed(2);
  const m = (name, op) => q(rows[name][op], 50);
  const row = (what, a, b, target) => `| ${what} | ${f(m(a[0], a[1]))} | ${f(m(b[0], b[1]))} | ${(m(a[0], a[1]) / m(b[0], b[1])).toFixed(2)}x | ${target} |`;
  const table = [
    '| measurement (256 MiB of random bytes, GB/s, median) | encrypted | without encryption (same run) | ratio | target |',
    '|---|---|---|---|---|',
    `| AES-256-GCM codec alone, seal / open (in memory) | ${f(m('mem', 'put'))} / ${f(m('mem', 'get'))} | - | - | - |`,
    row('write through the blob store (codec + local disk)', ['enc', 'put'], ['plain', 'put'], '≥ 0.8x'),
    row('read through the blob store (codec + local disk)', ['enc', 'get'], ['plain', 'get'], '≥ 0.8x'),
    row('write through the snapshot store (chunks, packs, compression, codec)', ['encDedup', 'put'], ['plainDedup', 'put'], '≥ 0.8x'),
    row('read through the snapshot store (chunks, packs, compression, codec)', ['encDedup', 'get'], ['plainDedup', 'get'], '≥ 0.8x'),
  ].join('\n');
  const rm = (name, op) => q(real[name][op], 50);
  const realTable = [
    `| measurement (a runsc checkpoint image as stored: ${(realImage.length / 1048576).toFixed(1)} MiB, GB/s, median of ${5 * N}) | encrypted | without encryption (same run) | ratio | target |`,
    '|---|---|---|---|---|',
    `| write through the snapshot store | ${f(rm('encDedup', 'put'))} | ${f(rm('plainDedup', 'put'))} | ${(rm('encDedup', 'put') / rm('plainDedup', 'put')).toFixed(2)}x | ≥ 0.8x |`,
    `| read through the snapshot store | ${f(rm('encDedup', 'get'))} | ${f(rm('plainDedup', 'get'))} | ${(rm('encDedup', 'get') / rm('plainDedup', 'get')).toFixed(2)}x | ≥ 0.8x |`,
  ].join('\n');
  await store.close();


  const full = `${table}\n\n${realTable}\n\n| measurement | chunked + deduplicated | baseline | ratio | target |\n|---|---|---|---|---|\n${dedupRows.join('\n')}`;
  console.log(full);
  if (values.write) {
    writeSection('encryption', 'Encryption at rest (issue 5)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores, ${N} iterations, with \`node scripts/bench-encryption.mjs --write\` (part of \`./space bench\`): a 256 MiB random object (incompressible, nothing to deduplicate: the worst case) written and read through the AES-256-GCM codec in memory, through the local blob store (page cache, fsync on write) with and without the codec, and through the snapshot store (content-defined chunks in compressed packs, then the blob store) with and without the codec; the same for a real runsc checkpoint image in its stored form (taken from the first snapshot below); and 10 snapshots of an idle \`minimal\` sandbox through the daemon (runsc's image stored decompressed, 4 KiB chunks deduplicated per tenant), on the gVisor driver and on the microVM driver.\n\n${full}`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
