/** `sandbox.ports`: expose a sandbox's ports through the daemon's ingress. */
import type { ExposedPort, IngressLogPage } from '@space/api';
import type { ApiClient } from './client.js';

export type { ExposedPort, IngressLogPage };

/** Options of {@link Ports.expose}. */
export interface ExposeOpts {
  /** Reachable by anyone with the URL, without the token. @default false */
  public?: boolean;
  /** The exposure ends after this many seconds (up to 30 days). @default while the sandbox lives */
  ttlS?: number;
}

/**
 * A sandbox's exposed ports. A private port answers requests that carry its token in the
 * `X-Space-Access-Token` header, or that come from a browser that opened its `signedUrl`.
 *
 * @example
 * await sandbox.commands.run('python3 -m http.server 8000', { background: true });
 * const p = await sandbox.ports.expose(8000);
 * await fetch(p.url, { headers: { 'X-Space-Access-Token': p.token! } });
 */
export class Ports {
  constructor(
    private readonly api: ApiClient,
    private readonly sandboxId: string,
  ) {}

  /** Exposes `port` (again: with a new token, which ends the old one). The token is in this answer only. */
  expose(port: number, opts: ExposeOpts = {}): Promise<ExposedPort> {
    return this.api.json<ExposedPort>('POST', `/v1/sandboxes/${this.sandboxId}/ports`, { json: { port, ...(opts.public !== undefined ? { public: opts.public } : {}), ...(opts.ttlS !== undefined ? { expiresInS: opts.ttlS } : {}) } });
  }

  /** The exposed ports, each with a fresh signed link. */
  async list(): Promise<ExposedPort[]> {
    return (await this.api.json<{ ports: ExposedPort[] }>('GET', `/v1/sandboxes/${this.sandboxId}/ports`)).ports;
  }

  /**
   * The audit log of requests to the sandbox's ports through the ingress, newest first.
   * @example const { items } = await sandbox.ports.log({ limit: 20 });
   */
  log(opts: { limit?: number; cursor?: string } = {}): Promise<IngressLogPage> {
    return this.api.json<IngressLogPage>('GET', `/v1/sandboxes/${this.sandboxId}/ingress/log`, { query: { limit: opts.limit, cursor: opts.cursor } });
  }

  /** Stops exposing `port`: its token and links stop working at once. */
  async unexpose(port: number): Promise<void> {
    await this.api.request('DELETE', `/v1/sandboxes/${this.sandboxId}/ports/${port}`);
  }
}
