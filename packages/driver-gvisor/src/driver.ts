/**
 * The gVisor driver: each sandbox is a `runsc` container with its own user-space kernel,
 * an in-memory overlay over a shared read-only template rootfs (or, with disks, its own
 * bounded btrfs disk: {@link GvisorDriverOptions.disks}), cgroup v1 cpu/memory limits,
 * RLIMIT_NPROC for the non-root user (the pids cgroup crashes this runsc's sentry), its own
 * network namespace (empty, or with one link to the egress proxy when a {@link SandboxNetwork}
 * is given), and the agent as its first process. The agent dials out to a
 * unix socket the daemon listens on in a per-sandbox host directory (`--host-uds=open`).
 */
import { existsSync, promises as fs, openSync, closeSync, readFileSync, statSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { spawn } from 'node:child_process';
import { CHECKPOINT_COMPLETE, Laps, createNetns, SpaceError, randomString, readKernelFile, run, tryRun, type DriverCreateSpec, type DriverEvents, type SandboxNetwork, type DriverReport, type RuntimeStatus, type SandboxDriver, type SandboxUsage, type DriverDisks, type ImageAttachment, type ImageFileCodec, type RestoreTimings } from '@space/core';
import { AGENT_RUNTIME_DIR, AGENT_SOCKET_DIR, AGENT_SOCKET_NAME } from '@space/protocol';
import { AGENT_BUNDLE, AGENT_COMPAT_LIB, AGENT_HELPER } from '@space/agent';

import { AGENT_ARGV, RUNTIME, ensureRuntime } from '@space/core';
import { StatefileCodec } from './statefile-codec.js';
import { DISK_MARK, DiskCodec, DiskPool, DiskStream, IMAGE_ID, defaultPoolBytes, imageId, parseDiskMark, templateOf, type DiskMark, type DiskUsage } from '@space/disk-pool';

/** Options of {@link GvisorDriver}. */
export interface GvisorDriverOptions {
  /** Directory for runsc state, bundles and sockets (the daemon's data directory). */
  dataDir: string;
  /** The runsc binary. @default "runsc" */
  runsc?: string;
  /** gVisor platform. @default "ptrace" (no KVM needed) */
  platform?: 'ptrace' | 'systrap' | 'kvm';
  /**
   * Processes the sandbox's non-root user may run at once (RLIMIT_NPROC). Under the ptrace
   * platform each guest process costs ~0.5 MiB of host memory, so the default scales with
   * the sandbox's memory limit: one process per 4 MiB, between 32 and 1024.
   */
  maxProcesses?: number;
  /**
   * The sandbox network: each sandbox gets a link whose only destination is the egress proxy
   * (runsc `--network=sandbox`). Without it sandboxes have no network but their loopback.
   */
  network?: SandboxNetwork;
  /**
   * Sandbox disks: each sandbox's root file system is a btrfs subvolume of the node's
   * {@link DiskPool} (`<dir>`), bounded by a quota, instead of an overlay held in memory
   * (docs/architecture.md, "Disks"). Absent: files live in memory.
   */
  disks?: GvisorDiskOptions;
}

/** The disks of {@link GvisorDriverOptions}. */
export interface GvisorDiskOptions {
  /** Directory of the disk pool. @default "<dataDir>/disks" */
  dir?: string;
  /** Size of a new pool, bytes, taken on the host when it is made ({@link DiskPool}). @default {@link defaultPoolBytes}: 32 GiB, or half of the host's free space if less */
  poolBytes?: number;
  /**
   * 256-bit key that keeps the pool encrypted at rest (its image in a vault, see
   * {@link DiskPool}); the daemon gives a secret of its own, wrapped by the node key. Without
   * one the pool is plaintext on the host.
   */
  key?: Buffer;
  /** Disk size when a create gives none, MiB. @default 5120 */
  defaultMb?: number;
  /** Largest disk, MiB. @default 65536 */
  maxMb?: number;
  /** Creates are refused while the host file system under the pool has less free than this, bytes. @default 1 GiB */
  reserveBytes?: number;
}

/** Name of the sandbox's link inside its namespace. */
const SANDBOX_IF = 'eth0';

const CGROUP_ROOT = '/sys/fs/cgroup';

/** A new runtime id for an incarnation of sandbox `id`. */
function newRid(id: string): string {
  return `${id}-${randomString(8)}`;
}
const CGROUP_PARENT = 'space';
const NETNS_PREFIX = 'space-';

/**
 * Capabilities of the agent: Docker's default set plus CAP_SYS_ADMIN, which the agent needs to
 * set the hostname of a sandbox restored from another's image. Commands run as root go through
 * the agent's helper, which drops CAP_SYS_ADMIN (even from the bounding set) before exec; the
 * non-root user's processes get no capabilities at all.
 */
const CAPS = ['CAP_SYS_ADMIN', 'CAP_CHOWN', 'CAP_DAC_OVERRIDE', 'CAP_FOWNER', 'CAP_FSETID', 'CAP_KILL', 'CAP_SETGID', 'CAP_SETUID', 'CAP_SETPCAP', 'CAP_NET_BIND_SERVICE', 'CAP_SYS_CHROOT', 'CAP_AUDIT_WRITE', 'CAP_MKNOD'];

/**
 * gVisor driver.
 *
 * @example
 * const driver = new GvisorDriver({ dataDir: '/var/lib/space' });
 */
export class GvisorDriver implements SandboxDriver {
  readonly name = 'gvisor';
  /**
   * Host directories (volumes) are bind mounts the gofer serves; checkpoints keep them. Only with
   * disks: runsc makes a missing mount point in the root's host directory, which without a disk is
   * the template's files, shared by every sandbox of every tenant (seen: a tenant's `/data`
   * appeared in `base` for all). With a disk it lands on the sandbox's own.
   */
  get mounts(): boolean {
    return !!this.pool;
  }
  /** runsc's state file stored with its blocks decompressed, so consecutive snapshots deduplicate. */
  readonly imageCodec = new StatefileCodec();
  /** The state file's codec; with disks, the reader of disks stored inside images (snapshots from before {@link imageAttachments}). */
  readonly imageCodecs: readonly ImageFileCodec[];
  /** With disks: the disk copy's files, stored beside the snapshot (into the encrypted store). */
  readonly imageAttachments: readonly ImageAttachment[];
  private events?: DriverEvents;
  private readonly servers = new Map<string, net.Server>();
  private readonly rids = new Map<string, string>();
  private readonly releasing = new Map<string, Set<Promise<void>>>();
  private readonly retiring = new Set<string>();
  /** Incarnations this daemon checkpointed: stopped by it, so a restore in their place need not kill them. */
  private readonly checkpointed = new Set<string>();
  private versionP: Promise<string> | undefined;
  private runtimeDir = '';
  private readonly runsc: string;
  private readonly stateDir: string;
  private readonly boxesDir: string;
  /** Sandbox disks, when enabled (see {@link GvisorDriverOptions.disks}). */
  readonly disks?: DriverDisks;
  private pool?: DiskPool;

  constructor(private readonly opts: GvisorDriverOptions) {
    this.runsc = opts.runsc ?? 'runsc';
    this.stateDir = path.join(opts.dataDir, 'runsc');
    this.boxesDir = path.join(opts.dataDir, 'sandboxes');
    if (opts.disks) {
      this.disks = { defaultMb: opts.disks.defaultMb ?? 5120, maxMb: opts.disks.maxMb ?? 65536, movable: true };
      if (this.disks.defaultMb > this.disks.maxMb) throw new SpaceError('CONFIG_INVALID', `The default disk (${this.disks.defaultMb} MiB) is larger than the largest allowed (${this.disks.maxMb} MiB): lower --disk-default or raise --disk-max`);
    }
    this.imageCodecs = opts.disks ? [new DiskCodec(() => this.pool), this.imageCodec] : [this.imageCodec];
    this.imageAttachments = opts.disks ? [new DiskStream(() => this.pool)] : [];
  }

  /** The disk pool; throws before {@link init}. */
  private disksPool(): DiskPool {
    if (!this.pool) throw new SpaceError('INTERNAL', 'init() first');
    return this.pool;
  }

  bind(events: DriverEvents): void {
    this.events = events;
  }

  private flags(): string[] {
    // With disks, the root is the sandbox's own disk, served as it is (no overlay in memory).
    // --qdisc=none: with this runsc's default (fifo) queue in front of the sandbox's link, a
    // sandbox sending at full speed stalls on retransmission timeouts with the host idle (100 MB
    // out of a sandbox: 41–312 MB/s, median ~70; without the queue 258–322, median ~280:
    // docs/architecture.md, "gVisor compatibility").
    return ['--root', this.stateDir, `--platform=${this.opts.platform ?? 'ptrace'}`, `--network=${this.opts.network ? 'sandbox' : 'none'}`, '--qdisc=none', '--host-uds=open', this.disks ? '--overlay2=none' : '--overlay2=root:memory'];
  }

  async init(): Promise<void> {
    await fs.mkdir(this.stateDir, { recursive: true, mode: 0o700 });
    await fs.mkdir(this.boxesDir, { recursive: true, mode: 0o700 });
    if (this.opts.disks) {
      const dir = this.opts.disks.dir ?? path.join(this.opts.dataDir, 'disks');
      await fs.mkdir(dir, { recursive: true, mode: 0o700 });
      const sizeBytes = this.opts.disks.poolBytes ?? (await defaultPoolBytes(dir, this.opts.disks.reserveBytes ?? 2 ** 30));
      this.pool = await DiskPool.open({ dir, sizeBytes, ...(this.opts.disks.key ? { key: this.opts.disks.key } : {}) });
      if (this.disks) this.disks.poolBytes = await this.pool.hostBytes();
    }
    this.runtimeDir = await ensureRuntime(path.join(this.opts.dataDir, 'runtime'), AGENT_BUNDLE, [AGENT_HELPER, AGENT_COMPAT_LIB]);
  }

  async doctor(): Promise<DriverReport> {
    const checks: DriverReport['checks'] = [];
    const v = await tryRun(this.runsc, ['--version'], 10_000);
    checks.push({ name: 'runsc', ok: !!v, detail: v ? v.stdout.split('\n')[0]! : 'runsc not found: apt-get install runsc' });
    for (const c of ['memory', 'cpu']) {
      const ok = existsSync(path.join(CGROUP_ROOT, c, 'cgroup.procs'));
      checks.push({ name: `cgroup v1 ${c}`, ok, detail: ok ? `${CGROUP_ROOT}/${c}` : `no cgroup v1 ${c} controller at ${CGROUP_ROOT}/${c}` });
    }
    const ip = await tryRun('ip', ['netns', 'list'], 5_000);
    checks.push({ name: 'network namespaces', ok: !!ip, detail: ip ? 'ip netns works' : 'iproute2 missing or no permission: apt-get install iproute2, run as root' });
    const nft = await tryRun('nft', ['--version'], 5_000);
    checks.push({ name: 'nftables', ok: !!nft, detail: nft ? nft.stdout.trim() : 'nft not found: apt-get install nftables (needed for sandbox egress)' });
    const bb = existsSync('/bin/busybox') || existsSync('/usr/bin/busybox');
    checks.push({ name: 'busybox-static', ok: bb, detail: bb ? 'present (minimal template)' : 'apt-get install busybox-static' });
    const mm = await tryRun('mmdebstrap', ['--version'], 5_000);
    checks.push({ name: 'mmdebstrap', ok: !!mm, detail: mm ? mm.stdout.trim() : 'apt-get install mmdebstrap (base template)' });
    const codec = this.imageCodec.available();
    checks.push({ name: 'space-statefile', ok: codec, detail: codec ? 'checkpoint images are stored decompressed, so snapshots deduplicate' : 'missing: snapshots are stored as runsc compresses them (no deduplication); rebuild with golang-go installed' });
    checks.push({ name: 'root', ok: process.getuid?.() === 0, detail: process.getuid?.() === 0 ? 'running as root' : 'runsc with cgroups and namespaces needs root' });
    const btrfs = await tryRun('btrfs', ['--version'], 5_000);
    checks.push({ name: 'btrfs-progs', ok: !!btrfs, detail: btrfs ? `${btrfs.stdout.trim()}${this.disks ? '' : ' (sandbox disks use it: --disks auto, the default on a single node, or on)'}` : 'apt-get install btrfs-progs (sandbox disks, --disks on)' });
    const required = ['runsc', 'cgroup v1 memory', 'cgroup v1 cpu', 'network namespaces', 'busybox-static', 'root', ...(this.disks ? ['btrfs-progs'] : [])];
    return { driver: this.name, available: checks.filter((c) => required.includes(c.name)).every((c) => c.ok), checks };
  }

  private box(id: string) {
    const dir = path.join(this.boxesDir, id);
    return { dir, bundle: path.join(dir, 'bundle'), sock: path.join(dir, 'sock'), log: path.join(dir, 'runsc.log'), ridFile: path.join(dir, 'runtime-id') };
  }

  /**
   * The runsc container id of a sandbox's current incarnation, `<id>-<8 random chars>`. A
   * restore in place starts a new container instead of waiting ~1.5 s for `runsc delete` of
   * the checkpointed one, which is removed in the background. Every rid has the same length:
   * runsc accepts a unique prefix as a container id, so one rid must never prefix another.
   * Netns and cgroup follow the rid.
   */
  private rid(id: string): string {
    let r = this.rids.get(id);
    if (!r) {
      try {
        r = readFileSync(this.box(id).ridFile, 'utf8').trim() || id;
      } catch {
        r = id;
      }
      this.rids.set(id, r);
    }
    return r;
  }

  private async listen(id: string): Promise<void> {
    const b = this.box(id);
    const sockPath = path.join(b.sock, AGENT_SOCKET_NAME);
    if (sockPath.length > 107) throw new SpaceError('DRIVER_FAILED', `Socket path ${sockPath} is too long for a unix socket; use a shorter --data-dir`);
    this.servers.get(id)?.close();
    await fs.rm(sockPath, { force: true });
    const server = net.createServer((s) => {
      s.setNoDelay?.(true);
      this.events?.agentConnected(id, s);
    });
    server.maxConnections = 2;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(sockPath, () => resolve());
    });
    this.servers.set(id, server);
  }

  /** With disks: imports the template's files into the pool (a full copy, once per template: base takes ~35 s here). */
  async prepare(spec: DriverCreateSpec): Promise<void> {
    if (this.pool) await this.importTemplate(spec.rootfs);
  }

  async create(spec: DriverCreateSpec, signal?: AbortSignal): Promise<void> {
    const rid = newRid(spec.id);
    if (this.pool) {
      await this.disksPool().checkHostRoom(this.opts.disks?.reserveBytes ?? 2 ** 30);
      const template = await this.importTemplate(spec.rootfs);
      await this.setDiskTemplate(spec.id, template);
      const disk = await this.pool.createDisk(rid, template, this.diskBytes(spec));
      // /tmp on the disk too (gVisor would put a tmpfs of its own, held in memory, there).
      await fs.mkdir(path.join(disk, 'tmp'), { recursive: true });
      await fs.chmod(path.join(disk, 'tmp'), 0o1777);
    }
    const b = await this.prepareBundle(spec, rid, signal);
    await fs.writeFile(b.ridFile, rid);
    this.rids.set(spec.id, rid);
    await this.runDetached(['run', '--detach', '--bundle', b.bundle, rid], b.log, b.netns);
  }

  async restore(spec: DriverCreateSpec, imageDir: string, signal?: AbortSignal): Promise<RestoreTimings> {
    // In place, the checkpointed container still exists: start a new incarnation beside it.
    const old = existsSync(this.box(spec.id).dir) ? this.rid(spec.id) : undefined;
    // A running old incarnation (rollback) must not reconnect its agent to the new one's socket.
    // (One already being released is stopped; runsc would make us wait for its lock.)
    // One this daemon checkpointed is stopped already: no kill (it was ~30 ms of every snapshot's downtime).
    if (old && !this.retiring.has(old) && !this.checkpointed.has(old)) await tryRun(this.runsc, ['--root', this.stateDir, 'kill', old, 'KILL'], 10_000);
    if (old) this.checkpointed.delete(old);
    const rid = newRid(spec.id);
    const laps = new Laps();
    if (this.pool) {
      const mark = await this.diskMarkOf(imageDir);
      // Its name on this node: another node's template, received from the store, is base-<uuid> here.
      const template = await templateOf(this.pool, mark);
      await this.setDiskTemplate(spec.id, template ? path.basename(template) : mark.template);
      await this.pool.diskFromCopy(mark.copy, rid, this.diskBytes(spec));
      laps.lap('diskMs');
    }
    else if (existsSync(path.join(imageDir, DISK_MARK))) throw new SpaceError('SNAPSHOT_CORRUPT', 'This image was taken with a disk (by a daemon with --disks on): start the daemon with --disks on to restore it');
    const b = await this.prepareBundle(spec, rid, signal);
    await fs.writeFile(b.ridFile, rid);
    this.rids.set(spec.id, rid);
    laps.lap('prepareMs');
    await this.runDetached(['restore', '--image-path', imageDir, '--detach', '--bundle', b.bundle, rid], b.log, b.netns);
    laps.lap('runtimeMs');
    if (old && old !== rid) this.releaseLater(spec.id, old);
    return laps.ms;
  }

  /** Removes an old incarnation in the background; {@link destroy} waits for it. */
  private releaseLater(id: string, rid: string): void {
    if (this.retiring.has(rid)) return;
    this.retiring.add(rid);
    const p = this.releaseRuntime(rid).finally(() => {
      this.releasing.get(id)?.delete(p);
      this.retiring.delete(rid);
    });
    let set = this.releasing.get(id);
    if (!set) this.releasing.set(id, (set = new Set()));
    set.add(p);
  }

  async retire(id: string): Promise<void> {
    this.servers.get(id)?.close();
    this.servers.delete(id);
    this.releaseLater(id, this.rid(id));
  }

  async pause(id: string): Promise<void> {
    await run(this.runsc, ['--root', this.stateDir, 'pause', this.rid(id)]);
  }

  async resume(id: string): Promise<void> {
    await run(this.runsc, ['--root', this.stateDir, 'resume', this.rid(id)]);
  }

  async detachAgent(id: string): Promise<void> {
    // close() stops accepting at once; its callback would wait for the live connection, so do not await it.
    this.servers.get(id)?.close();
    this.servers.delete(id);
    await fs.rm(path.join(this.box(id).sock, AGENT_SOCKET_NAME), { force: true });
  }

  /**
   * With disks: syncfs of the pool (`sync -f`) while the sandbox runs. The checkpoint takes a
   * read-only btrfs snapshot of the stopped disk, which writes out every dirty page of it first;
   * through the vault's software AES that was ~2.3 s of downtime after a 200 MB write, and
   * 0.16 s with the data flushed before (measured, docs/disks.md). A flush that fails or runs
   * past its time only leaves that work to the checkpoint.
   */
  async flush(id: string): Promise<boolean> {
    if (!this.pool) return false;
    const disk = this.pool.diskPath(this.rid(id));
    if (!existsSync(disk)) return false;
    await tryRun('sync', ['-f', disk], FLUSH_TIMEOUT_MS);
    return true;
  }

  /**
   * `runsc checkpoint` killed half-way leaves the container stopped with a partial image
   * (measured: killed 20 ms in, 746 bytes and a dead sandbox). So it does not run as a child
   * that dies with the daemon (or its process group, or its pipes): it runs in a session of
   * its own, logging to a file, and marks the image complete itself when runsc succeeds, so
   * the mark is there even if the daemon died meanwhile.
   */
  async checkpoint(id: string, imageDir: string): Promise<void> {
    await fs.mkdir(imageDir, { recursive: true, mode: 0o700 });
    const rid = this.rid(id);
    const argv = ['--root', this.stateDir, 'checkpoint', '--image-path', imageDir, rid];
    const env: Record<string, string> = { SPACE_COMPLETE_MARK: path.join(imageDir, CHECKPOINT_COMPLETE) };
    let script = '"$@" && : > "$SPACE_COMPLETE_MARK"';
    if (this.pool) {
      // The disk as the checkpoint left it (the container stopped), copied before the image is
      // marked complete: an image is never complete without its copy.
      const copy = imageId(imageDir);
      await this.pool.removeCopy(copy); // a template image taken again under its key
      const template = (await fs.readFile(path.join(this.box(id).dir, 'disk-template'), 'utf8')).trim();
      // The template's identity too, by which another node finds it (or receives it) whatever its name there.
      const tp = this.pool.templatePath(template);
      const base = tp ? await this.pool.streamUuid(tp).catch(() => undefined) : undefined;
      const mark: DiskMark = { copy, template, ...(base ? { base } : {}) };
      await fs.writeFile(path.join(imageDir, DISK_MARK), JSON.stringify(mark));
      Object.assign(env, { SPACE_DISK: this.pool.diskPath(rid), SPACE_DISK_COPY: this.pool.copyPath(copy) });
      script = '"$@" && btrfs subvolume snapshot -r "$SPACE_DISK" "$SPACE_DISK_COPY" && : > "$SPACE_COMPLETE_MARK"';
    }
    await this.raiseMemoryForCheckpoint(rid);
    await this.spawnOwnSession('sh', ['-c', script, 'sh', this.runsc, ...argv], this.box(id).log, 300_000, 'checkpoint', env);
    this.checkpointed.add(rid);
  }

  /**
   * The checkpoint runs in the sandbox's cgroup, and its work (serialising the runtime's state,
   * compressing the image) needs memory beyond what the session uses — more the longer the
   * session ran: this runsc keeps state for every process that ever ran (measured: ~270 KiB of
   * host memory and ~21 KiB of image per process; docs/architecture.md). A session near its limit
   * made the checkpoint run out and, like every failed checkpoint here, die (a 256 MiB sandbox
   * after ~400 commands). The session is quiesced by now, and a checkpoint stops the container
   * (a restore makes a new cgroup), so the limit of this incarnation goes up for it: doubled, by
   * 256 MiB at least.
   */
  private async raiseMemoryForCheckpoint(rid: string): Promise<void> {
    const dir = path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, rid);
    const limit = Number((await fs.readFile(path.join(dir, 'memory.limit_in_bytes'), 'utf8').catch(() => '0')).trim());
    if (!(limit > 0) || limit > 2 ** 50) return;
    const raised = String(limit + Math.max(limit, 256 * 2 ** 20));
    // With swap accounting, memory+swap must stay at least the memory limit: it goes first.
    const memsw = path.join(dir, 'memory.memsw.limit_in_bytes');
    if (existsSync(memsw)) await fs.writeFile(memsw, raised).catch(() => {});
    await fs.writeFile(path.join(dir, 'memory.limit_in_bytes'), raised).catch(() => {}); // (then the checkpoint runs within the old limit, as before)
  }

  /** The disk copy a checkpoint image was taken with (SNAPSHOT_CORRUPT when it has none, or it is gone). */
  private async diskMarkOf(imageDir: string): Promise<DiskMark> {
    let text: string;
    try {
      text = await fs.readFile(path.join(imageDir, DISK_MARK), 'utf8');
    } catch (err) {
      throw new SpaceError('SNAPSHOT_CORRUPT', 'This image was taken without a disk (by a daemon keeping files in memory): it cannot be restored with --disks on', { cause: err });
    }
    const mark = parseDiskMark(text);
    if (!existsSync(this.disksPool().copyPath(mark.copy))) throw new SpaceError('SNAPSHOT_CORRUPT', `The disk copy ${mark.copy} of this image is not on this node`);
    return mark;
  }

  /** Records which of the pool's templates the sandbox's disk grew from (named in its checkpoints' marks). */
  private async setDiskTemplate(id: string, template: string): Promise<void> {
    // Read now (and kept) rather than in the checkpoint's downtime, which names it in its mark.
    const p = this.pool?.templatePath(template);
    if (p) void this.pool!.streamUuid(p).catch(() => {});
    const dir = this.box(id).dir;
    await fs.mkdir(dir, { recursive: true, mode: 0o700 });
    await fs.writeFile(path.join(dir, 'disk-template'), template);
  }

  async forgetImage(id: string): Promise<void> {
    if (this.pool && IMAGE_ID.test(id)) await this.pool.removeCopy(id);
  }

  /** The template's root file system in the disk pool, imported on first use (a full copy, once per template and node). */
  private importTemplate(rootfs: string): Promise<string> {
    // Named by its directory's key and inode: a template built again under its key is a new directory.
    const name = `${path.basename(path.dirname(rootfs))}.${statSync(rootfs).ino}`.toLowerCase();
    return this.disksPool().importTemplate(name, rootfs).then(() => name);
  }

  private diskBytes(spec: DriverCreateSpec): number {
    return (spec.diskMb ?? this.disks!.defaultMb) * 1048576;
  }

  /** Waits for the checkpoints and restores of `id` that a previous daemon started; kills them after `timeoutMs`. */
  async settle(id: string, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const pids = await this.runtimeOps(id);
      if (!pids.length) return;
      if (Date.now() >= deadline) {
        for (const pid of pids) {
          try {
            process.kill(pid, 'SIGKILL');
          } catch {
            // gone meanwhile
          }
        }
        return;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Processes running `runsc checkpoint` or `runsc restore` of an incarnation of `id`. */
  private async runtimeOps(id: string): Promise<number[]> {
    const out: number[] = [];
    for (const d of await fs.readdir('/proc').catch(() => [] as string[])) {
      if (!/^\d+$/.test(d) || Number(d) === process.pid) continue;
      const args = (await fs.readFile(`/proc/${d}/cmdline`, 'utf8').catch(() => '')).split('\0');
      if (!args.some((a) => a === this.runsc || path.basename(a) === 'runsc')) continue;
      if (args.some((a) => a === 'checkpoint' || a === 'restore') && args.some((a) => a === id || a.startsWith(`${id}-`))) out.push(Number(d));
    }
    return out;
  }

  /** Asked once: every snapshot records it, and the binary does not change under a running daemon. */
  version(): Promise<string> {
    this.versionP ??= tryRun(this.runsc, ['--version'], 10_000).then((v) => `runsc ${v?.stdout.split('\n')[0]?.replace('runsc version ', '') ?? 'unknown'} runtime ${path.basename(this.runtimeDir)}${this.opts.network ? ' net' : ''}${this.disks ? ' disk' : ''}`);
    return this.versionP;
  }

  /** Directories, agent socket, netns and OCI bundle for a sandbox about to be run or restored. */
  private async prepareBundle(spec: DriverCreateSpec, rid: string, signal?: AbortSignal) {
    if (!this.events) throw new Error('bind() first');
    const rootfs = spec.rootfs;
    const b = { ...this.box(spec.id), netns: `${NETNS_PREFIX}${rid}` };
    await fs.mkdir(b.bundle, { recursive: true, mode: 0o700 });
    await fs.mkdir(b.sock, { recursive: true, mode: 0o700 });
    await this.listen(spec.id);
    await createNetns(b.netns, this.opts.network && { network: this.opts.network, id: spec.id, ifname: SANDBOX_IF });
    signal?.throwIfAborted();
    const nproc = this.opts.maxProcesses ?? Math.min(1024, Math.max(32, Math.floor(spec.memoryMb / 4)));
    const preload = path.join(b.dir, 'ld.so.preload');
    await fs.writeFile(preload, await preloadList(rootfs), { mode: 0o644 });
    // The image's own sudo cannot work here (no set-id): SPACE's client takes its place.
    const sudo = existsSync(path.join(rootfs, 'usr/bin/sudo'));
    const config = {
      ociVersion: '1.0.0',
      process: {
        terminal: false,
        user: { uid: 0, gid: 0 },
        args: AGENT_ARGV,
        env: [
          'PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin',
          'LANG=C.UTF-8',
          ...Object.entries(spec.env).map(([k, v]) => `${k}=${v}`),
          `SPACE_SANDBOX_ID=${spec.id}`,
          `SPACE_AGENT_SOCKET=${AGENT_SOCKET_DIR}/${AGENT_SOCKET_NAME}`,
          // This runsc's terminals never turn ^C, ^Z, ^\ into signals: the agent does (processes.ts).
          'SPACE_PTY_SIGNALS=agent',
          // ...and it never honours set-id bits: where the image has sudo, the agent runs a broker.
          ...(sudo ? ['SPACE_SUDO=broker'] : []),
        ],
        cwd: '/',
        capabilities: Object.fromEntries(['bounding', 'effective', 'inheritable', 'permitted'].map((k) => [k, CAPS])),
        rlimits: [
          { type: 'RLIMIT_NOFILE', hard: 65536, soft: 65536 },
          { type: 'RLIMIT_NPROC', hard: nproc, soft: nproc },
        ],
        // This runsc never honours set-id bits anyway; `sudo` works through the agent's broker.
        noNewPrivileges: true,
      },
      root: { path: this.pool ? this.pool.diskPath(rid) : rootfs, readonly: false },
      hostname: spec.id,
      mounts: [
        { destination: '/proc', type: 'proc', source: 'proc' },
        { destination: '/dev', type: 'tmpfs', source: 'tmpfs', options: ['nosuid', 'strictatime', 'mode=755', 'size=65536k'] },
        { destination: '/dev/pts', type: 'devpts', source: 'devpts', options: ['nosuid', 'noexec', 'newinstance', 'ptmxmode=0666', 'mode=0620'] },
        { destination: '/sys', type: 'sysfs', source: 'sysfs', options: ['nosuid', 'noexec', 'nodev', 'ro'] },
        { destination: AGENT_RUNTIME_DIR, type: 'bind', source: this.runtimeDir, options: ['rbind', 'ro'] },
        { destination: AGENT_SOCKET_DIR, type: 'bind', source: b.sock, options: ['rbind', 'rw'] },
        { destination: '/etc/ld.so.preload', type: 'bind', source: preload, options: ['rbind', 'ro'] },
        ...(sudo ? [{ destination: '/usr/bin/sudo', type: 'bind', source: path.join(this.runtimeDir, 'space-helper'), options: ['rbind', 'ro'] }] : []),
        ...(this.pool ? [{ destination: '/tmp', type: 'bind', source: path.join(this.pool.diskPath(rid), 'tmp'), options: ['rbind', 'rw'] }] : []),
        // Volumes: served by the gofer from the host directory (revalidated on access: --file-access-mounts=shared).
        ...(spec.mounts ?? []).map((m) => ({ destination: m.target, type: 'bind', source: m.source, options: ['rbind', m.readOnly ? 'ro' : 'rw', 'nosuid', 'nodev'] })),
      ],
      linux: {
        namespaces: [{ type: 'pid' }, { type: 'network', path: `/var/run/netns/${b.netns}` }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }],
        cgroupsPath: `/${CGROUP_PARENT}/${rid}`,
        resources: {
          memory: { limit: spec.memoryMb * 1024 * 1024 },
          cpu: { quota: Math.max(1000, Math.round(spec.cpu * 100_000)), period: 100_000 },
        },
      },
    };
    await fs.writeFile(path.join(b.bundle, 'config.json'), JSON.stringify(config));
    return b;
  }

  /**
   * `runsc run|restore --detach`: the container's stdio goes to the sandbox's log file.
   * With a network, this runsc refuses to start on a 6.x kernel ("cannot run with network
   * enabled in root network namespace": it probes /proc/sys/net/core, which every netns has
   * now). So it runs in a private mount namespace where the sandbox netns's
   * /proc/sys/net/core is covered by an empty tmpfs, still from the root netns (its control
   * socket is abstract, so netns-scoped, and later runsc commands run from the root netns).
   * The namespace is a slave of the host's: it holds a copy of every host mount while runsc
   * starts, and with `private` an unmount on the host (a volume closing, a disk pool) would
   * leave that copy holding the file system and its loop device until runsc exits; a slave
   * copy goes with the host's wherever the host's mounts are shared (systemd makes `/`
   * shared). The tmpfs stays in the namespace either way.
   */
  private runDetached(args: string[], log: string, netns: string): Promise<void> {
    const argv = [...this.flags(), ...args];
    const [cmd, cmdArgs] = this.opts.network
      ? ['unshare', ['-m', '--propagation', 'slave', 'sh', '-c', `nsenter --net=/var/run/netns/${netns} mount -t tmpfs -o size=4k,ro none /proc/sys/net/core && exec "$0" "$@"`, this.runsc, ...argv]]
      : [this.runsc, argv];
    return this.spawnOwnSession(cmd, cmdArgs, log, 60_000, args[0]!);
  }

  /**
   * Runs a runtime command in a session of its own (a daemon killed with its process group,
   * or whose pipes close, does not take it along), its output appended to `log`.
   */
  private spawnOwnSession(cmd: string, cmdArgs: string[], log: string, timeoutMs: number, what: string, env?: Record<string, string>): Promise<void> {
    const fd = openSync(log, 'a', 0o600);
    return new Promise<void>((resolve, reject) => {
      const child = spawn(cmd, cmdArgs, { stdio: ['ignore', fd, fd], detached: true, ...(env ? { env: { ...process.env, ...env } } : {}) });
      closeSync(fd);
      const timer = setTimeout(() => {
        try {
          if (child.pid) process.kill(-child.pid, 'SIGKILL');
        } catch {
          child.kill('SIGKILL');
        }
      }, timeoutMs);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new SpaceError('DRIVER_UNAVAILABLE', `Cannot run ${this.runsc}: ${err.message}; install it with apt-get install runsc`, { cause: err }));
      });
      child.on('exit', async (code, sig) => {
        clearTimeout(timer);
        if (code === 0) return resolve();
        const out = (await fs.readFile(log, 'utf8').catch(() => '')).trim().split('\n').slice(-3).join(' | ');
        reject(new SpaceError('DRIVER_FAILED', `runsc ${what} failed (${sig ?? `exit ${code}`}): ${out}`));
      });
    });
  }

  async adopt(id: string): Promise<boolean> {
    const st = await this.status(id);
    if (!st.running) return false;
    await this.opts.network?.attach(id, `${NETNS_PREFIX}${this.rid(id)}`, SANDBOX_IF);
    await this.listen(id);
    return true;
  }

  async status(id: string): Promise<RuntimeStatus> {
    const rid = this.rid(id);
    const r = await tryRun(this.runsc, ['--root', this.stateDir, 'state', rid], 10_000);
    let running = false;
    if (r) {
      try {
        const status = (JSON.parse(r.stdout) as { status?: string }).status;
        running = status === 'running' || status === 'paused';
      } catch {
        running = false;
      }
    }
    if (running) return { running };
    const oom = await this.oomInfo(rid);
    if (oom) return { running: false, reason: 'oom', detail: oom };
    return { running: false, reason: 'crashed', detail: r ? 'the sandbox stopped' : 'the runtime has no such sandbox' };
  }

  private async oomInfo(id: string): Promise<string | undefined> {
    const dir = path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, id);
    const ctl = await fs.readFile(path.join(dir, 'memory.oom_control'), 'utf8').catch(() => '');
    const kills = /oom_kill (\d+)/.exec(ctl);
    const failcnt = Number((await fs.readFile(path.join(dir, 'memory.failcnt'), 'utf8').catch(() => '0')).trim());
    if ((kills && Number(kills[1]) > 0) || failcnt > 0) {
      const limit = Number((await fs.readFile(path.join(dir, 'memory.limit_in_bytes'), 'utf8').catch(() => '0')).trim());
      return `memory limit of ${Math.round(limit / 1048576)} MiB exceeded`;
    }
    return undefined;
  }

  async usage(id: string): Promise<SandboxUsage> {
    const rid = this.rid(id);
    // Kernel files, read synchronously (readKernelFile): the sampler calls this for every sandbox every few seconds.
    const procs = readKernelFile(path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, rid, 'cgroup.procs')).split('\n').filter(Boolean);
    let rss = 0;
    for (const pid of procs) {
      const m = /VmRSS:\s+(\d+) kB/.exec(readKernelFile(`/proc/${pid}/status`));
      if (m) rss += Number(m[1]) * 1024;
    }
    const memDir = path.join(CGROUP_ROOT, 'memory', CGROUP_PARENT, rid);
    const cg = Number(readKernelFile(path.join(memDir, 'memory.usage_in_bytes'), '0').trim());
    // The working set: file pages not recently used (a disk's written files, cached) are reclaimed, not counted.
    const inactiveFile = Number(/^total_inactive_file (\d+)$/m.exec(readKernelFile(path.join(memDir, 'memory.stat')))?.[1] ?? 0);
    const cpu = Number(readKernelFile(path.join(CGROUP_ROOT, 'cpuacct', CGROUP_PARENT, rid, 'cpuacct.usage')).trim());
    const disk = await this.diskUsage(rid);
    return {
      rssBytes: rss,
      cgroupBytes: Math.max(0, cg - inactiveFile),
      ...(Number.isFinite(cpu) && cpu > 0 ? { cpuNs: cpu } : {}),
      ...(disk ? { diskUsedBytes: disk.usedBytes, ...(disk.limitBytes !== undefined ? { diskLimitBytes: disk.limitBytes } : {}) } : {}),
    };
  }

  /** What a sandbox's disk holds (btrfs's count, cached for a few seconds: usage is sampled often). */
  private async diskUsage(rid: string): Promise<DiskUsage | undefined> {
    if (!this.pool || !existsSync(this.pool.diskPath(rid))) return undefined;
    const hit = this.diskUsageCache.get(rid);
    if (hit && Date.now() - hit.at < 5_000) return hit.usage;
    const usage = await this.pool.usage(rid, false).catch(() => undefined);
    if (this.diskUsageCache.size > 10_000) this.diskUsageCache.clear();
    if (usage) this.diskUsageCache.set(rid, { at: Date.now(), usage });
    return usage;
  }

  private readonly diskUsageCache = new Map<string, { at: number; usage: DiskUsage }>();

  async destroy(id: string): Promise<void> {
    this.servers.get(id)?.close();
    this.servers.delete(id);
    await Promise.all([...(this.releasing.get(id) ?? [])]);
    this.releasing.delete(id);
    for (const rid of new Set([this.rid(id), ...(await this.incarnations(id))])) {
      this.checkpointed.delete(rid);
      await this.releaseRuntime(rid);
    }
    this.rids.delete(id);
    await fs.rm(this.box(id).dir, { recursive: true, force: true });
  }

  /**
   * Releases, in the background, every incarnation of `id` but the current one: a daemon killed
   * before it finished releasing a checkpointed one leaves it (container, netns, cgroups) behind.
   */
  async releaseStale(id: string): Promise<void> {
    const current = this.rid(id);
    for (const rid of await this.incarnations(id)) if (rid !== current) this.releaseLater(id, rid);
  }

  /** Runtime ids of everything the host holds of `id`: containers, and the netns or cgroups an interrupted release may have left without one. */
  private async incarnations(id: string): Promise<Set<string>> {
    const rids = new Set((await this.runtimeIds()).filter((r) => r === id || r.startsWith(`${id}-`)));
    // Network namespaces and cgroups are the host's, named by incarnation: those of another
    // runtime's running container (a node of the same cluster on this host, which took the
    // sandbox over) are not this driver's to remove.
    const found = new Set<string>();
    const netns = (await tryRun('ip', ['netns', 'list'], 10_000))?.stdout ?? '';
    for (const line of netns.split('\n')) {
      const name = line.split(' ')[0] ?? '';
      if (name === `${NETNS_PREFIX}${id}` || name.startsWith(`${NETNS_PREFIX}${id}-`)) found.add(name.slice(NETNS_PREFIX.length));
    }
    for (const ctl of ['memory', 'cpu']) {
      for (const d of await fs.readdir(path.join(CGROUP_ROOT, ctl, CGROUP_PARENT)).catch(() => [] as string[])) if (d === id || d.startsWith(`${id}-`)) found.add(d);
    }
    for (const rid of found) if (!rids.has(rid) && !(await this.anotherRuntimeHolds(rid))) rids.add(rid);
    for (const d of (await this.pool?.list())?.disks ?? []) if (d.startsWith(`${id}-`)) rids.add(d);
    return rids;
  }

  /** Whether a process of another runsc root (`--root=` not this driver's) is in incarnation `rid`'s cgroup or network namespace. */
  private async anotherRuntimeHolds(rid: string): Promise<boolean> {
    const pids = new Set<string>();
    for (const ctl of ['memory', 'cpu']) {
      for (const p of (await fs.readFile(path.join(CGROUP_ROOT, ctl, CGROUP_PARENT, rid, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n')) if (p.trim()) pids.add(p.trim());
    }
    for (const p of ((await tryRun('ip', ['netns', 'pids', `${NETNS_PREFIX}${rid}`], 10_000))?.stdout ?? '').split('\n')) if (p.trim()) pids.add(p.trim());
    for (const pid of pids) {
      const root = /--root=([^\0]+)/.exec(await fs.readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => ''))?.[1];
      if (root && path.resolve(root) !== path.resolve(this.stateDir)) return true;
    }
    return false;
  }

  /** Removes one container incarnation, its netns and cgroups. Idempotent. */
  private async releaseRuntime(rid: string): Promise<void> {
    await tryRun(this.runsc, ['--root', this.stateDir, 'kill', rid, 'KILL'], 10_000);
    // A delete can fail at once on a busy host (another runsc call holds the container's lock):
    // while the container is still there, try again, so no sandbox leaves an orphan behind.
    for (let attempt = 0; attempt < 5; attempt++) {
      if (await tryRun(this.runsc, ['--root', this.stateDir, 'delete', '--force', rid], 20_000)) break;
      if (!(await tryRun(this.runsc, ['--root', this.stateDir, 'state', rid], 10_000))) break;
      await new Promise((r) => setTimeout(r, 200 * (attempt + 1)));
    }
    await tryRun('ip', ['netns', 'del', `${NETNS_PREFIX}${rid}`], 10_000);
    await this.opts.network?.detach(`${NETNS_PREFIX}${rid}`);
    for (const ctl of ['memory', 'cpu', 'cpuacct', 'cpuset', 'pids', 'blkio', 'devices', 'freezer', 'systemd']) {
      const d = path.join(CGROUP_ROOT, ctl, CGROUP_PARENT, rid);
      if (existsSync(d)) await removeCgroup(d);
    }
    // Its disk last, once nothing serves it (what a checkpoint needed of it is in its copy).
    // (A failure leaves it listed: the next start's orphan sweep removes it.)
    if (this.pool && rid.includes('-')) await this.pool.removeDisk(rid).catch(() => {});
  }

  private async runtimeIds(): Promise<string[]> {
    const r = await tryRun(this.runsc, ['--root', this.stateDir, 'list', '--format', 'json'], 10_000);
    if (!r) return [];
    try {
      return ((JSON.parse(r.stdout) as { id: string }[] | null) ?? []).map((c) => c.id);
    } catch {
      return [];
    }
  }

  /**
   * Sandboxes this driver holds anything of: runsc containers, and sandbox directories (made
   * before a container exists, so a crash between the two still leaves a trace to clean).
   */
  async list(): Promise<string[]> {
    const dirs = await fs.readdir(this.boxesDir).catch(() => [] as string[]);
    const disks = (await this.pool?.list())?.disks ?? [];
    return [...new Set([...(await this.runtimeIds()).map((r) => r.split('-')[0]!), ...dirs.filter((d) => /^sb[a-z0-9]+$/.test(d)), ...disks.map((d) => d.split('-')[0]!)])];
  }

  async close(): Promise<void> {
    for (const s of this.servers.values()) s.close();
    this.servers.clear();
    await this.pool?.quiesce();
  }
}

/**
 * Removes a sandbox's cgroup. Processes of a container a killed daemon left behind (runsc's
 * sandbox and gofer) may still be in it, or exiting, after `runsc delete`: what is left is
 * killed and the removal tried again, for up to ~5 s (a cgroup holding a process cannot go).
 */
async function removeCgroup(dir: string): Promise<void> {
  for (let attempt = 0; attempt < 10; attempt++) {
    try {
      await fs.rmdir(dir);
      return;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EBUSY') return;
    }
    const procs = (await fs.readFile(path.join(dir, 'cgroup.procs'), 'utf8').catch(() => '')).split('\n').filter(Boolean);
    for (const pid of procs) {
      try {
        process.kill(Number(pid), 'SIGKILL');
      } catch {
        // gone already
      }
    }
    await new Promise((r) => setTimeout(r, 100 * (attempt + 1)));
  }
}

/** How long a snapshot waits for a sandbox's disk to be written out before it stops it (then the checkpoint does the rest). */
const FLUSH_TIMEOUT_MS = 120_000;

/**
 * The sandbox's `/etc/ld.so.preload`: SPACE's compatibility shim first (statx without
 * AT_NO_AUTOMOUNT, which this runsc rejects; see `packages/agent/native/compat.c`), then what
 * the template's own file lists, so an image that preloads a library keeps it.
 */
async function preloadList(rootfs: string): Promise<string> {
  const own = await fs.readFile(path.join(rootfs, 'etc', 'ld.so.preload'), 'utf8').catch(() => '');
  return `${RUNTIME.compatLib}\n${own}`;
}
