/** The one way the daemon tells an agent who it is now (after a restore, a pool take, new secrets). */
import type { AgentChannel } from '../agent/channel.js';

/** What an `identity` request may set; absent fields stay as they are. */
export interface IdentityChange {
  hostname?: string;
  /** Replaces the environment of the processes it starts from now on. */
  env?: Record<string, string>;
  /** A CA certificate (PEM) to trust: the tenant's egress CA. */
  trust?: string;
  /** The sandbox's disk size, bytes: a file system on a smaller block device is grown to it (see IdentityRequest). */
  diskBytes?: number;
}

/** How long an agent may take to answer an identity request, ms. */
export const IDENTITY_TIMEOUT_MS = 10_000;
/** The same with a disk to grow: the agent waits up to 10 s for the device and 60 s for the file system. */
export const IDENTITY_DISK_TIMEOUT_MS = 80_000;

/**
 * Sends `identity` to the agent on `ch`: it reports `sandboxId` from then on.
 * @example await sendIdentity(ch, sb.id, { hostname: sb.id, env });
 */
export async function sendIdentity(ch: AgentChannel, sandboxId: string, change: IdentityChange = {}): Promise<void> {
  await ch.unary(
    {
      op: 'identity',
      sandboxId,
      ...(change.hostname ? { hostname: change.hostname } : {}),
      ...(change.env ? { env: change.env } : {}),
      ...(change.trust ? { trust: change.trust } : {}),
      ...(change.diskBytes ? { diskBytes: change.diskBytes } : {}),
    },
    change.diskBytes ? IDENTITY_DISK_TIMEOUT_MS : IDENTITY_TIMEOUT_MS,
  );
}
