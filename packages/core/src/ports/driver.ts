/**
 * The isolation-driver interface. A driver boots a sandbox with the in-sandbox agent as its
 * first process and hands core a byte stream to that agent; core speaks the protocol.
 * Drivers import core; core imports no driver.
 */
import type { Duplex, Readable } from 'node:stream';
import type { EndReason } from '../model.js';

/** What a driver needs to boot one sandbox. */
export interface DriverCreateSpec {
  id: string;
  /** Template name (for logs). */
  template: string;
  /** The template's root file system on the host (shared, read-only lower layer). */
  rootfs: string;
  cpu: number;
  memoryMb: number;
  /** Size of its disk, MiB (drivers with {@link SandboxDriver.disks}; core fills in the default). */
  diskMb?: number;
  /** Environment for the agent, applied to every process it starts. */
  env: Record<string, string>;
  /** Host directories to mount into it (volumes; drivers with {@link SandboxDriver.mounts}). */
  mounts?: DriverMount[];
  /** Which driver runs it, when several are enabled (see `DriverRouter`); the default when absent. */
  driver?: string;
}

/** A host directory mounted into a sandbox. */
export interface DriverMount {
  /** Directory on the host. */
  source: string;
  /** Absolute path inside the sandbox. */
  target: string;
  readOnly: boolean;
}

/**
 * The sandbox network a driver wires into each sandbox's network namespace: one link whose
 * only reachable destination is the egress proxy (implemented by `@space/sandbox-net`).
 *
 * @example
 * const address = await network.attach('sb1', 'space-sb1-abcd1234', 'eth0');
 */
export interface SandboxNetwork {
  /**
   * Gives netns `netns` (of sandbox `id`) its link, named `ifname` inside; resolves to the
   * sandbox's address. With `create`, the namespace does not exist yet: it is made (loopback
   * up) in the same helper run as the link (see {@link createNetns}).
   */
  attach(id: string, netns: string, ifname: string, opts?: { create?: boolean }): Promise<string>;
  /** Forgets the link of `netns` (after the driver deleted the namespace, which removes the link). */
  detach(netns: string): Promise<void>;
  /** The address of sandbox `id`'s newest link, where the ingress connects (undefined without one). */
  addressOf(id: string): string | undefined;
}

/** Result of asking the runtime about one sandbox. */
export interface RuntimeStatus {
  running: boolean;
  /** When not running: why, if the driver can tell (e.g. `oom`). */
  reason?: EndReason;
  detail?: string;
}

/** Host cost of one sandbox. */
export interface SandboxUsage {
  /** Resident memory of every host process the sandbox costs, bytes. */
  rssBytes: number;
  /** Memory charged to the sandbox's cgroup, bytes, when known. */
  cgroupBytes?: number;
  /** CPU time used since it started, ns, when known. */
  cpuNs?: number;
  /** What its disk holds, bytes (template files included), when it has one. */
  diskUsedBytes?: number;
  /** Its disk's size, bytes, when it has one. */
  diskLimitBytes?: number;
}

/** A driver's sandbox disks: where the root file system's files go instead of memory. */
export interface DriverDisks {
  /** Disk size when a create gives none, MiB. */
  defaultMb: number;
  /** Largest disk a create may ask for, MiB. */
  maxMb: number;
  /**
   * The disk is a block device whose file system the sandbox's agent grows: after a restore
   * from an image made with a smaller disk the driver grows the device, and core has the
   * agent grow the file system (identity `diskBytes`) before the create returns (a microVM's).
   */
  grownByAgent?: boolean;
  /**
   * A disk moves with its session between nodes of a cluster: its images name the template it
   * grew from by an identity every node shares ({@link ImageAttachment.base}).
   */
  movable?: boolean;
  /** What the node's disk pool takes on the host's disk, bytes (set once the driver's {@link SandboxDriver.init} opened it). */
  poolBytes?: number;
}

/** What `space doctor` reports for a driver. */
export interface DriverReport {
  driver: string;
  available: boolean;
  checks: { name: string; ok: boolean; detail: string }[];
}

/** Callbacks a driver calls into core. */
export interface DriverEvents {
  /** The agent of sandbox `id` connected (first time or after a reconnect). */
  agentConnected(id: string, stream: Duplex): void;
}

/**
 * A reversible rewrite of one checkpoint image file for storage, chosen by the driver that
 * knows the runtime's format: e.g. gVisor's state file is compressed block by block, which
 * hides what consecutive snapshots share from deduplication, so its codec stores the blocks
 * decompressed and compresses them back, bit for bit, on the way out.
 *
 * @example
 * if (await codec.encode(`${dir}/checkpoint.img`, `${tmp}/checkpoint.img`)) store(`${tmp}/checkpoint.img`, codec.name);
 * await codec.decode(stored, `${dir}/checkpoint.img`); // byte-identical to what the runtime wrote
 */
export interface ImageFileCodec {
  /** Recorded in every snapshot that used it; a new incompatible form needs a new name. */
  readonly name: string;
  /** Writes the stored form of `src` to `dest`. False (nothing to do): `src` is stored as it is. */
  encode(src: string, dest: string): Promise<boolean>;
  /**
   * Writes the original file back from its stored form. Rejects with `SNAPSHOT_CORRUPT` when the
   * result is not byte-identical to the original (checked by hash), `DRIVER_UNAVAILABLE` when it cannot run.
   */
  decode(src: string, dest: string): Promise<void>;
}

/**
 * Bytes an image file stands for that are stored as an object of their own beside the snapshot
 * (`<snapshot key>.<suffix>`), streamed from where they are straight into the blob store, and
 * read back only when a restore needs them: e.g. a disk's files, which the node keeps in a local
 * copy named by a small mark file in the image. A snapshot's fetch then reads the image alone (a
 * wake of a sandbox holding a GiB on its disk fetched that GiB, to find its copy in the pool).
 * The image file itself is stored as it is (no {@link ImageFileCodec}).
 *
 * @example
 * const bytes = await attachment.open(`${imageDir}/space-disk.json`); // a btrfs send stream, or undefined
 * if (bytes) await blobs.put(`${key}.${attachment.suffix}`, bytes);
 * // restoring, after the image is unpacked:
 * if (await attachment.needed(file)) await attachment.apply(file, await blobs.get(`${key}.${attachment.suffix}`));
 */
export interface ImageAttachment {
  /** Recorded in every snapshot that used it; a new incompatible form needs a new name. */
  readonly name: string;
  /** The end of the object's key (`<snapshot key>.<suffix>`): 1 to 32 of a-z, 0-9 and '-'. */
  readonly suffix: string;
  /**
   * The bytes to store for image file `src`, or undefined when it is not a file this attachment
   * takes. The stream errors (and the snapshot fails) when they cannot be read whole.
   */
  open(src: string): Promise<Readable | undefined>;
  /**
   * The change from what the same file of image `earlier` (an earlier snapshot's id, on this
   * node) stood for to what image file `src` stands for, as bytes that {@link apply} takes after
   * the earlier image's bytes: stored as one more part after a copy of that image's parts, so a
   * snapshot after a small change (or none) stores the change, not everything again. What the
   * parts make must be what `src` stands for, exactly (a later change is made against it).
   * Undefined when it cannot make one (then the whole is opened).
   *
   * @example
   * const change = await attachment.openSince?.(`${imageDir}/space-disk.json`, 'sn2'); // btrfs send -p <sn2's copy> <this copy>
   */
  openSince?(src: string, earlier: string): Promise<Readable | undefined>;
  /** Whether restoring unpacked image file `src` needs the stored bytes (what they make is not on this node). */
  needed(src: string): Promise<boolean>;
  /**
   * Makes what image file `src` stands for from the stored bytes (the parts stored for it, one
   * after another: a whole, then changes from {@link openSince}); nothing half-made is left on a
   * failure. Rejects with `SNAPSHOT_CORRUPT` when the bytes do not make it.
   */
  apply(src: string, bytes: Readable): Promise<void>;
  /**
   * What the bytes of image file `src` are made against that another node may lack (a disk's
   * template files: its stream's parent), with its identity (the same on every node that has
   * it) and a way to read it whole. Stored beside the snapshot (`<key>.<suffix>-base`) where
   * snapshots must restore on other nodes (a cluster). Undefined: nothing such.
   *
   * @example
   * const b = await attachment.base?.(`${imageDir}/space-disk.json`); // { id: '<template's btrfs UUID>', open: () => btrfs send <template> }
   */
  base?(src: string): Promise<{ id: string; open(): Readable } | undefined>;
  /** Whether restoring image file `src` needs its {@link base} first (this node lacks it). */
  needsBase?(src: string): Promise<boolean>;
  /** Makes the {@link base} of image file `src` on this node from its stored bytes, kept for later restores. */
  applyBase?(src: string, bytes: Readable): Promise<void>;
}

/** How a driver stores its image files (see DriverRouter.imageForms): codecs, and attachments. */
export interface ImageForms {
  /** Codecs to store image files with, in the order they are tried. */
  codecs: readonly ImageFileCodec[];
  /** Attachments to store image files' bytes apart with, in the order they are tried. */
  attachments: readonly ImageAttachment[];
}

/** What reads the stored images of any enabled driver (the DriverRouter is one). */
export interface ImageReaders {
  /** The codec called `name` (to read what a snapshot recorded). */
  codecNamed(name: string): ImageFileCodec | undefined;
  /** The attachment called `name` (to restore what a snapshot recorded). */
  attachmentNamed(name: string): ImageAttachment | undefined;
}

/** Written into a checkpoint image directory once the image is complete (see {@link SandboxDriver.checkpoint}). */
export const CHECKPOINT_COMPLETE = '.space-complete';

/**
 * Where a driver's restore spent its time, in milliseconds (each optional: what the driver can
 * tell). Reported in wake and snapshot events.
 * @example { diskMs: 40, prepareMs: 55, runtimeMs: 310 }
 */
export interface RestoreTimings {
  /** The sandbox's disk made from the image's copy. */
  diskMs?: number;
  /** The bundle, network namespace and link. */
  prepareMs?: number;
  /** The runtime's own restore command. */
  runtimeMs?: number;
}

/**
 * One isolation technology (gVisor, microVM, ...). Every driver passes the shared conformance
 * suite (`@space/core`'s `conformance` tests) with explicit, reasoned skips.
 *
 * @example
 * const driver: SandboxDriver = new GvisorDriver({ dataDir });
 * driver.bind({ agentConnected: (id, s) => service.onAgent(id, s) });
 * await driver.create({ id, template: 'minimal', rootfs: '/var/lib/space/templates/minimal/rootfs', cpu: 1, memoryMb: 256, env: {} });
 */
export interface SandboxDriver {
  readonly name: string;
  /**
   * True when a checkpoint holds any state a sandbox can be in (a full-machine snapshot: the
   * guest kernel owns every socket). Otherwise core asks the agent first what would block one
   * (gVisor refuses open TCP connections) and refuses with `SNAPSHOT_UNSUPPORTED_STATE`.
   */
  readonly checkpointsAnyState?: boolean;
  /** How long a boot or restore may take until the agent answers, if longer than core's default (30 s). */
  readonly bootTimeoutMs?: number;
  /**
   * How this driver's image files are stored (see {@link ImageFileCodec}): each file goes
   * through the first codec that takes it; none: as they are.
   */
  readonly imageCodecs?: readonly ImageFileCodec[];
  /** Image files whose bytes are stored apart (see {@link ImageAttachment}); each file goes to the first that takes it. */
  readonly imageAttachments?: readonly ImageAttachment[];
  /**
   * Present when sandboxes get disks: their files live on a bounded disk, captured with each
   * checkpoint (kept by the driver under the image directory's name, until {@link forgetImage}).
   * Absent: files are held in memory and {@link DriverCreateSpec.diskMb} is refused.
   */
  readonly disks?: DriverDisks;
  /**
   * True when {@link DriverCreateSpec.mounts} work: host directories mounted into the sandbox,
   * kept across checkpoints (a restore gets the same mounts), their mount points made in the
   * sandbox's own files (never in files sandboxes share). Absent or false: volumes are refused.
   */
  readonly mounts?: boolean;
  /** Registers core's callbacks; called once before any other method. */
  bind(events: DriverEvents): void;
  /** Checks the host (binaries, cgroups, namespaces) without changing it. */
  doctor(): Promise<DriverReport>;
  /** Prepares the driver (runtime files). */
  init(): Promise<void>;
  /**
   * Readies what a {@link create} of `spec` needs that can take long, before core starts the
   * boot's clock: e.g. the template's files imported into the disk pool (once per template).
   */
  prepare?(spec: DriverCreateSpec, signal?: AbortSignal): Promise<void>;
  /** Boots a sandbox. Resolves once the runtime has started it; the agent connects via {@link DriverEvents}. */
  create(spec: DriverCreateSpec, signal?: AbortSignal): Promise<void>;
  /** After a daemon restart: reattach to a sandbox still running (true), or report it gone (false). */
  adopt(id: string): Promise<boolean>;
  /** Asks the runtime whether the sandbox still runs and, if not, why. */
  status(id: string): Promise<RuntimeStatus>;
  /** Host resources used by the sandbox. */
  usage(id: string): Promise<SandboxUsage>;
  /** Freezes the sandbox in memory. */
  pause(id: string): Promise<void>;
  /** Unfreezes a paused sandbox. */
  resume(id: string): Promise<void>;
  /**
   * Stops accepting the agent's connections, so that a quiesced agent stays disconnected
   * during a checkpoint. {@link restore} (or {@link adopt}) listens again.
   */
  detachAgent(id: string): Promise<void>;
  /**
   * Writes out what the sandbox has written to its storage and the host still holds in memory,
   * while the sandbox runs: a checkpoint's own flush happens while it is stopped, so a snapshot
   * taken just after a large write would otherwise freeze it for as long as the write-back takes
   * (200 MB on a disk here: 2.7 s of downtime, 0.5 s after a flush). Resolves true when there
   * was storage to flush. Optional: a driver whose sandboxes keep their files in memory has none.
   *
   * @example
   * if (await driver.flush?.('sb123')) laps.lap('flush');
   */
  flush?(id: string): Promise<boolean>;
  /**
   * Saves the whole sandbox (memory, processes, filesystem) into `imageDir`. The sandbox is
   * stopped afterwards (a restore brings it back). The agent must be quiesced first.
   *
   * Crash contract: the file {@link CHECKPOINT_COMPLETE} appears in `imageDir` when, and only
   * when, the image is complete, even if the daemon dies meanwhile; a checkpoint interrupted
   * by the daemon's death either completes on its own or leaves the sandbox able to go on
   * (running or paused), never stopped without an image.
   */
  checkpoint(id: string, imageDir: string): Promise<void>;
  /**
   * After a daemon restart: waits until no runtime operation the previous daemon started on
   * the sandbox (a checkpoint, a restore) is still running; one still running after
   * `timeoutMs` is killed. Drivers whose operations die with the daemon need not implement it.
   */
  settle?(id: string, timeoutMs: number): Promise<void>;
  /**
   * Boots a sandbox from a checkpoint image. `spec.id` may be the sandbox it was taken from
   * (in place: whatever runtime is left of it is removed first) or a new one (fork).
   */
  restore(spec: DriverCreateSpec, imageDir: string, signal?: AbortSignal): Promise<RestoreTimings | void>;
  /**
   * Releases the host resources of a checkpointed (stopped) sandbox in the background: the
   * runtime takes seconds to let go of a checkpointed container. {@link destroy} and
   * {@link restore} wait for or supersede it.
   */
  retire(id: string): Promise<void>;
  /**
   * The runtime's version, recorded in snapshots; it also names everything inside a
   * checkpoint (runtime and agent), so that a template snapshot is retaken when it changes.
   */
  version(): Promise<string>;
  /**
   * After a daemon restart: releases whatever is left of earlier incarnations of a running
   * sandbox (a release the crash interrupted). Drivers with one incarnation per sandbox need not implement it.
   */
  releaseStale?(id: string): Promise<void>;
  /** Stops the sandbox and removes every host resource it had. Idempotent. */
  destroy(id: string): Promise<void>;
  /**
   * The image named `imageId` (the base name of the directory it was checkpointed into: a
   * snapshot id, a template image key) is gone: drops what the driver kept beside it (a disk
   * copy). Idempotent; drivers that keep nothing need not implement it.
   */
  forgetImage?(imageId: string): Promise<void>;
  /** Ids of sandboxes the runtime knows of (to find orphans). */
  list(): Promise<string[]>;
  /** Stops listening; leaves sandboxes running (they are adopted on the next start). */
  close(): Promise<void>;
}
