/**
 * What the parts of the sandbox lifecycle share: the node's stores and driver, the live
 * sandboxes, admission, and — as explicit hooks the facade (`SandboxService`) wires after
 * building them — the other parts they call. A part never imports another part or the facade:
 * it calls them through {@link LifecycleHooks}, so the parts form no import cycle.
 */
import type { Duplex } from 'node:stream';
import type { AgentChannel } from '../agent/channel.js';
import type { BlobStore } from '../ports/blob-store.js';
import type { DriverCreateSpec } from '../ports/driver.js';
import type { DriverRouter } from '../ports/driver-router.js';
import type { Intent, Journal } from '../ports/intent-journal.js';
import type { Logger } from '../logger.js';
import type { Laps } from '../laps.js';
import type { CreateTimings, EndReason, Sandbox, Snapshot, SnapshotTrigger, Template } from '../model.js';
import type { WarmPool } from '../templates/warm-pool.js';
import type { SecretAttachment } from '../records.js';
import type { SecretService } from '../security/egress-policy.js';
import type { MetadataStore } from '../ports/metadata-store.js';
import type { TemplateService } from '../templates/template-service.js';
import type { Admission } from './admission.js';
import type { FaultPoints } from './faults.js';
import type { LiveTable } from './live.js';
import type { Volumes } from '../volumes/volumes.js';

/** Sandbox networking through the egress proxy (see `SandboxServiceOptions.egress`). */
export interface SandboxEgressOptions {
  secrets: SecretService;
  /** Environment of every sandbox: the proxy variables and where the CA files are. */
  env: Record<string, string>;
  /** The tenant's egress CA certificate (PEM), installed in each of its sandboxes. */
  trust(tenantId: string): Promise<string>;
}

/** A snapshot being taken: the record, the image it came from, and its journal entry. */
export interface TakenSnapshot {
  snapshot: Snapshot;
  imageDir: string;
  intent: Intent;
}

/** What a restore needs of a snapshot: which it is, whose, and where its bytes are stored. */
export type SnapshotRef = Pick<Snapshot, 'id' | 'sandboxId' | 'blobKey'>;

/**
 * Called once a snapshot's checkpoint image is complete in `imageDir`, before the sandbox is
 * restored from it and before the image is stored: a fork starts its copies from it then,
 * beside the parent's own restore. The image stays until the caller of `takeSnapshot` removes it.
 */
export type OnCheckpointed = (imageDir: string, snapshot: SnapshotRef) => void;

/** Checkpoints, snapshots and restores (checkpoint.ts). */
export interface CheckpointHooks {
  spec(sb: Sandbox): Promise<DriverCreateSpec>;
  assertSnapshottable(ch: AgentChannel, id: string, what: string): Promise<void>;
  quiesceAndCheckpoint(id: string, ch: AgentChannel, imageDir: string, injectFaults?: boolean): Promise<void>;
  takeSnapshot(sb: Sandbox, trigger: SnapshotTrigger, name: string | undefined, keepRunning: boolean, onCheckpointed?: OnCheckpointed): Promise<TakenSnapshot>;
  storeImage(sb: Sandbox, intent: Intent, imageDir: string, downtimeMs: number): Promise<Snapshot>;
  bootFromImage(target: Sandbox, imageDir: string): Promise<void>;
  unpack(snap: SnapshotRef): Promise<string>;
  restoreFrom(snap: SnapshotRef, target: Sandbox, imageDir?: string, laps?: Laps): Promise<void>;
  ownSnapshot(sb: Sandbox, snapshotId: string): Promise<Snapshot>;
  deleteSnapshot(sn: Snapshot): Promise<void>;
}

/** Bringing sandboxes back (recovery.ts). */
export interface RecoveryHooks {
  recover(sb: Sandbox, why: string): Promise<boolean>;
  runtimeRuns(id: string): Promise<boolean>;
  adoptRunning(sb: Sandbox): Promise<boolean>;
}

/** Timeouts, rolling snapshots, idle hibernation (timers.ts). */
export interface TimerHooks {
  arm(sb: Sandbox): void;
  schedule(sb: Sandbox): void;
  schedulePolicy(sb: Sandbox): void;
}

/** Ending sandboxes (endings.ts). */
export interface EndingHooks {
  terminate(id: string, state: 'killed' | 'dead', reason: EndReason, detail: string): Promise<Sandbox>;
  end(id: string, state: 'killed' | 'dead', endReason: EndReason, endDetail: string): Promise<Sandbox>;
}

/** The agents' connections (agents.ts). */
export interface AgentHooks {
  channel(id: string): Promise<AgentChannel>;
  withChannel<T>(id: string, use: (ch: AgentChannel) => T): Promise<T>;
  onAgent(id: string, stream: Duplex): void;
}

/** Hibernate and wake (sessions.ts). */
export interface SessionHooks {
  hibernate(tenantId: string, id: string): Promise<Sandbox>;
  wake(tenantId: string, id: string): Promise<Sandbox>;
  /** Wakes a hibernated sandbox (resumes a paused one when asked); others as they are. Concurrent callers wake it once. */
  awaken(tenantId: string, id: string, resumePaused?: boolean): Promise<Sandbox>;
  markWoken(sb: Sandbox): Promise<Sandbox>;
  /** The idle timer's hibernation (see Sessions.hibernateIfIdle). */
  hibernateIfIdle(id: string, idleMs: number): Promise<'hibernated' | 'active' | 'gone'>;
  /** Takes a hibernated sandbox of a node that is down for this one (see Sessions.takeOver). */
  takeOver(sb: Sandbox, why: string): Promise<Sandbox>;
  /** Throws unless the sandbox can run on node `to` (no disk or volume; its template's files there). */
  assertMovable(sb: Sandbox, to: string): Promise<void>;
}

/** Starting sandboxes from templates, and their pools (template-starts.ts). */
export interface StartHooks {
  startSandbox(t: Template, sb: Sandbox, env: Record<string, string>, trust: string | undefined, signal?: AbortSignal): Promise<Omit<CreateTimings, 'queueMs' | 'totalMs'>>;
  preparePool(t: Template): void;
  discardPooled(id: string): Promise<void>;
}

/** A sandbox's environment and network settings (egress-settings.ts). */
export interface EgressHooks {
  envOf(templateEnv: Record<string, string>, env: Record<string, string>, secrets: SecretAttachment[] | undefined): Record<string, string>;
  requireEgress(): SandboxEgressOptions;
}

/** Every part, as the others may call it. */
export interface LifecycleHooks {
  checkpoints: CheckpointHooks;
  recovery: RecoveryHooks;
  timers: TimerHooks;
  endings: EndingHooks;
  agents: AgentHooks;
  sessions: SessionHooks;
  starts: StartHooks;
  egress: EgressHooks;
  /** A tenant's sandbox, or SANDBOX_NOT_FOUND. */
  get(tenantId: string, id: string): Promise<Sandbox>;
}

/** What every part of the lifecycle is built with. */
export interface SandboxContext {
  readonly store: MetadataStore;
  readonly driver: DriverRouter;
  readonly log: Logger;
  readonly blobs: BlobStore;
  /** Scratch directory for checkpoint images. */
  readonly workDir: string;
  /** This node's name, recorded on the sandboxes it makes. */
  readonly nodeName: string | undefined;
  /**
   * The store is shared with other nodes (a cluster): images are stored so that any node can
   * restore them (with what their disks grew from: `putImage`'s `portable`).
   */
  readonly shared: boolean;
  /**
   * Whether this node acts on the sandbox: always when it is the store's only daemon; with a
   * shared store (nodes of a cluster), only on the sandboxes it runs (`node` is its name).
   */
  owns(sb: Pick<Sandbox, 'node'>): boolean;
  /** Largest snapshot payload accepted on restore, bytes. */
  readonly maxSnapshotBytes: number;
  /** Intents of lifecycle operations under way, durable. */
  readonly journal: Journal;
  readonly egress: SandboxEgressOptions | undefined;
  /** The node's volumes; absent: mounts are refused with `VOLUMES_UNAVAILABLE`. */
  readonly volumes: Volumes | undefined;
  readonly templates: TemplateService;
  readonly pool: WarmPool;
  readonly live: LiveTable;
  readonly admission: Admission;
  readonly faults: FaultPoints;
  /** How long a call waits for an agent that is reconnecting, ms. */
  readonly reconnectWaitMs: number;
  /** Aborted when the daemon shuts down: stops captures and refills. */
  readonly stopSignal: AbortSignal;
  /** Whether the daemon is shutting down. */
  stopping(): boolean;
  /** Runs a clean-up in the background; shutdown waits for it. */
  background(p: Promise<unknown>): void;
  /** Tracks work that owns sandboxes outside the database (captures, refills); shutdown waits for it. */
  transient<T>(p: Promise<T>): Promise<T>;
  /** Records an event in the sandbox's log. */
  event(sandboxId: string, type: string, message: string): Promise<void>;
  /** Runs `fn` after every earlier lifecycle action on the sandbox has finished. */
  withLock<T>(id: string, fn: () => Promise<T>): Promise<T>;
  /** How long a start or restore on driver `name` may take until the agent answers. */
  bootTimeout(name: string | undefined): number;
  /** The other parts (wired by the facade once all are built). */
  readonly hooks: LifecycleHooks;
}
