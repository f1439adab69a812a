#!/usr/bin/env node
// External stores vs the embedded ones, side by side in one run (issue 22's benchmarks that do
// not need several nodes): the metadata calls a create makes, on PostgreSQL vs SQLite; and a
// snapshot's bytes through the whole blob stack (dedup + encryption) into S3 (OpenStack Swift
// with s3api, on loopback) vs a local directory, written and read back.
// Run: node scripts/bench-stores.mjs [--iterations N] [--mb M] [--write]
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { parseArgs } from 'node:util';
import { DedupBlobStore, EncryptedBlobStore } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { S3BlobStore, parseS3Url } from '../packages/blob-s3/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { PostgresStore } from '../packages/store-postgres/dist/index.js';
import { openKeys, quantile, writeSection } from './bench-lib.mjs';
import { startPostgres } from '../test/postgres.mjs';
import { startS3 } from '../test/s3-server.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '300' }, mb: { type: 'string', default: '256' }, rounds: { type: 'string', default: '3' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const MB = Number(values.mb);
const ROUNDS = Number(values.rounds);
const dir = mkdtempSync('/tmp/spb-stores-');
const [pg, s3] = await Promise.all([startPostgres(), startS3()]);
const rows = [];
const row = (what, ours, base, unit, ratio) => rows.push(`| ${what} | ${ours} | ${base} | ${ratio} |`);
const ms = (x) => x.toFixed(2);

try {
  // 1. Metadata: what a create writes and reads (insert, two state updates, a get, an event).
  const sqlite = SqliteStore.open(path.join(dir, 'space.db'));
  const postgres = await PostgresStore.open(pg.url);
  const createCalls = async (store, i, tag) => {
    const id = `sb${tag}${i}`;
    const t0 = performance.now();
    await store.insertSandbox({ id, tenantId: 't', template: 'minimal', driver: 'gvisor', state: 'starting', cpu: 1, memoryMb: 512, timeoutMs: 0, env: {}, metadata: { n: String(i) }, createdAt: new Date().toISOString() });
    await store.updateSandbox(id, { state: 'running' });
    await store.insertEvent({ sandboxId: id, at: new Date().toISOString(), type: 'created', message: 'x' });
    await store.getSandbox(id);
    return performance.now() - t0;
  };
  const a = [];
  const b = [];
  for (let i = 0; i < N; i++) {
    // Alternating, so both see the same machine.
    b.push(await createCalls(sqlite, i, 's'));
    a.push(await createCalls(postgres, i, 'p'));
  }
  row('metadata of a create (insert, update, event, get), p50 ms', ms(quantile(a, 50)), ms(quantile(b, 50)), 'ms', `${(quantile(a, 50) / quantile(b, 50)).toFixed(1)}x`);
  row('metadata of a create, p95 ms', ms(quantile(a, 95)), ms(quantile(b, 95)), 'ms', `${(quantile(a, 95) / quantile(b, 95)).toFixed(1)}x`);
  const la = [];
  const lb = [];
  for (let i = 0; i < Math.min(N, 100); i++) {
    let t0 = performance.now();
    await sqlite.listSandboxes({ tenantId: 't', limit: 50 });
    lb.push(performance.now() - t0);
    t0 = performance.now();
    await postgres.listSandboxes({ tenantId: 't', limit: 50 });
    la.push(performance.now() - t0);
  }
  row(`list 50 of ${N} sandboxes, p50 ms`, ms(quantile(la, 50)), ms(quantile(lb, 50)), 'ms', `${(quantile(la, 50) / quantile(lb, 50)).toFixed(1)}x`);
  await sqlite.close();
  await postgres.close();

  // 2. Snapshot bytes through dedup + encryption into S3 vs a local directory.
  const { store, keys } = await openKeys(path.join(dir, 'keys-store'));
  const s3store = await S3BlobStore.open(parseS3Url(`s3://${s3.bucket}/bench?endpoint=${s3.endpoint}`), { credentials: s3.credentials });
  const stacks = {
    s3: new DedupBlobStore(new EncryptedBlobStore(s3store, keys, store), keys),
    local: new DedupBlobStore(new EncryptedBlobStore(new LocalBlobStore(path.join(dir, 'blobs')), keys, store), keys),
  };
  // Half random, half zeros: roughly what a checkpoint image is (pages and holes).
  const payload = () => {
    const out = [];
    for (let i = 0; i < MB; i++) out.push(i % 2 ? Buffer.alloc(1 << 20) : randomBytes(1 << 20));
    return out;
  };
  const put = { s3: [], local: [] };
  const get = { s3: [], local: [] };
  for (let r = 0; r < ROUNDS; r++) {
    const data = payload();
    for (const kind of r % 2 ? ['local', 's3'] : ['s3', 'local']) {
      const key = `snapshots/t1/bench-${kind}-${r}`;
      let t0 = performance.now();
      await stacks[kind].put(key, Readable.from(data));
      put[kind].push(MB / ((performance.now() - t0) / 1000));
      t0 = performance.now();
      let n = 0;
      for await (const c of await stacks[kind].get(key)) n += c.length;
      if (n !== MB << 20) throw new Error(`read back ${n} bytes, not ${MB << 20}`);
      get[kind].push(MB / ((performance.now() - t0) / 1000));
    }
  }
  const med = (xs) => quantile(xs, 50);
  row(`${MB} MiB snapshot written (dedup + encryption + store), MB/s, median of ${ROUNDS}`, med(put.s3).toFixed(0), med(put.local).toFixed(0), 'MB/s', `${(med(put.s3) / med(put.local)).toFixed(2)}x`);
  row(`${MB} MiB snapshot read back (verify, decrypt, reassemble), MB/s, median of ${ROUNDS}`, med(get.s3).toFixed(0), med(get.local).toFixed(0), 'MB/s', `${(med(get.s3) / med(get.local)).toFixed(2)}x`);
  s3store.close();
  await store.close?.();

  const table = ['| what | external (PostgreSQL / S3) | embedded (SQLite / local directory) | ratio |', '|---|---|---|---|', ...rows].join('\n');
  console.log(table);
  if (values.write) {
    writeSection('stores', 'External stores: PostgreSQL and S3', `Measured ${new Date().toISOString().slice(0, 10)} with \`node scripts/bench-stores.mjs --iterations ${N} --mb ${MB} --rounds ${ROUNDS} --write\`: a throwaway PostgreSQL 15 and OpenStack Swift 2.30 with s3api on loopback (test/postgres.mjs, test/s3-server.mjs), each measurement alternating with the embedded store in the same process. The blob rows go through the daemon's whole stack (content-defined chunks, dedup index, AES-GCM, the store), half random and half zero pages.\n\n${table}`);
  }
} finally {
  await Promise.all([pg.stop(), s3.stop()]);
  rmSync(dir, { recursive: true, force: true });
}
