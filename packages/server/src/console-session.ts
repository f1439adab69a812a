/**
 * Browser sessions for the web console: an API key is exchanged once for a session cookie, and
 * the key itself never reaches the browser's storage. The cookie is stateless — the key's id,
 * tenant, expiry and a nonce, MACed with a secret of the deployment (KeyService.daemonSecret, the
 * same on every node of a cluster and across restarts) — so any node accepts it and a daemon
 * restart signs nobody out. Every request re-checks that the key is not revoked (cached 5 s):
 * revoking the key ends its sessions. Cookie-authenticated requests that change anything must
 * carry the session's CSRF token (`X-CSRF-Token`), derived from the nonce; the cookie is
 * HttpOnly and SameSite=Strict, and Secure when the request came over TLS.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { SpaceError, type ApiKeys, type Principal } from '@space/core';

/** The session cookie's name. */
export const SESSION_COOKIE = 'space_session';
/** The header a cookie-authenticated request that changes state must carry. */
export const CSRF_HEADER = 'x-csrf-token';
/** How long a session lasts, seconds (12 h: a working day; sign in again after). */
export const SESSION_TTL_S = 12 * 3600;

/** A signed-in session as the console sees it. */
export interface ConsoleSession {
  tenantId: string;
  keyId: string;
  admin: boolean;
  /** Send as `X-CSRF-Token` with every request that changes state. */
  csrfToken: string;
  expiresAt: string;
}

interface Claims {
  k: string;
  t: string;
  a: boolean;
  /** Expiry, seconds since the epoch. */
  e: number;
  /** Nonce the CSRF token derives from. */
  n: string;
}

/**
 * Issues and checks console session cookies.
 *
 * @example
 * const sessions = new ConsoleSessions(secret, keys);
 * const { cookie, session } = await sessions.signIn('space_…');
 * const who = await sessions.principal(cookie); // { tenantId, keyId, admin }
 */
export class ConsoleSessions {
  private readonly live = new Map<string, { ok: boolean; until: number }>();

  constructor(
    private readonly secret: Buffer,
    private readonly keys: ApiKeys,
    private readonly now: () => number = Date.now,
  ) {}

  /** Verifies `apiKey` and returns a new session and its cookie value; `UNAUTHENTICATED` for a wrong key. */
  async signIn(apiKey: string): Promise<{ cookie: string; session: ConsoleSession }> {
    const p = await this.keys.verify(apiKey);
    const claims: Claims = { k: p.keyId, t: p.tenantId, a: p.admin, e: Math.floor(this.now() / 1000) + SESSION_TTL_S, n: randomBytes(16).toString('base64url') };
    const body = Buffer.from(JSON.stringify(claims)).toString('base64url');
    return { cookie: `v1.${body}.${this.mac(body)}`, session: this.view(claims) };
  }

  /**
   * The session a cookie value carries, or undefined when it is malformed, forged, expired, or
   * its key was revoked.
   */
  async session(cookie: string | undefined): Promise<ConsoleSession | undefined> {
    const claims = this.claims(cookie);
    if (!claims || !(await this.keyLive(claims))) return undefined;
    return this.view(claims);
  }

  /** Whether `token` is the CSRF token of the session in `cookie`. */
  csrfValid(cookie: string, token: string | undefined): boolean {
    const claims = this.claims(cookie);
    if (!claims || !token) return false;
    const want = Buffer.from(this.csrf(claims));
    const got = Buffer.from(token);
    return want.length === got.length && timingSafeEqual(want, got);
  }

  /** The principal a session stands for. */
  static principal(s: ConsoleSession): Principal {
    return { tenantId: s.tenantId, keyId: s.keyId, admin: s.admin };
  }

  private claims(cookie: string | undefined): Claims | undefined {
    if (!cookie || cookie.length > 1024) return undefined;
    const [v, body, mac] = cookie.split('.');
    if (v !== 'v1' || !body || !mac) return undefined;
    const want = Buffer.from(this.mac(body));
    const got = Buffer.from(mac);
    if (want.length !== got.length || !timingSafeEqual(want, got)) return undefined;
    let c: Claims;
    try {
      c = JSON.parse(Buffer.from(body, 'base64url').toString('utf8')) as Claims;
    } catch {
      return undefined;
    }
    if (typeof c.e !== 'number' || c.e * 1000 <= this.now() || typeof c.k !== 'string' || typeof c.t !== 'string') return undefined;
    return c;
  }

  private async keyLive(c: Claims): Promise<boolean> {
    const hit = this.live.get(c.k);
    if (hit && hit.until > this.now()) return hit.ok;
    const ok = await this.keys.isActive(c.t, c.k);
    if (this.live.size > 10_000) this.live.clear();
    this.live.set(c.k, { ok, until: this.now() + 5000 });
    return ok;
  }

  private view(c: Claims): ConsoleSession {
    return { tenantId: c.t, keyId: c.k, admin: c.a, csrfToken: this.csrf(c), expiresAt: new Date(c.e * 1000).toISOString() };
  }

  private csrf(c: Claims): string {
    return this.mac(`csrf.${c.n}`);
  }

  private mac(s: string): string {
    return createHmac('sha256', this.secret).update(s).digest('base64url');
  }
}

/** The `Set-Cookie` value for a session (or, with `cookie` undefined, the one that ends it). */
export function sessionCookie(cookie: string | undefined, secure: boolean): string {
  const attrs = ['Path=/', 'HttpOnly', 'SameSite=Strict', ...(secure ? ['Secure'] : [])];
  return cookie === undefined ? [`${SESSION_COOKIE}=`, 'Max-Age=0', ...attrs].join('; ') : [`${SESSION_COOKIE}=${cookie}`, `Max-Age=${SESSION_TTL_S}`, ...attrs].join('; ');
}

/** The session cookie's value in a `Cookie` header, if any. */
export function sessionCookieOf(header: string | undefined): string | undefined {
  if (!header) return undefined;
  for (const part of header.split(';')) {
    const i = part.indexOf('=');
    if (i > 0 && part.slice(0, i).trim() === SESSION_COOKIE) return part.slice(i + 1).trim();
  }
  return undefined;
}

/** A state-changing request without the session's CSRF token. */
export function csrfRefused(): SpaceError {
  return new SpaceError('CSRF_TOKEN_INVALID');
}
