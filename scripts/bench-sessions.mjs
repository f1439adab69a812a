#!/usr/bin/env node
// Stateful-session benchmarks, each beside a bare runsc baseline in the same run:
// pause/resume, snapshot (latency, downtime, size), hibernate/wake, fork into 1/4/10.
//   node scripts/bench-sessions.mjs [--iterations 10] [--write]
import { spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { bareOciConfig, quantile, runtimeDirOf, templateRootfs, writeSection } from './bench-lib.mjs';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { TEMPLATES_DIR, startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '10' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const q = quantile;
const fmt = (ms) => (ms < 10 ? ms.toFixed(2) : ms.toFixed(0));
const now = () => performance.now();

const dataDir = mkdtempSync('/tmp/spbs-');
// Files in memory (`--disks off`): the baseline is bare runsc with its root in memory; disks
// against memory are measured by bench-disks.mjs.
const spaced = await startSpaced(dataDir, { SPACE_DISKS: 'off' });
const { conn } = spaced;

// A bare container with the same rootfs and the same node runtime, idle (no agent, no API).
const bareRoot = path.join(dataDir, 'bare');
const runtimeDir = runtimeDirOf(dataDir);
const R = (...a) => spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), '--network=none', '--overlay2=root:memory', ...a], { stdio: 'ignore' });
function bareBundle(name) {
  const b = path.join(bareRoot, name);
  mkdirSync(b, { recursive: true });
  writeFileSync(path.join(b, 'config.json'), JSON.stringify(bareOciConfig({ rootfs: templateRootfs(TEMPLATES_DIR, 'minimal'), runtimeDir, name })));
  return b;
}
// The same bare container as SPACE's sandboxes must run it: with a network (a netns with a veth,
// `--network=sandbox`, and the /proc/sys/net/core tmpfs this runsc needs on a 6.x kernel). A
// SPACE image holds its network stack: restored bare, it needs one too. Each restore gets a
// fresh netns, made before its timer starts (SPACE makes one per restore: counted against it):
// runsc takes the addresses off the interfaces it finds, so a second restore into the same netns
// finds no address and skips the link's set-up — which made this baseline ~30 ms too fast
// before 2026-12-06 (runsc's log: `No usable IP addresses found for interface "eth0", skipping`).
const bareNs = `spbs-${process.pid}`;
function freshBareNs() {
  spawnSync('ip', ['netns', 'del', bareNs], { stdio: 'ignore' });
  for (const [cmd, args, input] of [
    ['ip', ['netns', 'add', bareNs]],
    ['ip', ['-b', '-'], `link add spbs${process.pid % 100000} type veth peer name eth0 netns ${bareNs}\naddr add 10.254.250.1/30 dev spbs${process.pid % 100000}\nlink set spbs${process.pid % 100000} up\n`],
    ['ip', ['-n', bareNs, '-b', '-'], 'addr add 10.254.250.2/30 dev eth0\nlink set eth0 up\nlink set lo up\n'],
  ]) spawnSync(cmd, args, { input, stdio: ['pipe', 'ignore', 'ignore'] });
}
const RN = (...a) => spawnSync('unshare', ['-m', '--propagation', 'slave', 'sh', '-c', `nsenter --net=/var/run/netns/${bareNs} mount -t tmpfs -o size=4k,ro none /proc/sys/net/core && exec "$0" "$@"`, 'runsc', '--root', path.join(bareRoot, 'state'), '--network=sandbox', '--overlay2=root:memory', ...a], { stdio: 'ignore' });
const RNcheckpoint = (img, id) => spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), '--network=sandbox', '--overlay2=root:memory', 'checkpoint', '--image-path', img, id], { stdio: 'ignore' });
function bareNetBundle(name) {
  const b = path.join(bareRoot, name);
  mkdirSync(b, { recursive: true });
  const cfg = bareOciConfig({ rootfs: templateRootfs(TEMPLATES_DIR, 'minimal'), runtimeDir, name });
  cfg.linux.namespaces = cfg.linux.namespaces.map((n) => (n.type === 'network' ? { type: 'network', path: `/var/run/netns/${bareNs}` } : n));
  writeFileSync(path.join(b, 'config.json'), JSON.stringify(cfg));
  return b;
}
const dirSize = (d) => readdirSync(d).reduce((a, f) => a + statSync(path.join(d, f)).size, 0);
/** Bytes of every file under `d`. */
const treeSize = (d) => readdirSync(d, { withFileTypes: true }).reduce((a, e) => a + (e.isDirectory() ? treeSize(path.join(d, e.name)) : statSync(path.join(d, e.name)).size), 0);

const rows = [];
const add = (name, ours, baseName, base, target) => rows.push({ name, p50: q(ours, 50), p95: q(ours, 95), baseName, bp50: base ? q(base, 50) : undefined, target });
/** The steps an event's message reports, `(ms: fetch 12, runtime 300)` → { fetch: 12, runtime: 300 }. */
const stepsOf = (message) => Object.fromEntries((/\(ms: ([^)]*)\)$/.exec(message)?.[1] ?? '').split(', ').filter(Boolean).map((kv) => [kv.split(' ')[0], Number(kv.split(' ')[1])]));
/** "of which" rows: each step's p50/p95 over the events whose message matches `re` (a step an event lacks counts 0). */
async function addSteps(re) {
  const all = (await sb.events()).filter((e) => re.test(e.message)).map((e) => stepsOf(e.message));
  const names = [...new Set(all.flatMap((x) => Object.keys(x)))];
  for (const k of names) add(`  of which ${k}`, all.map((x) => x[k] ?? 0), undefined, undefined, 'profile (event)');
}
let sb;

try {
  sb = await Sandbox.create({ ...conn, memoryMb: 256 });
  await sb.commands.run('true');
  let b = bareBundle('b0');
  R('run', '--detach', '--bundle', b, 'b0');

  // pause / resume
  const pause = [], resume = [], bpause = [], bresume = [];
  for (let i = 0; i < N; i++) {
    let t = now(); await sb.pause(); pause.push(now() - t);
    t = now(); await sb.resume(); resume.push(now() - t);
    t = now(); R('pause', 'b0'); bpause.push(now() - t);
    t = now(); R('resume', 'b0'); bresume.push(now() - t);
  }
  add('pause (API)', pause, '`runsc pause`', bpause, '—');
  add('resume (API)', resume, '`runsc resume`', bresume, '—');

  // snapshot (keeps running) vs bare checkpoint + restore
  const snap = [], down = [], sizes = [], stored = [], bsnap = [], bsizes = [];
  for (let i = 0; i < N; i++) {
    const before = treeSize(path.join(dataDir, 'blobs'));
    let t = now();
    const s = await sb.snapshot();
    snap.push(now() - t);
    down.push(s.downtimeMs);
    sizes.push(s.sizeBytes);
    stored.push(treeSize(path.join(dataDir, 'blobs')) - before);
    const img = path.join(bareRoot, `img${i}`);
    const next = `b${i + 1}`;
    t = now();
    R('checkpoint', '--image-path', img, `b${i}`);
    R('restore', '--image-path', img, '--detach', '--bundle', bareBundle(next), next);
    bsnap.push(now() - t);
    bsizes.push(dirSize(img));
    spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'delete', '--force', `b${i}`], { stdio: 'ignore' });
  }
  add('snapshot, sandbox keeps running (API)', snap, 'bare `runsc checkpoint` + `runsc restore`', bsnap, '—');
  add('  of which downtime', down, undefined, undefined, 'reported per snapshot');
  await addSteps(/^snapshot \S+ \(manual\)/);
  const last = `b${N}`;

  // hibernate / wake vs bare checkpoint / restore
  const hib = [], wake = [], bcp = [], brs = [];
  let cur = last;
  for (let i = 0; i < N; i++) {
    let t = now(); await sb.hibernate(); hib.push(now() - t);
    t = now(); await sb.wake(); wake.push(now() - t);
    const img = path.join(bareRoot, `h${i}`);
    t = now(); R('checkpoint', '--image-path', img, cur); bcp.push(now() - t);
    spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'delete', '--force', cur], { stdio: 'ignore' });
    const next = `h${i}`;
    t = now(); R('restore', '--image-path', img, '--detach', '--bundle', bareBundle(next), next); brs.push(now() - t);
    cur = next;
  }
  spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'kill', cur, 'KILL'], { stdio: 'ignore' });
  spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'delete', '--force', cur], { stdio: 'ignore' });
  // The networked bare container, checkpointed and restored as many times.
  const ncp = [], nrs = [];
  freshBareNs();
  cur = 'n0';
  RN('run', '--detach', '--bundle', bareNetBundle(cur), cur);
  for (let i = 0; i < N; i++) {
    const img = path.join(bareRoot, `nh${i}`);
    let t = now(); RNcheckpoint(img, cur); ncp.push(now() - t);
    spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'delete', '--force', cur], { stdio: 'ignore' });
    const next = `n${i + 1}`;
    freshBareNs();
    t = now(); RN('restore', '--image-path', img, '--detach', '--bundle', bareNetBundle(next), next); nrs.push(now() - t);
    cur = next;
  }
  spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'kill', cur, 'KILL'], { stdio: 'ignore' });
  spawnSync('runsc', ['--root', path.join(bareRoot, 'state'), 'delete', '--force', cur], { stdio: 'ignore' });
  add('hibernate (API)', hib, 'bare `runsc checkpoint`', bcp, '≤ 2x bare');
  add('  the same, against the bare container with a network', hib, 'bare `runsc checkpoint`, netns + veth, `--network=sandbox`', ncp, '≤ 2x bare');
  await addSteps(/^snapshot \S+ \(hibernate\)/);
  add('wake (API, until the agent answers)', wake, 'bare `runsc restore`', brs, '≤ 1.5x bare');
  add('  the same, against the bare container with a network', wake, 'bare `runsc restore`, netns + veth, `--network=sandbox`', nrs, '≤ 1.5x bare');
  await addSteps(/^woken from/);

  // fork into 1, 4, 10: until every copy has answered a command; the median of a few forks
  // each (one fork swings by a third between runs on 2 cores)
  const forks = [];
  for (const [n, reps] of [[1, 5], [4, 3], [10, 3]]) {
    const times = [];
    let answering = n;
    for (let i = 0; i < reps; i++) {
      const t = now();
      const copies = await sb.fork({ count: n });
      await Promise.all(copies.map((c) => c.commands.run('true')));
      times.push(now() - t);
      answering = Math.min(answering, copies.length);
      for (const c of copies) await c.kill();
    }
    forks.push([n, q(times, 50), answering, reps]);
  }
  await sb.kill();

  const lines = [
    '| measurement | p50 ms | p95 ms | baseline (same run) | baseline p50 ms | ratio | target |',
    '|---|---|---|---|---|---|---|',
    ...rows.map((r) => `| ${r.name} | ${fmt(r.p50)} | ${fmt(r.p95)} | ${r.baseName ?? '—'} | ${r.bp50 !== undefined ? fmt(r.bp50) : '—'} | ${r.bp50 ? `${(r.p50 / r.bp50).toFixed(2)}x` : '—'} | ${r.target} |`),
    `| snapshot size (runsc's image decompressed, before dedup and compression) | ${(q(sizes, 50) / 1048576).toFixed(2)} MiB | | bare checkpoint image (compressed) | ${(q(bsizes, 50) / 1048576).toFixed(2)} MiB | | — |`,
    `| bytes stored by each snapshot (the first: ${(stored[0] / 1048576).toFixed(2)} MiB) | ${(q(stored.slice(1), 50) / 1048576).toFixed(2)} MiB | | bare checkpoint image (compressed) | ${(q(bsizes, 50) / 1048576).toFixed(2)} MiB | ${(q(stored.slice(1), 50) / q(bsizes, 50)).toFixed(2)}x | — |`,
    ...forks.map(([n, ms, ok, reps]) => `| fork into ${n} (${ok} answering; median of ${reps}) | ${fmt(ms)} total | | ${n === 1 ? 'wake (API), above' : '—'} | ${n === 1 ? fmt(q(wake, 50)) : '—'} | ${n === 1 ? `${fmt(ms / q(wake, 50))}x a wake` : `${fmt(ms / n)} ms per copy`} | ${n === 1 ? '≤ 1.3x a wake' : n === 10 ? '≤ 2 s' : '—'} |`),
  ];
  const table = lines.join('\n');
  console.log(table);
  if (values.write) {
    writeSection('sessions', 'Stateful sessions: pause, snapshot, hibernate, fork (issue 4)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores, ${N} iterations each, with \`node scripts/bench-sessions.mjs --write\` (part of \`./space bench\`). The bare baseline is a runsc container with the same rootfs and node runtime, idle, without agent or API; for hibernate and wake also the same container with a network (a netns with a veth, \`--network=sandbox\`: what a SPACE image needs to restore, since it holds its network stack), a fresh one for each restore, made before its timer starts.\n\n${table}`);
  }
} finally {
  const st = path.join(bareRoot, 'state');
  for (const id of (spawnSync('runsc', ['--root', st, 'list', '-quiet'], { encoding: 'utf8' }).stdout ?? '').split('\n').filter(Boolean)) {
    spawnSync('runsc', ['--root', st, 'kill', id, 'KILL'], { stdio: 'ignore' });
    spawnSync('runsc', ['--root', st, 'delete', '--force', id], { stdio: 'ignore' });
  }
  spawnSync('ip', ['netns', 'del', bareNs], { stdio: 'ignore' });
  await stopSpaced(spaced);
  rmSync(dataDir, { recursive: true, force: true });
}
