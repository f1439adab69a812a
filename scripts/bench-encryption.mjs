#!/usr/bin/env node
// Encryption at rest, side by side in one run: the codec's AES-256-GCM throughput, and writing
// and reading a snapshot-sized object through the blob store with and without encryption.
//   node scripts/bench-encryption.mjs [--iterations 5] [--write]
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable, Writable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { parseArgs } from 'node:util';
import { openKeys, quantile, writeSection } from './bench-lib.mjs';
import { EncryptedBlobStore } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '5' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const SIZE = 256 * 1048576;
const q = quantile;

const dir = mkdtempSync('/tmp/spbenc-');
try {
  const { store, keys } = await openKeys(dir);
  const plainStore = new LocalBlobStore(path.join(dir, 'plain'));
  const encStore = new EncryptedBlobStore(new LocalBlobStore(path.join(dir, 'enc')), keys, store);
  const data = randomBytes(SIZE);
  const source = () => Readable.from((function* () {
    for (let o = 0; o < SIZE; o += 1 << 20) yield data.subarray(o, o + (1 << 20));
  })());
  const sink = () => new Writable({ write(_c, _e, cb) { cb(); } });
  const gbps = (ms) => SIZE / 1e9 / (ms / 1000);
  const rows = { put: [[], []], get: [[], []] };
  for (let i = 0; i < N; i++) {
    for (const [j, s] of [[0, plainStore], [1, encStore]]) {
      let t = performance.now();
      await s.put(`snapshots/t1/o${i}`, source());
      rows.put[j].push(gbps(performance.now() - t));
      t = performance.now();
      await pipeline(await s.get(`snapshots/t1/o${i}`), sink());
      rows.get[j].push(gbps(performance.now() - t));
      await s.delete(`snapshots/t1/o${i}`);
    }
  }
  const f = (x) => x.toFixed(2);
  const table = [
    '| measurement (256 MiB object, GB/s, median) | encrypted | plain (same run) | ratio | target |',
    '|---|---|---|---|---|',
    `| write through the blob store | ${f(q(rows.put[1], 50))} | ${f(q(rows.put[0], 50))} | ${(q(rows.put[1], 50) / q(rows.put[0], 50)).toFixed(2)}x | ≥ 0.8x |`,
    `| read through the blob store | ${f(q(rows.get[1], 50))} | ${f(q(rows.get[0], 50))} | ${(q(rows.get[1], 50) / q(rows.get[0], 50)).toFixed(2)}x | ≥ 0.8x |`,
  ].join('\n');
  await store.close();

  // Stored bytes of 10 consecutive snapshots of an idle sandbox, chunked and deduplicated, on
  // each driver: runsc's image is deflate-compressed, QEMU's migration stream is not.
  const dedupRows = [];
  for (const driver of ['gvisor', 'microvm']) {
  const dataDir = mkdtempSync('/tmp/spbenc-d-');
  const d = await startSpaced(dataDir, { SPACE_DRIVER: driver, SPACE_MICROVM_CACHE_DIR: process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm' });
  try {
    const sb = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    const du = (p) => {
      let n = 0;
      if (!existsSync(p)) return 0;
      for (const e of readdirSync(p, { withFileTypes: true })) n += e.isDirectory() ? du(path.join(p, e.name)) : statSync(path.join(p, e.name)).size;
      return n;
    };
    const stored = () => du(path.join(dataDir, 'blobs'));
    const base = stored();
    const after = [];
    const logical = [];
    for (let i = 0; i < 10; i++) {
      logical.push((await sb.snapshot()).sizeBytes);
      after.push(stored() - base);
    }
    const first = after[0];
    const next9 = after[9] - first;
    dedupRows.push(`| ${driver}: 10 consecutive snapshots of an idle sandbox, stored bytes (logical ${(logical[0] / 1048576).toFixed(1)} MiB each) | ${(after[9] / 1048576).toFixed(2)} MiB | 10 × the first (${(first / 1048576).toFixed(2)} MiB) | ${(after[9] / (10 * first)).toFixed(2)}x | the next 9 add ≤ 10% of the first: they add ${Math.round((next9 / first) * 100)}% |`);
  } finally {
    await stopSpaced(d);
    rmSync(dataDir, { recursive: true, force: true });
  }
  }
  const full = `${table}\n\n| measurement | chunked + deduplicated | baseline | ratio | target |\n|---|---|---|---|---|\n${dedupRows.join('\n')}`;
  console.log(full);
  if (values.write) {
    writeSection('encryption', 'Encryption at rest (issue 5)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores, ${N} iterations, with \`node scripts/bench-encryption.mjs --write\` (part of \`./space bench\`): a 256 MiB random object written to and read from the local blob store (page cache, fsync on write), plain vs through the AES-256-GCM codec with a fresh data key wrapped by a local key; then 10 snapshots of an idle \`minimal\` sandbox through the daemon (content-defined chunks, deduplicated per tenant), on the gVisor driver and on the microVM driver.\n\n${full}`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
