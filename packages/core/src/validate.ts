/** Validation of client input shared by the services. */
import { SpaceError } from './errors.js';
import { LIMITS } from './model.js';

const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]{0,255}$/;
const LABEL_KEY = /^[A-Za-z0-9_.\-/]{1,128}$/;

/** Validates an env or metadata map. */
export function checkMap(kind: 'env' | 'metadata', m: Record<string, string> | undefined, max: number): Record<string, string> {
  const out: Record<string, string> = {};
  if (!m) return out;
  const entries = Object.entries(m);
  if (entries.length > max) throw new SpaceError('BAD_REQUEST', `At most ${max} ${kind} entries are allowed (got ${entries.length})`);
  for (const [k, v] of entries) {
    if (!(kind === 'env' ? ENV_KEY : LABEL_KEY).test(k)) throw new SpaceError('BAD_REQUEST', `Invalid ${kind} key ${JSON.stringify(k)}`);
    if (typeof v !== 'string' || v.length > 32768 || v.includes('\0')) throw new SpaceError('BAD_REQUEST', `Invalid ${kind} value for ${k}: a string up to 32 KiB without NUL bytes is required`);
    out[k] = v;
  }
  return out;
}

/** Validates a limit against {@link LIMITS}; undefined gives its default. */
export function range(name: 'cpu' | 'memoryMb' | 'timeoutMs', v: number | undefined): number {
  const l = LIMITS[name];
  if (v === undefined) return l.default;
  if (name === 'timeoutMs' && v === 0) return 0;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < l.min || v > l.max) {
    throw new SpaceError('INVALID_LIMITS', `${name} must be between ${l.min} and ${l.max}${name === 'timeoutMs' ? ' (or 0 for no timeout)' : ''}; got ${v}`, { details: { field: name, min: l.min, max: l.max } });
  }
  return name === 'cpu' ? v : Math.floor(v);
}

/**
 * Validates a disk size (MiB) for a driver with `disks` (undefined: the driver keeps files in
 * memory, and any size is refused with `DISKS_UNAVAILABLE`). The disk holds the template's files
 * too, so it must be larger than `templateBytes` (with 64 MiB to spare) when that is known.
 * Undefined gives the driver's default (or undefined without disks).
 * @example diskSize(4096, { defaultMb: 5120, maxMb: 65536 }, 861e6) // 4096
 */
export function diskSize(v: number | undefined, disks: { defaultMb: number; maxMb: number } | undefined, templateBytes?: number): number | undefined {
  if (!disks) {
    if (v !== undefined) throw new SpaceError('DISKS_UNAVAILABLE', 'This daemon keeps sandbox files in memory (--disks off): diskMb cannot be given', { details: { field: 'diskMb' } });
    return undefined;
  }
  // The default grows for a template larger than it.
  const minMb = templateBytes ? Math.ceil(templateBytes / 1048576) + 64 : 64;
  const mb = v ?? Math.max(disks.defaultMb, minMb);
  if (typeof mb !== 'number' || !Number.isInteger(mb) || mb < minMb || mb > disks.maxMb) {
    throw new SpaceError('INVALID_LIMITS', `diskMb must be a whole number of MiB from ${minMb}${templateBytes ? ' (the template\'s files and 64 MiB)' : ''} to ${disks.maxMb} (this node's maximum); got ${v}`, { details: { field: 'diskMb', min: minMb, max: disks.maxMb } });
  }
  return mb;
}

/** Validates a path sent by a client. */
export function checkPath(p: unknown, field = 'path'): string {
  if (typeof p !== 'string' || p.length === 0 || p.length > 4096 || p.includes('\0')) {
    throw new SpaceError('INVALID_PATH', `${field} must be a non-empty path of at most 4096 bytes without NUL bytes`);
  }
  return p;
}


/** Prefix of the headers that carry file metadata on an upload (E2B's convention, and SPACE's). */
export const FILE_METADATA_HEADER = 'x-metadata-';

/**
 * File metadata from an upload's `X-Metadata-KEY: value` headers; undefined when none. Keys
 * are lowercased: HTTP header names have no case (fetch sends them lowercased, other clients
 * may not), so one key must never become two. The agent checks keys and values.
 * @example fileMetadataFromHeaders({ 'x-metadata-owner': 'agent-7' }) // { owner: 'agent-7' }
 */
export function fileMetadataFromHeaders(headers: Record<string, string | string[] | undefined>): Record<string, string> | undefined {
  let out: Record<string, string> | undefined;
  for (const [name, value] of Object.entries(headers)) {
    const key = name.toLowerCase();
    if (key.length > FILE_METADATA_HEADER.length && key.startsWith(FILE_METADATA_HEADER) && value !== undefined) (out ??= {})[key.slice(FILE_METADATA_HEADER.length)] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}
