/**
 * Who may use the in-sandbox (envd) API of a sandbox: whoever holds its access token, which
 * the control plane hands out with the sandbox (`envdAccessToken`). A token names the tenant
 * and the sandbox and is signed with a daemon secret (kept wrapped by the node key), so checking
 * it needs no lookup.
 */
import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import { SpaceError } from '@space/core';

/**
 * Signs and checks sandbox access tokens.
 *
 * @example
 * const tokens = new AccessTokens(await keys.daemonSecret('e2b-access-tokens'));
 */
export class AccessTokens {
  constructor(private readonly secret: Buffer) {}

  private mac(tenantId: string, sandboxId: string): string {
    return createHmac('sha256', this.secret).update(`${tenantId}\0${sandboxId}`).digest('base64url');
  }

  /** The token of a tenant's sandbox. */
  issue(tenantId: string, sandboxId: string): string {
    return `${Buffer.from(tenantId).toString('base64url')}.${this.mac(tenantId, sandboxId)}`;
  }

  /**
   * The traffic access token of a tenant's sandbox (E2B's `trafficAccessToken`): what requests
   * to a private sandbox's ports carry in `e2b-traffic-access-token`. Derived, so connect and
   * info can hand it out again; it opens ports only, never the envd API.
   */
  traffic(tenantId: string, sandboxId: string): string {
    return `tat_${createHmac('sha256', this.secret).update(`traffic\0${tenantId}\0${sandboxId}`).digest('base64url')}`;
  }

  /**
   * The token of a tenant's volume (E2B's volume `token`): what the volume content API takes as
   * `Authorization: Bearer`. Derived, so info can hand it out again; it opens that volume only.
   */
  volume(tenantId: string, volumeId: string): string {
    return `vt_${Buffer.from(tenantId).toString('base64url')}.${createHmac('sha256', this.secret).update(`volume\0${tenantId}\0${volumeId}`).digest('base64url')}`;
  }

  /** The tenant a valid volume token for `volumeId` belongs to; `UNAUTHENTICATED` otherwise. */
  verifyVolume(volumeId: string, authorization: string | undefined): string {
    const token = authorization?.startsWith('Bearer ') ? authorization.slice(7) : undefined;
    if (!token || token.length > 300 || !token.startsWith('vt_')) throw new SpaceError('UNAUTHENTICATED', 'Send the volume\'s token (from Volume.create or Volume.getInfo) as Authorization: Bearer <token>');
    const tenantId = Buffer.from(token.slice(3).split('.')[0] ?? '', 'base64url').toString();
    const want = Buffer.from(this.volume(tenantId, volumeId));
    const got = Buffer.from(token);
    if (want.length !== got.length || !timingSafeEqual(want, got)) throw new SpaceError('UNAUTHENTICATED', `The token is not valid for volume ${volumeId}`);
    return tenantId;
  }

  /** The tenant a valid token for `sandboxId` belongs to; `UNAUTHENTICATED` otherwise. */
  verify(sandboxId: string | undefined, token: string | undefined): string {
    if (!sandboxId || !token || token.length > 200) throw new SpaceError('UNAUTHENTICATED', 'Missing E2b-Sandbox-Id or X-Access-Token header');
    const [t, mac] = token.split('.');
    const tenantId = Buffer.from(t ?? '', 'base64url').toString();
    const want = Buffer.from(this.mac(tenantId, sandboxId));
    const got = Buffer.from(mac ?? '');
    if (want.length !== got.length || !timingSafeEqual(want, got)) throw new SpaceError('UNAUTHENTICATED', `The access token is not valid for sandbox ${sandboxId}`);
    return tenantId;
  }
}

/** What a signed file URL carries (E2B's `downloadUrl`/`uploadUrl` query). */
export interface SignedFileQuery {
  path?: string;
  username?: string;
  signature?: string;
  signature_expiration?: string;
}

/** E2B's signature of a file operation: `v1_` + unpadded base64 SHA-256 of `path:op:user:token[:expiration]`. */
export function fileSignature(path: string, operation: 'read' | 'write', user: string, token: string, expiration?: number): string {
  const raw = [path, operation, user, token, ...(expiration !== undefined ? [String(expiration)] : [])].join(':');
  return `v1_${createHash('sha256').update(raw).digest('base64').replace(/=+$/, '')}`;
}

/** Candidates matched between two turns of the event loop (~3.5 ms of hashing). */
const SLICE = 1000;

/** A sandbox a signed file URL may have been made for: its id and tenant. */
export interface SignedCandidate {
  id: string;
  tenantId: string;
}

/** Where {@link SignedFileOwners} reads its candidates. */
export interface SignedCandidateSource {
  /** Every sandbox not ended, across tenants. */
  all(): Promise<SignedCandidate[]>;
  /** One sandbox by id, if it has not ended. */
  one(id: string): Promise<SignedCandidate | undefined>;
}

/**
 * Finds the sandbox a signed file URL was made for, without reading every live sandbox per
 * request: the candidates are kept in memory (each with its access token, so a match costs one
 * SHA-256 per candidate and no HMAC), and read again only when a signature matches none of them
 * — by one read that began after the request came, shared by every request waiting then (a
 * sandbox created since the last read is found; a flood of bad signatures costs one read at a
 * time, not one each). A request that names its sandbox (`E2b-Sandbox-Id`, which a forwarding
 * node adds once it matched) is checked against that one only.
 *
 * @example
 * const owners = new SignedFileOwners(tokens, { all: () => svc.unendedSandboxes(), one: (id) => svc.unendedSandbox(id) });
 * const { tenantId, sandboxId } = await owners.match(req.query, 'read');
 */
export class SignedFileOwners {
  private cached: { id: string; tenantId: string; token: string }[] = [];
  /** The read under way, and when it began. */
  private reading?: { startedAt: number; done: Promise<void> };
  /** When the newest finished read began. */
  private readAt = -Infinity;

  constructor(private readonly tokens: AccessTokens, private readonly source: SignedCandidateSource, private readonly clock: () => number = () => performance.now()) {}

  /** The tenant and sandbox `q`'s signature was made for; `UNAUTHENTICATED` with envd's messages otherwise. */
  async match(q: SignedFileQuery, operation: 'read' | 'write', hint?: string, now = Date.now()): Promise<{ tenantId: string; sandboxId: string }> {
    if (hint !== undefined) {
      const one = hint.length < 64 ? await this.source.one(hint) : undefined;
      return signedCaller(this.tokens, one ? [one] : [], q, operation, now);
    }
    const arrived = this.clock();
    if (!q.signature) return signedCaller(this.tokens, [], q, operation, now); // envd's message
    const first = await this.tryCached(q, operation, now);
    // Still live? (One indexed read: a URL dies with its sandbox, whatever the cache holds.)
    if (first && (await this.source.one(first.sandboxId))) return first;
    await this.readSince(arrived);
    return (await this.tryCached(q, operation, now)) ?? signedCaller(this.tokens, [], q, operation, now);
  }

  /**
   * The cached candidate the signature was made for. One SHA-256 each (~3.5 µs here: 35 ms at
   * 10,000 live sandboxes), so the list is gone through in slices with the event loop let go
   * between them: other requests are not held up behind a long match.
   */
  private async tryCached(q: SignedFileQuery, operation: 'read' | 'write', now: number): Promise<{ tenantId: string; sandboxId: string } | undefined> {
    const all = this.cached;
    for (let i = 0; i < all.length; i += SLICE) {
      if (i > 0) await new Promise((r) => setImmediate(r));
      try {
        return signedCaller(this.tokens, all.slice(i, i + SLICE), q, operation, now);
      } catch (err) {
        if ((err as Error).message !== 'invalid signature') throw err;
      }
    }
    return undefined;
  }

  /** Waits for a read of the candidates that began at or after `t`. */
  private async readSince(t: number): Promise<void> {
    while (this.readAt < t) {
      if (!this.reading) {
        const startedAt = this.clock();
        const done = this.source.all().then((all) => {
          const known = new Map(this.cached.map((c) => [c.id, c.token]));
          this.cached = all.map((c) => ({ ...c, token: known.get(c.id) ?? this.tokens.issue(c.tenantId, c.id) }));
          this.readAt = startedAt;
        });
        this.reading = { startedAt, done: done.finally(() => (this.reading = undefined)) };
      }
      // A read that began before this request may miss its sandbox: the loop waits for the next.
      await this.reading.done;
    }
  }
}

/**
 * The sandbox a signed file URL was made for. The URL the SDK builds from `E2B_SANDBOX_URL`
 * names no sandbox, so each candidate's token is tried (one hash each). Errors carry E2B's
 * messages: `missing signature query parameter`, `invalid signature`, `signature is already expired`.
 *
 * @example
 * const { tenantId, sandboxId } = signedCaller(tokens, await svc.unendedSandboxes(), req.query, 'read');
 */
export function signedCaller(tokens: AccessTokens, candidates: (SignedCandidate & { token?: string })[], q: SignedFileQuery, operation: 'read' | 'write', now = Date.now()): { tenantId: string; sandboxId: string } {
  if (!q.signature) throw new SpaceError('UNAUTHENTICATED', 'missing signature query parameter');
  let expiration: number | undefined;
  if (q.signature_expiration !== undefined) {
    expiration = Number(q.signature_expiration);
    if (!Number.isInteger(expiration)) throw new SpaceError('UNAUTHENTICATED', 'invalid signature');
  }
  const got = Buffer.from(q.signature);
  for (const c of candidates) {
    const want = Buffer.from(fileSignature(q.path ?? '', operation, q.username ?? '', c.token ?? tokens.issue(c.tenantId, c.id), expiration));
    if (want.length !== got.length || !timingSafeEqual(want, got)) continue;
    if (expiration !== undefined && expiration < Math.floor(now / 1000)) throw new SpaceError('UNAUTHENTICATED', 'signature is already expired');
    return { tenantId: c.tenantId, sandboxId: c.id };
  }
  throw new SpaceError('UNAUTHENTICATED', 'invalid signature');
}
