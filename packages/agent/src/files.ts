/**
 * File operations inside the sandbox. Paths are resolved against the user's home when
 * relative. Writes land in a temporary file renamed into place on success, so a failed
 * upload never leaves a truncated file behind. New files belong to the requesting user.
 */
import { closeSync, constants, fchownSync, fstatSync, lstatSync, open, openSync, promises as fs, read, readdirSync, readlinkSync, readSync, renameSync, unlinkSync, watch, writev, type FSWatcher, type Stats } from 'node:fs';
import { promisify } from 'node:util';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { Channel, INITIAL_WINDOW, type EntryInfo, type EntryType } from '@space/protocol';
import type { ErrorCode } from '@space/api';
import { AgentError } from './processes.js';
import type { Stream } from './streams.js';
import { DEFAULT_USER, idName, resolveUser, type User } from './users.js';
import { readMetadata, writeMetadata, type Metadata } from './metadata.js';

const MAX_LIST = 10_000;
const READ_CHUNK = 64 * 1024;
/** The reads after the first: a whole credit window each. */
const REST_CHUNK = INITIAL_WINDOW;

// Calls on descriptors, through libuv's thread pool (FileHandle has no way to close at once).
const openFd = promisify(open);
const readFd = promisify(read);
const writevFd = promisify(writev);

const ERRNO: Record<string, ErrorCode> = {
  ENOENT: 'FILE_NOT_FOUND',
  EEXIST: 'FILE_EXISTS',
  ENOTDIR: 'NOT_A_DIRECTORY',
  EISDIR: 'IS_A_DIRECTORY',
  ENOTEMPTY: 'DIRECTORY_NOT_EMPTY',
  EACCES: 'PERMISSION_DENIED',
  EPERM: 'PERMISSION_DENIED',
};

/** Turns a node fs error into an {@link AgentError} with a SPACE code. */
export function fsError(err: unknown, p: string): AgentError {
  // The agent's own refusals (file metadata, …) keep their code and message.
  if (err instanceof AgentError) return err;
  const e = err as NodeJS.ErrnoException;
  const code = (e.code && ERRNO[e.code]) || 'INTERNAL';
  return new AgentError(code, `${e.code ?? 'error'}: ${p}`);
}

function userOf(who: string | undefined): User {
  const u = resolveUser(who);
  if (!u) throw new AgentError('BAD_REQUEST', `Unknown user ${JSON.stringify(who)} in this sandbox`);
  return u;
}

/** Resolves a client path (relative to the user's home). */
export function resolvePath(p: unknown, who?: string): string {
  if (typeof p !== 'string' || !p || p.includes('\0') || p.length > 4096) throw new AgentError('INVALID_PATH', 'path must be a non-empty string without NUL bytes');
  return path.resolve(userOf(who).home, p);
}

function typeOf(st: Stats): EntryType {
  if (st.isFile()) return 'file';
  if (st.isDirectory()) return 'dir';
  if (st.isSymbolicLink()) return 'symlink';
  return 'other';
}

/** Stat of one path (symlinks are not followed); with `metadata`, its file metadata too. */
export async function stat(p: string, metadata = false): Promise<EntryInfo> {
  // One entry, the most frequent call an agent makes (E2B's `files.exists` is one): read at
  // once rather than through libuv's thread pool, whose hand-off to a worker thread and back
  // costs ~0.8 ms of syscalls in gVisor (lstat in a sandbox, ptrace platform: 0.12 ms
  // synchronous, 0.92 ms through the pool; docs/benchmarks.md, "Core"). A walk of a whole tree
  // (list) keeps the pool, so that a large one never holds the agent's other streams up.
  const info = statNow(p);
  if (metadata) [info.metadata] = await readMetadata([p]);
  return info;
}

async function statOnly(p: string): Promise<EntryInfo> {
  try {
    const st = await fs.lstat(p);
    return { ...entryOf(p, st), ...(st.isSymbolicLink() ? { symlinkTarget: await fs.readlink(p) } : {}) };
  } catch (err) {
    throw fsError(err, p);
  }
}

function statNow(p: string): EntryInfo {
  try {
    const st = lstatSync(p);
    return { ...entryOf(p, st), ...(st.isSymbolicLink() ? { symlinkTarget: readlinkSync(p) } : {}) };
  } catch (err) {
    throw fsError(err, p);
  }
}

function entryOf(p: string, st: Stats): EntryInfo {
  return { name: path.basename(p), path: p, type: typeOf(st), size: st.size, mode: st.mode & 0o7777, mtimeMs: Math.round(st.mtimeMs), owner: idName(st.uid), group: idName(st.gid, true) };
}

/** Lists a directory, descending `depth - 1` levels; with `metadata`, each entry's file metadata too. */
export async function list(dir: string, depth = 1, metadata = false): Promise<EntryInfo[]> {
  const out: EntryInfo[] = [];
  const top = await stat(dir);
  if (top.type !== 'dir') throw new AgentError('NOT_A_DIRECTORY', `${dir} is not a directory`);
  const walk = async (d: string, level: number): Promise<void> => {
    let names: string[];
    try {
      names = (await fs.readdir(d)).sort();
    } catch (err) {
      throw fsError(err, d);
    }
    for (const n of names) {
      if (out.length >= MAX_LIST) return;
      const e = await statOnly(path.join(d, n)).catch(() => undefined);
      if (!e) continue;
      out.push(e);
      if (e.type === 'dir' && level < depth) await walk(e.path, level + 1);
    }
  };
  await walk(dir, 1);
  if (metadata) {
    const mds = await readMetadata(out.map((e) => e.path));
    out.forEach((e, i) => (e.metadata = mds[i]));
  }
  return out;
}

/** mkdir -p, owned by `who`. */
export async function mkdirp(p: string, who?: string): Promise<void> {
  const u = userOf(who);
  try {
    const first = await fs.mkdir(p, { recursive: true });
    if (first) {
      // chown every directory we created, from the first one down
      let cur = p;
      const created: string[] = [];
      while (cur.length >= first.length) {
        created.push(cur);
        cur = path.dirname(cur);
      }
      for (const c of created) await fs.chown(c, u.uid, u.gid);
    }
  } catch (err) {
    throw fsError(err, p);
  }
}

export async function remove(p: string, recursive: boolean): Promise<void> {
  try {
    const st = await fs.lstat(p);
    if (st.isDirectory()) await fs.rm(p, { recursive, force: false });
    else await fs.unlink(p);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ERR_FS_EISDIR') throw new AgentError('DIRECTORY_NOT_EMPTY', `${p} is a directory: pass recursive`);
    throw fsError(err, p);
  }
}

export async function rename(from: string, to: string): Promise<void> {
  try {
    await fs.rename(from, to);
  } catch (err) {
    throw fsError(err, `${from} -> ${to}`);
  }
}

/**
 * Streams a file to `stream` under its credit; resolves when done.
 *
 * The reply tells the size this stream will send, never a guess the daemon would pass on as
 * a `Content-Length` the body then breaks (a file rewritten while it is read is common:
 * logs, counters). A regular file that ends within the first piece is told at the size read;
 * a longer one at its size when opened, which caps the read, and the stream fails with
 * `FILE_CHANGED` if the file shrinks below it first. Files whose size says nothing (procfs,
 * FIFOs, devices) are told at the size read when one more read shows their end, else with
 * no size at all.
 */
export async function readTo(p: string, stream: Stream): Promise<void> {
  let fd: number;
  try {
    // Through the thread pool: opening a FIFO waits for its writer.
    fd = await openFd(p, constants.O_RDONLY | constants.O_NOFOLLOW);
  } catch (err) {
    throw fsError(err, p);
  }
  try {
    // What cannot wait on anything is done at once (a trip through the pool costs ~1 ms in gVisor).
    const st = fstatSync(fd);
    if (st.isDirectory()) throw new AgentError('IS_A_DIRECTORY', `${p} is a directory`);
    const readAsync = async (max = READ_CHUNK): Promise<Buffer> => {
      const buf = Buffer.allocUnsafe(max);
      const { bytesRead } = await readFd(fd, buf, 0, max, null);
      return buf.subarray(0, bytesRead);
    };
    // A regular file's first piece at once too, when it has a size: it cannot block as a FIFO
    // or a device can. procfs and sysfs files stat as size 0, and a few of them block
    // (/proc/kmsg in a microVM's guest): those take the pool.
    const first = st.isFile() && st.size > 0 ? readNow(fd, READ_CHUNK) : await readAsync();
    const pieces = [first];
    let size: number | undefined;
    let more = Infinity;
    if (st.isFile() && st.size > 0) {
      // A short read of a regular file is its end.
      size = first.length < READ_CHUNK ? first.length : Math.max(st.size, READ_CHUNK);
      more = size - first.length;
    } else if (first.length === 0) {
      size = more = 0;
    } else if (st.isFile() && first.length < READ_CHUNK) {
      // procfs and sysfs files stat as size 0 whatever they hold: one more read shows the end.
      const next = await readAsync();
      if (next.length === 0) [size, more] = [first.length, 0];
      else pieces.push(next);
    }
    stream.reply(size === undefined ? {} : { size });
    for (const piece of pieces) if (!(await sendPiece(stream, piece))) return;
    await sendRest(stream, readAsync, more, p);
  } finally {
    closeSync(fd);
  }
}

/** Up to `max` bytes of `fd` at its position, read now. */
function readNow(fd: number, max: number): Buffer {
  const buf = Buffer.allocUnsafe(max);
  return buf.subarray(0, readSync(fd, buf, 0, max, null));
}

/** Reads and sends up to `limit` more bytes (all that is left when Infinity), then ends. */
async function sendRest(stream: Stream, readAsync: (max?: number) => Promise<Buffer>, limit: number, p: string): Promise<void> {
  let left = limit;
  // Each read is a trip through libuv's thread pool (~1 ms of syscalls in gVisor): pieces of a
  // whole window, and the next one read while this one is sent.
  let next: Promise<Buffer> | undefined = left > 0 ? readAsync(Math.min(REST_CHUNK, left)) : undefined;
  try {
    while (next) {
      const piece = await next;
      next = undefined;
      if (piece.length === 0) {
        if (left === Infinity) break;
        stream.fail('FILE_CHANGED', `${p} shrank while it was read; read it again`);
        return;
      }
      left -= piece.length;
      if (left > 0) next = readAsync(Math.min(REST_CHUNK, left));
      if (!(await sendPiece(stream, piece))) return;
    }
  } finally {
    // The file closes after this: never under a read still under way.
    await next?.catch(() => {});
  }
  stream.end({});
}

/** Sends one piece under the stream's credit; false when the stream closed meanwhile. */
async function sendPiece(stream: Stream, piece: Buffer): Promise<boolean> {
  if (stream.closed) return false;
  if (piece.length > 0 && !stream.send(Channel.File, piece)) {
    await new Promise<void>((r) => {
      const go = () => { stream.off('drain', go); stream.off('close', go); r(); };
      stream.on('drain', go);
      stream.on('close', go);
    });
  }
  return !stream.closed;
}

/**
 * Receives a file from the daemon: DATA frames are written in order, credit is granted as
 * writes complete, End renames the temporary file into place. `metadata` is set on the
 * temporary file before the rename, so the file never appears without it; a file replaced
 * keeps the old one's metadata under keys the new write does not set.
 */
export async function writeFrom(p: string, stream: Stream, mode: number | undefined, who?: string, metadata?: Metadata): Promise<void> {
  const u = userOf(who);
  const tmp = path.join(path.dirname(p), `.${path.basename(p)}.space-${randomBytes(6).toString('hex')}`);
  // Opened, owned, closed and renamed at once: a new file (O_EXCL) cannot block as a FIFO can,
  // and a trip through the thread pool costs ~1 ms in gVisor. The writes take the pool.
  let fd: number;
  try {
    fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, mode ?? 0o644);
  } catch (err) {
    throw fsError(err, p);
  }
  try {
    fchownSync(fd, u.uid, u.gid);
  } catch (err) {
    closeSync(fd);
    unlinkQuietly(tmp);
    throw fsError(err, p);
  }
  let closed = false;
  const close = () => {
    if (closed) return;
    closed = true;
    closeSync(fd);
  };
  let size = 0;
  let chain = Promise.resolve();
  let failed: unknown;
  // What arrived while a write was under way goes out in the next one, all at once: each write
  // is a trip through libuv's thread pool, which costs ~1 ms of syscalls in gVisor (ptrace), so
  // one write per 64 KiB frame held an upload to 2–6 MB/s (docs/benchmarks.md, "Core").
  let queue: Buffer[] = [];
  const writeQueued = async () => {
    const batch = queue;
    queue = [];
    if (failed || !batch.length) return;
    const n = batch.reduce((a, b) => a + b.length, 0);
    try {
      await writeAll(fd, batch);
      size += n;
      stream.grant(n);
    } catch (err) {
      failed = err;
    }
  };
  const done = new Promise<void>((resolve, reject) => {
    stream.on('data', (_ch: Channel, data: Buffer) => {
      // A write is already queued behind the one under way if the queue holds anything.
      if (queue.push(data) === 1) chain = chain.then(writeQueued);
    });
    stream.once('end', () => {
      chain = chain.then(async () => {
        try {
          close();
          if (failed) throw failed;
          if (metadata && Object.keys(metadata).length > 0) {
            const [old] = await readMetadata([p]);
            await writeMetadata(tmp, { ...old, ...metadata });
          }
          renameSync(tmp, p);
          resolve();
        } catch (err) {
          unlinkQuietly(tmp);
          reject(fsError(err, p));
        }
      });
    });
    stream.once('cancel', () => {
      chain = chain.then(() => {
        try {
          close();
        } catch {
          // closed with an error: the file goes anyway
        }
        unlinkQuietly(tmp);
        reject(new AgentError('AGENT_DISCONNECTED', 'upload cancelled'));
      });
    });
  });
  stream.reply({ window: INITIAL_WINDOW });
  await done;
  stream.end({ size });
}

function unlinkQuietly(file: string): void {
  try {
    unlinkSync(file);
  } catch {
    // gone already
  }
}

/** Writes `buffers` in order at the file's position, however many calls the kernel needs. */
async function writeAll(fd: number, buffers: Buffer[]): Promise<void> {
  let left = buffers;
  while (left.length) {
    let { bytesWritten } = await writevFd(fd, left);
    if (bytesWritten === 0) throw Object.assign(new Error('the file system took none of the bytes written'), { code: 'EIO' });
    while (left.length && bytesWritten >= left[0]!.length) {
      bytesWritten -= left[0]!.length;
      left = left.slice(1);
    }
    if (bytesWritten > 0) left = [left[0]!.subarray(bytesWritten), ...left.slice(1)];
  }
}

export { DEFAULT_USER };

/**
 * Streams changes under `dir` as JSON lines until the stream closes. A rename shows as the
 * removal of the old name and the creation of the new one (inotify's rename events carry
 * no pairing here).
 *
 * Whether a `rename` event is a creation or a removal is decided by the names known to exist
 * (listed before the watch starts, then kept up to date by the events themselves), not by
 * looking at the file afterwards: a file made and removed before the look would otherwise be
 * reported removed twice and never created.
 */
export async function watchTo(dir: string, recursive: boolean, stream: Stream): Promise<void> {
  const top = await stat(dir);
  if (top.type !== 'dir') throw new AgentError('NOT_A_DIRECTORY', `${dir} is not a directory`);
  let watcher: FSWatcher;
  let known: Set<string>;
  try {
    known = new Set(readdirSync(dir, { recursive }).map((n) => n.toString()));
    watcher = watch(dir, { recursive, persistent: false });
  } catch (err) {
    throw fsError(err, dir);
  }
  stream.reply({});
  const emit = (name: string, type: 'create' | 'write' | 'remove') => stream.send(Channel.Stdout, Buffer.from(JSON.stringify({ name, type }) + '\n'));
  watcher.on('change', (eventType, filename) => {
    if (!filename) return;
    const name = filename.toString();
    // The agent's own temporary files of an atomic write (see writeFrom) are not news.
    if (/^\..+\.space-[0-9a-f]{12}$/.test(path.basename(name))) return;
    if (eventType === 'change') {
      if (!known.has(name)) {
        known.add(name);
        emit(name, 'create');
      }
      return void emit(name, 'write');
    }
    if (known.delete(name)) {
      for (const k of known) if (k.startsWith(`${name}/`)) known.delete(k);
      emit(name, 'remove');
    } else {
      known.add(name);
      emit(name, 'create');
    }
  });
  watcher.on('error', (err) => stream.fail('INTERNAL', `watching ${dir} failed: ${err.message}`));
  await new Promise<void>((resolve) => {
    watcher.on('close', resolve);
    stream.on('close', () => {
      watcher.close();
      resolve();
    });
  });
}
