/**
 * File metadata: short string pairs attached to a file (E2B's `files.write(…, {metadata})`),
 * kept in the file's extended attributes so they follow it through renames and into snapshots
 * and forks. Node has no call for extended attributes, so the static helper does the system
 * calls (`space-helper meta serve`, native/helper.c). Starting a process costs ~25 ms in
 * gVisor (measured: a stat went from 6 to 30 ms with one a call), so one helper is started on
 * first use and kept: requests go down its stdin, one reply line each comes back in order. It
 * is part of the sandbox's process tree, so it is in snapshots too; if it dies, the next
 * request starts another.
 *
 * Where the file system has no extended attributes — a sandbox disk, whose files gVisor's gofer
 * serves without them in this runsc — the metadata is kept beside the file instead
 * (a {@link SIDECAR} directory at the root of the file's file system): a hard link to the file (it follows every rename, inside the sandbox or
 * through the API, and goes into snapshots and forks with the disk) and a JSON file of its
 * pairs. A file whose only name left is the hard link was deleted: its entry is removed at the
 * next write of metadata.
 */
import { spawn, type ChildProcessWithoutNullStreams } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { AGENT_RUNTIME_DIR } from '@space/protocol';
import { AgentError } from './processes.js';

const HELPER = `${AGENT_RUNTIME_DIR}/space-helper`;
/** Runtimes older than the helper have none: their files have no metadata to read. */
const hasHelper = existsSync(HELPER);
const TIMEOUT_MS = 30_000;
/** What a key may hold: an HTTP token (it travels as an `X-Metadata-KEY` header). */
const KEY = /^[A-Za-z0-9!#$%&'*+\-.^_`|~]{1,200}$/;
/** What a value may hold: printable ASCII (an HTTP header value). */
const VALUE = /^[\x20-\x7e]{0,4096}$/;
const MAX_KEYS = 64;

/** File metadata: keys are HTTP tokens, values printable ASCII. */
export type Metadata = Record<string, string>;

interface Waiter {
  resolve: (line: string) => void;
  reject: (err: Error) => void;
}

/** The running helper and the replies it owes, oldest first. */
let server: { child: ChildProcessWithoutNullStreams; waiting: Waiter[]; buffered: string } | undefined;

function start(): NonNullable<typeof server> {
  const child = spawn(HELPER, ['meta', 'serve'], { stdio: ['pipe', 'pipe', 'pipe'] });
  const s = { child, waiting: [] as Waiter[], buffered: '' };
  let stderr = '';
  child.stdout.setEncoding('utf8');
  child.stdout.on('data', (chunk: string) => {
    s.buffered += chunk;
    for (let nl = s.buffered.indexOf('\n'); nl >= 0; nl = s.buffered.indexOf('\n')) {
      const line = s.buffered.slice(0, nl);
      s.buffered = s.buffered.slice(nl + 1);
      s.waiting.shift()?.resolve(line);
    }
  });
  child.stderr.on('data', (c: Buffer) => (stderr = (stderr + c.toString()).slice(-2000)));
  child.stdin.on('error', () => {});
  const gone = (why: string) => {
    if (server === s) server = undefined;
    for (const w of s.waiting.splice(0)) w.reject(new AgentError('INTERNAL', `file metadata helper ${why}${stderr ? `: ${stderr.trim()}` : ''}`));
  };
  child.on('error', (err) => gone(`failed: ${err.message}`));
  child.on('exit', (code, signal) => gone(`exited (${signal ?? code})`));
  // It must never keep the agent's event loop alive on its own.
  child.unref();
  (child.stdout as unknown as { unref?: () => void }).unref?.();
  return s;
}

/** Sends one request (NUL-terminated fields) and resolves to its reply line. */
function request(fields: string[]): Promise<string> {
  const s = (server ??= start());
  return new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      // A helper that stops answering is replaced; its replies would come out of order.
      s.child.kill('SIGKILL');
      reject(new AgentError('TIMEOUT', `file metadata helper did not answer in ${TIMEOUT_MS} ms`));
    }, TIMEOUT_MS);
    s.waiting.push({
      resolve: (line) => (clearTimeout(timer), resolve(line)),
      reject: (err) => (clearTimeout(timer), reject(err)),
    });
    s.child.stdin.write(fields.map((f) => `${f}\0`).join(''));
  });
}

/**
 * Checks metadata a client sent; throws BAD_REQUEST naming the bad key or value.
 * @example checkMetadata({ owner: 'agent-7' }) // returns it
 */
export function checkMetadata(md: unknown): Metadata {
  if (typeof md !== 'object' || md === null || Array.isArray(md)) throw new AgentError('BAD_REQUEST', 'metadata must be an object of string values');
  const entries = Object.entries(md);
  if (entries.length > MAX_KEYS) throw new AgentError('BAD_REQUEST', `metadata has ${entries.length} keys; at most ${MAX_KEYS}`);
  for (const [k, v] of entries) {
    if (!KEY.test(k)) throw new AgentError('BAD_REQUEST', `metadata key ${JSON.stringify(k)}: use 1-200 letters, digits and !#$%&'*+-.^_\`|~`);
    if (typeof v !== 'string' || !VALUE.test(v)) throw new AgentError('BAD_REQUEST', `metadata value of ${JSON.stringify(k)}: use up to 4096 printable ASCII characters`);
  }
  return md as Metadata;
}

/** The metadata of each path (an empty object where there is none, or the path is gone). */
export async function readMetadata(paths: string[]): Promise<Metadata[]> {
  if (!hasHelper) return paths.map(() => ({}));
  const found = await Promise.all(
    paths.map(async (p) => {
      try {
        return JSON.parse(await request(['g', p])) as Metadata;
      } catch (err) {
        if (err instanceof SyntaxError) return {};
        throw err;
      }
    }),
  );
  // Files without extended attributes may have theirs beside them.
  if (!found.some((md) => Object.keys(md).length === 0)) return found;
  // Entries of one listing share their directory: its sidecar is looked for once.
  const sidecars = new Map<string, Promise<string | undefined>>();
  const indexes = new Map<string, Promise<Map<string, string>>>();
  return Promise.all(
    found.map(async (md, i) => {
      if (Object.keys(md).length) return md;
      const parent = path.dirname(paths[i]!);
      if (!sidecars.has(parent)) sidecars.set(parent, sidecarOf(parent).catch(() => undefined));
      const dir = await sidecars.get(parent);
      if (!dir || !existsSync(dir)) return md;
      if (!indexes.has(dir)) indexes.set(dir, sidecarIndex(dir));
      return (await sidecarEntry(dir, await indexes.get(dir)!, paths[i]!))?.md ?? {};
    }),
  );
}

/** Sets `md`'s keys on `p` (other keys stay). */
export async function writeMetadata(p: string, md: Metadata): Promise<void> {
  const pairs = Object.entries(md);
  if (pairs.length === 0) return;
  if (!hasHelper) throw new AgentError('BAD_REQUEST', 'This sandbox\'s runtime has no file metadata support (it predates it): write the file without metadata');
  const reply = await request(['s', p, String(pairs.length), ...pairs.flat()]);
  if (reply === 'ok') return;
  if (!/not supported/i.test(reply)) throw new AgentError('INTERNAL', `setting file metadata on ${p}: ${reply.replace(/^error: /, '')}`);
  await writeSidecar(p, md);
}

/**
 * Where the metadata of the files in directory `parent` is kept when their file system has no
 * extended attributes: a directory `.space-metadata` (root's only) at the root of the file
 * system `parent` is on — a hard link can only be made within one (`/tmp` is one of its own in
 * a sandbox).
 */
async function sidecarOf(parent: string): Promise<string> {
  let dir = await fs.realpath(parent);
  const { dev } = await fs.lstat(dir);
  while (dir !== '/' && (await fs.lstat(path.dirname(dir))).dev === dev) dir = path.dirname(dir);
  return path.join(dir, SIDECAR);
}

/** The sidecar directory's name: `<id>.link` (a hard link to the file) and `<id>.json` (its pairs). */
export const SIDECAR = '.space-metadata';

/** A sidecar directory's entries by the inode their link shares with the file (`dev:ino`, as this kernel numbers them now); `collect` removes those of deleted files. */
async function sidecarIndex(dir: string, collect = false): Promise<Map<string, string>> {
  const index = new Map<string, string>();
  const names = await fs.readdir(dir).catch(() => [] as string[]);
  await Promise.all(
    names.filter((n) => n.endsWith('.link')).map(async (n) => {
      const id = n.slice(0, -'.link'.length);
      const st = await fs.lstat(path.join(dir, n)).catch(() => undefined);
      if (!st) return;
      // The file's every other name is gone: so is the file, and its metadata with it.
      if (st.nlink <= 1 && collect) return void (await Promise.all([fs.rm(path.join(dir, n), { force: true }), fs.rm(path.join(dir, `${id}.json`), { force: true })]));
      index.set(`${st.dev}:${st.ino}`, id);
    }),
  );
  return index;
}

/** The sidecar entry of `p` (a regular file), if it has one. */
async function sidecarEntry(dir: string, index: Map<string, string>, p: string): Promise<{ id: string; md: Metadata } | undefined> {
  const st = await fs.lstat(p).catch(() => undefined);
  const id = st?.isFile() ? index.get(`${st.dev}:${st.ino}`) : undefined;
  if (!id) return undefined;
  const md = await fs.readFile(path.join(dir, `${id}.json`), 'utf8').then((t) => JSON.parse(t) as Metadata, () => ({}));
  return { id, md };
}

/** Sets `md`'s keys on `p` in its file system's sidecar directory. */
async function writeSidecar(p: string, md: Metadata): Promise<void> {
  if (!(await fs.lstat(p)).isFile()) throw new AgentError('BAD_REQUEST', `File metadata cannot be kept for ${p}: its file system has no extended attributes, and it is not a regular file`);
  const dir = await sidecarOf(path.dirname(p));
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  // A sandbox user may have made one first in a shared directory (/tmp): a symbolic link or a
  // directory of theirs would have the agent write where they chose.
  const own = await fs.lstat(dir);
  if (!own.isDirectory() || own.uid !== process.getuid?.() || (own.mode & 0o077) !== 0) throw new AgentError('BAD_REQUEST', `File metadata cannot be kept on this file system: ${dir} is not the agent's own directory (someone else made it): remove it, or write without metadata`);
  const entry = await sidecarEntry(dir, await sidecarIndex(dir, true), p);
  const id = entry?.id ?? randomUUID();
  if (!entry) await fs.link(p, path.join(dir, `${id}.link`));
  const tmp = path.join(dir, `${id}.json.${process.pid}.tmp`);
  await fs.writeFile(tmp, JSON.stringify({ ...entry?.md, ...md }), { mode: 0o600 });
  await fs.rename(tmp, path.join(dir, `${id}.json`));
}
