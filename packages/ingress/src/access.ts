/**
 * Who may use a private port: the holder of its access token (a header), or of a pass — an
 * expiring HMAC over the sandbox, the port and the token's hash, handed out as a signed link
 * that the ingress turns into an HttpOnly cookie for that host. A pass dies with its expiry,
 * with the exposure (a new token changes the hash), and with the node's ingress secret.
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';

/** The header that carries a port's access token. */
export const ACCESS_TOKEN_HEADER = 'x-space-access-token';
/** E2B's name for the same header (`trafficAccessToken`). */
export const E2B_ACCESS_TOKEN_HEADER = 'e2b-traffic-access-token';
/** The cookie a signed link sets (host-only: one per sandbox port). */
export const PASS_COOKIE = 'space_ingress';
/** The path of signed links on every ingress host. */
export const SIGNED_LINK_PATH = '/.space/auth';

/** What a pass is bound to. */
export interface PassSubject {
  sandboxId: string;
  port: number;
  /** SHA-256 (hex) of the port's current access token. */
  tokenHash: string;
}

/** SHA-256 (hex) of a token: what core stores when it issues one (sandboxes/ports.ts) and what is compared. */
export function hashToken(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/**
 * Whether `presented` is the token whose hash is `tokenHash` (constant time).
 * @example tokenMatches(req.headers['x-space-access-token'], route.tokenHash)
 */
export function tokenMatches(presented: string | undefined, tokenHash: string): boolean {
  if (!presented || presented.length > 200) return false;
  const a = Buffer.from(hashToken(presented), 'hex');
  const b = Buffer.from(tokenHash, 'hex');
  return a.length === b.length && timingSafeEqual(a, b);
}

function signature(secret: Buffer, s: PassSubject, expiresAtS: number): string {
  return createHmac('sha256', secret).update(`space-ingress-pass\n${s.sandboxId}\n${s.port}\n${s.tokenHash}\n${expiresAtS}`).digest('base64url');
}

/**
 * A pass valid until `expiresAtS` (unix seconds): `EXPIRY.SIGNATURE`.
 * @example const pass = makePass(secret, { sandboxId, port: 8000, tokenHash }, Math.floor(Date.now() / 1000) + 3600);
 */
export function makePass(secret: Buffer, subject: PassSubject, expiresAtS: number): string {
  return `${expiresAtS}.${signature(secret, subject, expiresAtS)}`;
}

/**
 * The pass's expiry (unix seconds) when it is valid for `subject` now, else undefined.
 * @example checkPass(secret, subject, cookieValue) // 1764633600 or undefined
 */
export function checkPass(secret: Buffer, subject: PassSubject, pass: string | undefined, nowS = Math.floor(Date.now() / 1000)): number | undefined {
  if (!pass || pass.length > 200) return undefined;
  const dot = pass.indexOf('.');
  const exp = Number(pass.slice(0, dot));
  if (dot < 1 || !Number.isInteger(exp) || exp <= nowS) return undefined;
  const want = Buffer.from(signature(secret, subject, exp));
  const got = Buffer.from(pass.slice(dot + 1));
  return want.length === got.length && timingSafeEqual(want, got) ? exp : undefined;
}

/**
 * The value of cookie `name` in a Cookie header (the first one).
 * @example cookieValue('a=1; space_ingress=x.y', 'space_ingress') // "x.y"
 */
export function cookieValue(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const eq = part.indexOf('=');
    if (eq > 0 && part.slice(0, eq).trim() === name) return part.slice(eq + 1).trim();
  }
  return undefined;
}

/**
 * A Cookie header without cookie `name` (undefined when nothing is left): the sandbox never
 * sees the pass.
 */
export function withoutCookie(header: string | undefined, name: string): string | undefined {
  if (!header) return undefined;
  const kept = header.split(';').filter((part) => {
    const eq = part.indexOf('=');
    return !(eq > 0 && part.slice(0, eq).trim() === name);
  });
  const out = kept.map((p) => p.trim()).filter(Boolean).join('; ');
  return out || undefined;
}
