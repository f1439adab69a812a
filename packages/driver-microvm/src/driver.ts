/**
 * The microVM driver: each sandbox is a QEMU `microvm` machine with its own guest kernel,
 * under KVM where /dev/kvm works and software emulation (TCG) otherwise. The guest boots the
 * project's kernel + initramfs (see {@link GuestBuilder}); its root is the template's ext4 disk
 * (shared, read-only) under an in-memory overlay, and the agent runtime is a second read-only
 * disk. The agent speaks the same protocol as on gVisor over a virtio-serial port whose host end
 * is a unix socket the driver connects to. Snapshots are QEMU migration streams (the whole
 * machine: memory, devices, every socket), written to and read from unix sockets the daemon
 * holds, so QEMU never spawns anything and runs under its seccomp sandbox with `spawn=deny`.
 * The network is the same per-sandbox namespace as on gVisor: the sandbox link joins a
 * bridge with the VM's tap device, so egress control and credential brokering apply unchanged.
 */
import { createHash, randomBytes } from 'node:crypto';
import { closeSync, createReadStream, createWriteStream, existsSync, openSync, promises as fs, readFileSync, statSync } from 'node:fs';
import { spawn } from 'node:child_process';
import net from 'node:net';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { CHECKPOINT_COMPLETE, SpaceError, createNetns, randomString, readKernelFile, run, tryRun, ensureRuntime, type DriverCreateSpec, type DriverDisks, type DriverEvents, type DriverReport, type ImageAttachment, type RuntimeStatus, type SandboxDriver, type SandboxNetwork, type SandboxUsage } from '@space/core';
import { DISK_MARK, DiskPool, DiskStream, IMAGE_ID, defaultPoolBytes, imageId, parseDiskMark, type DiskMark } from '@space/disk-pool';
import { SERIAL_OPEN_MAGIC, type SerialOpen } from '@space/protocol';
import { AGENT_BUNDLE, AGENT_COMPAT_LIB, AGENT_HELPER } from '@space/agent';
import { GuestBuilder } from './guest.js';
import { qmp } from './qmp.js';

/** Options of {@link MicrovmDriver}. */
export interface MicrovmDriverOptions {
  /** The daemon's data directory; the driver keeps its files under `microvm/`. */
  dataDir: string;
  /** Where the agent runtime is kept (shared with the gVisor driver). @default `<dataDir>/runtime` */
  runtimeDir?: string;
  /** @default "qemu-system-x86_64" */
  qemu?: string;
  /**
   * Hardware acceleration. `auto` uses KVM when /dev/kvm exists and a guest actually boots
   * under it (nested KVM can be present and hang), else software emulation.
   * @default "auto"
   */
  accel?: 'auto' | 'kvm' | 'tcg';
  /** A Debian linux-image .deb to boot instead of the one `linux-image-amd64` names. */
  kernelDeb?: string;
  /** Where guest kernels, initramfs and disk images are cached (shareable between daemons). @default `<dataDir>/microvm` */
  cacheDir?: string;
  /** The sandbox network (as for gVisor). Without it the guest has no network but loopback. */
  network?: SandboxNetwork;
  /** Processes the sandbox's non-root user may run at once. @default memory / 4 MiB, 32..1024 */
  maxProcesses?: number;
  /**
   * The unprivileged user QEMU drops to once its devices are open (`-runas`); created as a
   * system user when missing. `null` keeps QEMU as root (still under seccomp).
   * @default "space-vmm"
   */
  vmmUser?: string | null;
  /**
   * For tests: the loader that gives a restored VM's image a RAM file of its own fails once it
   * has loaded the machine, so checkpoints take the fallback (the whole stream, no RAM file).
   * @default false
   */
  failRamLoader?: boolean;
  /**
   * Sandbox disks: the guest's writable layer is an ext4 file system on a disk of its own (an
   * image file of the sandbox's disk size in the node's {@link DiskPool}, one btrfs subvolume
   * per disk) instead of a tmpfs in guest RAM, so files do not count against memory and a full
   * disk is `ENOSPC` for the writer. Snapshots copy the disk copy-on-write and store it beside
   * the image as gVisor's disks are (docs/disks.md). Absent: files live in guest memory.
   */
  disks?: MicrovmDiskOptions;
}

/** The disks of {@link MicrovmDriverOptions}. */
export interface MicrovmDiskOptions {
  /**
   * Directory of the driver's disk pool: its own, not the gVisor driver's (each driver lists the
   * sandboxes its pool holds). @default "<dataDir>/microvm/pool"
   */
  dir?: string;
  /** 256-bit key of the pool's vault (encrypted at rest, see {@link DiskPool}). */
  key?: Buffer;
  /** Disk size when a create gives none, MiB. @default 5120 */
  defaultMb?: number;
  /** Largest disk, MiB. @default 65536 */
  maxMb?: number;
  /** Size of a new pool, bytes, taken on the host when it is made ({@link DiskPool}). @default {@link defaultPoolBytes}: 32 GiB, or half of the host's free space if less */
  poolBytes?: number;
  /** Creates are refused (CAPACITY_EXHAUSTED) while the host file system has less free. @default 1 GiB */
  reserveBytes?: number;
}

/** Names the box of an image's RAM loader (`<sandbox id>.load`; see ownRam). */
const LOADER_SUFFIX = '.load';
/** Host memory QEMU needs beyond the guest's RAM (device model, TCG translation cache). */
const VMM_OVERHEAD_MB = 160;
const CGROUP_ROOT = '/sys/fs/cgroup';
const CGROUP_PARENT = 'space';
const NETNS_PREFIX = 'space-';
/** Parent of each VM's writable directory (see `paths().vmm`): traversable, not listable. */
const VMM_RUN_DIR = '/run/space-vmm';
/** Where fresh guest RAM files live: tmpfs, never written back to disk. */
const SHM_DIR = '/dev/shm';
/** The sandbox's link inside its namespace, which the bridge joins to the VM's tap. */
const SANDBOX_IF = 'eth0';
/** The pool's template every microVM disk grows from: an empty directory (the disk holds one image file). */
const DISK_TEMPLATE = 'microvm-empty';
/** A disk's image file, in its subvolume; the guest finds it by its ext4 label. */
const DISK_FILE = 'disk.ext4';
const DISK_LABEL = 'space-disk';
/** QEMU's descriptors of the disk: this one read-write, the next read-only (`-add-fd`). */
const DISK_FD = 3;

/** What a VM was started with; a restore must use exactly the same machine. */
interface VmConfig {
  memoryMb: number;
  cpus: number;
  vmlinux: string;
  initramfs: string;
  rootDisk: string;
  runtimeDisk: string;
  cmdline: string;
  network: boolean;
  /**
   * In an image: the guest RAM is the image's `ram` file, not in the migration stream (taken
   * with `x-ignore-shared`). Restores map that file privately (copy on write), so every
   * sandbox restored from one image shares its unchanged pages.
   */
  ramFile?: boolean;
  /**
   * The guest's writable layer is on a disk of this many bytes (an ext4 image, `disk.ext4` in
   * the incarnation's disk in the pool); absent: a tmpfs in guest RAM. Restores of an image with
   * one make the new incarnation's disk from the copy its checkpoint took ({@link DISK_MARK}).
   */
  diskBytes?: number;
}

/** Where the current incarnation's RAM lives (`<box>/ram.json`). */
interface RamBacking {
  path: string;
  /** share=on: the VM writes into the file (a fresh RAM file); off: a private mapping of an image's RAM. */
  shared: boolean;
}

/**
 * The btrfs limit of a disk's subvolume for a disk of `bytes`: a backstop only (the guest's file
 * system is what fills), twice the disk because a block rewritten after a snapshot keeps its old
 * extent referenced.
 */
const diskBackstop = (bytes: number): number => 2 * bytes;

/** A saved machine a new incarnation loads (see `start`). */
interface Incoming {
  /** The image's machine state. */
  memory: string;
  /** The image's RAM file, mapped copy-on-write. */
  ram?: string;
  /** Grow the disk to this many bytes once the machine runs (larger than the image's). */
  growDiskTo?: number;
}

/** What the driver knows of one sandbox's current incarnation. */
interface Box {
  /** Connected agent socket, if any. */
  agent?: net.Socket;
  /** Set by detachAgent: do not reconnect until the next restore/adopt. */
  detached: boolean;
  /** What the next connection's open message carries (boot env, network, clock, entropy). */
  open: SerialOpen;
  /** Bumped per incarnation, so an old reconnect loop stops. */
  generation: number;
}

function newRid(id: string): string {
  return `${id}-${randomString(8)}`;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * The microVM driver.
 *
 * @example
 * const driver = new MicrovmDriver({ dataDir: '/var/lib/space' });
 * driver.bind({ agentConnected: (id, s) => service.onAgent(id, s) });
 * await driver.init();
 */
export class MicrovmDriver implements SandboxDriver {
  readonly name = 'microvm';
  readonly checkpointsAnyState = true;
  /** Under software emulation a boot takes 10–20 s, more with several at once. */
  readonly bootTimeoutMs = 180_000;
  private events?: DriverEvents;
  private readonly dir: string;
  private readonly boxesDir: string;
  private readonly qemu: string;
  private readonly guest: GuestBuilder;
  private readonly cacheDir: string;
  private vmmUser: { name: string; uid: number; gid: number } | undefined;
  /** Tells this daemon's VM directories under /run from another daemon's. */
  private readonly tag: string;
  private readonly boxes = new Map<string, Box>();
  private runtimeDir = '';
  private accelP: Promise<{ accel: 'kvm' | 'tcg'; why: string }> | undefined;
  private versionP: Promise<string> | undefined;
  /** Sandbox disks, when enabled (see {@link MicrovmDriverOptions.disks}). */
  readonly disks?: DriverDisks;
  /** With disks: a snapshot's disk copy, stored beside its image (into the encrypted store). */
  readonly imageAttachments: readonly ImageAttachment[];
  private pool?: DiskPool;

  constructor(private readonly opts: MicrovmDriverOptions) {
    if (opts.disks) {
      this.disks = { defaultMb: opts.disks.defaultMb ?? 5120, maxMb: opts.disks.maxMb ?? 65536, grownByAgent: true };
      if (this.disks.defaultMb > this.disks.maxMb) throw new SpaceError('CONFIG_INVALID', `The default disk (${this.disks.defaultMb} MiB) is larger than the largest allowed (${this.disks.maxMb} MiB): lower --disk-default or raise --disk-max`);
    }
    this.imageAttachments = opts.disks ? [new DiskStream(() => this.pool)] : [];
    this.dir = path.join(opts.dataDir, 'microvm');
    this.boxesDir = path.join(this.dir, 'boxes');
    this.qemu = opts.qemu ?? 'qemu-system-x86_64';
    this.cacheDir = opts.cacheDir ?? this.dir;
    this.tag = createHash('sha256').update(path.resolve(opts.dataDir)).digest('hex').slice(0, 8);
    this.guest = new GuestBuilder({ dir: this.cacheDir, ...(opts.kernelDeb ? { kernelDeb: opts.kernelDeb } : {}) });
  }

  /** Where each VM's directory is (`<dir>/<sandbox id>/qmp.sock`): what a lease keeper stops. */
  get vmsDir(): string {
    return this.boxesDir;
  }

  bind(events: DriverEvents): void {
    this.events = events;
  }

  async init(): Promise<void> {
    await fs.mkdir(this.boxesDir, { recursive: true, mode: 0o700 });
    // A loader a daemon died with (see ownRam): its image was never marked complete.
    for (const d of await fs.readdir(this.boxesDir)) if (d.endsWith(LOADER_SUFFIX)) await this.destroy(d);
    const user = this.opts.vmmUser === undefined ? 'space-vmm' : this.opts.vmmUser;
    if (user) this.vmmUser = await ensureSystemUser(user);
    this.runtimeDir = await ensureRuntime(this.opts.runtimeDir ?? path.join(this.opts.dataDir, 'runtime'), AGENT_BUNDLE, [AGENT_HELPER, AGENT_COMPAT_LIB]);
    // Fails here (not at the first create) when QEMU, the kernel or the asked-for KVM cannot be had.
    await this.guest.kernel();
    await this.accel();
    if (this.opts.disks) await this.openPool(this.opts.disks);
  }

  /** Opens the disk pool and imports the empty template every disk grows from (once). */
  private async openPool(o: MicrovmDiskOptions): Promise<void> {
    // (Not `<dir>/disks`: the guest builder's cache of template disks.)
    const dir = o.dir ?? path.join(this.dir, 'pool');
    await fs.mkdir(dir, { recursive: true, mode: 0o700 });
    const sizeBytes = o.poolBytes ?? (await defaultPoolBytes(dir, o.reserveBytes ?? 2 ** 30));
    this.pool = await DiskPool.open({ dir, sizeBytes, ...(o.key ? { key: o.key } : {}) });
    if (this.disks) this.disks.poolBytes = await this.pool.hostBytes();
    if (!this.pool.templatePath(DISK_TEMPLATE)) {
      const empty = await fs.mkdtemp(path.join(this.dir, 'empty-'));
      try {
        await this.pool.importTemplate(DISK_TEMPLATE, empty);
      } finally {
        await fs.rm(empty, { recursive: true, force: true });
      }
    }
  }

  /** The disk pool; throws before {@link init}. */
  private disksPool(): DiskPool {
    if (!this.pool) throw new SpaceError('SNAPSHOT_CORRUPT', 'This image was taken with a disk (by a daemon with --disks on): start the daemon with --disks on to restore it');
    return this.pool;
  }

  /**
   * A disk for incarnation `rid`: a new empty ext4 file system of `bytes` (sparse: the host
   * holds what the guest writes; `mke2fs` with lazy init takes ~10 ms), or a writable copy-on-write
   * snapshot of copy `fromCopy` (a restore, fork or rollback; nothing copied). Returns the
   * image file. The subvolume's btrfs limit is twice the disk: the file cannot outgrow its size,
   * but a block rewritten after a snapshot keeps the old extent referenced, which btrfs counts.
   */
  private async makeDisk(rid: string, bytes: number, fromCopy?: string): Promise<string> {
    const pool = this.disksPool();
    if (!fromCopy) await pool.checkHostRoom(this.opts.disks?.reserveBytes ?? 2 ** 30);
    const dir = fromCopy ? await pool.diskFromCopy(fromCopy, rid, diskBackstop(bytes)) : await pool.createDisk(rid, DISK_TEMPLATE, diskBackstop(bytes));
    const file = path.join(dir, DISK_FILE);
    if (!fromCopy) {
      try {
        await run('truncate', ['-s', String(bytes), file], 10_000);
        // No blocks kept for root (the agent is root); lazy init: nothing written but metadata.
        await run('mke2fs', ['-q', '-F', '-t', 'ext4', '-L', DISK_LABEL, '-m', '0', '-E', 'lazy_itable_init=1,lazy_journal_init=1,nodiscard', file], 60_000);
      } catch (err) {
        await pool.removeDisk(rid).catch(() => {});
        throw err;
      }
    }
    return file;
  }

  /** The disk of incarnation `rid`'s image file, if it has one. */
  private diskFile(rid: string): string | undefined {
    if (!this.pool) return undefined;
    try {
      const f = path.join(this.pool.diskPath(rid), DISK_FILE);
      return existsSync(f) ? f : undefined;
    } catch {
      return undefined; // (not a disk name: a loader's)
    }
  }

  async doctor(): Promise<DriverReport> {
    const checks: DriverReport['checks'] = [];
    const v = await tryRun(this.qemu, ['--version'], 10_000);
    checks.push({ name: 'qemu', ok: !!v, detail: v ? v.stdout.split('\n')[0]! : `${this.qemu} not found: apt-get install qemu-system-x86` });
    const k = await this.guest.kernel().then(
      (g) => ({ ok: true, detail: `kernel ${g.release}, initramfs ${path.basename(g.initramfs)}` }),
      (err: unknown) => ({ ok: false, detail: err instanceof Error ? err.message : String(err) }),
    );
    checks.push({ name: 'guest kernel', ...k });
    const mk = await tryRun('mke2fs', ['-V'], 5_000);
    checks.push({ name: 'mke2fs', ok: !!mk, detail: mk ? (mk.stderr || mk.stdout).split('\n')[0]! : 'apt-get install e2fsprogs' });
    if (this.disks) {
      const btrfs = await tryRun('btrfs', ['--version'], 5_000);
      checks.push({ name: 'btrfs-progs', ok: !!btrfs, detail: btrfs ? `${btrfs.stdout.trim()} (the sandbox disks' pool)` : 'apt-get install btrfs-progs (sandbox disks, --disks on)' });
    }
    if (v && k.ok) {
      const a = await this.accel().then(
        (x) => ({ ok: true, detail: `${x.accel}: ${x.why}` }),
        (err: unknown) => ({ ok: false, detail: err instanceof Error ? err.message : String(err) }),
      );
      checks.push({ name: 'acceleration', ...a });
    }
    const u = this.opts.vmmUser === undefined ? 'space-vmm' : this.opts.vmmUser;
    if (u) {
      const id = await tryRun('id', ['-u', u], 5_000);
      checks.push({ name: 'vmm user', ok: true, detail: id ? `QEMU drops to ${u} (uid ${id.stdout.trim()})` : `${u} is created (useradd --system) when the driver starts` });
    }
    checks.push({ name: 'root', ok: process.getuid?.() === 0, detail: process.getuid?.() === 0 ? 'running as root' : 'network namespaces and cgroups need root' });
    return { driver: this.name, available: checks.every((c) => c.ok), checks };
  }

  /** KVM if asked, or (auto) if a guest boots under it within seconds; else TCG. Probed once. */
  private accel(): Promise<{ accel: 'kvm' | 'tcg'; why: string }> {
    const want = this.opts.accel ?? 'auto';
    if (want === 'tcg') return Promise.resolve({ accel: 'tcg', why: 'software emulation (configured)' });
    this.accelP ??= (async () => {
      let usable = true;
      try {
        await fs.access('/dev/kvm', fs.constants.R_OK | fs.constants.W_OK);
      } catch {
        usable = false;
      }
      const booted = usable && (await this.probeKvm());
      if (booted) return { accel: 'kvm' as const, why: 'KVM (a probe guest booted under it)' };
      const why = usable ? '/dev/kvm exists but a probe guest did not boot under it within 6 s (nested KVM without VMX?)' : '/dev/kvm is missing or not accessible';
      if (want === 'kvm') throw new SpaceError('DRIVER_UNAVAILABLE', `--microvm-accel kvm, but ${why}: use --microvm-accel auto or tcg (software emulation) on this host`);
      return { accel: 'tcg' as const, why: `software emulation: ${why}` };
    })().catch((err: unknown) => {
      this.accelP = undefined;
      throw err;
    });
    return this.accelP;
  }

  /**
   * Whether a guest runs under KVM here: boots the guest kernel with no disks, whose /init
   * reports and powers off within a second on KVM. /dev/kvm can exist, even create VMs, and
   * never run one (nested KVM without VMX, as on this project's CI host). The answer is kept
   * per host boot in the cache directory, so daemons after the first do not wait for it.
   */
  private async probeKvm(): Promise<boolean> {
    const k = await this.guest.kernel();
    const bootId = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    const key = `${bootId} ${k.vmlinux} ${k.initramfs}`;
    const file = path.join(this.cacheDir, 'kvm-probe.json');
    try {
      const cached = JSON.parse(readFileSync(file, 'utf8')) as { key: string; ok: boolean };
      if (cached.key === key) return cached.ok;
    } catch {
      // not probed on this boot yet
    }
    const r = await tryRun('timeout', ['-s', 'KILL', '6', this.qemu, '-M', 'microvm', '-accel', 'kvm', '-cpu', 'host', '-m', '128M', '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot', '-serial', 'stdio', '-kernel', k.vmlinux, '-initrd', k.initramfs, '-append', `console=ttyS0 quiet panic=-1 reboot=t ${tscArg()}`], 10_000);
    const ok = !!r && r.stdout.includes('SPACE_INIT_FAILED');
    await fs.writeFile(file, JSON.stringify({ key, ok })).catch(() => {});
    return ok;
  }

  private paths(id: string) {
    const dir = path.join(this.boxesDir, id);
    return {
      dir,
      qmp: path.join(dir, 'qmp.sock'),
      agent: path.join(dir, 'agent.sock'),
      /**
       * The one directory the VMM's user may write (its migration socket). Under /run, not the
       * data directory: the user must be able to reach it, and may reach nothing else of ours.
       */
      vmm: path.join(VMM_RUN_DIR, `${this.tag}-${id}`),
      migrate: path.join(VMM_RUN_DIR, `${this.tag}-${id}`, 'migrate.sock'),
      pid: path.join(dir, 'qemu.pid'),
      console: path.join(dir, 'console.log'),
      /** QEMU's own stdout and stderr. */
      log: path.join(dir, 'qemu.log'),
      rid: path.join(dir, 'runtime-id'),
      config: path.join(dir, 'vm.json'),
      ram: path.join(dir, 'ram.json'),
    };
  }

  private rid(id: string): string {
    try {
      return readFileSync(this.paths(id).rid, 'utf8').trim() || id;
    } catch {
      return id;
    }
  }

  private box(id: string): Box {
    let b = this.boxes.get(id);
    if (!b) this.boxes.set(id, (b = { detached: false, open: {}, generation: 0 }));
    return b;
  }

  async create(spec: DriverCreateSpec, signal?: AbortSignal): Promise<void> {
    const k = await this.guest.kernel();
    const rootDisk = await this.guest.disk(spec.rootfs, 'space-root');
    const runtimeDisk = await this.guest.disk(this.runtimeDir, 'space-rt', { busybox: this.guestBusybox() });
    signal?.throwIfAborted();
    const cpus = Math.max(1, Math.ceil(spec.cpu));
    const nproc = this.opts.maxProcesses ?? Math.min(1024, Math.max(32, Math.floor(spec.memoryMb / 4)));
    // The in-memory root file system may use up to half of the guest's RAM (tmpfs default).
    const diskBytes = this.disks ? (spec.diskMb ?? this.disks.defaultMb) * 1048576 : undefined;
    const cmdline = `console=ttyS0 quiet panic=-1 reboot=t ${tscArg()} space.id=${spec.id} space.nproc=${nproc} space.rwmb=${Math.floor(spec.memoryMb / 2)}${diskBytes ? ' space.disk=1' : ''}`;
    const config: VmConfig = { memoryMb: spec.memoryMb, cpus, vmlinux: k.vmlinux, initramfs: k.initramfs, rootDisk, runtimeDisk, cmdline, network: !!this.opts.network, ...(diskBytes ? { diskBytes } : {}) };
    const b = this.box(spec.id);
    b.open = { boot: { sandboxId: spec.id, env: spec.env } };
    await this.start(spec.id, spec.cpu, config, undefined, undefined, signal);
  }

  /** The RAM file of a fresh incarnation: on tmpfs, so guest memory is never written back to disk. */
  private freshRam(rid: string): string {
    return path.join(SHM_DIR, `space-${rid}.ram`);
  }

  /** The busybox copied onto the runtime disk (addresses and clock for the agent). */
  private guestBusybox(): string {
    return existsSync('/bin/busybox') ? '/bin/busybox' : '/usr/bin/busybox';
  }

  /**
   * Starts QEMU for a new incarnation of sandbox `id`: a netns with the sandbox link bridged to
   * a tap, a RAM file, a cgroup, and QEMU detached from the daemon; with `incoming`, the VM
   * loads a saved machine (and, with `incoming.ram`, maps that image's RAM copy-on-write).
   */
  private async start(id: string, cpuQuota: number, config: VmConfig, incoming: Incoming | undefined, diskCopy: string | undefined, signal?: AbortSignal): Promise<void> {
    if (!this.events) throw new Error('bind() first');
    const p = this.paths(id);
    const rid = newRid(id);
    await fs.mkdir(p.dir, { recursive: true, mode: 0o700 });
    await fs.mkdir(VMM_RUN_DIR, { recursive: true, mode: 0o711 });
    await fs.mkdir(p.vmm, { recursive: true, mode: 0o700 });
    if (this.vmmUser) await fs.chown(p.vmm, this.vmmUser.uid, this.vmmUser.gid);
    await fs.writeFile(p.rid, rid);
    for (const f of [p.qmp, p.agent, p.migrate, p.pid]) await fs.rm(f, { force: true });
    if (p.agent.length > 107) throw new SpaceError('DRIVER_FAILED', `Socket path ${p.agent} is too long for a unix socket; use a shorter --data-dir`);
    const b = this.box(id);
    b.generation++;
    b.detached = false;
    const netns = `${NETNS_PREFIX}${rid}`;
    if (config.network && !this.opts.network) throw new SpaceError('DRIVER_FAILED', 'This snapshot was taken with a sandbox network and the daemon runs without one (--egress off)');
    await createNetns(netns, config.network && this.opts.network ? { network: this.opts.network, id, ifname: SANDBOX_IF } : undefined);
    if (config.network) b.open.net = await this.bridge(netns);
    else delete b.open.net;
    signal?.throwIfAborted();
    const { accel } = await this.accel();
    const ram: RamBacking = incoming?.ram ? { path: incoming.ram, shared: false } : { path: this.freshRam(rid), shared: true };
    await fs.writeFile(p.ram, JSON.stringify(ram));
    const disk = config.diskBytes ? await this.makeDisk(rid, config.diskBytes, diskCopy) : undefined;
    const args = this.vmmArgs(id, config, ram, disk, accel, p, !!incoming);
    await fs.writeFile(p.config, JSON.stringify(config));
    const pid = await this.spawnVmm(netns, args, p, disk);
    await this.cgroup(rid, pid, config.memoryMb, cpuQuota);
    if (incoming) await this.receive(p, incoming.memory, !!incoming.ram);
    if (incoming?.growDiskTo && disk) await this.growDisk(rid, p, config, incoming.growDiskTo);
    void this.connectAgent(id, b.generation);
  }

  /**
   * Grows the disk of a running restored machine to `bytes`: its btrfs backstop first, then the
   * device (QEMU extends the file and tells the guest, whose kernel sees the new size a moment
   * later). The file system on it is grown by the agent (core sends the size in the identity).
   * Before the agent connects, so no request reaches the old size.
   */
  private async growDisk(rid: string, p: ReturnType<MicrovmDriver['paths']>, config: VmConfig, bytes: number): Promise<void> {
    await this.pool!.resizeDisk(rid, diskBackstop(bytes));
    await qmp(p.qmp, [{ execute: 'block_resize', arguments: { device: 'disk', size: bytes } }]).catch((err: unknown) => {
      throw new SpaceError('DRIVER_FAILED', `QEMU could not grow the sandbox's disk to ${bytes} bytes: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    });
    // Its next checkpoint's image carries the size it has now.
    config.diskBytes = bytes;
    await fs.writeFile(p.config, JSON.stringify(config));
  }

  /**
   * QEMU's command line for an incarnation of `id` (or a loader of its image) with its RAM in
   * `ram`; `incoming` waits for a saved machine, `hold` keeps the loaded machine stopped.
   */
  private vmmArgs(id: string, config: VmConfig, ram: RamBacking, disk: string | undefined, accel: 'kvm' | 'tcg', p: ReturnType<MicrovmDriver['paths']>, incoming: boolean, hold = false): string[] {
    return [
      '-name', `space-${id},process=space-vm-${id}`,
      '-M', 'microvm,pit=off,pic=off,isa-serial=on,rtc=on,memory-backend=ram0',
      '-object', `memory-backend-file,id=ram0,size=${config.memoryMb}M,mem-path=${ram.path},share=${ram.shared ? 'on' : 'off'}`,
      '-accel', accel === 'kvm' ? 'kvm' : 'tcg,tb-size=64',
      '-cpu', accel === 'kvm' ? 'host' : 'max',
      '-m', `${config.memoryMb}M`,
      '-smp', String(config.cpus),
      '-nodefaults', '-no-user-config', '-display', 'none', '-no-reboot',
      '-serial', `file:${p.console}`,
      '-kernel', config.vmlinux, '-initrd', config.initramfs, '-append', config.cmdline,
      '-drive', `id=root,file=${config.rootDisk},format=raw,if=none,readonly=on`, '-device', 'virtio-blk-device,drive=root',
      '-drive', `id=rt,file=${config.runtimeDisk},format=raw,if=none,readonly=on`, '-device', 'virtio-blk-device,drive=rt',
      // The writable disk, as two descriptors the daemon opens (see spawnVmm); a loader (no
      // `disk`), whose guest never runs, gets a null device of its size.
      ...(config.diskBytes ? [...(disk ? ['-add-fd', `fd=${DISK_FD},set=1`, '-add-fd', `fd=${DISK_FD + 1},set=1`] : []), '-drive', disk ? `id=disk,file=/dev/fdset/1,format=raw,if=none,discard=unmap` : `id=disk,driver=null-co,size=${config.diskBytes},if=none`, '-device', 'virtio-blk-device,drive=disk'] : []),
      '-device', 'virtio-serial-device',
      '-chardev', `socket,id=agent,path=${p.agent},server=on,wait=off`,
      '-device', 'virtserialport,chardev=agent,name=space-agent',
      '-object', 'rng-random,id=rng,filename=/dev/urandom', '-device', 'virtio-rng-device,rng=rng',
      ...(config.network ? ['-netdev', 'tap,id=net0,ifname=tap0,script=no,downscript=no', '-device', 'virtio-net-device,netdev=net0'] : []),
      '-qmp', `unix:${p.qmp},server=on,wait=off`,
      // QEMU's seccomp filter: no exec, no obsolete syscalls, no scheduler/affinity changes. It
      // is installed before QEMU drops to its own user (-runas), so set*id calls stay allowed;
      // without CAP_SETUID after the drop they cannot raise anything.
      '-sandbox', `on,obsolete=deny,elevateprivileges=${this.vmmUser ? 'allow' : 'deny'},spawn=deny,resourcecontrol=deny`,
      ...(this.vmmUser ? ['-runas', this.vmmUser.name] : []),
      ...(incoming ? ['-incoming', 'defer'] : []),
      // A loader (see ownRam) only holds the machine: its guest never runs.
      ...(hold ? ['-S'] : []),
    ];
  }

  /**
   * Starts QEMU in the sandbox's netns, detached from the daemon (it outlives a daemon restart),
   * and waits for its control socket. Not `-daemonize`: that forks after the seccomp filter
   * forbids it. nsenter execs QEMU in place, so the child's pid is QEMU's.
   */
  private async spawnVmm(netns: string, args: string[], p: ReturnType<MicrovmDriver['paths']>, disk?: string): Promise<number> {
    const fd = openSync(p.log, 'w', 0o600);
    // The disk as descriptors, read-write and read-only: QEMU, which has dropped to its own
    // user by then, reopens its disk read-only when a snapshot stops the machine and read-write
    // when a restored one starts, and could not open the file itself (the pool is the daemon's).
    const diskFds = disk ? [openSync(disk, 'r+'), openSync(disk, 'r')] : [];
    const child = spawn('nsenter', [`--net=/var/run/netns/${netns}`, this.qemu, ...args], { stdio: ['ignore', fd, fd, ...diskFds], detached: true });
    closeSync(fd);
    for (const d of diskFds) closeSync(d);
    let exited: string | undefined;
    child.on('error', (err) => (exited = `cannot run ${this.qemu}: ${err.message} (apt-get install qemu-system-x86)`));
    child.on('exit', (code, sig) => (exited ??= sig ?? `exit ${code}`));
    child.unref();
    const pid = child.pid;
    for (let i = 0; ; i++) {
      if (exited !== undefined || !pid) throw new SpaceError('DRIVER_FAILED', `QEMU did not start (${exited}): ${(await logTail(p.log)) || 'no output'}`);
      if (await canConnect(p.qmp)) break;
      if (i > 1500) {
        process.kill(pid, 'SIGKILL');
        throw new SpaceError('DRIVER_FAILED', 'QEMU did not open its control socket within 30 s');
      }
      await sleep(20);
    }
    await fs.writeFile(p.pid, String(pid));
    return pid;
  }

  /** Joins the sandbox link and a new tap in one bridge; returns the guest's addresses (moved off the namespace). */
  private async bridge(netns: string): Promise<SerialOpen['net']> {
    const addrs = JSON.parse((await run('ip', ['-n', netns, '-j', 'addr', 'show', 'dev', SANDBOX_IF])).stdout) as { addr_info?: { family: string; local: string; prefixlen: number }[] }[];
    const a = addrs[0]?.addr_info?.find((x) => x.family === 'inet');
    const routes = JSON.parse((await run('ip', ['-n', netns, '-j', 'route', 'show', 'dev', SANDBOX_IF])).stdout) as { dst: string; gateway?: string }[];
    const gw = routes.find((r) => r.gateway)?.gateway;
    if (!a || !gw) throw new SpaceError('DRIVER_FAILED', `The sandbox link in ${netns} has no address or route`);
    // The namespace itself must not own the guest's address (it would answer for it).
    await tryRun('ip', ['netns', 'exec', netns, 'sysctl', '-q', '-w', 'net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1'], 10_000);
    await run('ip', ['-n', netns, '-b', '-'], 10_000, [`route flush dev ${SANDBOX_IF}`, `addr flush dev ${SANDBOX_IF}`, 'link add br0 type bridge', 'tuntap add tap0 mode tap', `link set ${SANDBOX_IF} master br0`, 'link set tap0 master br0', 'link set tap0 up', 'link set br0 up', ''].join('\n'));
    return { address: a.local, prefixLength: a.prefixlen, gateway: gw, routes: routes.filter((r) => r.gateway).map((r) => r.dst) };
  }

  /** A cgroup v1 memory + cpu group for the VMM process: guest RAM + device model, and the sandbox's CPU share. */
  private async cgroup(rid: string, pid: number, memoryMb: number, cpu: number): Promise<void> {
    const mem = path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, rid);
    const cpuDir = path.join(CGROUP_ROOT, 'cpu', CGROUP_PARENT, rid);
    await fs.mkdir(mem, { recursive: true });
    await fs.writeFile(path.join(mem, 'memory.limit_in_bytes'), String((memoryMb + VMM_OVERHEAD_MB) * 1048576));
    await fs.writeFile(path.join(mem, 'cgroup.procs'), String(pid));
    await fs.mkdir(cpuDir, { recursive: true });
    await fs.writeFile(path.join(cpuDir, 'cpu.cfs_period_us'), '100000');
    await fs.writeFile(path.join(cpuDir, 'cpu.cfs_quota_us'), String(Math.max(1000, Math.round(cpu * 100_000))));
    await fs.writeFile(path.join(cpuDir, 'cgroup.procs'), String(pid));
  }

  /** Streams a saved machine into a VM started with `-incoming defer`, then runs it. */
  private async receive(p: ReturnType<MicrovmDriver['paths']>, file: string, ramFromFile: boolean): Promise<void> {
    await this.listenIncoming(p, ramFromFile);
    const sock = await connectRetry(p.migrate, 10_000);
    // QEMU closes its end as soon as it has read the end of the stream, which can be before
    // this side sees its own write finish: whether the load worked is QEMU's to say, below.
    // The file is closed then too: a read stream whose destination closed before it read to
    // its end stays open, unpiped, for as long as the daemon runs (measured: with a second test
    // lane loading the host, two restores of one microVM suite run each left a descriptor of an
    // image's deleted `memory` file, its whole size held on the host, and the disk pool's vault
    // could not be unmounted).
    await new Promise<void>((resolve, reject) => {
      const rs = createReadStream(file, { highWaterMark: 1 << 20 });
      rs.on('error', (err) => {
        sock.destroy();
        reject(new SpaceError('DRIVER_FAILED', `Cannot read the machine state ${file}: ${err.message}`, { cause: err }));
      });
      sock.on('error', () => rs.destroy());
      sock.on('close', () => {
        rs.destroy();
        resolve();
      });
      rs.pipe(sock);
    });
    await this.loaded(p, true);
  }

  /** Has a VM started with `-incoming defer` listen for a saved machine on its migration socket. */
  private async listenIncoming(p: ReturnType<MicrovmDriver['paths']>, ramFromFile: boolean): Promise<void> {
    await qmp(p.qmp, [
      // With the image's RAM mapped from its file, the stream carries only the devices.
      { execute: 'migrate-set-capabilities', arguments: { capabilities: [{ capability: 'x-ignore-shared', state: ramFromFile }] } },
      { execute: 'migrate-incoming', arguments: { uri: `unix:${p.migrate}` } },
    ]);
  }

  /** Waits until the VM has loaded the machine streamed in; then runs it, or (`run` false) leaves it stopped. */
  private async loaded(p: ReturnType<MicrovmDriver['paths']>, run: boolean): Promise<void> {
    for (let i = 0; ; i++) {
      const st = (await qmp(p.qmp, [{ execute: 'query-status' }]).catch(() => [undefined]))[0] as { status: string } | undefined;
      if (!st) throw new SpaceError('DRIVER_FAILED', `QEMU could not load the machine state: ${(await logTail(p.log)) || 'it exited'}`);
      if (st.status !== 'inmigrate') {
        if (run && st.status !== 'running') await qmp(p.qmp, [{ execute: 'cont' }]);
        return;
      }
      if (i > 3000) throw new SpaceError('DRIVER_FAILED', 'QEMU did not finish loading the snapshot within 60 s');
      await sleep(20);
    }
  }

  /**
   * Connects to the agent's port (retrying while the VM boots), opens the connection and hands
   * it to core; reconnects when it drops, unless detached or superseded by a new incarnation.
   */
  private async connectAgent(id: string, generation: number): Promise<void> {
    const p = this.paths(id);
    const b = this.box(id);
    const deadline = Date.now() + 120_000;
    while (b.generation === generation && !b.detached) {
      const sock = await connectRetry(p.agent, 1_000).catch(() => undefined);
      if (b.generation !== generation || b.detached) {
        sock?.destroy();
        return;
      }
      if (!sock) {
        if (Date.now() > deadline || !(await this.alive(id))) return;
        continue;
      }
      sock.setNoDelay(true);
      // The clock as it is now, not when the restore began: a restore under load takes seconds,
      // and a guest set to the older time stays that far behind.
      const open = b.open.now !== undefined ? { ...b.open, now: Date.now() } : b.open;
      // Boot settings, clock and entropy go with the first connection of an incarnation only.
      b.open = open.net ? { net: open.net } : {};
      sock.write(`${SERIAL_OPEN_MAGIC}${Buffer.from(JSON.stringify(open)).toString('base64')}\n`);
      b.agent = sock;
      const closed = new Promise<void>((r) => sock.once('close', () => r()));
      sock.on('error', () => {});
      // Core gets the stream once the agent speaks: QEMU accepts the connection at once, and a
      // guest that is still booting must not run into core's hello timeout (a reconnect the
      // agent does not notice would put a second open line into a live connection).
      sock.once('data', (first: Buffer) => {
        sock.pause();
        sock.unshift(first);
        if (b.generation !== generation) return sock.destroy();
        this.events?.agentConnected(id, sock);
        // Paused explicitly, the stream would not flow again by itself when core listens.
        sock.resume();
      });
      await closed;
      if (b.agent === sock) b.agent = undefined;
      await sleep(100);
    }
  }

  async restore(spec: DriverCreateSpec, imageDir: string, signal?: AbortSignal): Promise<void> {
    const config = JSON.parse(await fs.readFile(path.join(imageDir, 'vm.json'), 'utf8').catch((err: unknown) => {
      throw new SpaceError('SNAPSHOT_CORRUPT', `The snapshot at ${imageDir} is not a microVM snapshot (no vm.json)`, { cause: err });
    })) as VmConfig;
    for (const f of [config.vmlinux, config.initramfs, config.rootDisk, config.runtimeDisk, ...(config.ramFile ? [path.join(imageDir, 'ram')] : [])]) {
      if (!existsSync(f)) throw new SpaceError('DRIVER_FAILED', `The snapshot needs ${f}, which is gone from this host`);
    }
    // The disk's size is in the image (its file system, the device the guest saw). A larger one
    // is the image's disk grown once the machine runs (the device here, its file system by the
    // agent: core's identity); a smaller one would be a shrink of a mounted file system, so a
    // create from a template image that asks for it boots instead (core falls back on this error).
    const growTo = config.diskBytes && spec.diskMb !== undefined && spec.diskMb * 1048576 > config.diskBytes ? spec.diskMb * 1048576 : undefined;
    if (config.diskBytes && spec.diskMb !== undefined && spec.diskMb * 1048576 < config.diskBytes) throw new SpaceError('INVALID_LIMITS', `This image's disk is ${config.diskBytes / 1048576} MiB and ${spec.diskMb} MiB was asked for: a microVM disk restored from an image can grow, not shrink (ask for ${config.diskBytes / 1048576} MiB or more, or create from a template without a start command, which boots)`, { details: { field: 'diskMb' } });
    const mark = config.diskBytes ? await this.diskMarkOf(imageDir) : undefined;
    // In place: whatever is left of the old incarnation goes first.
    if (existsSync(this.paths(spec.id).dir)) await this.stopVm(spec.id);
    const b = this.box(spec.id);
    b.open = { now: Date.now(), seed: randomBytes(64).toString('base64') };
    await this.start(spec.id, spec.cpu, config, { memory: path.join(imageDir, 'memory'), ...(config.ramFile ? { ram: path.join(imageDir, 'ram') } : {}), ...(growTo ? { growDiskTo: growTo } : {}) }, mark?.copy, signal);
  }

  /** Kills the VMM of the current incarnation and releases its netns and cgroups. */
  private async stopVm(id: string): Promise<void> {
    const b = this.boxes.get(id);
    if (b) {
      b.generation++;
      b.agent?.destroy();
    }
    const pid = await this.pid(id);
    if (pid && (await this.isQemu(pid, id))) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // already gone
      }
      // Gone means gone from /proc (a zombie still holds its cgroup, which then cannot be removed).
      for (let i = 0; i < 250 && existsSync(`/proc/${pid}`); i++) await sleep(20);
    }
    await this.release(this.rid(id));
  }

  private async release(rid: string): Promise<void> {
    await fs.rm(this.freshRam(rid), { force: true });
    // Its disk (what a checkpoint needed of it is in the checkpoint's copy). A failure leaves
    // it listed: destroy and the next start's orphan sweep try again.
    if (this.diskFile(rid)) await this.pool!.removeDisk(rid).catch(() => {});
    const netns = `${NETNS_PREFIX}${rid}`;
    await tryRun('ip', ['netns', 'del', netns], 10_000);
    await this.opts.network?.detach(netns);
    for (const ctl of ['memory', 'cpu', 'cpuacct']) {
      const d = path.join(CGROUP_ROOT, ctl, CGROUP_PARENT, rid);
      // A VMM that just quit may still be leaving the group (EBUSY) for a moment.
      for (let i = 0; i < 100 && existsSync(d); i++) {
        if (await fs.rmdir(d).then(() => true, () => false)) break;
        await sleep(20);
      }
    }
  }

  async retire(id: string): Promise<void> {
    // The VMM quit after the checkpoint; only its namespace and cgroups are left.
    await this.stopVm(id);
  }

  async pause(id: string): Promise<void> {
    await qmp(this.paths(id).qmp, [{ execute: 'stop' }]);
  }

  async resume(id: string): Promise<void> {
    await qmp(this.paths(id).qmp, [{ execute: 'cont' }]);
  }

  async detachAgent(id: string): Promise<void> {
    this.box(id).detached = true;
  }

  async checkpoint(id: string, imageDir: string): Promise<void> {
    const p = this.paths(id);
    await fs.mkdir(imageDir, { recursive: true, mode: 0o700 });
    const memory = path.join(imageDir, 'memory');
    const config = JSON.parse(await fs.readFile(p.config, 'utf8')) as VmConfig;
    // A VM writing into its own RAM file: the stream skips the RAM, which is copied as a file
    // (sparse) and mapped copy-on-write by every restore. A VM on a private mapping of an
    // image's RAM has its changes in anonymous pages: its stream carries all of it, and goes
    // through a loader that gives the image a RAM file of its own (ownRam).
    const ram = JSON.parse(await fs.readFile(p.ram, 'utf8').catch(() => '{"path":"","shared":false}')) as RamBacking;
    let ramFile = ram.shared && existsSync(ram.path);
    if (ramFile) {
      await qmp(p.qmp, [{ execute: 'stop' }]);
      await this.save(p, memory, true);
      // The guest is stopped, so its RAM file no longer changes.
      await run('cp', ['--sparse=always', ram.path, path.join(imageDir, 'ram')], 300_000);
    } else {
      ramFile = await this.ownRam(id, p, config, imageDir);
      // The loader failed: the whole stream, RAM included, as before there was one.
      if (!ramFile) await this.save(p, memory, false);
    }
    await fs.writeFile(path.join(imageDir, 'vm.json'), JSON.stringify({ ...config, ramFile }));
    // The disk as the stopped machine left it: QEMU flushed it when the stream completed, and
    // the btrfs snapshot writes the file's dirty pages out first. Before the image is marked
    // complete: an image is never complete without its copy.
    if (config.diskBytes) await this.copyDisk(id, imageDir);
    // The stream ends in the daemon: a daemon that dies before this line leaves the VM stopped
    // (not quit) and no mark, and the next daemon continues the VM.
    await fs.writeFile(path.join(imageDir, CHECKPOINT_COMPLETE), new Date().toISOString());
    // A checkpointed sandbox is stopped; a restore brings it back.
    await qmp(p.qmp, [{ execute: 'quit' }]).catch(() => {});
  }

  /**
   * Saves the stopped machine of the VMM at `p` into the file `out`: QEMU streams it to a unix
   * socket the daemon holds (QEMU runs with spawn=deny, so no `exec:` migration). With
   * `ignoreShared`, RAM that lives in a shared file is left out of the stream.
   */
  private async save(p: ReturnType<MicrovmDriver['paths']>, out: string, ignoreShared: boolean): Promise<void> {
    await fs.rm(p.migrate, { force: true });
    let done!: Promise<void>;
    const server = net.createServer({ allowHalfOpen: false }, (sock) => {
      server.close();
      done = pipeline(sock, createWriteStream(out, { mode: 0o600 }));
      // Awaited once QEMU says it finished; a stream that breaks while it is polled must not be an unhandled rejection meanwhile.
      done.catch(() => {});
    });
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(p.migrate, () => resolve());
    });
    // QEMU runs as its own user by now: the socket must be its to connect to.
    if (this.vmmUser) await fs.chown(p.migrate, this.vmmUser.uid, this.vmmUser.gid);
    try {
      await this.migrate(p, p.migrate, ignoreShared);
      await done;
    } finally {
      server.close();
    }
  }

  /** Has the VMM at `p` stream its stopped machine to the unix socket `target`, and waits until it is sent. */
  private async migrate(p: ReturnType<MicrovmDriver['paths']>, target: string, ignoreShared: boolean): Promise<void> {
    await qmp(p.qmp, [
      { execute: 'migrate-set-capabilities', arguments: { capabilities: [{ capability: 'x-ignore-shared', state: ignoreShared }] } },
      { execute: 'migrate-set-parameters', arguments: { 'max-bandwidth': 64 * 1024 ** 3 } },
      { execute: 'migrate', arguments: { uri: `unix:${target}` } },
    ]);
    for (let i = 0; ; i++) {
      const [m] = (await qmp(p.qmp, [{ execute: 'query-migrate' }])) as { status?: string; 'error-desc'?: string }[];
      if (m?.status === 'completed') return;
      if (m?.status === 'failed' || m?.status === 'cancelled') throw new SpaceError('DRIVER_FAILED', `QEMU could not save the machine: ${m['error-desc'] ?? m.status}`);
      if (i > 15_000) throw new SpaceError('DRIVER_FAILED', 'QEMU did not finish saving the machine within 300 s');
      await sleep(20);
    }
  }

  /**
   * Saves VM `id`, which runs on a private mapping of its image's RAM (a restored VM), into an
   * image whose RAM is a file of its own, as a booted VM's image is: a loader QEMU, whose guest
   * never runs, takes the whole machine streamed straight from the VM into a fresh RAM file
   * (share=on, on tmpfs), saves it again without the RAM, and the RAM file is copied into the
   * image. Restores of the image then map that file copy-on-write, so forks of a restored VM
   * share their unchanged pages instead of each loading a full copy. Leaves the VM stopped.
   * Returns false (and the image directory without `memory` or `ram`) when the loader fails.
   */
  private async ownRam(id: string, p: ReturnType<MicrovmDriver['paths']>, config: VmConfig, imageDir: string): Promise<boolean> {
    const lid = `${id}${LOADER_SUFFIX}`;
    const lp = this.paths(lid);
    const rid = newRid(lid);
    const memory = path.join(imageDir, 'memory');
    const ramPath = path.join(imageDir, 'ram');
    let stopped = false;
    try {
      await fs.mkdir(lp.dir, { recursive: true, mode: 0o700 });
      await fs.mkdir(lp.vmm, { recursive: true, mode: 0o700 });
      if (this.vmmUser) await fs.chown(lp.vmm, this.vmmUser.uid, this.vmmUser.gid);
      await fs.writeFile(lp.rid, rid);
      const netns = `${NETNS_PREFIX}${rid}`;
      await createNetns(netns);
      // The machine's network device must have the backend it was saved with (a tap: the
      // offloads it negotiated); this tap is joined to nothing.
      if (config.network) await run('ip', ['-n', netns, 'tuntap', 'add', 'tap0', 'mode', 'tap'], 10_000);
      const { accel } = await this.accel();
      // RAM loaded into tmpfs: page faults on a disk file's shared mapping cost ~4x.
      const pid = await this.spawnVmm(netns, this.vmmArgs(lid, config, { path: this.freshRam(rid), shared: true }, undefined, accel, lp, true, true), lp);
      await this.cgroup(rid, pid, config.memoryMb, 1);
      await this.listenIncoming(lp, false);
      await qmp(p.qmp, [{ execute: 'stop' }]);
      stopped = true;
      // QEMU to QEMU (both run as the VMM user): the stream never passes through the daemon.
      await this.migrate(p, lp.migrate, false);
      await this.loaded(lp, false);
      if (this.opts.failRamLoader) throw new SpaceError('DRIVER_FAILED', 'failRamLoader is set');
      await this.save(lp, memory, true);
      await qmp(lp.qmp, [{ execute: 'quit' }]).catch(() => {});
      for (let i = 0; i < 500 && (await this.isQemu(pid, lid)); i++) await sleep(10);
      await run('cp', ['--sparse=always', this.freshRam(rid), ramPath], 300_000);
      return true;
    } catch {
      if (!stopped) await qmp(p.qmp, [{ execute: 'stop' }]);
      // A VM whose stream reached the loader cannot be saved again as it is (QEMU: "paused
      // due to previous migration"); running it for an instant makes it a machine to save.
      const [st] = (await qmp(p.qmp, [{ execute: 'query-status' }])) as { status?: string }[];
      if (st?.status === 'postmigrate') await qmp(p.qmp, [{ execute: 'cont' }, { execute: 'stop' }]);
      await fs.rm(ramPath, { force: true });
      await fs.rm(memory, { force: true });
      return false;
    } finally {
      await this.destroy(lid);
    }
  }

  /** Takes the stopped VM `id`'s disk copy for the image in `imageDir` and writes its mark. */
  private async copyDisk(id: string, imageDir: string): Promise<void> {
    const pool = this.disksPool();
    const copy = imageId(imageDir);
    await pool.removeCopy(copy); // a template image taken again under its key
    await pool.copyDisk(this.rid(id), copy);
    const mark: DiskMark = { copy, template: DISK_TEMPLATE };
    await fs.writeFile(path.join(imageDir, DISK_MARK), JSON.stringify(mark));
  }

  /** The disk copy a checkpoint image was taken with (SNAPSHOT_CORRUPT when it has none, or it is gone). */
  private async diskMarkOf(imageDir: string): Promise<DiskMark> {
    const pool = this.disksPool();
    const text = await fs.readFile(path.join(imageDir, DISK_MARK), 'utf8').catch((err: unknown) => {
      throw new SpaceError('SNAPSHOT_CORRUPT', `The microVM image at ${imageDir} has a disk but no disk mark`, { cause: err });
    });
    const mark = parseDiskMark(text);
    if (!existsSync(pool.copyPath(mark.copy))) throw new SpaceError('SNAPSHOT_CORRUPT', `The disk copy ${mark.copy} of this image is not on this node`);
    return mark;
  }

  /** Everything inside a checkpoint: QEMU, kernel + initramfs, the agent runtime. */
  version(): Promise<string> {
    this.versionP ??= (async () => {
      const v = await tryRun(this.qemu, ['--version'], 10_000);
      const k = await this.guest.kernel();
      return `qemu ${/version (\S+)/.exec(v?.stdout ?? '')?.[1] ?? 'unknown'} kernel ${k.release} ${path.basename(k.initramfs, '.cpio')} runtime ${path.basename(this.runtimeDir)}${this.opts.network ? ' net' : ''}${this.pool ? ' disk' : ''}`;
    })();
    return this.versionP;
  }

  private async pid(id: string): Promise<number | undefined> {
    const n = Number((await fs.readFile(this.paths(id).pid, 'utf8').catch(() => '')).trim());
    return n > 0 ? n : undefined;
  }

  /** Whether `pid` is still the QEMU of sandbox `id` (not a reused pid). */
  private async isQemu(pid: number, id: string): Promise<boolean> {
    const cmd = await fs.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    return cmd.includes(`process=space-vm-${id}\0`);
  }

  private async alive(id: string): Promise<boolean> {
    const pid = await this.pid(id);
    return !!pid && (await this.isQemu(pid, id));
  }

  async adopt(id: string): Promise<boolean> {
    if (!(await this.alive(id))) return false;
    const rid = this.rid(id);
    await this.opts.network?.attach(id, `${NETNS_PREFIX}${rid}`, SANDBOX_IF);
    const b = this.box(id);
    b.generation++;
    b.detached = false;
    b.open = {};
    void this.connectAgent(id, b.generation);
    return true;
  }

  async status(id: string): Promise<RuntimeStatus> {
    if (await this.alive(id)) return { running: true };
    const rid = this.rid(id);
    const dir = path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, rid);
    const ctl = await fs.readFile(path.join(dir, 'memory.oom_control'), 'utf8').catch(() => '');
    const kills = /oom_kill (\d+)/.exec(ctl);
    if (kills && Number(kills[1]) > 0) return { running: false, reason: 'oom', detail: 'the VM exceeded its memory limit on the host' };
    const console = await fs.readFile(this.paths(id).console, 'utf8').catch(() => '');
    const failed = /SPACE_INIT_FAILED (.*)/.exec(console)?.[1];
    if (failed) return { running: false, reason: 'crashed', detail: `the guest did not start: ${failed}` };
    const panic = /Kernel panic[^\n]*/.exec(console)?.[0];
    return { running: false, reason: 'crashed', detail: panic ? `guest ${panic}` : 'the VM stopped' };
  }

  async usage(id: string): Promise<SandboxUsage> {
    const pid = await this.pid(id);
    if (!pid) return { rssBytes: 0 };
    // Kernel files, read synchronously (readKernelFile): the sampler calls this for every sandbox every few seconds.
    const rss = Number(/VmRSS:\s+(\d+) kB/.exec(readKernelFile(`/proc/${pid}/status`))?.[1] ?? 0) * 1024;
    const stat = readKernelFile(`/proc/${pid}/stat`).split(') ')[1]?.split(' ') ?? [];
    // utime + stime (fields 14, 15; 12 and 13 after the command), in clock ticks of 10 ms.
    const ticks = Number(stat[11] ?? 0) + Number(stat[12] ?? 0);
    const rid = this.rid(id);
    const cg = Number(readKernelFile(path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, rid, 'memory.usage_in_bytes'), '0').trim());
    // The disk: the bytes its image holds on the host (what the guest wrote), and its size.
    const file = this.diskFile(rid);
    const st = file ? statSync(file, { throwIfNoEntry: false }) : undefined;
    const disk = st ? { diskUsedBytes: st.blocks * 512, diskLimitBytes: st.size } : {};
    return { rssBytes: rss, cgroupBytes: cg, ...(ticks > 0 ? { cpuNs: ticks * 10_000_000 } : {}), ...disk };
  }

  async destroy(id: string): Promise<void> {
    await this.stopVm(id);
    // Incarnations whose release a crash interrupted may have left a netns or cgroup behind.
    const netns = (await tryRun('ip', ['netns', 'list'], 10_000))?.stdout ?? '';
    for (const line of netns.split('\n')) {
      const name = line.split(' ')[0] ?? '';
      if (name.startsWith(`${NETNS_PREFIX}${id}-`)) await this.release(name.slice(NETNS_PREFIX.length));
    }
    for (const d of await fs.readdir(path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT)).catch(() => [] as string[])) if (d.startsWith(`${id}-`)) await this.release(d);
    for (const d of (await this.pool?.list())?.disks ?? []) if (d.startsWith(`${id}-`)) await this.pool!.removeDisk(d);
    this.boxes.delete(id);
    await fs.rm(this.paths(id).vmm, { recursive: true, force: true });
    await fs.rm(this.paths(id).dir, { recursive: true, force: true });
  }

  /**
   * Sandboxes this driver holds anything of: VM directories, and disks (a crash between the
   * disk and the directory still leaves a trace to clean).
   */
  async list(): Promise<string[]> {
    const dirs = (await fs.readdir(this.boxesDir).catch(() => [] as string[])).filter((d) => /^sb[a-z0-9]+$/.test(d));
    const disks = ((await this.pool?.list())?.disks ?? []).map((d) => d.split('-')[0]!).filter((d) => /^sb[a-z0-9]+$/.test(d));
    return [...new Set([...dirs, ...disks])];
  }

  async forgetImage(id: string): Promise<void> {
    if (this.pool && IMAGE_ID.test(id)) await this.pool.removeCopy(id);
  }

  async close(): Promise<void> {
    for (const b of this.boxes.values()) {
      b.generation++;
      b.agent?.destroy();
    }
    await this.pool?.quiesce();
  }
}

/** The uid/gid of system user `name`, made with useradd when missing (no home, no login). */
async function ensureSystemUser(name: string): Promise<{ name: string; uid: number; gid: number }> {
  const look = async () => {
    const r = await tryRun('id', ['-u', name], 5_000);
    const g = await tryRun('id', ['-g', name], 5_000);
    return r && g ? { name, uid: Number(r.stdout.trim()), gid: Number(g.stdout.trim()) } : undefined;
  };
  const found = await look();
  if (found) return found;
  await run('useradd', ['--system', '--no-create-home', '--home-dir', '/nonexistent', '--shell', '/usr/sbin/nologin', name], 30_000).catch(async (err: unknown) => {
    // Another daemon may have made it meanwhile.
    if (await look()) return;
    throw new SpaceError('DRIVER_UNAVAILABLE', `Cannot create the system user ${name} that QEMU runs as: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
  });
  const made = await look();
  if (!made) throw new SpaceError('DRIVER_UNAVAILABLE', `The system user ${name} does not exist after useradd`);
  return made;
}

let tsc: string | undefined;
/** `tsc_early_khz` for the guest: without it ~30% of microvm boots hang calibrating the TSC under emulation. Read once. */
function tscArg(): string {
  if (tsc === undefined) {
    const mhz = /cpu MHz\s*:\s*([\d.]+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1];
    tsc = mhz ? `tsc_early_khz=${Math.round(Number(mhz) * 1000)}` : '';
  }
  return tsc;
}

/** The last lines QEMU printed, for an error message. */
async function logTail(log: string): Promise<string> {
  return (await fs.readFile(log, 'utf8').catch(() => '')).trim().split('\n').slice(-3).join(' | ');
}

/** One connection attempt to a unix socket. */
function connectOnce(socketPath: string): Promise<net.Socket> {
  return new Promise<net.Socket>((resolve, reject) => {
    const s = net.connect(socketPath);
    s.once('connect', () => {
      s.off('error', reject);
      resolve(s);
    });
    s.once('error', reject);
  });
}

/** Whether a unix socket accepts connections now. */
function canConnect(socketPath: string): Promise<boolean> {
  return connectOnce(socketPath).then(
    (s) => {
      s.destroy();
      return true;
    },
    () => false,
  );
}

/** Connects to a unix socket, retrying while it does not exist yet or refuses. */
async function connectRetry(socketPath: string, timeoutMs: number): Promise<net.Socket> {
  const end = Date.now() + timeoutMs;
  for (;;) {
    try {
      return await connectOnce(socketPath);
    } catch (err) {
      if (Date.now() > end) throw err;
      await sleep(10);
    }
  }
}
