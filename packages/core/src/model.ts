/**
 * The sandbox model and its lifecycle state machine. Each action says in code which states
 * allow it; {@link assertAllowed} rejects the rest with `SANDBOX_INVALID_STATE` (or
 * `SANDBOX_NOT_RUNNING` for a sandbox that has ended).
 */
import { SpaceError } from './errors.js';
import { randomString } from './ids.js';
import type { Sandbox, SandboxState } from '@space/api';

export { randomString } from './ids.js';
export { SANDBOX_STATES } from '@space/api';
export type { CreateTimings, EndReason, Sandbox, SandboxEvent, SandboxState, Snapshot, SnapshotPolicy, SnapshotTrigger } from '@space/api';

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
  // Exposing a port is a record the ingress reads; serving it needs the sandbox running.
  exposePort: ['starting', 'running', 'paused', 'hibernated'],
  // Moving to another node hibernates it here first.
  move: ['running', 'paused', 'hibernated'],
};

/** Actions checked by {@link assertAllowed}. */
export type SandboxAction = 'exec' | 'files' | 'kill' | 'pause' | 'resume' | 'hibernate' | 'wake' | 'snapshot' | 'rollback' | 'fork' | 'setPolicy' | 'setEgress' | 'setTimeout' | 'attachSecrets' | 'setHeaderRules' | 'exposePort' | 'move';

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
  /** The node that built it (a tenant's template: its root file system is in that node's cache). */
  node?: string;
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
