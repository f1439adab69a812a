#!/usr/bin/env node
// What keeping the disk pool encrypted at rest costs: sequential write (dd, conv=fsync) and cold
// read (caches dropped) of a file on a disk of a pool kept in its vault (fscrypt) vs the same on
// a pool without one, side by side in one run, alternating. No runtime: the pools alone.
//   node scripts/bench-disk-vault.mjs [--mb 512] [--runs 3] [--write]
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { quantile, writeSection } from './bench-lib.mjs';
import { DiskPool } from '../packages/driver-gvisor/dist/index.js';
import { closeDiskPoolSettled } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { mb: { type: 'string', default: '512' }, runs: { type: 'string' }, iterations: { type: 'string' }, write: { type: 'boolean', default: false } } });
const MB = Number(values.mb);
// `./space bench --iterations N` passes its flags to every script: here they are the runs.
const RUNS = Number(values.runs ?? values.iterations ?? 3);
const MiB = 1048576;
const dropCaches = () => execFileSync('sh', ['-c', 'sync; echo 3 > /proc/sys/vm/drop_caches']);
const timed = (fn) => {
  const t = performance.now();
  fn();
  return performance.now() - t;
};

const dir = mkdtempSync('/tmp/space-bench-vault-');
const tpl = path.join(dir, 'tpl');
mkdirSync(path.join(tpl, 'etc'), { recursive: true });
writeFileSync(path.join(tpl, 'etc', 'hostname'), 'bench\n');
const pools = {};
const results = { vault: { write: [], read: [] }, plain: { write: [], read: [] } };
try {
  // Each where a daemon keeps its pool (<data>/disks), so that the tests' helper unmounts it.
  pools.vault = await DiskPool.open({ dir: path.join(dir, 'vault', 'disks'), sizeBytes: 4 * MB * MiB, key: randomBytes(32) });
  pools.plain = await DiskPool.open({ dir: path.join(dir, 'plain', 'disks'), sizeBytes: 4 * MB * MiB });
  for (const pool of Object.values(pools)) {
    await pool.importTemplate('t', tpl);
    await pool.createDisk('d', 't', 2 * MB * MiB);
  }
  for (let i = 0; i < RUNS; i++) {
    for (const [name, pool] of Object.entries(pools)) {
      const file = path.join(pool.diskPath('d'), 'f');
      dropCaches();
      results[name].write.push(timed(() => execFileSync('dd', ['if=/dev/zero', `of=${file}`, 'bs=1M', `count=${MB}`, 'conv=fsync', 'status=none'])));
      dropCaches();
      results[name].read.push(timed(() => execFileSync('dd', [`if=${file}`, 'of=/dev/null', 'bs=1M', 'status=none'])));
      rmSync(file);
    }
  }
} finally {
  for (const pool of Object.values(pools)) await pool.close().catch(() => {});
  // A pool stays mounted after close (a daemon's sandboxes run on); a half-opened one may hold its vault.
  for (const name of ['vault', 'plain']) await closeDiskPoolSettled(path.join(dir, name));
  rmSync(dir, { recursive: true, force: true });
}

const mbps = (msList) => Math.round(MB / (quantile(msList, 50) / 1000));
const row = (what, key) => {
  const [v, p] = [mbps(results.vault[key]), mbps(results.plain[key])];
  return `| ${what}, MB/s (median of ${RUNS}) | ${v} | ${p} | ${(v / p).toFixed(2)}x |`;
};
const cipher = execFileSync('sh', ['-c', "grep -A2 '^name *: xts(aes)' /proc/crypto | sed -n 's/^driver *: //p' | head -1"], { encoding: 'utf8' }).trim() || 'unknown';
const body = [
  `Measured with \`node scripts/bench-disk-vault.mjs --mb ${MB} --runs ${RUNS} --write\` (part of \`./space bench\`): a file of ${MB} MiB written with \`dd conv=fsync\` and read back with the caches dropped, on a disk of a pool kept in its vault (fscrypt, docs/disks.md "At rest") and on a disk of a pool without one, alternating. This kernel's AES for fscrypt: \`${cipher}\`.`,
  '',
  '| what | pool in its vault | pool without one | ratio |',
  '|---|---|---|---|',
  row(`write ${MB} MiB (conv=fsync)`, 'write'),
  row(`read ${MB} MiB, caches dropped`, 'read'),
].join('\n');
console.log(body);
if (values.write) writeSection('disk-vault', 'Disks at rest', body);
