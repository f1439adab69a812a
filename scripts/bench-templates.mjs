#!/usr/bin/env node
// Fast-start benchmarks, each beside its baseline in the same run:
//   - create + first command from a warm pool (target p50 ≤ 60 ms);
//   - the same restored from the template snapshot (no pool) vs a bare `runsc restore` +
//     `runsc exec` of the same image (target ≤ 1.2x);
//   - 20 concurrent creates vs 20 sequential: throughput (target ≥ 1.3x) and p95 latency;
//   - host memory per pooled sandbox.
//   node scripts/bench-templates.mjs [--iterations 30] [--write]
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { quantile, writeSection } from './bench-lib.mjs';
import { Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { eventually, startSpaced, stopSpaced } from '../test/helpers.mjs';
import { templateImagesDir } from '../packages/server/dist/index.js';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '30' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const q = quantile;
const fmt = (ms) => (ms < 10 ? ms.toFixed(2) : ms.toFixed(0));
const now = () => performance.now();

const dataDir = mkdtempSync('/tmp/spbt-');
// Files in memory (`--disks off`): the baseline is bare runsc with its root in memory; disks
// against memory are measured by bench-disks.mjs.
const spaced = await startSpaced(dataDir, { SPACE_DISKS: 'off' });
const { conn } = spaced;
const bareRoot = path.join(dataDir, 'bare');
/** Runs a command to its end without blocking the event loop (the SDK's keep-alive connections stay served). */
const exec = (cmd, args, input) =>
  new Promise((resolve) => {
    const c = spawn(cmd, args, { stdio: [input === undefined ? 'ignore' : 'pipe', 'ignore', 'ignore'] });
    if (input !== undefined) c.stdin.end(input);
    c.on('close', resolve);
  });
const R = (...a) => exec('runsc', ['--root', path.join(bareRoot, 'state'), '--network=none', '--overlay2=root:memory', ...a]);

/** Host memory of sandboxes whose cgroup is not in `except`: RSS of their processes and cgroup usage. */
function spaceMemory(except = new Set()) {
  const base = '/sys/fs/cgroup/memory/space';
  let rss = 0;
  let cg = 0;
  const dirs = [];
  for (const d of existsSync(base) ? readdirSync(base, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => e.name) : []) {
    if (except.has(d)) continue;
    dirs.push(d);
    const dir = path.join(base, d);
    cg += Number(readFileSync(path.join(dir, 'memory.usage_in_bytes'), 'utf8'));
    for (const pid of readFileSync(path.join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean)) {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
      if (m) rss += Number(m[1]) * 1024;
    }
  }
  return { rss, cg, dirs };
}

const rows = [];
const add = (name, xs, baseName, base, target) => rows.push({ name, p50: q(xs, 50), p95: q(xs, 95), baseName, bp50: base ? q(base, 50) : undefined, target });
const ttfc = async (opts = {}) => {
  const t = now();
  const sb = await Sandbox.create({ ...conn, ...opts });
  await sb.commands.run('true');
  return { ms: now() - t, sb };
};

try {
  // The template snapshot of `minimal` (taken at start-up; make sure it is there).
  await Templates.prepare('minimal', conn);
  const imageDir = path.join(templateImagesDir(dataDir), readdirSync(templateImagesDir(dataDir)).find((d) => d.startsWith('minimal-') && !d.includes('.tmp')));
  const warm = await ttfc();
  const bundleConfig = JSON.parse(readFileSync(path.join(dataDir, 'sandboxes', warm.sb.id, 'bundle', 'config.json'), 'utf8'));
  await warm.sb.kill();

  // 1. Restore from the template snapshot (no pool) vs bare runsc restore + exec of the same image.
  const restore = [];
  const parts = { restoreMs: [], agentMs: [], identityMs: [] };
  for (let i = 0; i < N; i++) {
    const r = await ttfc();
    restore.push(r.ms);
    for (const k of Object.keys(parts)) parts[k].push(r.sb.info.createTimings[k]);
    await r.sb.kill();
  }
  const bare = [];
  for (let i = 0; i < N; i++) {
    const b = path.join(bareRoot, `b${i}`);
    const sock = path.join(bareRoot, `sock${i}`);
    mkdirSync(b, { recursive: true });
    mkdirSync(sock, { recursive: true });
    const cfg = structuredClone(bundleConfig);
    cfg.mounts = cfg.mounts.map((m) => (m.destination === '/run/space' ? { ...m, source: sock } : m));
    cfg.linux.namespaces = cfg.linux.namespaces.map((n) => (n.type === 'network' ? { type: 'network' } : n));
    delete cfg.linux.cgroupsPath;
    writeFileSync(path.join(b, 'config.json'), JSON.stringify(cfg));
    const t = now();
    await R('restore', '--image-path', imageDir, '--detach', '--bundle', b, `bare${i}`);
    await R('exec', `bare${i}`, '/bin/true');
    bare.push(now() - t);
    await R('kill', `bare${i}`, 'KILL');
    await R('delete', '--force', `bare${i}`);
  }
  // The same with the least a networked sandbox needs: a netns with a veth, --network=sandbox
  // (through the /proc/sys/net/core tmpfs this runsc needs on a 6.x kernel), as SPACE does.
  const bareNet = [];
  for (let i = 0; i < N; i++) {
    const b = path.join(bareRoot, `n${i}`);
    const sock = path.join(bareRoot, `nsock${i}`);
    const ns = `spbench-${process.pid}-${i}`;
    mkdirSync(b, { recursive: true });
    mkdirSync(sock, { recursive: true });
    const cfg = structuredClone(bundleConfig);
    cfg.mounts = cfg.mounts.map((m) => (m.destination === '/run/space' ? { ...m, source: sock } : m));
    cfg.linux.namespaces = cfg.linux.namespaces.map((n) => (n.type === 'network' ? { type: 'network', path: `/var/run/netns/${ns}` } : n));
    delete cfg.linux.cgroupsPath;
    writeFileSync(path.join(b, 'config.json'), JSON.stringify(cfg));
    const t = now();
    await exec('ip', ['netns', 'add', ns]);
    await exec('ip', ['-b', '-'], `link add spbv${i} type veth peer name eth0 netns ${ns}\naddr add 10.254.${i}.1/30 dev spbv${i}\nlink set spbv${i} up\n`);
    await exec('ip', ['-n', ns, '-b', '-'], `addr add 10.254.${i}.2/30 dev eth0\nlink set eth0 up\nlink set lo up\n`);
    await exec('unshare', ['-m', '--propagation', 'slave', 'sh', '-c', `nsenter --net=/var/run/netns/${ns} mount -t tmpfs -o size=4k,ro none /proc/sys/net/core && exec "$0" "$@"`, 'runsc', '--root', path.join(bareRoot, 'state'), '--network=sandbox', '--overlay2=root:memory', 'restore', '--image-path', imageDir, '--detach', '--bundle', b, `baren${i}`]);
    await R('exec', `baren${i}`, '/bin/true');
    bareNet.push(now() - t);
    await R('kill', `baren${i}`, 'KILL');
    await R('delete', '--force', `baren${i}`);
    await exec('ip', ['netns', 'del', ns]);
  }
  add('create + `true`, restored from the template snapshot (SDK)', restore, 'bare `runsc restore` + `runsc exec`, netns + veth, `--network=sandbox`', bareNet, '≤ 1.2x bare');
  add('  the same bare, without a network (`--network=none`)', bare, undefined, undefined, 'reported');
  add('  of which the runtime\'s restore', parts.restoreMs, undefined, undefined, '—');
  add('  of which the agent\'s reconnect', parts.agentMs, undefined, undefined, '—');
  add('  of which identity (id, hostname, env)', parts.identityMs, undefined, undefined, '—');

  // 2. Warm pool: wait (untimed) until the pool is full, then create + `true`.
  const others = new Set(spaceMemory().dirs);
  const POOL = 3;
  await Templates.setPool('minimal', POOL, conn);
  // 3. Memory per pooled sandbox: the cgroups that appeared with the pool.
  await eventually(async () => (await Templates.get('minimal', conn)).pool.ready === POOL, { tries: 600, everyMs: 50 });
  const pooledMem = spaceMemory(others);
  const perRss = pooledMem.rss / pooledMem.dirs.length;
  const perCg = pooledMem.cg / pooledMem.dirs.length;
  const pooled = [];
  let misses = 0;
  for (let i = 0; i < N; i++) {
    await eventually(async () => (await Templates.get('minimal', conn)).pool.ready === POOL, { tries: 600, everyMs: 50 });
    const r = await ttfc({ env: { RUN: String(i) } });
    if (r.sb.info.createTimings.source !== 'pool') misses++;
    pooled.push(r.ms);
    await r.sb.kill();
  }
  add(`create + \`true\` from a warm pool (SDK; ${misses} of ${N} missed the pool)`, pooled, 'restored from the template snapshot (above)', restore, 'p50 ≤ 60 ms');
  await Templates.setPool('minimal', 0, conn);

  // 4. 20 creates at once vs one after another (no pool: every one is a restore).
  const C = 20;
  let t = now();
  const seq = [];
  for (let i = 0; i < C; i++) seq.push(await ttfc());
  const seqTotal = now() - t;
  for (const r of seq) await r.sb.kill();
  t = now();
  const conc = await Promise.all(Array.from({ length: C }, () => ttfc()));
  const concTotal = now() - t;
  for (const r of conc) await r.sb.kill();
  add(`${C} concurrent creates + \`true\`, latency of each`, conc.map((r) => r.ms), `${C} sequential, latency of each`, seq.map((r) => r.ms), 'p95 reported');

  const lines = [
    '| measurement | p50 ms | p95 ms | baseline (same run) | baseline p50 ms | ratio | target |',
    '|---|---|---|---|---|---|---|',
    ...rows.map((r) => `| ${r.name} | ${fmt(r.p50)} | ${fmt(r.p95)} | ${r.baseName ?? '—'} | ${r.bp50 !== undefined ? fmt(r.bp50) : '—'} | ${r.bp50 ? `${(r.p50 / r.bp50).toFixed(2)}x` : '—'} | ${r.target} |`),
    `| ${C} creates: total time | ${fmt(concTotal)} concurrent | | ${C} sequential | ${fmt(seqTotal)} | throughput ${(seqTotal / concTotal).toFixed(2)}x | ≥ 1.3x |`,
    `| host memory per pooled sandbox (idle, running) | ${(perRss / 1048576).toFixed(1)} MiB RSS | | its cgroup's usage | ${(perCg / 1048576).toFixed(1)} MiB | | reported |`,
  ];
  const table = lines.join('\n');
  console.log(table);
  if (values.write) {
    writeSection('templates', 'Fast start: template snapshots, warm pools, concurrent creates (issue 3)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores, ${N} iterations each, with \`node scripts/bench-templates.mjs --write\` (part of \`./space bench\`). The bare baseline restores the very image creates restore, with the same bundle (minus the daemon's socket and cgroup) in a netns with one veth and \`--network=sandbox\` (what any networked runsc sandbox needs; SPACE adds its nftables rules, the agent's identity and trust store), and runs \`/bin/true\` with \`runsc exec\`; the same without any network is reported too.\n\n${table}`);
  }
} finally {
  const st = path.join(bareRoot, 'state');
  for (const id of (spawnSync('runsc', ['--root', st, 'list', '-quiet'], { encoding: 'utf8' }).stdout ?? '').split('\n').filter(Boolean)) {
    spawnSync('runsc', ['--root', st, 'kill', id, 'KILL'], { stdio: 'ignore' });
    spawnSync('runsc', ['--root', st, 'delete', '--force', id], { stdio: 'ignore' });
  }
  await stopSpaced(spaced);
  rmSync(dataDir, { recursive: true, force: true });
}
