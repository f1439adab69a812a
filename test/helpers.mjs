// Shared test fixtures: a real daemon (real runsc, real SQLite, real sockets) on a loopback
// port in a fresh data directory, and leak checks. Every sandbox a test makes is killed.
import assert from 'node:assert/strict';
import { execFile, execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, existsSync, fstatSync, fsyncSync, mkdirSync, mkdtempSync, openSync, readFileSync, readSync, readdirSync, readlinkSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { defaultWorkDir, startDaemon, templateImagesDir } from '../packages/server/dist/index.js';
import { Sandbox, SpaceError } from '../packages/sdk/dist/index.js';

/** Template cache shared by test daemons so `base` is built once per machine. */
export const TEMPLATES_DIR = process.env.SPACE_TEMPLATES_DIR ?? '/var/cache/space/templates';
// Every disk pool a test daemon makes takes its size on the host at once (docs/disks.md, "The
// pool's size"): 8 GiB each, not the default 32, so that the two lanes' daemons fit side by side.
process.env.SPACE_DISK_POOL_SIZE ??= '8G';

/**
 * The sandbox network of a test daemon: a /24 of its own, derived from its data directory, so
 * daemons side by side do not share a proxy address and a restarted one finds its links again.
 * The suite's two lanes (SPACE_TEST_LANE 0 and 1, scripts/test.mjs) draw from disjoint halves
 * of 10.232.0.0/13, so daemons of files running side by side never meet.
 */
export function egressRange(dataDir) {
  const known = rangeOf.get(dataDir);
  if (known) return known;
  // Two daemons of one file drawing the same /24 (1 in ~1,000 per pair: seen in CI, a cluster
  // file's third node refused with EADDRINUSE): the later one draws again.
  for (let i = 0; ; i++) {
    const h = createHash('sha256').update(i ? `${dataDir}#${i}` : dataDir).digest();
    const lane = process.env.SPACE_TEST_LANE;
    const range = lane === '0' || lane === '1' ? `10.${232 + Number(lane) * 4 + (h[0] % 4)}.${h[1]}.0/24` : `10.${232 + (h[0] % 8)}.${h[1]}.0/24`;
    if ([...rangeOf.values()].includes(range)) continue;
    rangeOf.set(dataDir, range);
    return range;
  }
}

/** The ranges this process's daemons were given, by data directory (a restarted daemon gets its own again). */
const rangeOf = new Map();

/**
 * Starts a daemon for one test file.
 * @returns {{ url, key, conn, dataDir, daemon, track(sb), create(opts), close() }}
 */
export async function startTestDaemon(opts = {}) {
  const dataDir = mkdtempSync('/tmp/spt-');
  makeNodeKey(dataDir);
  const daemon = await startDaemon({ dataDir, listen: '127.0.0.1:0', templatesDir: TEMPLATES_DIR, logLevel: process.env.SPACE_TEST_LOG ?? 'warn', ...opts, egress: { range: egressRange(dataDir), ...(opts.egress ?? {}) } });
  const key = readFileSync(daemon.state.keyFile, 'utf8').trim();
  const conn = { apiUrl: daemon.url, apiKey: key };
  const made = [];
  const fx = {
    url: daemon.url,
    key,
    conn,
    dataDir,
    daemon,
    track(sb, c = conn) {
      made.push({ id: sb.id ?? sb, conn: c });
      return sb;
    },
    async create(o = {}, c = conn) {
      const sb = await Sandbox.create({ ...c, memoryMb: 256, ...o });
      return fx.track(sb, c);
    },
    async close() {
      for (const m of made) await Sandbox.kill(m.id, m.conn).catch(() => {});
      // (fx.daemon: a test may have restarted it in the same data directory)
      await fx.daemon.close();
      const leaks = [...closeVolumes(dataDir), ...(await closeDiskPoolSettled(dataDir)), ...leftovers(dataDir, made.map((m) => m.id)), ...spareNetns(dataDir).map((n) => `spare netns ${n}`)];
      // SPACE_TEST_KEEP=1 keeps the data directory (runsc logs, database) to debug a failure.
      if (!process.env.SPACE_TEST_KEEP) rmSync(dataDir, { recursive: true, force: true });
      return leaks;
    },
  };
  return fx;
}

/**
 * Every regular file under `dir` as it is at rest: not through mounted file systems (with disks
 * on, the pool and its vault are mounted under `disks/`, and open volumes under `volumes/`:
 * live views, like a sandbox's memory; their image files are what is on the node's disk), and
 * skipping the agent's runtime copy (the host's own node binary). Files gone meanwhile are skipped.
 */
export function filesAtRest(dir, out = [], mounts = new Set(readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]))) {
  let entries;
  try {
    entries = readdirSync(dir, { withFileTypes: true });
  } catch (err) {
    if (err.code === 'ENOENT') return out;
    throw err;
  }
  for (const e of entries) {
    const p = path.join(dir, e.name);
    if (e.isDirectory() && !mounts.has(p) && !(dir.endsWith(path.sep + path.basename(dir)) && e.name === 'runtime')) filesAtRest(p, out, mounts);
    else if (e.isFile()) out.push(p);
  }
  return out;
}

const SCAN_CHUNK = 64 * 1024 * 1024;

/** The byte ranges of `file` that hold data (its extents, from `filefrag`): a sparse image's holes are skipped. */
function dataRanges(file) {
  const out = execFileSync('filefrag', ['-e', '-b4096', file], { encoding: 'utf8' });
  const ranges = [];
  // Extents allocated but never written (`fallocate`: a disk pool's reserved room) read as zeros.
  for (const m of out.matchAll(/^\s*\d+:\s*(\d+)\.\.\s*(\d+):.*$/gm)) {
    if (/\bunwritten\b/.test(m[0])) continue;
    const [start, end] = [Number(m[1]) * 4096, (Number(m[2]) + 1) * 4096];
    const last = ranges.at(-1);
    if (last && last[1] === start) last[1] = end;
    else ranges.push([start, end]);
  }
  return ranges;
}

/**
 * The bytes of `file`: whole, or for a file larger than 64 MiB (a sparse disk or vault image, up
 * to the host disk's size) the data of its extents in 64 MiB pieces overlapping by 4 KiB. A file
 * gone meanwhile yields nothing.
 *
 * @example const holds = [...fileChunks(image)].some((b) => b.includes(marker));
 */
export function* fileChunks(file) {
  let fd;
  try {
    fd = openSync(file, 'r');
  } catch (err) {
    if (err.code === 'ENOENT') return; // a lock or temporary file of the runtime, gone since
    throw err;
  }
  try {
    const size = fstatSync(fd).size;
    if (size <= SCAN_CHUNK) {
      yield readFileSync(fd);
      return;
    }
    // Written out first: pages not yet allocated (delayed allocation) are in no extent.
    fsyncSync(fd);
    for (const [start, end] of dataRanges(file)) {
      for (let pos = start; pos < end; pos += SCAN_CHUNK - 4096) {
        const buf = Buffer.allocUnsafe(Math.min(SCAN_CHUNK, end - pos));
        yield buf.subarray(0, readSync(fd, buf, 0, buf.length, pos));
      }
    }
  } finally {
    closeSync(fd);
  }
}

/**
 * Every file of {@link filesAtRest} with its bytes ({@link fileChunks}): yields `[file, bytes]`.
 *
 * @example for (const [f, buf] of contentsAtRest(dataDir)) assert.equal(buf.indexOf(marker), -1, f);
 */
export function* contentsAtRest(dir) {
  for (const f of filesAtRest(dir)) for (const buf of fileChunks(f)) yield [f, buf];
}

/**
 * Unmounts the disk pool of a stopped daemon (`--disks on`) that made it in its data directory,
 * returning the sandbox disks still in it (leaks: every sandbox was killed). The pool stays
 * mounted after a daemon stops, as its sandboxes run on; a test's data directory goes. For a
 * daemon in another process (the wait blocks this one); {@link closeDiskPoolSettled} for one in
 * this process.
 */
export function closeDiskPool(dataDir) {
  const disks = [];
  for (const _ of closingPools(dataDir, disks)) execFileSync('sleep', ['0.1']);
  return disks;
}

/**
 * {@link closeDiskPool} for a daemon that ran in this process: waits without blocking it, as
 * what the daemon still had under way (a file it is closing in the pool's vault) finishes on
 * this process's event loop — a blocking wait would hold the vault busy for as long as it waits.
 */
export async function closeDiskPoolSettled(dataDir) {
  const disks = [];
  for (const _ of closingPools(dataDir, disks)) await new Promise((r) => setTimeout(r, 100));
  return disks;
}

/**
 * Unmounts the pools of `dataDir`, adding the disks left in them to `disks`; yields each time
 * a vault is still busy, for the caller to wait 100 ms its own way (throws after 1,200 waits).
 */
function* closingPools(dataDir, disks) {
  for (const dir of poolDirs(dataDir)) {
    disks.push(...unmountPool(dir));
    for (let i = 0; !tryUnmountVault(dir); i++) {
      if (i >= 1200) throw vaultBusy(dir);
      yield;
    }
  }
}

/** The pools a daemon keeps in its data directory: a second driver's (inside the default driver's directory) first. */
function poolDirs(dataDir) {
  return [path.join(dataDir, 'disks', 'microvm'), path.join(dataDir, 'disks', 'gvisor'), path.join(dataDir, 'disks')];
}

const mountedAt = (m) => readFileSync('/proc/self/mountinfo', 'utf8').split('\n').some((l) => l.split(' ')[4] === m);

/** Unmounts the btrfs of the pool in directory `dir`, returning the disks left in it; then writes its vault out. */
function unmountPool(dir) {
  const mnt = path.join(dir, 'mnt');
  let disks = [];
  if (mountedAt(mnt)) {
    disks = readdirSync(path.join(mnt, 'disks')).map((d) => `disk ${d}`);
    execFileSync('umount', [mnt]);
  }
  const vault = path.join(dir, 'vault');
  if (mountedAt(vault)) execFileSync('sync', ['-f', vault]);
  return disks;
}

/**
 * One try at unmounting the vault the pool's image is kept in (true when it is not mounted any
 * more). Its loop device lets go once the pool's writes are through it — on a loaded host more
 * than the 5 s this once waited (a CI run failed so, 2026-12-06), and more than 30 s after a
 * microVM battery wrote GiBs through the vault's software AES.
 */
function tryUnmountVault(dir) {
  const vault = path.join(dir, 'vault');
  if (!mountedAt(vault)) return true;
  try {
    execFileSync('umount', [vault], { stdio: 'pipe' });
    return true;
  } catch {
    return false;
  }
}

/** The error for a vault still busy after the wait, naming what holds it (open files, mappings, other mount namespaces). */
function vaultBusy(dir) {
  const vault = path.join(dir, 'vault');
  return new Error(`The disk pool's vault ${vault} is still busy after 2 minutes; held by: ${holdersOf(vault).join('; ') || 'nothing a process shows (a loop device?)'}; loop devices: ${execFileSync('losetup', ['-a'], { encoding: 'utf8' }).trim().replace(/\n/g, '; ')}`);
}

/**
 * The processes that hold `dir`: a descriptor or a mapping of a file under it, or a mount
 * namespace other than this process's where it is mounted. For the message of a busy unmount.
 */
export function holdersOf(dir) {
  const own = readlinkOr('/proc/self/ns/mnt');
  const out = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    const what = [];
    let fds = [];
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
    } catch {
      continue;
    }
    for (const target of fds.map((fd) => readlinkOr(`/proc/${pid}/fd/${fd}`))) if (target.startsWith(dir + '/')) what.push(`fd ${target}`);
    let maps = '';
    try {
      maps = readFileSync(`/proc/${pid}/maps`, 'utf8');
    } catch {
      // gone
    }
    for (const l of new Set(maps.split('\n').map((l) => l.slice(l.indexOf('/'))).filter((f) => f.startsWith(dir + '/')))) what.push(`maps ${l}`);
    const ns = readlinkOr(`/proc/${pid}/ns/mnt`);
    if (ns && ns !== own) {
      try {
        if (readFileSync(`/proc/${pid}/mountinfo`, 'utf8').split('\n').some((l) => (l.split(' ')[4] ?? '').startsWith(dir))) what.push(`mounted in its namespace ${ns}`);
      } catch {
        // gone
      }
    }
    if (!what.length) continue;
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim().slice(0, 120);
    } catch {
      // gone meanwhile
    }
    out.push(`${pid} (${cmd}): ${what.join(', ')}`);
  }
  return out;
}

function readlinkOr(p) {
  try {
    return readlinkSync(p);
  } catch {
    return '';
  }
}

/**
 * The work directory a daemon with the default settings uses (checkpoint images on their way):
 * in RAM without disks; with disks (the default on a node of its own), inside the disk pool's
 * encrypted vault (docs/disks.md, "At rest").
 */
export function workDirOf(dataDir) {
  const vault = path.join(dataDir, 'disks', 'vault', 'files', 'work');
  return existsSync(vault) ? vault : defaultWorkDir(dataDir);
}

/**
 * Removes a stopped daemon's data directory (its disk pool unmounted first, as the daemon leaves
 * it mounted), returning the sandbox disks still in the pool (leaks).
 */
export function removeDataDir(dataDir) {
  const leaks = closeDiskPool(dataDir);
  if (!process.env.SPACE_TEST_KEEP) rmDataDir(dataDir);
  return leaks;
}

/**
 * Removes a data directory and the daemon's directory in RAM that goes with it
 * (/dev/shm/spaced-<hash>: a clean stop removes it, a SIGKILLed daemon leaves it).
 */
function rmDataDir(dataDir) {
  rmSync(dataDir, { recursive: true, force: true });
  rmSync(path.dirname(templateImagesDir(dataDir)), { recursive: true, force: true });
}

/**
 * Unmounts the volumes of a stopped daemon still open (leaks: a volume is closed when the last
 * sandbox holding it ends), returning them.
 */
export function closeVolumes(dataDir) {
  const prefix = path.join(dataDir, 'volumes') + '/';
  const open = readFileSync('/proc/self/mountinfo', 'utf8').split('\n').map((l) => l.split(' ')[4]).filter((m) => m?.startsWith(prefix) && m.endsWith('/mnt'));
  for (const m of open) execFileSync('umount', [m]);
  return open.map((m) => `volume open at ${m}`);
}

/** Writes the node's encryption key into a data directory, as an operator (or `space up`) would. */
export function makeNodeKey(dataDir) {
  mkdirSync(path.join(dataDir, 'keys'), { recursive: true, mode: 0o700 });
  if (!existsSync(path.join(dataDir, 'keys', 'node.key'))) writeFileSync(path.join(dataDir, 'keys', 'node.key'), randomBytes(32), { mode: 0o600 });
}

/**
 * The spare link namespaces of the daemon of `dataDir` (`space-spare-<tag of its range>-<i>`):
 * its stop deletes them (checked when a test's daemon is closed); a killed daemon leaves them to
 * its next start.
 */
export function spareNetns(dataDir) {
  const rangeFile = path.join(dataDir, 'sandbox-net');
  if (!existsSync(rangeFile)) return [];
  const tag = createHash('sha256').update(readFileSync(rangeFile, 'utf8').trim()).digest('hex').slice(0, 4);
  return execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' }).split('\n').map((l) => l.split(' ')[0]).filter((n) => n.startsWith(`space-spare-${tag}-`));
}

/** Host resources still held for these sandbox ids (runsc containers, QEMU processes, netns, cgroups, mounts). */
export function leftovers(dataDir, ids) {
  const out = [];
  const pool = path.join(dataDir, 'disks', 'mnt');
  try {
    const list = JSON.parse(execFileSync('runsc', ['--root', path.join(dataDir, 'runsc'), 'list', '--format', 'json'], { encoding: 'utf8' }) || '[]') ?? [];
    for (const c of list) out.push(`runsc container ${c.id}`);
  } catch {
    // no state dir: nothing there
  }
  const netns = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8');
  for (const id of ids) {
    if (netns.includes(`space-${id}`)) out.push(`netns space-${id}`);
    for (const ctl of ['memory', 'cpu']) {
      const dir = `/sys/fs/cgroup/${ctl}/space`;
      if (existsSync(dir)) for (const d of readdirSync(dir)) if (d === id || d.startsWith(`${id}-`)) out.push(`cgroup ${ctl}/space/${d}`);
    }
    if (mounts.includes(id)) out.push(`mount of ${id}`);
    // (The disk pool itself stays mounted while its daemon runs and after: closeDiskPool.)
    if (existsSync(path.join(pool, 'disks', id))) out.push(`disk of ${id}`);
  }
  // The disk pool and its vault stay mounted after the daemon (closeDiskPool unmounts them).
  const poolMounts = new Set([pool, path.join(dataDir, 'disks', 'vault')]);
  if (mounts.split('\n').some((l) => l.split(' ')[4]?.startsWith(dataDir) && !poolMounts.has(l.split(' ')[4]))) out.push(`mount under ${dataDir}`);
  // microVM sandboxes: a QEMU process per sandbox, named space-vm-<id>, and its RAM file.
  for (const f of existsSync('/dev/shm') ? readdirSync('/dev/shm') : []) for (const id of ids) if (f.startsWith(`space-${id}-`)) out.push(`RAM file /dev/shm/${f}`);
  for (const f of existsSync('/run/space-vmm') ? readdirSync('/run/space-vmm') : []) for (const id of ids) if (f.endsWith(`-${id}`)) out.push(`VMM directory /run/space-vmm/${f}`);
  for (const pid of readdirSync('/proc').filter((d) => /^\d+$/.test(d))) {
    let cmd = '';
    try {
      cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8');
    } catch {
      continue;
    }
    for (const id of ids) if (cmd.includes(`process=space-vm-${id}\0`)) out.push(`VMM process ${pid} of ${id}`);
  }
  return out;
}

/** Collects an async iterable of Buffers into one Buffer. */
export async function readAll(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(Buffer.from(c));
  return Buffer.concat(chunks);
}

/** Raw API call returning { status, body }. */
export async function api(fx, method, p, { key = fx.key, json, body, headers = {} } = {}) {
  const res = await fetch(fx.url + p, {
    method,
    headers: { ...(key ? { authorization: `Bearer ${key}` } : {}), ...(json !== undefined ? { 'content-type': 'application/json' } : {}), ...headers },
    ...(json !== undefined ? { body: JSON.stringify(json) } : body !== undefined ? { body } : {}),
  });
  const text = await res.text();
  let parsed;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = text;
  }
  return { status: res.status, body: parsed, headers: res.headers };
}

/** Polls `fn` until it returns a truthy value (bounded by `tries`). */
export async function eventually(fn, { tries = 200, everyMs = 100 } = {}) {
  let last;
  for (let i = 0; i < tries; i++) {
    last = await fn();
    if (last) return last;
    await new Promise((r) => setTimeout(r, everyMs));
  }
  throw new Error(`condition not met after ${tries} tries (last: ${JSON.stringify(last)})`);
}

/** The CLI as users run it: the launcher `space` on the PATH points at. */
const CLI = new URL('../packages/cli/bin/space', import.meta.url).pathname;

/**
 * A `space` CLI runner with its own config home (SPACE_URL/SPACE_API_KEY cleared), like a new user.
 * @returns {(...args: string[]) => Promise<{ code: number, stdout: string, stderr: string }>} and `.env`
 */
export function cliRunner(home, extraEnv = {}) {
  // `space up` installs `space` on the PATH: into the test's own directory, never /usr/local/bin.
  const env = { ...process.env, XDG_CONFIG_HOME: home, SPACE_BIN_DIR: path.join(home, 'bin'), ...extraEnv };
  delete env.SPACE_CONTEXT;
  if (!('SPACE_URL' in extraEnv)) delete env.SPACE_URL;
  if (!('SPACE_API_KEY' in extraEnv)) delete env.SPACE_API_KEY;
  const run = (...args) =>
    new Promise((resolve) => {
      execFile(CLI, args, { env, timeout: 900_000 }, (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr }));
    });
  /**
   * Runs the CLI in a terminal of its own (util-linux `script`; one that reports no size), typing
   * `input` into it; resolves with the exit code and what the terminal showed (CRs removed).
   * @example await space.inTerminal('echo hi\nexit 7\n', 'shell', id) // { code: 7, output: '…hi…' }
   */
  run.inTerminal = (input, ...args) =>
    new Promise((resolve, reject) => {
      const cmd = [CLI, ...args].map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' ');
      const p = spawn('script', ['-qefc', cmd, '/dev/null'], { env, stdio: ['pipe', 'pipe', 'pipe'], timeout: 120_000 });
      let output = '';
      p.stdout.on('data', (d) => (output += d));
      p.stderr.on('data', (d) => (output += d));
      p.on('error', reject);
      p.on('close', (code) => resolve({ code, output: output.replace(/\r/g, '') }));
      p.stdin.end(input);
    });
  return run;
}

const SPACED = new URL('../packages/server/dist/main.js', import.meta.url).pathname;

/**
 * Starts `spaced` as its own process (for SIGKILL/restart tests) and waits for its state file.
 * @returns {Promise<{ child, exited: Promise<{code, sig}>, conn }>}
 */
export async function startSpaced(dataDir, env = {}) {
  makeNodeKey(dataDir);
  const child = spawn(process.execPath, [SPACED, '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR, '--log-level', 'warn'], { stdio: ['ignore', 'ignore', 'inherit'], env: { ...process.env, SPACE_SANDBOX_NET: egressRange(dataDir), ...env } });
  const exited = new Promise((r) => child.on('exit', (code, sig) => r({ code, sig })));
  // Until it says it is up, or ends: bounded by 2 minutes, not by how busy the host is (a start
  // recovers sandboxes and opens the disk pool; 20 s was once not enough on a loaded CI host).
  // A daemon that never comes up is killed: left running, it would hold the test file open.
  const state = await eventually(() => {
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`spaced ended before it was up (${child.exitCode ?? child.signalCode}); its log is on stderr above`);
    try {
      const st = JSON.parse(readFileSync(path.join(dataDir, 'spaced.json'), 'utf8'));
      return st.pid === child.pid ? st : undefined;
    } catch {
      return undefined;
    }
  }, { tries: 1200 }).catch((err) => {
    child.kill('SIGKILL');
    throw err;
  });
  const conn = { apiUrl: state.url, apiKey: readFileSync(state.keyFile, 'utf8').trim() };
  return { child, exited, conn };
}

/**
 * A daemon that crash tests SIGKILL and start again over one data directory. `finish()` kills
 * the sandboxes in `ids`, stops the daemon, and returns what was left behind (open volumes, a
 * mounted disk pool, runtime resources), removing the data directory.
 *
 * @example
 * const h = crashableSpaced('/tmp/spkv-');
 * await h.start();
 * await h.kill();
 * await h.start({ SPACE_FAULT_INJECT: 'volume-snapshot:frozen' });
 * assert.deepEqual(await h.finish(), []);
 */
export function crashableSpaced(prefix, baseEnv = {}) {
  const dataDir = mkdtempSync(prefix);
  const alive = () => h.d && h.d.child.exitCode === null && h.d.child.signalCode === null;
  const h = {
    dataDir,
    ids: new Set(),
    d: undefined,
    async start(env = {}) {
      return (h.d = await startSpaced(dataDir, { ...baseEnv, ...env }));
    },
    async kill() {
      if (alive()) h.d.child.kill('SIGKILL');
      await h.d.exited;
    },
    async finish() {
      if (alive()) {
        for (const id of h.ids) await Sandbox.kill(id, h.d.conn).catch(() => {});
        h.d.child.kill('SIGTERM');
        await h.d.exited;
      } else {
        // Killed last: what its next start would have deleted.
        for (const n of spareNetns(dataDir)) execFileSync('ip', ['netns', 'del', n]);
      }
      const leaks = [...closeVolumes(dataDir), ...closeDiskPool(dataDir), ...leftovers(dataDir, [...h.ids]), ...spareNetns(dataDir).map((n) => `spare netns ${n}`)];
      if (!process.env.SPACE_TEST_KEEP) rmDataDir(dataDir);
      return leaks;
    },
  };
  return h;
}

/**
 * Stops a daemon started with {@link startSpaced} after killing every sandbox it has (a stopped
 * daemon leaves its sandboxes running for re-adoption; a benchmark or test that failed midway
 * must not leave them behind).
 */
export async function stopSpaced(d) {
  try {
    for (const sb of (await Sandbox.list({ ...d.conn, limit: 1000 })).items) if (sb.state !== 'killed' && sb.state !== 'dead') await Sandbox.kill(sb.id, d.conn).catch(() => {});
  } catch {
    // the daemon is gone already
  }
  await new Promise((r) => {
    if (d.child.exitCode !== null || d.child.signalCode !== null) return r();
    d.child.on('exit', r);
    d.child.kill('SIGTERM');
  });
}

/**
 * The code of the SpaceError a promise rejects with; fails the test when it resolves or rejects
 * with anything else.
 * @example assert.equal(await rejectionCode(Volumes.get('nope', conn)), 'VOLUME_NOT_FOUND');
 */
export async function rejectionCode(p) {
  try {
    await p;
  } catch (err) {
    assert.ok(err instanceof SpaceError, String(err));
    return err.code;
  }
  assert.fail('expected a rejection');
}
