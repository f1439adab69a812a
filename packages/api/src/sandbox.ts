/**
 * Sandboxes, snapshots and their events as the API returns them, and what a create asks for.
 */
import type { VolumeMount } from './volume.js';
import type { EgressPolicy, HeaderRule, SecretAttachment } from './records.js';

/**
 * Lifecycle states.
 * - `starting`: the driver is booting it; no commands yet.
 * - `running`: the agent answers.
 * - `paused`: frozen in memory (no CPU); resume to continue.
 * - `hibernated`: saved to a snapshot, no host resources; wakes on demand.
 * - `killed`: ended on request or by its timeout (terminal).
 * - `dead`: ended by itself — out of memory, crashed, or gone while the daemon was down (terminal).
 */
export const SANDBOX_STATES = ['starting', 'running', 'paused', 'hibernated', 'killed', 'dead'] as const;

/** One of {@link SANDBOX_STATES}. */
export type SandboxState = (typeof SANDBOX_STATES)[number];

/** Why a sandbox ended. */
export type EndReason = 'killed' | 'timeout' | 'oom' | 'crashed' | 'lost' | 'node-lost' | 'start-failed' | 'shutdown';

/** Rolling snapshots: one every `intervalMs`, the newest `keep` scheduled ones kept. */
export interface SnapshotPolicy {
  intervalMs: number;
  keep: number;
}

/** Why a snapshot was taken. */
export type SnapshotTrigger = 'manual' | 'schedule' | 'hibernate' | 'fork';

/** A stored snapshot of a sandbox's whole state (memory, processes, filesystem). */
export interface Snapshot {
  id: string;
  sandboxId: string;
  tenantId: string;
  name?: string;
  trigger: SnapshotTrigger;
  createdAt: string;
  /**
   * Size of the snapshot's contents: the runtime's image as the snapshot store receives it
   * (for gVisor decompressed), before deduplication and compression — what it adds to the
   * disk is usually much less (docs/benchmarks.md).
   */
  sizeBytes: number;
  /** The snapshot the sandbox was last restored from, if any (lineage). */
  parentSnapshotId?: string;
  /** How long the sandbox was stopped to take it, ms. */
  downtimeMs: number;
  template: string;
  driver: string;
  blobKey: string;
}

/** Something that happened to a sandbox, for its event log. */
export interface SandboxEvent {
  sandboxId: string;
  at: string;
  type: string;
  message: string;
}

/** A sandbox as stored and as returned by the API. */
export interface Sandbox {
  id: string;
  tenantId: string;
  template: string;
  driver: string;
  state: SandboxState;
  /** Why it ended (terminal states only). */
  endReason?: EndReason;
  /** Human-readable detail of the end (e.g. "memory limit of 256 MiB exceeded"). */
  endDetail?: string;
  cpu: number;
  memoryMb: number;
  /**
   * Size of its disk, MiB: the root file system's files (template files included) live on a
   * disk of this size, not in memory. Absent: the daemon keeps sandbox files in memory (`--disks off`).
   */
  diskMb?: number;
  /** Milliseconds after creation when the sandbox is killed; 0 = never. */
  timeoutMs: number;
  env: Record<string, string>;
  metadata: Record<string, string>;
  createdAt: string;
  startedAt?: string;
  endedAt?: string;
  /** When the timeout kills it (ISO time), if it has one. */
  expiresAt?: string;
  /** The sandbox this one was forked from. */
  parentId?: string;
  /** The snapshot it was last restored or forked from. */
  fromSnapshotId?: string;
  /** The newest complete snapshot (used to recover from a failed checkpoint). */
  lastSnapshotId?: string;
  /** Rolling snapshot policy, if any. */
  snapshotPolicy?: SnapshotPolicy;
  /** What the timeout does. @default "kill" */
  onTimeout?: 'kill' | 'hibernate';
  /** Hibernate after this many ms without an API call for the sandbox (its processes may still run). */
  idleTimeoutMs?: number;
  /** A request through the ingress to one of its ports wakes it when hibernated, resumes it when paused. */
  autoResume?: boolean;
  /** Where creation time went. */
  createTimings?: CreateTimings;
  /** Where it may connect through the egress proxy (absent: nothing). */
  egress?: EgressPolicy;
  /** Secrets attached to it: it holds their placeholders, never their values. */
  secrets?: SecretAttachment[];
  /** Volumes mounted into it; it holds them until it is killed or dies. */
  volumes?: VolumeMount[];
  /** The node that runs it (`GET /v1/nodes`): where it was created, or moved to. */
  node?: string;
  /**
   * How many times it changed node (a move, or a wake on another node while its own was down):
   * the ownership's generation. Absent: never.
   */
  generation?: number;
  /** Moved while running (a drain): the node it moved to wakes it. */
  wakeOnArrival?: boolean;
}

/**
 * Where a sandbox's creation time went, ms. `source` says how it started: taken from a warm
 * `pool`, restored from its template's `snapshot`, or a cold `boot`.
 */
export interface CreateTimings {
  source: 'pool' | 'snapshot' | 'boot';
  /** Waiting for a free start slot. */
  queueMs: number;
  /** The runtime's restore of the template snapshot (source `snapshot`). */
  restoreMs?: number;
  /** The runtime's boot (source `boot`). */
  bootMs?: number;
  /** From the runtime's start to the agent's first contact. */
  agentMs: number;
  /** Giving the sandbox its own id, hostname and environment. */
  identityMs: number;
  totalMs: number;
}

/** What a client asks for when creating a sandbox. */
export interface CreateSandboxOpts {
  /** Template. @default "minimal" */
  template?: string;
  /** Isolation driver, one of the daemon's enabled drivers (`gvisor`, `microvm`). @default the daemon's default */
  driver?: string;
  /** CPU cores (fractions allowed). @default 1 */
  cpu?: number;
  /** Memory limit, MiB. @default 512 */
  memoryMb?: number;
  /**
   * Disk size, MiB, template files included; a full disk fails the write (`ENOSPC`), not the
   * sandbox. Only on daemons with disks (`--disks auto`, the default, on a single node; or
   * `--disks on`). @default 5120
   */
  diskMb?: number;
  /** Kill the sandbox this many ms after creation; 0 = never. @default 1800000 (30 min) */
  timeoutMs?: number;
  /** Environment variables of every process. */
  env?: Record<string, string>;
  /** Labels to filter listings by. */
  metadata?: Record<string, string>;
  /** What happens when `timeoutMs` is reached. @default "kill" */
  onTimeout?: 'kill' | 'hibernate';
  /** Hibernate after this many ms without an API call for the sandbox; 0 or absent = never. */
  idleTimeoutMs?: number;
  /**
   * Wake on request: a request through the ingress to one of its exposed ports wakes it when
   * hibernated (and resumes it when paused), then is served. @default false
   */
  autoResume?: boolean;
  /** Where it may connect through the egress proxy. @default nothing */
  egress?: Partial<EgressPolicy>;
  /** Names of the tenant's secrets to attach: the sandbox gets placeholders in env vars of those names. */
  secrets?: string[];
  /** Request headers the egress proxy sets on its requests to some hosts; the values never enter the sandbox. */
  headers?: HeaderRule[];
  /**
   * Volumes of the tenant to mount (`space volume create`): read-write by this sandbox alone,
   * or read-only (`readOnly: true`) by many. Not rolled back with the sandbox's snapshots.
   */
  volumes?: VolumeMount[];
}
