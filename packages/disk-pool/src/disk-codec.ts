/**
 * A disk's files into the snapshot store. A checkpoint image made with disks holds a small
 * mark (`space-disk.json`: the copy of the disk taken with it, and the template it grew from);
 * the copy itself stays in the node's pool. {@link DiskStream} stores, beside the snapshot, a
 * `btrfs send` stream of the copy against its template — every file the sandbox changed, in
 * btrfs's own format — so that the snapshot in the store (encrypted under the tenant's key,
 * deduplicated by content) holds the disk too, and restores where the copy is gone: the stream
 * is received again. It is piped from `btrfs send` into the store as it comes, and read only by a
 * restore that lacks the copy: a wake or a fork on the node that took the snapshot fetches the
 * mark alone. Where the sandbox's previous snapshot's copy is still in the pool, a new snapshot
 * stores only the change since it ({@link DiskStream.openSince}), after a copy of that one's
 * stored parts; a restore receives the parts in order.
 *
 * Snapshots stored before (format 2) hold the stream inside the image, after the mark:
 * {@link DiskCodec} reads them. Its form: `SPACEDSK` (8 bytes), u32 length of the mark, the
 * mark (as written), the stream.
 */
import { spawn } from 'node:child_process';
import { createReadStream, existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { PassThrough, Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SpaceError, type ImageAttachment, type ImageFileCodec } from '@space/core';
import type { DiskPool } from './disk-pool.js';

/** In a checkpoint image made with disks: `{ "copy": id, "template": name, "base": uuid }`. */
export const DISK_MARK = 'space-disk.json';

/** What {@link DISK_MARK} says. */
export interface DiskMark {
  /** The copy of the disk taken with the checkpoint (`copies/<copy>` in the pool). */
  copy: string;
  /** The pool's template the disk grew from (`templates/<template>`): the parent of the stored stream. */
  template: string;
  /**
   * That template's identity in streams ({@link DiskPool.streamUuid}), the same on every node
   * holding it: another node finds it by this, under whatever name. (Marks from before
   * 2026-12-07 have none: their template is found by name only.)
   */
  base?: string;
}

const MAGIC = Buffer.from('SPACEDSK');

/** Reads and checks a mark; SNAPSHOT_CORRUPT when it is not one. */
export function parseDiskMark(text: string): DiskMark {
  let m: Partial<DiskMark> | undefined;
  try {
    m = JSON.parse(text) as Partial<DiskMark>;
  } catch {
    m = undefined;
  }
  if (typeof m?.copy !== 'string' || typeof m.template !== 'string' || (m.base !== undefined && typeof m.base !== 'string')) throw new SpaceError('SNAPSHOT_CORRUPT', `The image's disk mark is not valid: ${text.slice(0, 200)}`);
  return { copy: m.copy, template: m.template, ...(m.base !== undefined ? { base: m.base } : {}) };
}

/** Reads and checks the mark in image file `file`. */
async function readDiskMark(file: string): Promise<DiskMark> {
  return parseDiskMark(await fs.readFile(file, 'utf8'));
}

/** What a restore of an image with a disk needs: the pool (SNAPSHOT_CORRUPT without one). */
function poolFor(pool: DiskPool | undefined): DiskPool {
  if (!pool) throw new SpaceError('SNAPSHOT_CORRUPT', 'This image was taken with a disk (by a daemon with --disks on): start the daemon with --disks on to restore it');
  return pool;
}

/**
 * The disk of a snapshot, stored apart from its image (see the module's comment).
 *
 * @example
 * const disks = new DiskStream(() => pool);
 * const bytes = await disks.open(`${img}/space-disk.json`);            // btrfs send of the copy against its template
 * if (await disks.needed(`${dir}/space-disk.json`)) await disks.apply(`${dir}/space-disk.json`, stored);
 */
export class DiskStream implements ImageAttachment {
  readonly name = 'gvisor-disk-btrfs-send-v2';
  readonly suffix = 'disk';

  constructor(
    /** The pool, once the driver has opened it. */
    private readonly pool: () => DiskPool | undefined,
    /** Per stream: a disk of a few GiB of changes takes a while. */
    private readonly timeoutMs = 30 * 60_000,
  ) {}

  async open(src: string): Promise<Readable | undefined> {
    const pool = this.pool();
    if (!pool || path.basename(src) !== DISK_MARK) return undefined;
    const mark = await readDiskMark(src);
    const parent = await templateOf(pool, mark);
    const copy = pool.copyPath(mark.copy);
    if (!parent || !existsSync(copy)) throw new SpaceError('DRIVER_FAILED', `The disk copy ${mark.copy} or its template ${mark.template} is missing from the pool: the snapshot cannot be stored`);
    return btrfsOutput(['send', '-q', '-p', parent, copy], this.timeoutMs);
  }

  /** The template the disk grew from, whole (`btrfs send` of it): what another node needs first. */
  async base(src: string): Promise<{ id: string; open(): Readable } | undefined> {
    const pool = this.pool();
    if (!pool || path.basename(src) !== DISK_MARK) return undefined;
    const mark = await readDiskMark(src);
    const parent = mark.base && (await templateOf(pool, mark));
    if (!mark.base || !parent) return undefined;
    return { id: mark.base, open: () => btrfsOutput(['send', '-q', parent], this.timeoutMs) };
  }

  async needsBase(src: string): Promise<boolean> {
    const mark = await readDiskMark(src);
    return mark.base !== undefined && !(await templateOf(poolFor(this.pool()), mark));
  }

  async applyBase(src: string, bytes: Readable): Promise<void> {
    const mark = await readDiskMark(src);
    if (!mark.base) throw new SpaceError('SNAPSHOT_CORRUPT', 'The disk mark names no template identity');
    const uuid = mark.base;
    const pool = poolFor(this.pool());
    // Once per template at a time (restores of one template's sandboxes at once share it).
    let p = this.receivingBases.get(uuid);
    if (!p) {
      p = receiveBase(pool, uuid, bytes, this.timeoutMs).finally(() => this.receivingBases.delete(uuid));
      this.receivingBases.set(uuid, p);
    } else bytes.destroy();
    await p;
  }

  private readonly receivingBases = new Map<string, Promise<string>>();

  /**
   * The change from image `earlier`'s disk copy to this image's: `btrfs send -p <earlier's copy>
   * <this copy>`, which walks only the parts of the two trees that differ and carries the files
   * changed since. Received after earlier's stored stream (its parts), it makes this copy. Both
   * copies are of one sandbox's disk; undefined when either is gone from the pool.
   */
  async openSince(src: string, earlier: string): Promise<Readable | undefined> {
    const pool = this.pool();
    if (!pool || path.basename(src) !== DISK_MARK) return undefined;
    const mark = await readDiskMark(src);
    const before = pool.copyPath(earlier);
    const copy = pool.copyPath(mark.copy);
    if (earlier === mark.copy || !existsSync(before) || !existsSync(copy)) return undefined;
    return btrfsOutput(['send', '-q', '-p', before, copy], this.timeoutMs);
  }

  async needed(src: string): Promise<boolean> {
    const mark = await readDiskMark(src);
    return !existsSync(poolFor(this.pool()).copyPath(mark.copy));
  }

  async apply(src: string, bytes: Readable): Promise<void> {
    const mark = await readDiskMark(src);
    await receiveCopy(poolFor(this.pool()), mark, bytes, this.timeoutMs);
  }
}

/**
 * Reads the disks of snapshots stored before {@link DiskStream} (the stream inside the image):
 * decode only; new snapshots store their disks apart.
 *
 * @example
 * const codec = new DiskCodec(() => pool);
 * await codec.decode(`${dir}/space-disk.json.stored`, `${dir}/space-disk.json`); // the mark; the copy received if missing
 */
export class DiskCodec implements ImageFileCodec {
  readonly name = 'gvisor-disk-btrfs-send-v1';

  constructor(
    /** The pool, once the driver has opened it. */
    private readonly pool: () => DiskPool | undefined,
    /** Per file: a disk of a few GiB of changes takes a while. */
    private readonly timeoutMs = 30 * 60_000,
  ) {}

  /** Never: new snapshots store the disk apart ({@link DiskStream}). */
  async encode(): Promise<boolean> {
    return false;
  }

  async decode(src: string, dest: string): Promise<void> {
    const fh = await fs.open(src, 'r');
    let mark: DiskMark;
    let text: Buffer;
    try {
      const head = Buffer.alloc(12);
      await fh.read(head, 0, 12, 0);
      if (!head.subarray(0, 8).equals(MAGIC)) throw new SpaceError('SNAPSHOT_CORRUPT', 'The stored disk is not in the form this daemon writes');
      text = Buffer.alloc(head.readUInt32BE(8));
      await fh.read(text, 0, text.length, 12);
      mark = parseDiskMark(text.toString('utf8'));
    } finally {
      await fh.close();
    }
    const pool = poolFor(this.pool());
    if (!existsSync(pool.copyPath(mark.copy))) await receiveCopy(pool, mark, createReadStream(src, { start: 12 + text.length }), this.timeoutMs);
    await fs.writeFile(dest, text, { mode: 0o600 });
  }
}

/**
 * Makes the copy of `mark` again from a stored stream: received under a scratch directory and
 * moved into place when complete, so a crash (or a stream that turns out corrupt at its end)
 * never leaves a partial copy that looks whole.
 */
async function receiveCopy(pool: DiskPool, mark: DiskMark, stream: Readable, timeoutMs: number): Promise<void> {
  if (!(await templateOf(pool, mark))) throw new SpaceError('TEMPLATE_NOT_ON_NODE', `The disk of this snapshot grew from template files (${mark.template}${mark.base ? `, ${mark.base}` : ''}) this node's pool does not hold; restore it on the node that took it`);
  try {
    // Every stream to its end (a whole, then the changes since, each against the one before: a
    // stream names its parent, which btrfs finds among those received before it).
    await receiveScratch(pool, stream, timeoutMs, async (scratch, received) => {
      // A stream's subvolume is named as the copy it was sent from: the last one's is this copy.
      const got = path.basename(pool.copyPath(mark.copy));
      if (!received.includes(got)) throw new SpaceError('SNAPSHOT_CORRUPT', received.length ? `The stored disk streams make ${received.join(', ')}, not copy ${mark.copy}` : 'The stored disk stream holds no subvolume');
      // A read-only subvolume cannot be renamed: a snapshot of it takes its place (no bytes copied).
      await btrfs(['subvolume', 'snapshot', '-r', path.join(scratch, got), pool.copyPath(mark.copy)], timeoutMs);
    });
  } catch (err) {
    if (err instanceof SpaceError) throw err;
    throw new SpaceError('SNAPSHOT_CORRUPT', `The stored disk could not be received: ${(err as Error).message}`, { cause: err });
  }
}

/**
 * Receives `stream` (one or more `btrfs send` streams) into a new scratch directory of the pool
 * and hands the subvolumes it made to `keep`; then they go, through the pool's trash, emptied
 * first so that dropping them keeps the quota counts exact (one that cannot go now is swept
 * when the pool next opens), and the directory with them. A crash, or a stream that fails at
 * its end, so leaves nothing that looks whole.
 */
async function receiveScratch<T>(pool: DiskPool, stream: Readable, timeoutMs: number, keep: (scratch: string, received: string[]) => Promise<T>): Promise<T> {
  const scratch = await pool.receiving();
  try {
    await btrfs(['receive', '-q', scratch], timeoutMs, { stdin: stream });
    return await keep(scratch, await fs.readdir(scratch));
  } finally {
    for (const d of await fs.readdir(scratch).catch(() => [] as string[])) await pool.remove(path.join(scratch, d)).catch(() => {});
    await fs.rmdir(scratch).catch(() => {});
  }
}

/**
 * The path of the template subvolume the disk of `mark` grew from: by its identity in streams
 * where the mark has one (whatever its name on this node), else by name; undefined when absent.
 *
 * @example
 * await templateOf(pool, { copy: 'sn1', template: 'minimal-3f.1557', base: 'd0622188-…' }); // '<pool>/templates/base-d0622188-…' on another node
 */
export async function templateOf(pool: DiskPool, mark: DiskMark): Promise<string | undefined> {
  const named = pool.templatePath(mark.template);
  if (!mark.base) return named;
  if (named && (await pool.streamUuid(named).catch(() => undefined)) === mark.base) return named;
  const name = await pool.templateByUuid(mark.base);
  return name ? pool.templatePath(name) : undefined;
}

/**
 * Makes another node's template subvolume `uuid` in this pool from a full stream of it
 * ({@link DiskPool.keepBase}): received into a scratch directory first, so a crash or a stream
 * that fails at its end leaves nothing that looks whole. Returns its name.
 */
async function receiveBase(pool: DiskPool, uuid: string, stream: Readable, timeoutMs: number): Promise<string> {
  try {
    return await receiveScratch(pool, stream, timeoutMs, async (scratch, got) => {
      if (got.length !== 1) throw new SpaceError('SNAPSHOT_CORRUPT', `The stored template files make ${got.length} subvolumes, not one`);
      return pool.keepBase(path.join(scratch, got[0]!), uuid);
    });
  } catch (err) {
    if (err instanceof SpaceError) throw err;
    throw new SpaceError('SNAPSHOT_CORRUPT', `The stored template files could not be received: ${(err as Error).message}`, { cause: err });
  }
}

/** Runs btrfs (stdin from a stream, if given); rejects with its stderr. */
function btrfs(args: string[], timeoutMs: number, io: { stdin?: Readable } = {}): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const child = spawn('btrfs', args, { stdio: [io.stdin ? 'pipe' : 'ignore', 'ignore', 'pipe'] });
    const stderr = tail(child.stderr!);
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    const piping = io.stdin ? pipeline(io.stdin, child.stdin!) : Promise.resolve();
    // Judged once btrfs has exited (below); a pipe that breaks first (btrfs ending early, or
    // killed as the daemon stops: "Premature close") must not be an unhandled rejection meanwhile.
    piping.catch(() => {});
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(cannotRun(err));
    });
    child.on('close', (code, sig) => {
      clearTimeout(timer);
      // A stream that fails at its end (its checksum) fails the receive even if btrfs took it.
      piping.then(
        () => (code === 0 ? resolve() : reject(new Error(`btrfs ${args[0]} failed (${sig ?? `exit ${code}`}): ${stderr()}`))),
        (err: unknown) => reject(code === 0 ? err : new Error(`btrfs ${args[0]} failed (${sig ?? `exit ${code}`}): ${stderr()}`)),
      );
    });
  });
}

/**
 * btrfs's standard output as a stream that ends only once btrfs has exited well, and errors
 * otherwise: a reader never takes a cut-off stream for a whole one. Destroying it kills btrfs.
 */
function btrfsOutput(args: string[], timeoutMs: number): Readable {
  const child = spawn('btrfs', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  const stderr = tail(child.stderr!);
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const exited = new Promise<void>((resolve, reject) => {
    child.on('error', (err) => reject(cannotRun(err)));
    child.on('close', (code, sig) => (code === 0 ? resolve() : reject(new SpaceError('DRIVER_FAILED', `btrfs ${args[0]} failed (${sig ?? `exit ${code}`}): ${stderr()}`))));
  }).finally(() => clearTimeout(timer));
  exited.catch(() => {}); // judged at the stream's end (below)
  // Read from now on: a child's output that nothing listens to when it exits is drained and
  // dropped by Node (a stream read later, after a copy in the store, came out empty). The pipe
  // holds btrfs back once its buffer is full.
  const out = child.stdout!.pipe(new PassThrough());
  async function* output(): AsyncGenerator<Buffer> {
    for await (const chunk of out) yield chunk as Buffer;
    await exited;
  }
  const stream = Readable.from(output(), { objectMode: false });
  // Destroyed before its end (read or not: a store that failed first): btrfs goes too.
  stream.once('close', () => child.exitCode === null && child.signalCode === null && child.kill('SIGKILL'));
  return stream;
}

/** The last 4 KiB a stream wrote, trimmed, as a function to call once it has ended. */
function tail(r: Readable): () => string {
  let text = '';
  r.on('data', (d: Buffer) => (text += d.toString()).length > 4096 && (text = text.slice(-4096)));
  return () => text.trim();
}

function cannotRun(err: Error): SpaceError {
  return new SpaceError('DRIVER_FAILED', `btrfs cannot run: ${err.message} (apt-get install btrfs-progs)`, { cause: err });
}
