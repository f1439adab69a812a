// What every benchmark script shares: percentiles, a wait for a quiet host, and writing its table into
// docs/benchmarks.md between its markers.
import { randomBytes } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import path from 'node:path';
import { KeyService, LocalKeyProvider } from '../packages/core/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';

/** The p-th percentile of `xs` (nearest rank). */
export const quantile = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

/**
 * Replaces the block `<!-- name:start --> … <!-- name:end -->` of docs/benchmarks.md with
 * `body`; if the file has no such block yet, adds it under `## heading` before "Reading the numbers".
 */
export function writeSection(name, heading, body) {
  const file = new URL('../docs/benchmarks.md', import.meta.url);
  const doc = readFileSync(file, 'utf8');
  const block = `<!-- ${name}:start -->\n${body}\n<!-- ${name}:end -->`;
  const re = new RegExp(`<!-- ${name}:start -->[\\s\\S]*<!-- ${name}:end -->`);
  writeFileSync(file, re.test(doc) ? doc.replace(re, () => block) : doc.replace('### Reading the numbers', `## ${heading}\n\n${block}\n\n### Reading the numbers`));
}

/** A metadata store and a started KeyService in `dir`, under a fresh node key (what the daemon has). */
export async function openKeys(dir) {
  mkdirSync(path.join(dir, 'keys'), { recursive: true });
  writeFileSync(path.join(dir, 'keys', 'node.key'), randomBytes(32));
  const store = SqliteStore.open(path.join(dir, 'space.db'));
  const logger = { info() {}, warn() {}, error() {}, debug() {} };
  const keys = new KeyService({ store, providers: [new LocalKeyProvider(path.join(dir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger });
  await keys.start();
  return { store, keys };
}

/**
 * The OCI config of a bare runsc container beside SPACE's: the template's rootfs and the node
 * runtime SPACE mounts at /.space, running `args` (by default the agent's Node, idle) as root,
 * without agent, API or network; `cgroupsPath` puts it in cgroups of its own.
 * @example writeFileSync(path.join(bundle, 'config.json'), JSON.stringify(bareOciConfig({ rootfs, runtimeDir, name: 'b0' })));
 */
export function bareOciConfig({ rootfs, runtimeDir, name, memoryMb = 256, cgroupsPath, args = ['/.space/lib/ld-linux-x86-64.so.2', '--library-path', '/.space/lib', '/.space/node', '--single-threaded', '-e', 'setInterval(() => {}, 1000)'] }) {
  return {
    ociVersion: '1.0.0',
    process: { user: { uid: 0, gid: 0 }, args, env: ['PATH=/bin'], cwd: '/' },
    root: { path: rootfs, readonly: false },
    hostname: name,
    mounts: [{ destination: '/proc', type: 'proc', source: 'proc' }, { destination: '/.space', type: 'bind', source: runtimeDir, options: ['rbind', 'ro'] }],
    linux: { namespaces: [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }], resources: { memory: { limit: memoryMb * 1048576 } }, ...(cgroupsPath ? { cgroupsPath } : {}) },
  };
}

/**
 * The root file system of a built-in template in a templates directory (`<name>-<hash of its
 * recipe>/rootfs`, the newest if several).
 * @example templateRootfs(TEMPLATES_DIR, 'minimal') // '/var/cache/space/templates/minimal-15dbde3573da/rootfs'
 */
export function templateRootfs(templatesDir, name) {
  const dirs = readdirSync(templatesDir).filter((d) => d.startsWith(`${name}-`)).map((d) => path.join(templatesDir, d, 'rootfs'));
  const found = dirs.sort((a, b) => statSync(b).mtimeMs - statSync(a).mtimeMs)[0];
  if (!found) throw new Error(`no ${name} template under ${templatesDir}: start a daemon with --templates-dir ${templatesDir} once to build it`);
  return found;
}

/** The node runtime a daemon in `dataDir` prepared (what SPACE mounts at /.space in its sandboxes). */
export function runtimeDirOf(dataDir) {
  return path.join(dataDir, 'runtime', readdirSync(path.join(dataDir, 'runtime')).find((d) => !d.includes('.tmp')));
}

/**
 * Waits until the host's CPUs have been mostly idle for a second (under a fifth of one core
 * busy; at most `timeoutMs`): a daemon just started takes its template snapshots and fills its
 * warm pools in the background, which would otherwise land in the first measurements. Returns
 * whether it got quiet; a caller measures anyway, and says so.
 */
export async function untilHostQuiet(timeoutMs = 120_000) {
  const busy = () => {
    const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].split(/\s+/).slice(1).map(Number);
    return { busy: f.reduce((a, b) => a + b, 0) - f[3] - f[4], all: f.reduce((a, b) => a + b, 0) };
  };
  const cores = availableParallelism();
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const a = busy();
    await new Promise((r) => setTimeout(r, 1000));
    const b = busy();
    if (((b.busy - a.busy) / (b.all - a.all)) * cores < 0.2) return true;
  }
  return false;
}
