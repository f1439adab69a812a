/**
 * The sandbox model and its lifecycle state machine. Each action says in code which states
 * allow it; {@link assertAllowed} rejects the rest with `SANDBOX_INVALID_STATE` (or
 * `SANDBOX_NOT_RUNNING` for a sandbox that has ended).
 */
import { SpaceError } from './errors.js';
import { randomString } from './ids.js';
import type { EgressPolicy, SecretAttachment } from './records.js';

export { randomString } from './ids.js';

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
export type EndReason = 'killed' | 'timeout' | 'oom' | 'crashed' | 'lost' | 'start-failed' | 'shutdown';

/** States in which nothing more can happen. */
export const TERMINAL_STATES: readonly SandboxState[] = ['killed', 'dead'];

/** Lifecycle actions and the states that allow them. */
export const ALLOWED: Record<SandboxAction, readonly SandboxState[]> = {
  // A hibernated sandbox wakes on demand for commands and files.
  exec: ['running', 'hibernated'],
  files: ['running', 'hibernated'],
  kill: ['starting', 'running', 'paused', 'hibernated'],
  pause: ['running'],
  resume: ['paused'],
  hibernate: ['running', 'paused'],
  wake: ['hibernated'],
  snapshot: ['running', 'paused'],
  rollback: ['running', 'paused', 'hibernated'],
  fork: ['running', 'paused', 'hibernated'],
  setPolicy: ['starting', 'running', 'paused', 'hibernated'],
  // Settings the proxy or the daemon applies: any sandbox not ended.
  setEgress: ['starting', 'running', 'paused', 'hibernated'],
  setTimeout: ['starting', 'running', 'paused', 'hibernated'],
  // Secrets become env vars through the agent (only a running one takes them; see attachSecrets).
  attachSecrets: ['starting', 'running', 'paused', 'hibernated'],
  setHeaderRules: ['running', 'hibernated'],
};

/** Actions checked by {@link assertAllowed}. */
export type SandboxAction = 'exec' | 'files' | 'kill' | 'pause' | 'resume' | 'hibernate' | 'wake' | 'snapshot' | 'rollback' | 'fork' | 'setPolicy' | 'setEgress' | 'setTimeout' | 'attachSecrets' | 'setHeaderRules';

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
  /** Where creation time went. */
  createTimings?: CreateTimings;
  /** Where it may connect through the egress proxy (absent: nothing). */
  egress?: EgressPolicy;
  /** Secrets attached to it: it holds their placeholders, never their values. */
  secrets?: SecretAttachment[];
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

/** Where a template's root file system comes from. */
export type TemplateSource =
  | { type: 'builtin' }
  | { type: 'debian'; packages: string[] }
  | { type: 'upload'; format: 'oci' | 'docker' | 'rootfs'; sha256: string; sizeBytes: number };

/** A command the template starts before its snapshot, and how to tell it is ready. */
export interface TemplateStart {
  /** Shell command line, run in the background as the default user. */
  cmd: string;
  /** Shell command that exits 0 once the start command is ready; retried every 200 ms. */
  readyCmd?: string;
  /** How long to wait for readiness. @default 60000 */
  readyTimeoutMs: number;
}

/** The snapshot of a template's booted (and started) sandbox, restored by every create. */
export interface TemplateImage {
  /** Directory name under the daemon's template-images directory. */
  key: string;
  /** The sandbox id the image was taken from (its agent reports that id until told otherwise). */
  sourceId: string;
  sizeBytes: number;
  /** Boot + start + checkpoint, ms. */
  captureMs: number;
  createdAt: string;
}

/**
 * A template: a root file system, optional start command and environment, its snapshot and
 * warm pool. Built-in templates (`minimal`, `base`) have tenantId "" and every tenant sees them.
 */
export interface Template {
  name: string;
  /** The owner; "" for built-ins. */
  tenantId: string;
  state: 'building' | 'ready';
  source: TemplateSource;
  /** Content key: where its root file system is cached (same inputs, same key). */
  key: string;
  start?: TemplateStart;
  env: Record<string, string>;
  /** Sandboxes kept restored and ready for this template. */
  poolSize: number;
  createdAt: string;
  readyAt?: string;
  rootfsBytes?: number;
  image?: TemplateImage;
}

/** Template names: lowercase letters, digits, `.`, `_`, `-`. */
export const TEMPLATE_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** Defaults and bounds of sandbox limits. */
export const LIMITS = {
  cpu: { min: 0.1, max: 16, default: 1 },
  memoryMb: { min: 64, max: 65536, default: 512 },
  timeoutMs: { min: 1000, max: 7 * 24 * 3600 * 1000, default: 30 * 60 * 1000 },
  envEntries: 256,
  metadataEntries: 64,
} as const;

/** Throws unless `action` is allowed in the sandbox's current state. */
export function assertAllowed(sb: Pick<Sandbox, 'id' | 'state' | 'endReason'>, action: SandboxAction): void {
  if (ALLOWED[action].includes(sb.state)) return;
  if (TERMINAL_STATES.includes(sb.state)) {
    throw new SpaceError('SANDBOX_NOT_RUNNING', `Sandbox ${sb.id} has ended (${sb.state}${sb.endReason ? `: ${sb.endReason}` : ''}); ${action} is not possible`, {
      details: { sandboxId: sb.id, state: sb.state, endReason: sb.endReason },
    });
  }
  throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${sb.id} is ${sb.state}; ${action} needs one of: ${ALLOWED[action].join(', ')}`, {
    details: { sandboxId: sb.id, state: sb.state, allowed: ALLOWED[action] },
  });
}


/**
 * A new sandbox id: `sb` + 18 lowercase letters/digits (matches `^[a-z0-9]+$`, usable as hostname).
 *
 * @example
 * newSandboxId(); // 'sbq2k8d0x1m3n5p7r9t1'
 */
export function newSandboxId(): string {
  return 'sb' + randomString(18);
}

/** A new snapshot id: `sn` + 18 lowercase letters/digits. */
export function newSnapshotId(): string {
  return 'sn' + randomString(18);
}


/** Pattern every sandbox id matches. */
export const SANDBOX_ID_RE = /^sb[a-z0-9]{18}$/;
