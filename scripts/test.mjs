#!/usr/bin/env node
// Runs the whole suite with node's test runner, one file at a time (sandboxes are heavy on
// 2 cores), the fast lane first. Pass test files to run only those: ./space test test/api.test.mjs;
// --fast runs the fast lane alone (~15 s): ./space test --fast
// Afterwards, every network namespace and cgroup a sandbox had must be gone: anything new
// under `space-*` netns or the `space` cgroups fails the run, whichever test leaked it (what a
// daemon still running beside the suite holds is its own, not a leak).
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';

// The fast lane first: seconds, no runtime (the fake driver, the protocol, the stores, the
// import-cycle check), so a broken core fails the run before the real-runtime suites start.
export const FAST = ['import-cycles', 'cli-launcher', 'lifecycle-fake', 'crash-fake', 'volumes-fake', 'ingress', 'protocol', 'store', 'store-postgres', 'blob-store', 'nodes', 'snapshot-store'].map((n) => `test/${n}.test.mjs`);
const all = readdirSync(new URL('../test/', import.meta.url)).filter((f) => f.endsWith('.test.mjs')).sort().map((f) => `test/${f}`);
const files = all;
const fastOnly = process.argv[2] === '--fast';
const only = fastOnly ? FAST : process.argv.slice(2);

/** Host resources of sandboxes: `space-*` network namespaces, `space/*` cgroups, mounted disk pools, open volumes; and the tests' PostgreSQL and Swift servers. */
function sandboxResources() {
  const netns = (spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout ?? '').split('\n').map((l) => l.split(' ')[0]).filter((n) => n?.startsWith('space-')).map((n) => `netns ${n}`);
  const cgroups = ['memory', 'cpu'].flatMap((c) => {
    const d = `/sys/fs/cgroup/${c}/space`;
    return existsSync(d) ? readdirSync(d, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => `cgroup ${c}/space/${e.name}`) : [];
  });
  // Disk pools (--disks on) of test daemons: each unmounts its own when it closes.
  const pools = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m?.endsWith('/disks/mnt')).map((m) => `disk pool mounted at ${m}`);
  // Open volumes: a volume is closed (unmounted) when no sandbox holds it.
  const volumes = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => /\/volumes\/vol-[a-z0-9]+\/mnt$/.test(m ?? '')).map((m) => `volume open at ${m}`);
  // Throwaway PostgreSQL servers of the tests (test/postgres.mjs): each test stops its own.
  const procs = (spawnSync('ps', ['-eo', 'args'], { encoding: 'utf8' }).stdout ?? '').split('\n');
  const postgres = procs.filter((l) => /postgres -D \/tmp\/spt-pg-/.test(l)).map((l) => `PostgreSQL still running: ${l.trim()}`);
  // … and their object stores (test/s3-server.mjs).
  const swift = procs.filter((l) => /swift-[a-z]+-server \/tmp\/spt-s3-/.test(l)).map((l) => `Swift still running: ${l.trim()}`);
  return new Set([...netns, ...cgroups, ...pools, ...volumes, ...postgres, ...swift]);
}

const before = sandboxResources();
// A file may take up to 30 min: the workload battery boots both drivers' `base` (~11 min warm;
// more when the agent changed and the microVM's template is taken again).
const runFiles = (list) => spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-timeout=1800000', ...list], { stdio: 'inherit' });
let r;
if (only.length) r = runFiles(only);
else {
  // Node's runner orders the files it is given, so the fast lane is a run of its own, first;
  // a broken core fails here in seconds instead of half an hour in.
  r = runFiles(FAST);
  if (r.status === 0) r = runFiles(files.filter((f) => !FAST.includes(f)));
}
/**
 * Sandbox ids another daemon on this host still holds (a `spaced` process that outlives the
 * suite, e.g. the user's own, busy beside it): each keeps a directory per sandbox under its data
 * directory, made before the sandbox's netns and cgroups and removed after them.
 */
function othersSandboxes() {
  const ids = new Set();
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let argv;
    try {
      argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    } catch {
      continue;
    }
    if (!argv.some((a) => a.endsWith('server/dist/main.js'))) continue;
    const i = argv.indexOf('--data-dir');
    const dataDir = i >= 0 ? argv[i + 1] : '/var/lib/space';
    for (const sub of ['sandboxes', 'microvm/boxes']) {
      const d = `${dataDir}/${sub}`;
      if (existsSync(d)) for (const id of readdirSync(d)) ids.add(id);
    }
  }
  return ids;
}

// Listed before and after the other daemons' sandboxes: what is in both lists existed all along,
// so its directory did too when they were read (a busy daemon creating and killing sandboxes in
// the meantime is no leak of the suite's).
const first = sandboxResources();
const others = othersSandboxes();
const second = sandboxResources();
const leaked = [...first].filter((x) => second.has(x) && !before.has(x) && ![...others].some((id) => x.includes(`space-${id}`) || x.includes(`/space/${id}`)));
if (leaked.length) {
  console.error(`\nLEAK: the suite left these sandbox resources behind:\n  ${leaked.join('\n  ')}`);
  process.exit(1);
}
process.exit(r.status ?? 1);
