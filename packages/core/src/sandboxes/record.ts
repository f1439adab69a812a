/** The one place a new sandbox record is made (a create, a fork's copy). */
import type { VolumeMount } from '@space/api';
import type { EgressPolicy, SecretAttachment } from '../records.js';
import type { Sandbox } from '../model.js';

/** What a new sandbox record is made of. */
export interface NewSandboxRecord {
  id: string;
  tenantId: string;
  template: string;
  driver: string;
  cpu: number;
  memoryMb: number;
  /** Disk size, MiB; none: files in memory. */
  diskMb?: number;
  /** 0: none. */
  timeoutMs: number;
  env: Record<string, string>;
  metadata: Record<string, string>;
  onTimeout?: Sandbox['onTimeout'];
  idleTimeoutMs?: number;
  autoResume?: boolean;
  egress?: EgressPolicy;
  secrets?: SecretAttachment[];
  /** Volumes it mounts. */
  volumes?: VolumeMount[];
  /** A fork's copy: the sandbox and snapshot it comes from. */
  parentId?: string;
  fromSnapshotId?: string;
  /** The node it is made on. */
  node?: string;
  /** @default now */
  createdAt?: Date;
}

/**
 * A sandbox record in state `starting`, its expiry counted from its creation.
 *
 * @example
 * const sb = newSandboxRecord({ id, tenantId, template: 'minimal', driver: 'gvisor', cpu: 1, memoryMb: 512, timeoutMs: 0, env: {}, metadata: {} });
 */
export function newSandboxRecord(r: NewSandboxRecord): Sandbox {
  const now = r.createdAt ?? new Date();
  return {
    id: r.id,
    tenantId: r.tenantId,
    template: r.template,
    driver: r.driver,
    state: 'starting',
    cpu: r.cpu,
    memoryMb: r.memoryMb,
    ...(r.diskMb !== undefined ? { diskMb: r.diskMb } : {}),
    timeoutMs: r.timeoutMs,
    env: r.env,
    metadata: r.metadata,
    ...(r.onTimeout ? { onTimeout: r.onTimeout } : {}),
    ...(r.idleTimeoutMs ? { idleTimeoutMs: r.idleTimeoutMs } : {}),
    ...(r.autoResume ? { autoResume: true } : {}),
    ...(r.egress ? { egress: r.egress } : {}),
    ...(r.secrets?.length ? { secrets: r.secrets } : {}),
    ...(r.volumes?.length ? { volumes: r.volumes } : {}),
    createdAt: now.toISOString(),
    ...(r.timeoutMs ? { expiresAt: new Date(now.getTime() + r.timeoutMs).toISOString() } : {}),
    ...(r.parentId ? { parentId: r.parentId } : {}),
    ...(r.fromSnapshotId ? { fromSnapshotId: r.fromSnapshotId } : {}),
    ...(r.node ? { node: r.node } : {}),
  };
}
