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

/** Validates a path sent by a client. */
export function checkPath(p: unknown, field = 'path'): string {
  if (typeof p !== 'string' || p.length === 0 || p.length > 4096 || p.includes('\0')) {
    throw new SpaceError('INVALID_PATH', `${field} must be a non-empty path of at most 4096 bytes without NUL bytes`);
  }
  return p;
}

