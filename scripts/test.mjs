#!/usr/bin/env node
// Runs the whole suite with node's test runner: the fast lane first (seconds, no runtime), then
// the real-runtime files in two lanes side by side, each lane one file at a time (sandboxes are
// heavy on 2 cores): lane 1 the microVM files (QEMU, emulated where there is no KVM), the
// crash loop, the workload battery, the cluster and E2B files, lane 2 the other gVisor files —
// about 36 minutes each here (the table at the end of a run gives each file's time, to
// rebalance by).
// Pass test files to run only those, one at a time: ./space test test/api.test.mjs; --fast runs
// the fast lane alone (~30 s): ./space test --fast; SPACE_TEST_LANES=1 runs the real-runtime
// files one at a time in a single lane.
// Afterwards, every network namespace and cgroup a sandbox had must be gone: anything new
// under `space-*` netns or the `space` cgroups fails the run, whichever test leaked it (what a
// daemon still running beside the suite holds is its own, not a leak).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { createInterface } from 'node:readline';

// The fast lane first: seconds, no runtime (the fake driver, the protocol, the stores, the
// import-cycle check), so a broken core fails the run before the real-runtime suites start.
export const FAST = ['import-cycles', 'cli-launcher', 'lifecycle-fake', 'crash-fake', 'cluster-fake', 'lease-keeper', 'e2b-access', 'console-session', 'disks-mode', 'deploy', 'volumes-fake', 'ingress', 'protocol', 'store', 'store-postgres', 'blob-store', 'nodes', 'snapshot-store', 'sandbox-net', 'usage-history'].map((n) => `test/${n}.test.mjs`);
/**
 * Lane 1: the files that boot microVMs — the only users of the microVM guest cache
 * (/var/cache/space/microvm), which therefore never sees two builders — and gVisor files that
 * even the lanes out. Measured in a CI run on a clean clone (2026-12-07): lane 1 29 min
 * (workloads 11.6, crash-lifecycle 8.6, microvm 3.3, ingress-sandbox 2.9, conformance-microvm 1.5,
 * console 1.3), lane 2 ~43 min, the run 45 min; so the cluster (4.1 min) and E2B (3.1 min) files
 * moved here. The next run on a clean clone (2026-12-08) took 67 min: lane 1 60 min (workloads
 * 18, crash-lifecycle 17.5, microvm 6.1, E2B 5.5, cluster 5.2, ingress-sandbox 3.2,
 * conformance-microvm 2.9, console 1.7), lane 2 33 min. The host ran lane 1's two longest files
 * twice as slowly as the day before; the cluster and E2B files went back to lane 2, for ~48 and
 * ~44 min at that speed.
 */
export const LANE_ONE = ['workloads', 'conformance-microvm', 'microvm', 'ingress-sandbox', 'crash-lifecycle', 'console'].map((n) => `test/${n}.test.mjs`);
const all = readdirSync(new URL('../test/', import.meta.url)).filter((f) => f.endsWith('.test.mjs')).sort().map((f) => `test/${f}`);
const fastOnly = process.argv[2] === '--fast';
const only = fastOnly ? FAST : process.argv.slice(2);
const LANES = Number(process.env.SPACE_TEST_LANES ?? 2);

/** Host resources of sandboxes: `space-*` network namespaces, `space/*` cgroups, mounted disk pools, open volumes; and the tests' PostgreSQL and Swift servers. */
function sandboxResources() {
  const netns = (spawnSync('ip', ['netns', 'list'], { encoding: 'utf8' }).stdout ?? '').split('\n').map((l) => l.split(' ')[0]).filter((n) => n?.startsWith('space-')).map((n) => `netns ${n}`);
  const cgroups = ['memory', 'cpu'].flatMap((c) => {
    const d = `/sys/fs/cgroup/${c}/space`;
    return existsSync(d) ? readdirSync(d, { withFileTypes: true }).filter((e) => e.isDirectory()).map((e) => `cgroup ${c}/space/${e.name}`) : [];
  });
  // Disk pools (--disks on) of test daemons: each unmounts its own when it closes.
  const pools = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m?.endsWith('/disks/mnt') || m?.endsWith('/disks/vault')).map((m) => `disk pool mounted at ${m}`);
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
const testArgs = ['--test', '--test-concurrency=1', '--test-timeout=1800000'];
const runFiles = (list) => spawnSync(process.execPath, [...testArgs, ...list], { stdio: 'inherit' });

/**
 * Runs `list` one file at a time, each line of output prefixed with the lane's name; resolves
 * to each file's result and wall time. `lane` (0, 1) is the tests' SPACE_TEST_LANE: the lanes'
 * daemons take their sandbox networks from disjoint ranges (test/helpers.mjs, egressRange).
 */
async function runLane(name, lane, list) {
  const results = [];
  for (const file of list) {
    const started = Date.now();
    const child = spawn(process.execPath, [...testArgs, file], { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, SPACE_TEST_LANE: String(lane) } });
    const lines = [];
    for (const stream of [child.stdout, child.stderr]) {
      createInterface({ input: stream }).on('line', (line) => {
        lines.push(line);
        console.log(`[${name}] ${line}`);
      });
    }
    const code = await new Promise((resolve) => child.on('close', (c, sig) => resolve(c ?? (sig ? 128 : 1))));
    results.push({ file, lane: name, seconds: (Date.now() - started) / 1000, ok: code === 0, failures: code === 0 ? [] : failures(lines) });
  }
  return results;
}

/**
 * The failed tests in a file's TAP output, each with its YAML block (error, expected, actual,
 * stack), so the end of a long run says why a file failed without scrolling back through the
 * lanes' interleaved output. Suites failed only by their subtests are left out.
 */
function failures(lines) {
  const out = [];
  for (let i = 0; i < lines.length; i++) {
    const m = /^(\s*)not ok \d+ - (.*)$/.exec(lines[i]);
    if (!m) continue;
    const block = [];
    for (let j = i + 1; j < lines.length && lines[j] !== `${m[1]}  ...`; j++) block.push(lines[j]);
    if (block.some((l) => /failureType: 'subtestsFailed'/.test(l))) continue;
    out.push([`not ok - ${m[2]}`, ...block.slice(0, 40).map((l) => l.slice(m[1].length))].join('\n'));
  }
  // What failed outside any test (a crash before the first one, an uncaught error) is in the tail.
  return out.length ? out : [lines.slice(-30).join('\n')];
}

/**
 * Builds the built-in templates' root file systems into the shared cache before the lanes
 * start, so two daemons never build the same one at once (a build replaces the directory).
 */
async function warmTemplates() {
  const { RootfsStore } = await import('../packages/templates/dist/index.js');
  const store = new RootfsStore(process.env.SPACE_TEMPLATES_DIR ?? '/var/cache/space/templates');
  for (const name of ['minimal', 'base']) {
    const key = store.builtinKey(name);
    if (store.has(key)) continue;
    const t = Date.now();
    console.log(`# building the ${name} template's root file system for the suite (once per machine)`);
    await store.build(key, { type: 'builtin', name });
    console.log(`# ${name} built in ${((Date.now() - t) / 1000).toFixed(0)} s`);
  }
}

let status;
if (only.length) status = runFiles(only).status;
else {
  // Node's runner orders the files it is given, so the fast lane is a run of its own, first;
  // a broken core fails here in seconds instead of half an hour in.
  status = runFiles(FAST).status;
  if (status === 0) {
    const rest = all.filter((f) => !FAST.includes(f));
    const started = Date.now();
    let results;
    if (LANES >= 2) {
      await warmTemplates();
      const lanes = await Promise.all([runLane('lane 1', 0, rest.filter((f) => LANE_ONE.includes(f))), runLane('lane 2', 1, rest.filter((f) => !LANE_ONE.includes(f)))]);
      results = lanes.flat();
    } else results = await runLane('all', 0, rest);
    console.log(`\n# real-runtime files (${LANES >= 2 ? 'two lanes' : 'one lane'}), ${((Date.now() - started) / 60000).toFixed(1)} min in all:`);
    for (const r of [...results].sort((a, b) => b.seconds - a.seconds)) console.log(`#  ${r.ok ? 'ok  ' : 'FAIL'} ${r.seconds.toFixed(0).padStart(5)} s  ${r.lane.padEnd(7)} ${r.file}`);
    const failed = results.filter((r) => !r.ok);
    for (const r of failed) for (const f of r.failures) console.log(`\n# ${r.file}:\n${f.replace(/^/gm, '#   ')}`);
    if (failed.length) console.log(`# ${failed.length} file(s) failed: ${failed.map((r) => r.file).join(', ')}`);
    status = failed.length ? 1 : 0;
  }
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
process.exit(status ?? 1);
