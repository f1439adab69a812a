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

/**
 * The sandbox a signed file URL was made for. The URL the SDK builds from `E2B_SANDBOX_URL`
 * names no sandbox, so each candidate's token is tried (one hash each). Errors carry E2B's
 * messages: `missing signature query parameter`, `invalid signature`, `signature is already expired`.
 *
 * @example
 * const { tenantId, sandboxId } = signedCaller(tokens, await svc.unendedSandboxes(), req.query, 'read');
 */
export function signedCaller(tokens: AccessTokens, candidates: { id: string; tenantId: string }[], q: SignedFileQuery, operation: 'read' | 'write', now = Date.now()): { tenantId: string; sandboxId: string } {
  if (!q.signature) throw new SpaceError('UNAUTHENTICATED', 'missing signature query parameter');
  let expiration: number | undefined;
  if (q.signature_expiration !== undefined) {
    expiration = Number(q.signature_expiration);
    if (!Number.isInteger(expiration)) throw new SpaceError('UNAUTHENTICATED', 'invalid signature');
  }
  const got = Buffer.from(q.signature);
  for (const c of candidates) {
    const want = Buffer.from(fileSignature(q.path ?? '', operation, q.username ?? '', tokens.issue(c.tenantId, c.id), expiration));
    if (want.length !== got.length || !timingSafeEqual(want, got)) continue;
    if (expiration !== undefined && expiration < Math.floor(now / 1000)) throw new SpaceError('UNAUTHENTICATED', 'signature is already expired');
    return { tenantId: c.tenantId, sandboxId: c.id };
  }
  throw new SpaceError('UNAUTHENTICATED', 'invalid signature');
}
