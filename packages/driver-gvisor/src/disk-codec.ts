/**
 * A disk's files into the snapshot store. A checkpoint image made with disks holds a small
 * mark (`space-disk.json`: the copy of the disk taken with it, and the template it grew from);
 * the copy itself stays in the node's pool, plaintext like the live disk. This codec stores the
 * mark as the mark followed by a `btrfs send` stream of the copy against its template — every
 * file the sandbox changed, in btrfs's own format — so that a snapshot in the store (encrypted
 * under the tenant's key, deduplicated by content) holds the disk too, and restores where the
 * copy is gone: its decode writes the mark back and, when the pool lacks the copy, receives it.
 *
 * Stored form: `SPACEDSK` (8 bytes), u32 length of the mark, the mark (as written), the stream.
 */
import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream, existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { SpaceError, type ImageFileCodec } from '@space/core';
import type { DiskPool } from './disk-pool.js';

/** In a checkpoint image made with disks: `{ "copy": id, "template": name }`. */
export const DISK_MARK = 'space-disk.json';

/** What {@link DISK_MARK} says. */
export interface DiskMark {
  /** The copy of the disk taken with the checkpoint (`copies/<copy>` in the pool). */
  copy: string;
  /** The pool's template the disk grew from (`templates/<template>`): the parent of the stored stream. */
  template: string;
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
  if (typeof m?.copy !== 'string' || typeof m.template !== 'string') throw new SpaceError('SNAPSHOT_CORRUPT', `The image's disk mark is not valid: ${text.slice(0, 200)}`);
  return { copy: m.copy, template: m.template };
}

/**
 * @example
 * const codec = new DiskCodec(() => pool);
 * await codec.encode(`${img}/space-disk.json`, `${img}.stored/space-disk.json`); // mark + btrfs send stream
 */
export class DiskCodec implements ImageFileCodec {
  readonly name = 'gvisor-disk-btrfs-send-v1';

  constructor(
    /** The pool, once the driver has opened it. */
    private readonly pool: () => DiskPool | undefined,
    /** Per file: a disk of a few GiB of changes takes a while. */
    private readonly timeoutMs = 30 * 60_000,
  ) {}

  async encode(src: string, dest: string): Promise<boolean> {
    const pool = this.pool();
    if (!pool || path.basename(src) !== DISK_MARK) return false;
    const text = await fs.readFile(src);
    const mark = parseDiskMark(text.toString('utf8'));
    const parent = pool.templatePath(mark.template);
    const copy = pool.copyPath(mark.copy);
    if (!parent || !existsSync(copy)) throw new SpaceError('DRIVER_FAILED', `The disk copy ${mark.copy} or its template ${mark.template} is missing from the pool: the snapshot cannot be stored`);
    const head = Buffer.alloc(12);
    MAGIC.copy(head, 0);
    head.writeUInt32BE(text.length, 8);
    const out = createWriteStream(dest, { mode: 0o600 });
    out.write(head);
    out.write(text);
    await this.btrfs(['send', '-q', '-p', parent, copy], { stdout: out });
    return true;
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
    const pool = this.pool();
    if (!pool) throw new SpaceError('SNAPSHOT_CORRUPT', 'This image was taken with a disk (by a daemon with --disks on): start the daemon with --disks on to restore it');
    if (!existsSync(pool.copyPath(mark.copy))) await this.receive(pool, mark, src, 12 + text.length);
    await fs.writeFile(dest, text, { mode: 0o600 });
  }

  /**
   * Makes the copy again from the stored stream: received under a scratch directory and moved
   * into place when complete, so a crash never leaves a partial copy that looks whole.
   */
  private async receive(pool: DiskPool, mark: DiskMark, src: string, offset: number): Promise<void> {
    if (!pool.templatePath(mark.template)) throw new SpaceError('SNAPSHOT_CORRUPT', `The disk of this snapshot grew from template files (${mark.template}) this node's pool does not hold; create a sandbox of that template here first`);
    const scratch = await fs.mkdtemp(path.join(path.dirname(pool.copyPath(mark.copy)), '.recv-'));
    try {
      await this.btrfs(['receive', '-q', '-e', scratch], { stdin: createReadStream(src, { start: offset }) });
      const got = (await fs.readdir(scratch))[0];
      if (!got) throw new SpaceError('SNAPSHOT_CORRUPT', 'The stored disk stream holds no subvolume');
      // A read-only subvolume cannot be renamed: a snapshot of it takes its place (no bytes copied).
      await this.btrfs(['subvolume', 'snapshot', '-r', path.join(scratch, got), pool.copyPath(mark.copy)]);
      await this.btrfs(['subvolume', 'delete', path.join(scratch, got)]);
    } catch (err) {
      for (const d of await fs.readdir(scratch).catch(() => [] as string[])) await this.btrfs(['subvolume', 'delete', path.join(scratch, d)]).catch(() => {});
      if (err instanceof SpaceError) throw err;
      throw new SpaceError('SNAPSHOT_CORRUPT', `The stored disk could not be received: ${(err as Error).message}`, { cause: err });
    } finally {
      await fs.rmdir(scratch).catch(() => {});
    }
  }

  /** Runs btrfs with a stream as its input or output; rejects with its stderr. */
  private btrfs(args: string[], io: { stdin?: NodeJS.ReadableStream; stdout?: NodeJS.WritableStream } = {}): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const child = spawn('btrfs', args, { stdio: [io.stdin ? 'pipe' : 'ignore', io.stdout ? 'pipe' : 'ignore', 'pipe'] });
      let stderr = '';
      child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()).length > 4096 && (stderr = stderr.slice(-4096)));
      const timer = setTimeout(() => child.kill('SIGKILL'), this.timeoutMs);
      const piping = Promise.all([io.stdin ? pipeline(io.stdin, child.stdin!) : undefined, io.stdout ? pipeline(child.stdout!, io.stdout) : undefined]);
      // Judged once btrfs has exited (below); a pipe that breaks first (btrfs ending early, or
      // killed as the daemon stops: "Premature close") must not be an unhandled rejection meanwhile.
      piping.catch(() => {});
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new SpaceError('DRIVER_FAILED', `btrfs cannot run: ${err.message} (apt-get install btrfs-progs)`, { cause: err }));
      });
      child.on('close', (code, sig) => {
        clearTimeout(timer);
        piping.then(
          () => (code === 0 ? resolve() : reject(new Error(`btrfs ${args[0]} failed (${sig ?? `exit ${code}`}): ${stderr.trim()}`))),
          (err: unknown) => reject(code === 0 ? err : new Error(`btrfs ${args[0]} failed (${sig ?? `exit ${code}`}): ${stderr.trim()}`)),
        );
      });
    });
  }
}
