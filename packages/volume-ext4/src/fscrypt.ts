/**
 * The kernel's file-system encryption (fscrypt, policy v2) on ext4 images, as volumes and the
 * disk pool's vault use it: the `fscrypt` tool (Debian package `fscrypt`) with a raw 256-bit
 * key, its settings kept beside the images instead of in /etc.
 *
 * On this kernel fscrypt's only cipher is AES-256-XTS in plain C (`xts(ecb(aes-fixed-time))`,
 * no AES-NI module, no Adiantum): ~90–110 MB/s of data read from or written to the disk beneath
 * (measured in docs/architecture.md); a kernel with AES-NI does GB/s.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { SpaceError, mountPoints, run } from '@space/core';

/** fscrypt's settings: raw keys, AES-256-XTS contents, AES-256-CTS names, policy v2. */
export const FSCRYPT_CONF = {
  source: 'raw_key',
  hash_costs: { time: '1', memory: '1024', parallelism: '1' },
  options: { padding: '32', contents: 'AES_256_XTS', filenames: 'AES_256_CTS', policy_version: '2' },
  use_fs_keyring_for_v1_policies: false,
  allow_cross_user_metadata: false,
};

/** Writes {@link FSCRYPT_CONF} to `confPath` (mode 0600) unless it is there. */
export async function ensureFscryptConf(confPath: string): Promise<void> {
  await fs.mkdir(path.dirname(confPath), { recursive: true, mode: 0o700 });
  if (!existsSync(confPath)) await fs.writeFile(confPath, JSON.stringify(FSCRYPT_CONF, null, 2), { mode: 0o600 });
}

/**
 * Runs `fscrypt args` for the file system mounted at `rootMnt`. fscrypt reads a raw key only
 * from a regular file of 32 bytes (not a pipe), so the key is written to a file in RAM
 * (`/dev/shm`), readable by root alone, for the call's duration.
 *
 * @example
 * await fscrypt(['unlock', '/srv/vault/files'], { confPath, rootMnt: '/srv/vault', key, timeoutMs: 60_000 });
 */
export async function fscrypt(args: string[], o: { confPath: string; rootMnt: string; key?: Buffer; timeoutMs: number }): Promise<string> {
  const env = { FSCRYPT_CONF: o.confPath, FSCRYPT_ROOT_MNT: o.rootMnt };
  if (!o.key) return (await run('fscrypt', [...args, '--quiet'], o.timeoutMs, undefined, env)).stdout;
  const dir = await fs.mkdtemp(path.join(existsSync('/dev/shm') ? '/dev/shm' : '/run', 'space-fscrypt-'));
  try {
    await fs.writeFile(path.join(dir, 'key'), o.key, { mode: 0o600 });
    return (await run('fscrypt', [...args, `--key=${path.join(dir, 'key')}`, '--quiet'], o.timeoutMs, undefined, env)).stdout;
  } finally {
    await fs.rm(dir, { recursive: true, force: true });
  }
}

/** mkfs.ext4's options for an image fscrypt can work on: no reserved blocks, `encrypt`, lazy init. */
export function mkfsEncryptableArgs(image: string, label: string): string[] {
  // `nodiscard`: mkfs would punch an image's reserved (fallocated) space back into holes.
  return ['-q', '-F', '-m', '0', '-O', 'encrypt', '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', '-L', label.slice(0, 16), image];
}

/**
 * Unmounts `mnt`, waiting out "busy" for up to ~5 s: a file its last user just closed, or the
 * loop device of an image kept inside, lets go a moment after. Not mounted: nothing to do.
 *
 * @example await unmountSettled('/srv/disks/vault', 60_000);
 */
export async function unmountSettled(mnt: string, timeoutMs: number): Promise<void> {
  for (let i = 0; mountPoints().has(path.resolve(mnt)); i++) {
    try {
      await run('umount', [mnt], timeoutMs);
    } catch (err) {
      if (i >= 50 || !/busy/i.test((err as Error).message)) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

/** Options of {@link EncryptedImage}. */
export interface EncryptedImageOptions {
  /** The image file (sparse unless made with `allocate`: {@link EncryptedImage.open}). */
  image: string;
  /** Where it is mounted; the encrypted directory is `<mnt>/files`. */
  mnt: string;
  /** fscrypt's settings file. */
  confPath: string;
  /** Each command must finish within this. @default 120000 */
  timeoutMs?: number;
}

/**
 * An ext4 image, loop-mounted, whose `files` directory is encrypted with fscrypt under a
 * 256-bit key: what is written there reaches the host's disk as ciphertext (names included),
 * and reads back only while the key is in the kernel (from {@link open} until {@link close}).
 * The disk pool keeps its btrfs image and its work files in one (the "vault").
 *
 * @example
 * const vault = new EncryptedImage({ image: '/srv/disks/vault.img', mnt: '/srv/disks/vault', confPath: '/srv/disks/fscrypt.conf' });
 * const files = await vault.open(key, 100 * 2 ** 30); // '/srv/disks/vault/files'
 */
export class EncryptedImage {
  private readonly timeoutMs: number;

  constructor(private readonly opts: EncryptedImageOptions) {
    this.timeoutMs = opts.timeoutMs ?? 120_000;
  }

  /** The encrypted directory (readable while open). */
  get files(): string {
    return path.join(this.opts.mnt, 'files');
  }

  /** Whether the image is mounted. */
  get mounted(): boolean {
    return mountPoints().has(path.resolve(this.opts.mnt));
  }

  /**
   * Makes the image the first time (`sizeBytes`; made under another name and renamed, so a crash
   * leaves none half-made), mounts it and unlocks `files` with `key`. Idempotent: an image
   * mounted and unlocked already (a daemon started again) is used as it is. A key that is not
   * the image's: `KEY_INVALID`. With `allocate`, a new image takes its whole size on the host
   * (`fallocate`: nothing written), so that the host's disk filling up cannot fail its writes (a
   * loop device over a full file system answers I/O errors); without, it is sparse.
   */
  async open(key: Buffer, sizeBytes: number, opts: { allocate?: boolean } = {}): Promise<string> {
    await ensureFscryptConf(this.opts.confPath);
    await fs.mkdir(this.opts.mnt, { recursive: true, mode: 0o700 });
    if (!existsSync(this.opts.image)) await this.make(key, sizeBytes, opts.allocate ?? false);
    const wasMounted = this.mounted;
    if (!wasMounted) await this.mount(this.opts.image);
    try {
      await this.fscrypt(['unlock', this.files], key);
    } catch (err) {
      if (!/already unlocked/.test((err as Error).message)) {
        if (!wasMounted) await this.close().catch(() => {});
        throw new SpaceError('KEY_INVALID', `${this.opts.image} cannot be unlocked with its key: ${(err as Error).message}`, { cause: err });
      }
    }
    return this.files;
  }

  private async make(key: Buffer, sizeBytes: number, allocate: boolean): Promise<void> {
    const part = `${this.opts.image}.part`;
    await fs.rm(part, { force: true });
    await (await fs.open(part, 'w', 0o600)).close();
    if (allocate) await run('fallocate', ['--length', String(sizeBytes), part], this.timeoutMs);
    else await fs.truncate(part, sizeBytes);
    await run('mkfs.ext4', mkfsEncryptableArgs(part, 'space-vault'), this.timeoutMs);
    await this.mount(part);
    try {
      await this.fscrypt(['setup', this.opts.mnt]);
      await fs.mkdir(this.files, { mode: 0o700 });
      await this.fscrypt(['encrypt', this.files, '--source=raw_key', '--name=space'], key);
    } finally {
      await run('umount', [this.opts.mnt], this.timeoutMs);
    }
    await fs.rename(part, this.opts.image);
  }

  /**
   * `noinit_itable`: the kernel would otherwise zero every inode table of the (sparse, large)
   * image in the background, allocating gigabytes on the host for nothing (mkfs marked them
   * uninitialized, which is all ext4 needs).
   */
  private async mount(image: string): Promise<void> {
    await run('mount', ['-t', 'ext4', '-o', 'loop,nosuid,nodev,noatime,noinit_itable', image, this.opts.mnt], this.timeoutMs);
  }

  private fscrypt(args: string[], key?: Buffer): Promise<string> {
    return fscrypt(args, { confPath: this.opts.confPath, rootMnt: this.opts.mnt, timeoutMs: this.timeoutMs, ...(key ? { key } : {}) });
  }

  /** Unmounts the image (what uses its files must be closed): the key leaves the kernel with it. */
  close(): Promise<void> {
    // The loop device of an image kept in it (the pool's) lets go a moment after its unmount.
    return unmountSettled(this.opts.mnt, this.timeoutMs);
  }
}
