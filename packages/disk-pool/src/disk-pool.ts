/**
 * Sandbox disks on one node-wide btrfs (issue 23): a sparse image file, loop-mounted, holding a
 * read-only subvolume per template and a writable subvolume per sandbox disk. A disk is a
 * snapshot of its template's subvolume (no bytes copied) with a qgroup limit on what it
 * references — its size, template files included — so a writer that fills it gets `EDQUOT`
 * and nothing else happens to the sandbox. Point-in-time copies (for snapshots and forks) are
 * read-only subvolume snapshots, and a fork's disk a writable snapshot of one: forks share every
 * unchanged block. Why btrfs: measured on this kernel, it is the one file system with both a
 * per-directory size limit and block sharing (docs/architecture.md, "Disks").
 *
 * Layout under the mount point: `templates/<name>`, `disks/<id>`, `copies/<id>`.
 * Everything is done with the `btrfs` command (btrfs-progs), the tool made for it.
 *
 * Reserved on the host: a pool takes its whole size on the host's disk when it is made
 * (`fallocate`: instant, nothing written), its vault's image too. A sparse image over a host
 * disk that fills up answers I/O errors, and btrfs then turns the whole pool read-only — every
 * sandbox's disk at once, until it is mounted again (measured: docs/disks.md, "The pool's size,
 * and a host disk that fills up"). Reserved, a full host leaves the pool as it is; a writer that fills the pool
 * itself gets `ENOSPC`. Pools made before reservations (2026-12-07) stay sparse.
 *
 * At rest, encrypted: given a key, the pool's image lives in a vault — an ext4 image whose
 * `files` directory is encrypted with fscrypt ({@link EncryptedImage}) — so the disks' files, and
 * the work files the daemon keeps there ({@link DiskPool.scratchDir}), reach the host's disk as
 * ciphertext. Why a file system in a file in a file system: this kernel has no dm-crypt, and
 * fscrypt is ext4's, which cannot share blocks (docs/architecture.md, "Disks at rest").
 */
import { execFile } from 'node:child_process';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { SpaceError, mountPoints } from '@space/core';
import { EncryptedImage } from '@space/volume-ext4';

const run = promisify(execFile);

/** Options of {@link DiskPool.open}. */
export interface DiskPoolOptions {
  /** Directory of the pool: its image (`pool.img`) and mount point (`mnt`). */
  dir: string;
  /**
   * Size of the pool, bytes, taken on the host when it is made (only then; see
   * {@link defaultPoolBytes}). Its vault adds room for work files: a quarter of it, {@link MIN_WORK_ROOM_BYTES} at least.
   */
  sizeBytes: number;
  /** Each btrfs command must finish within this. @default 60000 */
  timeoutMs?: number;
  /**
   * 256-bit key of the vault the pool's image is kept in (encrypted at rest). Without one, or
   * for a pool made before vaults (`<dir>/pool.img`), the image is plaintext on the host.
   */
  key?: Buffer;
}

/** What a disk holds, as btrfs counts it. */
export interface DiskUsage {
  /** Bytes the disk references (its template's shared blocks included): what its limit bounds. */
  usedBytes: number;
  /** Bytes only this disk holds: what it adds to the node. */
  exclusiveBytes: number;
  /** Its limit; undefined when unlimited. */
  limitBytes?: number;
}

const NAME = /^[a-z0-9][a-z0-9._-]{0,127}$/;

/** A subvolume UUID as btrfs prints it. */
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

function checkName(kind: string, name: string): void {
  if (!NAME.test(name)) throw new SpaceError('BAD_REQUEST', `Invalid ${kind} name ${JSON.stringify(name)}: use 1 to 128 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit`);
}

/** Whether `dir` is a mount point. */
function isMountPoint(dir: string): boolean {
  return mountPoints().has(path.resolve(dir));
}

const GiB = 2 ** 30;

/**
 * A pool's size when the operator gives none: 32 GiB, or half of what the host file system under
 * `dir` has free beyond `reserveBytes` if that is less (less again where its room for work files
 * would not fit beside it) — the pool takes it on the host at once. Below {@link MIN_POOL_BYTES}
 * on a host with too little room (the pool's open then says so).
 *
 * @example const sizeBytes = await defaultPoolBytes('/var/lib/space/disks', 2 ** 30);
 */
export async function defaultPoolBytes(dir: string, reserveBytes: number): Promise<number> {
  const st = await fs.statfs(dir);
  const room = st.bavail * st.bsize - reserveBytes;
  const mib = (n: number) => Math.max(0, Math.floor(n / 2 ** 20) * 2 ** 20);
  const half = mib(Math.min(32 * GiB, room / 2));
  return half + workRoom(half) <= room ? half : mib(room - workRoom(0));
}

/** The smallest pool (a pool of the default's size needs this plus {@link MIN_WORK_ROOM_BYTES} for work files, beside the host's reserve). */
export const MIN_POOL_BYTES = 256 * 2 ** 20;

/**
 * The least room for work files a vault keeps beside its pool. They are checkpoint images being
 * packed, and on the microVM driver also the RAM image each restored VM maps for as long as it
 * runs (up to its memory): a snapshot of a restored 1 GiB microVM needs ~2.1 GiB at once (its
 * mapped image and the new one), which 2 GiB could not give (docs/disks.md, "The pool's size").
 *
 * @example
 * // What a new pool of `poolBytes` takes on the host, with its vault:
 * const hostBytes = poolBytes + Math.max(MIN_WORK_ROOM_BYTES, poolBytes / 4);
 */
export const MIN_WORK_ROOM_BYTES = 4 * GiB;

/** Room for work files a vault keeps beside its pool: a quarter of the pool, {@link MIN_WORK_ROOM_BYTES} at least. */
const workRoom = (poolBytes: number) => Math.max(MIN_WORK_ROOM_BYTES, Math.floor(poolBytes / 4 / 2 ** 20) * 2 ** 20);

/** Scratch directories of receives under way, in `copies/`. */
const RECEIVING = '.recv-';

/**
 * The node's pool of sandbox disks.
 *
 * @example
 * const pool = await DiskPool.open({ dir: '/var/lib/space/disks', sizeBytes: 100 * 2 ** 30 });
 * await pool.importTemplate('base', '/var/lib/space/templates/base/rootfs');
 * const root = await pool.createDisk('sb123', 'base', 4 * 2 ** 30); // the sandbox's root directory
 */
export class DiskPool {
  private constructor(
    /** Where the pool is mounted. */
    readonly mountPoint: string,
    private readonly image: string,
    private readonly timeoutMs: number,
    private readonly vault?: EncryptedImage,
    /** The file the host holds: the vault's image, or the pool's own. */
    private readonly hostImage: string = image,
  ) {}

  /** Whether the pool's bytes are encrypted at rest (it is kept in a vault). */
  get encrypted(): boolean {
    return !!this.vault;
  }

  /**
   * A directory for work files (checkpoint images, disk streams) encrypted at rest with the pool,
   * when it is in a vault: `<dir>/vault/files/work`. Known before the pool opens (a daemon sets
   * its work directory from it); undefined for a pool without one.
   *
   * @example DiskPool.scratchDir('/var/lib/space/disks') // '/var/lib/space/disks/vault/files/work'
   */
  static scratchDir(dir: string): string | undefined {
    return DiskPool.plaintext(dir) ? undefined : path.join(dir, 'vault', 'files', 'work');
  }

  /** The image of a pool made before vaults, if `dir` holds one: it stays where it is, plaintext. */
  private static plaintext(dir: string): string | undefined {
    const image = path.join(dir, 'pool.img');
    return existsSync(image) ? image : undefined;
  }

  /**
   * Opens the pool in `opts.dir`: makes its image and file system the first time, mounts it if
   * it is not mounted (after a reboot), and switches quotas on. Throws `CONFIG_INVALID` when
   * btrfs cannot be used here (no btrfs-progs, no loop devices, no btrfs in the kernel).
   */
  static async open(opts: DiskPoolOptions): Promise<DiskPool> {
    const timeoutMs = opts.timeoutMs ?? 60_000;
    // A pool made before vaults stays where it is (plaintext; docs/disks.md says how to move on).
    const plain = DiskPool.plaintext(opts.dir);
    const vault = opts.key && !plain ? new EncryptedImage({ image: path.join(opts.dir, 'vault.img'), mnt: path.join(opts.dir, 'vault'), confPath: path.join(opts.dir, 'fscrypt.conf'), timeoutMs }) : undefined;
    const image = plain ?? (vault ? path.join(vault.files, 'pool.img') : path.join(opts.dir, 'pool.img'));
    const mnt = path.join(opts.dir, 'mnt');
    const pool = new DiskPool(mnt, image, timeoutMs, vault, vault ? path.join(opts.dir, 'vault.img') : image);
    await fs.mkdir(mnt, { recursive: true });
    try {
      const outerMade = existsSync(pool.hostImage);
      if (!outerMade) {
        // Taken on the host now: it must fit, beside what is kept free.
        const host = await fs.statfs(opts.dir);
        const need = opts.sizeBytes + (vault ? workRoom(opts.sizeBytes) : 0);
        if (opts.sizeBytes < MIN_POOL_BYTES || need > host.bavail * host.bsize) {
          throw new SpaceError('CONFIG_INVALID', `A disk pool of ${Math.round(opts.sizeBytes / 2 ** 20)} MiB (${Math.round(need / 2 ** 20)} MiB with its room for work files) does not fit: ${Math.round((host.bavail * host.bsize) / 2 ** 20)} MiB are free under ${opts.dir}, and a pool needs ${MIN_POOL_BYTES / 2 ** 20} MiB at least. Free some space, give a smaller --disk-pool-size, or start with --disks off`);
        }
      }
      if (vault) await vault.open(opts.key!, opts.sizeBytes + workRoom(opts.sizeBytes), { allocate: true });
      if (!existsSync(image)) {
        // Made under another name and renamed: a crash never leaves a half-made image behind.
        const part = `${image}.part`;
        await fs.rm(part, { force: true });
        await (await fs.open(part, 'w', 0o600)).close();
        await pool.cmd('fallocate', ['--length', String(opts.sizeBytes), part]);
        await pool.cmd('mkfs.btrfs', ['-q', '-L', 'space-disks', part]);
        await fs.rename(part, image);
      }
      // commit=5: quota counts (what a disk holds) are settled at each commit, at most 5 s old.
      // nodiscard: what the pool frees stays reserved in its image (a discard punches holes).
      if (!isMountPoint(mnt)) await pool.cmd('mount', ['-o', 'loop,noatime,nodiscard,commit=5', image, mnt]);
      await pool.cmd('btrfs', ['quota', 'enable', mnt]);
      const uuid = /uuid:\s*([0-9a-f-]{36})/.exec(await pool.cmd('btrfs', ['filesystem', 'show', mnt]))?.[1];
      pool.qgroupsDir = uuid ? `/sys/fs/btrfs/${uuid}/qgroups` : undefined;
      // Counts left inconsistent (by a crash, or deletions before it) enforce no limit: count again.
      await pool.recount();
      for (const d of ['templates', 'disks', 'copies', 'trash']) await fs.mkdir(path.join(mnt, d), { recursive: true });
      // What a crash left half-removed.
      for (const t of await fs.readdir(path.join(mnt, 'trash'))) pool.purge(path.join(mnt, 'trash', t));
      // Receives a crash cut short (disk-codec.ts: scratch directories beside the copies): what
      // they received goes through the trash.
      for (const r of (await fs.readdir(path.join(mnt, 'copies'))).filter((n) => n.startsWith(RECEIVING))) {
        for (const d of await fs.readdir(path.join(mnt, 'copies', r))) await pool.remove(path.join(mnt, 'copies', r, d)).catch(() => {});
        await fs.rmdir(path.join(mnt, 'copies', r)).catch(() => {});
      }
    } catch (err) {
      if (err instanceof SpaceError && (err.code === 'CONFIG_INVALID' || err.code === 'KEY_INVALID')) throw err;
      throw new SpaceError('CONFIG_INVALID', `Cannot set up the disk pool in ${opts.dir}: ${(err as Error).message}. Sandbox disks need btrfs-progs, loop devices and btrfs in the kernel, and to keep them encrypted fscrypt and ext4 with encryption (./space up installs btrfs-progs and fscrypt)`, { cause: err });
    }
    return pool;
  }

  /** sysfs directory of the pool's quota state (`inconsistent`), when the kernel has one. */
  private qgroupsDir?: string;
  private recounting: Promise<void> = Promise.resolve();
  /**
   * Set by {@link quiesce}: purges and recounts still queued are left for the next open (which
   * empties the trash and rescans inconsistent counts), so a daemon's stop waits for the one
   * under way only — a busy session leaves dozens, ~6 s each (measured: `space down` after the
   * CLI test's sessions waited past its 30 s).
   */
  private closing = false;

  /** Counts again when the kernel has marked the counts inconsistent (see {@link purge}). Serialized with purges. */
  recount(): Promise<void> {
    this.recounting = this.recounting.then(() => this.recountNow());
    return this.recounting;
  }

  private async recountNow(): Promise<void> {
    if (this.closing || !this.qgroupsDir || (await fs.readFile(`${this.qgroupsDir}/inconsistent`, 'utf8').catch(() => '0')).trim() !== '1') return;
    await this.cmd('btrfs', ['quota', 'rescan', '-w', this.mountPoint]).catch(() => {});
  }

  /**
   * Deletes a subvolume moved to the trash, in the background, one at a time. This kernel
   * (6.18, btrfs-progs 6.2) marks every count inconsistent when it drops a deleted subvolume
   * that still shares a subtree with another (a disk and its copies): "to be deleted qgroup …
   * has non-zero numbers", at any `drop_subtree_threshold`; and inconsistent counts enforce no
   * limit (measured: a 200 MiB disk then took 300 MB). Emptied first (its files removed and
   * committed), a subvolume shares nothing when it is dropped and the counts stay exact (~6 s
   * for a disk of `base` on a busy host). A rescan is the fallback should they not.
   */
  private purge(p: string): void {
    this.recounting = this.recounting.then(async () => {
      if (this.closing) return;
      try {
        await this.cmd('find', [p, '-xdev', '-mindepth', '1', '-maxdepth', '1', '-exec', 'rm', '-rf', '{}', '+']);
        await this.cmd('btrfs', ['filesystem', 'sync', this.mountPoint]);
        const id = /Subvolume ID:\s*(\d+)/.exec(await this.cmd('btrfs', ['subvolume', 'show', p]))?.[1];
        await this.cmd('btrfs', ['subvolume', 'delete', p]);
        if (id) await this.cmd('btrfs', ['subvolume', 'sync', this.mountPoint, id]);
      } catch {
        // left in the trash: the next open tries again
      }
      await this.recountNow();
    });
  }

  private async cmd(file: string, args: string[]): Promise<string> {
    try {
      return (await run(file, args, { timeout: this.timeoutMs, encoding: 'utf8' })).stdout;
    } catch (err) {
      const e = err as NodeJS.ErrnoException & { stderr?: string };
      if (e.code === 'ENOENT') throw new SpaceError('CONFIG_INVALID', `${file} is not installed (apt-get install btrfs-progs)`, { cause: err });
      throw new SpaceError('DRIVER_FAILED', `${file} ${args.join(' ')} failed: ${(e.stderr ?? e.message).trim()}`, { cause: err });
    }
  }

  private at(kind: 'templates' | 'disks' | 'copies', name: string): string {
    checkName({ templates: 'template', disks: 'disk', copies: 'disk copy' }[kind], name);
    return path.join(this.mountPoint, kind, name);
  }

  /** Directory of disk `id` (whether or not it exists). */
  diskPath(id: string): string {
    return this.at('disks', id);
  }

  /** Directory of copy `copyId` (whether or not it exists). */
  copyPath(copyId: string): string {
    return this.at('copies', copyId);
  }

  /** The template's subvolume (read-only), if imported. */
  templatePath(name: string): string | undefined {
    const p = this.at('templates', name);
    return existsSync(p) ? p : undefined;
  }

  /**
   * The identity `btrfs send` gives subvolume `p` in its streams, the same on every node that
   * holds it: its received UUID when it was received from a stream, else its own UUID. A change
   * sent against it names it as its parent, and `btrfs receive` finds the parent by it.
   */
  async streamUuid(p: string): Promise<string> {
    let u = this.uuids.get(p);
    if (!u) {
      u = this.cmd('btrfs', ['subvolume', 'show', p]).then((out) => {
        const field = (name: string) => new RegExp(`^\\s*${name}:\\s*(\\S+)`, 'm').exec(out)?.[1];
        const received = field('Received UUID');
        const own = field('UUID');
        if (!own) throw new SpaceError('DRIVER_FAILED', `btrfs subvolume show gave no UUID for ${p}`);
        return received && received !== '-' ? received : own;
      });
      this.uuids.set(p, u);
      u.catch(() => this.uuids.delete(p));
    }
    return u;
  }

  /** Stream identities of read-only subvolumes, by path (templates: they never change). */
  private readonly uuids = new Map<string, Promise<string>>();

  /**
   * The name of the template subvolume whose stream identity is `uuid` ({@link streamUuid}):
   * one imported here, or one received from another node's ({@link keepBase}); undefined
   * when the pool has none.
   */
  async templateByUuid(uuid: string): Promise<string | undefined> {
    const received = `base-${uuid}`;
    if (UUID.test(uuid) && existsSync(this.at('templates', received))) return received;
    for (const name of await fs.readdir(path.join(this.mountPoint, 'templates'))) {
      if (name.endsWith('.part')) continue;
      if ((await this.streamUuid(this.at('templates', name)).catch(() => undefined)) === uuid) return name;
    }
    return undefined;
  }

  /**
   * Keeps `received`, a subvolume received from a full stream of another node's template
   * subvolume (in a {@link receiving} directory), as `templates/base-<uuid>`: a read-only
   * snapshot of it, which keeps its received UUID — by which changes sent against the template
   * on that node find their parent here. Returns its name. SNAPSHOT_CORRUPT when the stream made
   * another subvolume.
   */
  async keepBase(received: string, uuid: string): Promise<string> {
    if (!UUID.test(uuid) || (await this.streamUuid(received)) !== uuid) throw new SpaceError('SNAPSHOT_CORRUPT', `The stored template files make ${path.basename(received)}, not the template ${uuid}`);
    this.uuids.delete(received);
    const name = `base-${uuid}`;
    if (!existsSync(this.at('templates', name))) await this.cmd('btrfs', ['subvolume', 'snapshot', '-r', received, this.at('templates', name)]);
    return name;
  }

  /**
   * Imports a template's root file system (a directory) as a read-only subvolume, once: filled
   * under a temporary name and renamed when complete, so a crash leaves no partial template.
   */
  importTemplate(name: string, fromDir: string): Promise<string> {
    // Concurrent imports of one template (two creates at once) share the first.
    let p = this.importing.get(name);
    if (!p) {
      p = this.importOnce(name, fromDir).finally(() => this.importing.delete(name));
      this.importing.set(name, p);
    }
    return p;
  }

  private readonly importing = new Map<string, Promise<string>>();

  private async importOnce(name: string, fromDir: string): Promise<string> {
    const final = this.at('templates', name);
    if (existsSync(final)) return final;
    const part = `${final}.part`;
    if (existsSync(part)) await this.cmd('btrfs', ['subvolume', 'delete', part]);
    await this.cmd('btrfs', ['subvolume', 'create', part]);
    await this.cmd('cp', ['-a', '--reflink=auto', `${fromDir}/.`, part]);
    await this.cmd('btrfs', ['property', 'set', '-ts', part, 'ro', 'true']);
    await fs.rename(part, final);
    return final;
  }

  /** Sets (or changes) the limit of what a subvolume may reference. */
  private limit(p: string, bytes: number): Promise<string> {
    if (!Number.isSafeInteger(bytes) || bytes <= 0) throw new SpaceError('INVALID_LIMITS', `A disk size must be a positive number of bytes; got ${bytes}`);
    return this.cmd('btrfs', ['qgroup', 'limit', String(bytes), p]);
  }

  /**
   * A new disk for sandbox `id`: a writable snapshot of the template (no bytes copied) limited to
   * `sizeBytes`, template files included. Returns its directory (the sandbox's root).
   */
  async createDisk(id: string, template: string, sizeBytes: number): Promise<string> {
    const from = this.templatePath(template);
    if (!from) throw new SpaceError('TEMPLATE_NOT_FOUND', `Template ${template} is not in the disk pool`);
    return this.snapshotInto(from, this.at('disks', id), sizeBytes);
  }

  /** A read-only point-in-time copy `copyId` of disk `id` (take it while the sandbox is stopped). */
  async copyDisk(id: string, copyId: string): Promise<string> {
    const to = this.at('copies', copyId);
    if (existsSync(to)) throw new SpaceError('INTERNAL', `Disk copy ${copyId} exists already`);
    await this.cmd('btrfs', ['subvolume', 'snapshot', '-r', this.at('disks', id), to]);
    return to;
  }

  /** A new writable disk `id` from copy `copyId` (a fork or a rollback), limited to `sizeBytes`. */
  diskFromCopy(copyId: string, id: string, sizeBytes: number): Promise<string> {
    return this.snapshotInto(this.at('copies', copyId), this.at('disks', id), sizeBytes);
  }

  private async snapshotInto(from: string, to: string, sizeBytes: number): Promise<string> {
    if (existsSync(to)) throw new SpaceError('INTERNAL', `Disk ${path.basename(to)} exists already`);
    await this.cmd('btrfs', ['subvolume', 'snapshot', from, to]);
    try {
      await this.limit(to, sizeBytes);
    } catch (err) {
      await this.cmd('btrfs', ['subvolume', 'delete', to]).catch(() => {});
      throw err;
    }
    return to;
  }

  /** Changes the size of disk `id` (smaller than what it holds: writes fail until it shrinks). */
  async resizeDisk(id: string, sizeBytes: number): Promise<void> {
    await this.limit(this.at('disks', id), sizeBytes);
  }

  /**
   * What disk `id` holds and may hold. Counts are exact after btrfs has accounted the last
   * transaction: `exact` waits for it (a sync of the pool); without it they may lag by seconds.
   */
  async usage(id: string, exact = true): Promise<DiskUsage> {
    const p = this.at('disks', id);
    if (exact) await this.cmd('btrfs', ['filesystem', 'sync', p]);
    const out = await this.cmd('btrfs', ['qgroup', 'show', '-rf', '--raw', p]);
    // Header lines, then: qgroupid rfer excl max_rfer (one row: this subvolume's own qgroup).
    const row = out
      .split('\n')
      .map((l) => l.trim().split(/\s+/))
      .find((f) => /^0\/\d+$/.test(f[0] ?? ''));
    if (!row) throw new SpaceError('DRIVER_FAILED', `btrfs qgroup show gave no row for ${id}: ${out.trim()}`);
    const limit = row[3] && row[3] !== 'none' ? Number(row[3]) : undefined;
    return { usedBytes: Number(row[1]), exclusiveBytes: Number(row[2]), ...(limit !== undefined ? { limitBytes: limit } : {}) };
  }

  /** Removes disk `id` (gone already: nothing to do). */
  removeDisk(id: string): Promise<void> {
    return this.remove(this.at('disks', id));
  }

  /** Removes copy `copyId` (gone already: nothing to do). */
  removeCopy(copyId: string): Promise<void> {
    return this.remove(this.at('copies', copyId));
  }

  /**
   * Removes a subvolume of the pool (gone already: nothing to do): at once from its place (moved
   * to the trash, made writable first, as a read-only subvolume cannot be moved), then emptied
   * and deleted in the background (see {@link purge}). Its qgroup goes by itself once the kernel
   * has dropped it.
   *
   * @example
   * await pool.remove(path.join(scratch, 'sn1')); // a subvolume received from a stored stream
   */
  async remove(p: string): Promise<void> {
    if (!existsSync(p)) return;
    // -f: a copy received from the store carries a received UUID, which this flip drops. (In its
    // place the copy needs it: a change stored against it names it. Once it goes, nothing does.)
    await this.cmd('btrfs', ['property', 'set', '-f', '-ts', p, 'ro', 'false']);
    const trash = path.join(this.mountPoint, 'trash', `${path.basename(p)}.${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`);
    await fs.rename(p, trash);
    this.purge(trash);
  }

  /**
   * A new scratch directory beside the copies to receive stored streams into (removed, with what
   * is in it, by the next open after a crash).
   *
   * @example
   * const scratch = await pool.receiving(); // <pool>/copies/.recv-XXXXXX
   */
  receiving(): Promise<string> {
    return fs.mkdtemp(path.join(this.mountPoint, 'copies', RECEIVING));
  }

  /** Disks and copies that exist (after a crash: compare with what the daemon knows). */
  async list(): Promise<{ disks: string[]; copies: string[] }> {
    const names = async (d: string) => (await fs.readdir(path.join(this.mountPoint, d))).filter((n) => !n.endsWith('.part') && !n.startsWith(RECEIVING)).sort();
    return { disks: await names('disks'), copies: await names('copies') };
  }

  /** Resolves when no recount started by a deletion is running. */
  settled(): Promise<void> {
    return this.recounting;
  }

  /**
   * Ends the pool's background work for this process: the purge or recount under way finishes,
   * the queued ones are left for the next open. The pool stays mounted (its sandboxes may run on).
   */
  async quiesce(): Promise<void> {
    this.closing = true;
    await this.recounting;
  }

  /** Unmounts the pool, and its vault (its disks and work files must be out of use). */
  async close(): Promise<void> {
    await this.quiesce();
    if (isMountPoint(this.mountPoint)) await this.cmd('umount', [this.mountPoint]);
    await this.vault?.close();
  }

  /** The pool's image file. */
  get imagePath(): string {
    return this.image;
  }

  /**
   * What the pool takes on the host's disk, bytes: its vault's image (the pool and its room for
   * work files) or its own, as allocated (a pool made before 2026-12-07 is sparse: what it holds).
   *
   * @example const gib = (await pool.hostBytes()) / 2 ** 30;
   */
  async hostBytes(): Promise<number> {
    const st = await fs.stat(this.hostImage);
    return Math.min(st.size, st.blocks * 512);
  }

  /**
   * Throws CAPACITY_EXHAUSTED when the host file system under the pool (its vault's image) has
   * less than `reserveBytes` free, or the pool itself less than 1/64 of its size (at least 64
   * MiB): new disks are refused there, running sandboxes go on.
   *
   * @example await pool.checkHostRoom(2 ** 30); // before a new disk
   */
  async checkHostRoom(reserveBytes: number): Promise<void> {
    const refuse = (what: string) => new SpaceError('CAPACITY_EXHAUSTED', `The node's disk is nearly full (${what}): no new sandbox disks until space is freed`, { details: { retryAfterS: 60, resource: 'disk' } });
    const under = path.dirname(this.hostImage);
    const host = await fs.statfs(under);
    if (host.bavail * host.bsize < reserveBytes) throw refuse(`${Math.round((host.bavail * host.bsize) / 1048576)} MiB free under ${under}, ${Math.round(reserveBytes / 1048576)} MiB kept in reserve`);
    const pool = await fs.statfs(this.mountPoint);
    if (pool.bavail * pool.bsize < Math.max(64 * 2 ** 20, (pool.blocks * pool.bsize) / 64)) throw refuse(`the disk pool has ${Math.round((pool.bavail * pool.bsize) / 1048576)} MiB of its ${Math.round((pool.blocks * pool.bsize) / 1048576)} MiB free`);
  }
}

/** Names of images, and so of the disk copies taken with them: snapshot ids, template image keys. */
export const IMAGE_ID = /^[a-z0-9][a-z0-9._-]{0,127}$/;

/**
 * The name of the image checkpointed into `imageDir` (its directory's base name), which names
 * the disk copy taken with it.
 *
 * @example imageId('/var/lib/space/work/sn1a2b') // 'sn1a2b'
 */
export function imageId(imageDir: string): string {
  const id = path.basename(imageDir);
  if (!IMAGE_ID.test(id)) throw new SpaceError('INTERNAL', `A checkpoint image directory must be named like an image id, not ${JSON.stringify(id)}`);
  return id;
}
