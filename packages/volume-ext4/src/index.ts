/**
 * @space/volume-ext4 — a node's volumes (issue 23), one ext4 file system per volume in a
 * sparse image file, so a writer that fills a volume gets `ENOSPC` and nothing else happens.
 * Its files live in one directory encrypted with the kernel's file-system encryption (fscrypt,
 * policy v2, AES-256-XTS contents and AES-256-CTS names) under a 256-bit key core gives it — a
 * data key wrapped by the tenant's key — so a closed volume's image holds only ciphertext, file
 * names included, and revoking the tenant's key leaves it unopenable.
 *
 * Why this: this kernel has no device mapper (no dm-crypt) and btrfs here has no fscrypt; ext4
 * has both a size bound (its own size) and encryption. The `fscrypt` tool (Debian package
 * `fscrypt`) does the key handling; `fallocate`, `mkfs.ext4`, `mount`, `fsfreeze` the rest. An
 * image takes its whole size on the host when made (reserved, not written).
 *
 * Layout: `<dir>/<id>/volume.img`, mounted (loop) at `<dir>/<id>/mnt`, files in `mnt/files`;
 * snapshots are copies of the image in `<dir>/<id>/snapshots/<snapshot>.img` (ciphertext too).
 */
import { existsSync, promises as fs, readFileSync, readdirSync } from 'node:fs';
import path from 'node:path';
import { KeyedSerial, SpaceError, mountPoints, run, type VolumeHost, type VolumeHostReport } from '@space/core';
import { ensureFscryptConf, fscrypt, mkfsEncryptableArgs, unmountSettled } from './fscrypt.js';

export * from './fscrypt.js';

/** Options of {@link Ext4Volumes}. */
export interface Ext4VolumesOptions {
  /** Directory holding every volume (e.g. `/var/lib/space/volumes`). */
  dir: string;
  /** Owner of a new volume's files directory (the sandboxes' default user). @default 1000 */
  uid?: number;
  /** @default 1000 */
  gid?: number;
  /** Each command must finish within this. @default 120000 */
  timeoutMs?: number;
  /** Crash tests only: called while a snapshot holds an open volume frozen (e.g. the daemon SIGKILLs itself). */
  whileFrozen?: () => void;
}

const ID = /^[a-z0-9][a-z0-9-]{0,63}$/;

/**
 * Writes a file's dirty pages out. Before a sparse copy: what the loop device wrote may still
 * sit in the page cache unallocated, and a copy that skips holes must see it as data.
 */
async function syncFile(file: string): Promise<void> {
  const h = await fs.open(file, 'r');
  try {
    await h.sync();
  } finally {
    await h.close();
  }
}

/**
 * Volumes as ext4 images with fscrypt-encrypted files.
 *
 * @example
 * const host = new Ext4Volumes({ dir: '/var/lib/space/volumes' });
 * await host.create('vol-1a2b', 1024, key);
 * const files = await host.open('vol-1a2b', key); // bind-mount this into sandboxes
 */
export class Ext4Volumes implements VolumeHost {
  private readonly timeoutMs: number;
  /** Serializes the operations on each volume (a mount racing an unmount would leave either state). */
  private readonly serial = new KeyedSerial();

  constructor(private readonly opts: Ext4VolumesOptions) {
    this.timeoutMs = opts.timeoutMs ?? 120_000;
  }

  /** Runs a host command; a missing tool is `VOLUMES_UNAVAILABLE`, a failure `INTERNAL` (with its output). */
  private async run(cmd: string, args: string[], env?: Record<string, string>): Promise<string> {
    try {
      return (await run(cmd, args, this.timeoutMs, undefined, env)).stdout;
    } catch (err) {
      if ((err as { cause?: NodeJS.ErrnoException }).cause?.code === 'ENOENT') throw new SpaceError('VOLUMES_UNAVAILABLE', `${cmd} is not installed: volumes need it (apt-get install fscrypt e2fsprogs util-linux)`, { cause: err });
      throw new SpaceError('INTERNAL', (err as Error).message, { cause: err });
    }
  }

  /** Runs fscrypt on volume `id`'s file system (see {@link fscrypt}); a missing tool is `VOLUMES_UNAVAILABLE`. */
  private async fscrypt(id: string, args: string[], key?: Buffer): Promise<string> {
    try {
      return await fscrypt(args, { confPath: this.confPath, rootMnt: this.mnt(id), timeoutMs: this.timeoutMs, ...(key ? { key } : {}) });
    } catch (err) {
      if ((err as { cause?: NodeJS.ErrnoException }).cause?.code === 'ENOENT') throw new SpaceError('VOLUMES_UNAVAILABLE', 'fscrypt is not installed: volumes need it (apt-get install fscrypt)', { cause: err });
      throw new SpaceError('INTERNAL', (err as Error).message, { cause: err });
    }
  }

  private get confPath(): string {
    return path.join(this.opts.dir, 'fscrypt.conf');
  }

  private box(id: string): string {
    if (!ID.test(id)) throw new SpaceError('BAD_REQUEST', `Invalid volume id ${JSON.stringify(id)}`);
    return path.join(this.opts.dir, id);
  }

  private image(id: string): string {
    return path.join(this.box(id), 'volume.img');
  }

  private mnt(id: string): string {
    return path.join(this.box(id), 'mnt');
  }

  private files(id: string): string {
    return path.join(this.mnt(id), 'files');
  }

  private snapshotPath(id: string, snapshotId: string): string {
    if (!ID.test(snapshotId)) throw new SpaceError('BAD_REQUEST', `Invalid snapshot id ${JSON.stringify(snapshotId)}`);
    return path.join(this.box(id), 'snapshots', `${snapshotId}.img`);
  }

  async doctor(): Promise<VolumeHostReport> {
    const missing: string[] = [];
    for (const [tool, pkg] of [['fscrypt', 'fscrypt'], ['mkfs.ext4', 'e2fsprogs'], ['fsfreeze', 'util-linux'], ['fallocate', 'util-linux'], ['mount', 'mount']] as const) {
      if (!['/usr/sbin', '/usr/bin', '/sbin', '/bin'].some((d) => existsSync(path.join(d, tool)))) missing.push(`${tool} (package ${pkg})`);
    }
    if (missing.length) return { available: false, detail: `missing: ${missing.join(', ')}` };
    if (!existsSync('/sys/fs/ext4/features/encryption')) return { available: false, detail: 'this kernel\'s ext4 has no encryption (CONFIG_FS_ENCRYPTION)' };
    if (!existsSync('/dev/loop-control')) return { available: false, detail: 'no loop devices (/dev/loop-control)' };
    return { available: true, detail: 'ext4 images, files encrypted with fscrypt (AES-256-XTS)' };
  }

  private async ensureConf(): Promise<void> {
    await fs.mkdir(this.opts.dir, { recursive: true, mode: 0o700 });
    await ensureFscryptConf(this.confPath);
  }

  private async mount(id: string): Promise<void> {
    if (mountPoints().has(this.mnt(id))) return;
    await fs.mkdir(this.mnt(id), { recursive: true, mode: 0o700 });
    // A loop device of an earlier mount still detaching would be picked up again by `mount -o
    // loop` and then detached under the new mount (measured: writes lost): wait for it to go.
    await this.loopsGone(id);
    await this.run('mount', ['-t', 'ext4', '-o', 'loop,nosuid,nodev,noatime', this.image(id), this.mnt(id)]);
  }

  /** Loop devices backed by the volume's image (an earlier mount's, detaching). */
  private loopsOf(id: string): string[] {
    const image = path.resolve(this.image(id));
    const out: string[] = [];
    for (const dev of existsSync('/sys/block') ? readdirSync('/sys/block').filter((d) => d.startsWith('loop')) : []) {
      let backing: string;
      try {
        backing = readFileSync(`/sys/block/${dev}/loop/backing_file`, 'utf8').trim();
      } catch {
        continue;
      }
      if (backing === image || backing === `${image} (deleted)`) out.push(`/dev/${dev}`);
    }
    return out;
  }

  /** Waits until no loop device is backed by the image any more (detaching those left after 5 s). */
  private async loopsGone(id: string): Promise<void> {
    for (let i = 0; ; i++) {
      const loops = this.loopsOf(id);
      if (!loops.length) return;
      if (i === 50) for (const l of loops) await this.run('losetup', ['--detach', l]).catch(() => {});
      if (i > 100) throw new SpaceError('INTERNAL', `Loop devices ${loops.join(', ')} of volume ${id} do not detach`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  private async unmount(id: string): Promise<void> {
    // The file system's keys go with it: unmounted, only ciphertext is left. A file its last
    // user just closed (a download's, a sandbox's gofer exiting) may keep it busy a moment.
    try {
      await unmountSettled(this.mnt(id), this.timeoutMs);
    } catch (err) {
      throw new SpaceError('INTERNAL', (err as Error).message, { cause: err });
    }
    // Its loop device detaches on its own (autoclear), a moment later: the image is whole once it has.
    await this.loopsGone(id);
  }

  create(id: string, sizeMb: number, key: Buffer): Promise<void> {
    return this.serial.run(id, async () => {
      await this.ensureConf();
      await fs.mkdir(path.join(this.box(id), 'snapshots'), { recursive: true, mode: 0o700 });
      try {
        await (await fs.open(this.image(id), 'w', 0o600)).close();
        await this.reserve(id, sizeMb);
        await this.run('mkfs.ext4', mkfsEncryptableArgs(this.image(id), id));
        await this.mount(id);
        await this.fscrypt(id, ['setup', this.mnt(id)]);
        await fs.mkdir(this.files(id), { mode: 0o755 });
        await this.fscrypt(id, ['encrypt', this.files(id), '--source=raw_key', '--name=space'], key);
        await fs.chown(this.files(id), this.opts.uid ?? 1000, this.opts.gid ?? 1000);
        await fs.chmod(this.files(id), 0o755);
        await this.unmount(id);
      } catch (err) {
        await this.unmount(id).catch(() => {});
        await fs.rm(this.box(id), { recursive: true, force: true });
        throw err;
      }
    });
  }

  /**
   * Allocates the image's whole size on the host (`fallocate`: instant, nothing written), so a
   * host disk filling up later cannot fail a volume's writes (a loop device over a full file
   * system gives ext4 I/O errors). Not enough room: `CAPACITY_EXHAUSTED`, naming the disk.
   */
  private async reserve(id: string, sizeMb: number): Promise<void> {
    try {
      await this.run('fallocate', ['--length', `${sizeMb}MiB`, this.image(id)]);
    } catch (err) {
      if (!/No space left/i.test((err as Error).message)) throw err;
      const s = await fs.statfs(this.opts.dir);
      throw new SpaceError('CAPACITY_EXHAUSTED', `The node's disk (${this.opts.dir}) has ${Math.floor((s.bavail * s.bsize) / 1048576)} MiB free: no room for a volume of ${sizeMb} MiB`, { cause: err, details: { retryAfterS: 60 } });
    }
  }

  open(id: string, key: Buffer): Promise<string> {
    return this.serial.run(id, async () => {
      if (!existsSync(this.image(id))) throw new SpaceError('VOLUME_NOT_FOUND', `Volume ${id} has no image on this node`, { details: { volumeId: id } });
      await this.ensureConf();
      await this.mount(id);
      try {
        await this.fscrypt(id, ['unlock', this.files(id)], key);
      } catch (err) {
        if (!/already unlocked/.test((err as Error).message)) {
          await this.unmount(id).catch(() => {});
          throw new SpaceError('KEY_INVALID', `Volume ${id} cannot be opened with its key: ${(err as Error).message}`, { cause: err });
        }
      }
      return this.files(id);
    });
  }

  close(id: string): Promise<void> {
    return this.serial.run(id, () => this.unmount(id));
  }

  async openIds(): Promise<string[]> {
    const prefix = path.resolve(this.opts.dir) + '/';
    return [...mountPoints()].filter((m) => m.startsWith(prefix) && m.endsWith('/mnt')).map((m) => m.slice(prefix.length, -'/mnt'.length)).filter((id) => ID.test(id));
  }

  async usedBytes(id: string): Promise<number | undefined> {
    if (!mountPoints().has(this.mnt(id))) return undefined;
    const s = await fs.statfs(this.mnt(id));
    return (s.blocks - s.bfree) * s.bsize;
  }

  remove(id: string): Promise<void> {
    return this.serial.run(id, async () => {
      await this.unmount(id);
      await fs.rm(this.box(id), { recursive: true, force: true });
    });
  }

  snapshot(id: string, snapshotId: string): Promise<void> {
    return this.serial.run(id, async () => {
      const dest = this.snapshotPath(id, snapshotId);
      const tmp = `${dest}.tmp`;
      const frozen = mountPoints().has(this.mnt(id));
      // A consistent copy of an open volume: ext4 flushes and holds every write until thawed.
      if (frozen) await this.run('fsfreeze', ['--freeze', this.mnt(id)]);
      try {
        if (frozen) this.opts.whileFrozen?.();
        await syncFile(this.image(id));
        await this.run('cp', ['--sparse=always', '--reflink=auto', this.image(id), tmp]);
      } finally {
        if (frozen) await this.run('fsfreeze', ['--unfreeze', this.mnt(id)]);
      }
      await syncFile(tmp);
      await fs.rename(tmp, dest);
    });
  }

  restore(id: string, snapshotId: string): Promise<void> {
    return this.serial.run(id, async () => {
      if (mountPoints().has(this.mnt(id))) throw new SpaceError('VOLUME_IN_USE', `Volume ${id} is open: close it before restoring a snapshot`, { details: { volumeId: id } });
      const src = this.snapshotPath(id, snapshotId);
      if (!existsSync(src)) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Volume ${id} has no snapshot ${snapshotId} on this node`, { details: { snapshotId } });
      const tmp = `${this.image(id)}.tmp`;
      await syncFile(src);
      await this.run('cp', ['--sparse=always', '--reflink=auto', src, tmp]);
      await syncFile(tmp);
      await fs.rename(tmp, this.image(id));
      // The copy was sparse: reserve the whole size again.
      await this.reserve(id, Math.round((await fs.stat(this.image(id))).size / 1048576));
    });
  }

  removeSnapshot(id: string, snapshotId: string): Promise<void> {
    return this.serial.run(id, () => fs.rm(this.snapshotPath(id, snapshotId), { force: true }));
  }

  async recover(): Promise<void> {
    if (!existsSync(this.opts.dir)) return;
    // A daemon killed during a snapshot leaves the volume frozen: every writer would hang.
    for (const id of await this.openIds()) await this.run('fsfreeze', ['--unfreeze', this.mnt(id)]).catch(() => {});
    for (const id of (await fs.readdir(this.opts.dir)).filter((n) => ID.test(n))) {
      await fs.rm(`${this.image(id)}.tmp`, { force: true });
      const snaps = path.join(this.box(id), 'snapshots');
      for (const f of existsSync(snaps) ? await fs.readdir(snaps) : []) if (f.endsWith('.tmp')) await fs.rm(path.join(snaps, f), { force: true });
    }
  }
}
