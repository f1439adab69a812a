/**
 * Who may use the in-sandbox (envd) API of a sandbox: whoever holds its access token, which
 * the control plane hands out with the sandbox (`envdAccessToken`). A token names the tenant
 * and the sandbox and is signed with a daemon secret (kept wrapped by the node key), so checking
 * it needs no lookup.
 */
import { createHmac, timingSafeEqual } from 'node:crypto';
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
