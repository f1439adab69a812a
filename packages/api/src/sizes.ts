/** Sizes as people write them on command lines: `512M`, `4G`, `1.5G`, `1T`, or a number of MiB. */
import { SpaceError } from './errors.js';

const UNITS: Record<string, number> = { '': 1, m: 1, g: 1024, t: 1024 * 1024 };

/**
 * A size in MiB from `512M`, `4G`, `4GiB`, `1.5g`, `1T`, or a plain number of MiB; whole MiB,
 * at least 1. Anything else (`0`, `-1G`, `10GG`, `4K`) is `INVALID_LIMITS` naming `what`.
 *
 * @example parseSizeMb('4G') // 4096
 * @example parseSizeMb('512') // 512
 */
export function parseSizeMb(s: string, what = 'size'): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([mgt]?)(?:i?b)?\s*$/i.exec(s);
  const mb = m ? Math.round(Number(m[1]) * UNITS[m[2]!.toLowerCase()]!) : NaN;
  if (!Number.isSafeInteger(mb) || mb < 1) throw new SpaceError('INVALID_LIMITS', `Invalid ${what} ${JSON.stringify(s)}: write it like 512M, 4G or 1T (MiB, GiB, TiB)`, { details: { field: what } });
  return mb;
}
