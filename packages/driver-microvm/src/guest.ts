/**
 * Guest artifacts, built by the project from Debian packages and cached by content:
 * - the uncompressed kernel (the xz payload of Debian's vmlinuz: boots ~2x faster than the
 *   compressed one under emulation) and its modules, from `linux-image-amd64` fetched with
 *   `apt-get download` (installing the package would run a ~4 min post-install for nothing);
 * - an initramfs: static busybox, the modules the guest needs with their dependencies, /init;
 * - ext4 disk images (`mke2fs -d`, no loop mounts): one per template root file system, one
 *   for the agent runtime (node + agent + busybox).
 * Nothing here knows the VMM: a Firecracker driver boots the same files.
 */
import { createHash } from 'node:crypto';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { SpaceError, run } from '@space/core';
import { GUEST_INIT } from './init.js';

/** Modules the guest loads, by name; their dependencies are added from each module's `depends=`. */
const MODULES = ['virtio_mmio', 'virtio_blk', 'virtio_console', 'virtio_net', 'virtio_rng', 'ext4', 'overlay', 'crc32c_generic'];

/** Files of a prepared guest. */
export interface GuestKernel {
  /** Kernel release, e.g. `6.1.0-57-amd64`. */
  release: string;
  /** Uncompressed, PVH-bootable ELF kernel. */
  vmlinux: string;
  initramfs: string;
}

/** Options of {@link GuestBuilder}. */
export interface GuestBuilderOptions {
  /** Where artifacts are cached (`<data>/microvm`). */
  dir: string;
  /** A kernel .deb to use instead of downloading `linux-image-amd64`. */
  kernelDeb?: string;
  /** The static busybox copied into the guest. @default /bin/busybox */
  busybox?: string;
}

async function sha(file: string): Promise<string> {
  return createHash('sha256').update(await fs.readFile(file)).digest('hex');
}

/** Builds in progress in this process, by target (two sandboxes of one template share one build). */
const building = new Map<string, Promise<string>>();

/** Writes `target` via a temporary sibling so that a crash never leaves a half-made artifact. */
function atomically(target: string, make: (tmp: string) => Promise<void>): Promise<string> {
  if (existsSync(target)) return Promise.resolve(target);
  let p = building.get(target);
  if (!p) {
    p = makeAtomically(target, make).finally(() => building.delete(target));
    building.set(target, p);
  }
  return p;
}

async function makeAtomically(target: string, make: (tmp: string) => Promise<void>): Promise<string> {
  const tmp = `${target}.tmp-${process.pid}`;
  await fs.rm(tmp, { recursive: true, force: true });
  try {
    await make(tmp);
    await fs.rename(tmp, target);
  } catch (err) {
    await fs.rm(tmp, { recursive: true, force: true });
    throw err;
  }
  return target;
}

/** Total size of a directory tree, bytes (apparent sizes; hard links counted once). */
async function treeBytes(dir: string): Promise<{ bytes: number; inodes: number }> {
  const { stdout } = await run('du', ['-s', '-B1', '--apparent-size', dir], 120_000);
  const inodes = (await run('sh', ['-c', 'find "$0" -xdev | wc -l', dir], 120_000)).stdout.trim();
  return { bytes: Number(stdout.split(/\s/)[0]), inodes: Number(inodes) };
}

/**
 * Builds and caches guest artifacts.
 *
 * @example
 * const guest = new GuestBuilder({ dir: '/var/lib/space/microvm' });
 * const k = await guest.kernel();
 * const disk = await guest.disk('/var/lib/space/templates/minimal/rootfs', 'space-root');
 */
export class GuestBuilder {
  private kernelP: Promise<GuestKernel> | undefined;
  private readonly busybox: string;

  constructor(private readonly opts: GuestBuilderOptions) {
    this.busybox = opts.busybox ?? (existsSync('/bin/busybox') ? '/bin/busybox' : '/usr/bin/busybox');
  }

  /** The kernel and initramfs, made once (and again when the kernel package, busybox or /init change). */
  kernel(): Promise<GuestKernel> {
    this.kernelP ??= this.makeKernel().catch((err) => {
      this.kernelP = undefined;
      throw err;
    });
    return this.kernelP;
  }

  private async makeKernel(): Promise<GuestKernel> {
    const kdir = path.join(this.opts.dir, 'kernel');
    await fs.mkdir(kdir, { recursive: true, mode: 0o700 });
    if (this.opts.kernelDeb && !existsSync(this.opts.kernelDeb)) throw new SpaceError('DRIVER_UNAVAILABLE', `The kernel package ${this.opts.kernelDeb} does not exist: give a Debian linux-image .deb (apt-get download linux-image-amd64), or leave it out to fetch one`);
    const deb = this.opts.kernelDeb ?? (await this.downloadKernel(kdir));
    const debSum = (await sha(deb)).slice(0, 16);
    const extracted = await atomically(path.join(kdir, debSum), async (tmp) => {
      await fs.mkdir(tmp, { recursive: true });
      await run('dpkg-deb', ['-x', deb, tmp], 300_000);
      const boot = (await fs.readdir(path.join(tmp, 'boot'))).find((f) => f.startsWith('vmlinuz-'));
      if (!boot) throw new SpaceError('DRIVER_UNAVAILABLE', `${deb} holds no boot/vmlinuz-*: give a Debian linux-image package`);
      // The uncompressed kernel is the xz stream inside the bzImage.
      const bz = await fs.readFile(path.join(tmp, 'boot', boot));
      const at = bz.indexOf(Buffer.from([0xfd, 0x37, 0x7a, 0x58, 0x5a, 0x00]));
      if (at < 0) throw new SpaceError('DRIVER_UNAVAILABLE', `${boot} is not xz-compressed; cannot extract the uncompressed kernel`);
      await fs.writeFile(path.join(tmp, 'payload.xz'), bz.subarray(at));
      await run('sh', ['-c', 'xz --single-stream -dc "$0/payload.xz" > "$0/vmlinux"', tmp], 120_000);
      await fs.rm(path.join(tmp, 'payload.xz'));
      await fs.writeFile(path.join(tmp, 'release'), boot.slice('vmlinuz-'.length));
    });
    const release = (await fs.readFile(path.join(extracted, 'release'), 'utf8')).trim();
    const key = createHash('sha256').update(debSum).update(await fs.readFile(this.busybox)).update(GUEST_INIT).update(MODULES.join(',')).digest('hex').slice(0, 16);
    const initramfs = await atomically(path.join(kdir, `initramfs-${key}.cpio`), (tmp) => this.makeInitramfs(extracted, release, tmp));
    return { release, vmlinux: path.join(extracted, 'vmlinux'), initramfs };
  }

  /** `apt-get download` of the kernel package `linux-image-amd64` points to. */
  private async downloadKernel(kdir: string): Promise<string> {
    const have = (await fs.readdir(kdir)).filter((f) => /^linux-image-.*\.deb$/.test(f)).sort();
    if (have.length) return path.join(kdir, have.at(-1)!);
    const dep = await run('apt-cache', ['depends', 'linux-image-amd64'], 60_000).catch((err: unknown) => {
      throw new SpaceError('DRIVER_UNAVAILABLE', 'Cannot find the Debian kernel package: run apt-get update (or pass --microvm-kernel-deb FILE)', { cause: err });
    });
    const pkg = /Depends: (linux-image-\S+)/.exec(dep.stdout)?.[1];
    if (!pkg) throw new SpaceError('DRIVER_UNAVAILABLE', 'apt-cache names no kernel behind linux-image-amd64: run apt-get update (or pass --microvm-kernel-deb FILE)');
    const tmp = path.join(kdir, `download-${process.pid}`);
    await fs.mkdir(tmp, { recursive: true });
    try {
      // apt drops privileges to _apt for downloads: the directory must be theirs to write.
      await fs.chmod(tmp, 0o777);
      await run('sh', ['-c', 'cd "$0" && apt-get download -q "$1"', tmp, pkg], 600_000).catch((err: unknown) => {
        throw new SpaceError('DRIVER_UNAVAILABLE', `Cannot download ${pkg}: ${err instanceof Error ? err.message : String(err)}; pass --microvm-kernel-deb FILE on a host without a Debian mirror`, { cause: err });
      });
      const deb = (await fs.readdir(tmp)).find((f) => f.endsWith('.deb'));
      if (!deb) throw new SpaceError('DRIVER_UNAVAILABLE', `apt-get download ${pkg} gave no .deb`);
      await fs.rename(path.join(tmp, deb), path.join(kdir, deb));
      return path.join(kdir, deb);
    } finally {
      await fs.rm(tmp, { recursive: true, force: true });
    }
  }

  private async makeInitramfs(extracted: string, release: string, out: string): Promise<void> {
    const modRoot = path.join(extracted, 'lib', 'modules', release);
    // name -> path relative to modRoot, from every .ko in the tree.
    const byName = new Map<string, string>();
    const walk = async (rel: string): Promise<void> => {
      for (const e of await fs.readdir(path.join(modRoot, rel), { withFileTypes: true })) {
        const r = path.join(rel, e.name);
        if (e.isDirectory()) await walk(r);
        else if (e.name.endsWith('.ko')) byName.set(e.name.slice(0, -3).replace(/-/g, '_'), r);
      }
    };
    await walk('kernel');
    const builtin = new Set((await fs.readFile(path.join(modRoot, 'modules.builtin'), 'utf8')).split('\n').map((l) => path.basename(l, '.ko').replace(/-/g, '_')));
    // Dependencies first: a depth-first walk over each module's `depends=` list.
    const order: string[] = [];
    const seen = new Set<string>();
    const add = async (name: string): Promise<void> => {
      const n = name.replace(/-/g, '_');
      if (seen.has(n) || builtin.has(n)) return;
      seen.add(n);
      const rel = byName.get(n);
      if (!rel) throw new SpaceError('DRIVER_UNAVAILABLE', `kernel ${release} has no module ${n}`);
      const ko = await fs.readFile(path.join(modRoot, rel));
      const at = ko.indexOf('depends=');
      const deps = at < 0 ? '' : ko.subarray(at + 8, ko.indexOf(0, at)).toString();
      for (const d of deps.split(',').filter(Boolean)) await add(d);
      order.push(rel);
    };
    for (const m of MODULES) await add(m);

    const root = `${out}.d`;
    await fs.rm(root, { recursive: true, force: true });
    try {
      for (const d of ['bin', 'etc', 'lib/modules']) await fs.mkdir(path.join(root, d), { recursive: true });
      await fs.copyFile(this.busybox, path.join(root, 'bin', 'busybox'));
      await fs.chmod(path.join(root, 'bin', 'busybox'), 0o755);
      for (const rel of order) {
        await fs.mkdir(path.join(root, 'lib', 'modules', path.dirname(rel)), { recursive: true });
        await fs.copyFile(path.join(modRoot, rel), path.join(root, 'lib', 'modules', rel));
      }
      await fs.writeFile(path.join(root, 'etc', 'modules.order'), order.join('\n') + '\n');
      await fs.writeFile(path.join(root, 'init'), GUEST_INIT, { mode: 0o755 });
      await run('sh', ['-c', 'cd "$0" && find . | sort | "$1" cpio -o -H newc > "$2" 2>/dev/null', root, this.busybox, out], 120_000);
    } finally {
      await fs.rm(root, { recursive: true, force: true });
    }
  }

  /**
   * An ext4 image of `dir` labelled `label`, cached by the directory's path and change time
   * (template root file systems and runtimes are immutable once complete).
   */
  async disk(dir: string, label: 'space-root' | 'space-rt', extra: Record<string, string> = {}): Promise<string> {
    const st = await fs.stat(dir);
    const extras = Object.entries(extra).sort();
    const key = createHash('sha256').update(`${path.resolve(dir)}\0${st.mtimeMs}\0${label}\0${JSON.stringify(extras)}`).digest('hex').slice(0, 20);
    const disks = path.join(this.opts.dir, 'disks');
    await fs.mkdir(disks, { recursive: true, mode: 0o700 });
    return atomically(path.join(disks, `${label}-${key}.ext4`), async (tmp) => {
      let src = dir;
      if (extras.length) {
        // A copy of the tree plus the extra files (the runtime disk carries busybox).
        src = `${tmp}.src`;
        await run('cp', ['-a', '--reflink=auto', `${dir}/.`, src], 300_000);
        for (const [name, from] of extras) await fs.copyFile(from, path.join(src, name));
      }
      try {
        const { bytes, inodes } = await treeBytes(src);
        // Room for ext4's own metadata, and a little for the journal-less file system to breathe.
        const mb = Math.ceil((bytes * 1.15) / 1048576) + 16;
        await run('mke2fs', ['-q', '-F', '-t', 'ext4', '-O', '^has_journal', '-L', label, '-N', String(inodes + 1024), '-d', src, tmp, `${mb}M`], 600_000).catch((err: unknown) => {
          throw new SpaceError('DRIVER_FAILED', `Cannot make the ${label} disk from ${dir}: ${err instanceof Error ? err.message : String(err)} (apt-get install e2fsprogs)`, { cause: err });
        });
      } finally {
        if (src !== dir) await fs.rm(src, { recursive: true, force: true });
      }
    });
  }
}
