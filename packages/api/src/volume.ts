/**
 * Named volumes: a tenant's persistent, size-bounded file systems that outlive sandboxes and
 * are mounted into them (`space create --volume NAME:/data[:ro]`).
 */
import { SpaceError } from './errors.js';

/** A volume mounted into a sandbox, as a create asks for it and as the sandbox records it. */
export interface VolumeMount {
  /** The volume's name (of the sandbox's tenant). */
  volume: string;
  /** Absolute path inside the sandbox, e.g. `/data`. */
  path: string;
  /** Mounted read-only: many sandboxes may share it so. @default false */
  readOnly?: boolean;
}

/** Who has a volume mounted. */
export interface VolumeUser {
  sandboxId: string;
  path: string;
  readOnly: boolean;
}

/** A volume as the API returns it. */
export interface Volume {
  /** Stable id (`vol-…`); the name is what users type. */
  id: string;
  name: string;
  /** Its size, MiB: a writer that fills it gets `ENOSPC`. */
  sizeMb: number;
  createdAt: string;
  /** Sandboxes that have it mounted (killed and dead ones let go of it). */
  mountedBy: VolumeUser[];
  /**
   * The node that keeps it, in a cluster (nodes sharing a database): its files are on that
   * node's disk, its sandboxes run there, and any node forwards its requests there.
   */
  node?: string;
}

/** A point-in-time copy of a volume (`space volume snapshot NAME`). */
export interface VolumeSnapshot {
  id: string;
  volume: string;
  createdAt: string;
}

/** One entry of a volume's directory listing or a file's information. */
export interface VolumeEntry {
  name: string;
  /** Path inside the volume, starting with `/`. */
  path: string;
  type: 'file' | 'directory' | 'symlink' | 'other';
  size: number;
  mode: number;
  uid: number;
  gid: number;
  mtime: string;
  atime: string;
  ctime: string;
  /** Where a symbolic link points (never followed by transfers). */
  target?: string;
}

const MOUNT = /^([^:]+):(\/[^:]*)(?::(ro|rw))?$/;

/**
 * A mount as people write it on command lines: `NAME:/path` or `NAME:/path:ro`.
 * Malformed text is `BAD_REQUEST`; the path itself is checked by the daemon.
 *
 * @example parseVolumeMount('datasets:/data:ro') // { volume: 'datasets', path: '/data', readOnly: true }
 */
export function parseVolumeMount(s: string): VolumeMount {
  const m = MOUNT.exec(s);
  if (!m) throw new SpaceError('BAD_REQUEST', `Invalid volume mount ${JSON.stringify(s)}: write NAME:/path or NAME:/path:ro`, { details: { field: 'volumes' } });
  return { volume: m[1]!, path: m[2]!, ...(m[3] === 'ro' ? { readOnly: true } : {}) };
}
