/** Random identifiers. Imports nothing of core's, so any module may use it. */
import { randomBytes } from 'node:crypto';

const ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789';

/**
 * A random string over [a-z0-9] (the alphabet of sandbox and snapshot ids).
 * @example randomString(8) // 'q2k8d0x1'
 */
export function randomString(n: number): string {
  const bytes = randomBytes(n);
  let s = '';
  for (const b of bytes) s += ALPHABET[b % 36];
  return s;
}
