/** Secrets: values kept by the daemon, swapped in by the egress proxy at the point of use. */
import type { SecretInfo } from '@space/api';
import { ApiClient, type ConnectionOpts } from './client.js';

export type { SecretInfo };

/** What {@link Secrets.set} stores. */
export interface SecretSetOpts extends ConnectionOpts {
  /** The value (write-only: never returned). */
  value: string;
  /** Hosts the value may be sent to: names, or `*.example.org` for any subdomain. */
  hosts: string[];
  /** A request header the proxy sets on every request to the hosts (e.g. `Authorization`). */
  header?: string;
  /** The header's value, `{value}` standing for the secret. @default "{value}" */
  format?: string;
}

/**
 * A tenant's secrets. Attach them to sandboxes by name (`Sandbox.create({ secrets: [...] })`):
 * the sandbox gets a placeholder in an env var of that name; the egress proxy replaces it with
 * the value only on requests to the secret's hosts.
 *
 * @example
 * await Secrets.set('GITHUB_TOKEN', { value: process.env.GITHUB_TOKEN!, hosts: ['api.github.com'], header: 'Authorization', format: 'Bearer {value}' });
 * const sb = await Sandbox.create({ template: 'base', secrets: ['GITHUB_TOKEN'], egress: { domains: ['api.github.com'] } });
 * await sb.commands.run('curl -s https://api.github.com/user'); // authenticated; the token never entered the sandbox
 */
export class Secrets {
  /** Creates or replaces a secret; sandboxes use the new value from their next request. */
  static set(name: string, opts: SecretSetOpts): Promise<SecretInfo> {
    const { value, hosts, header, format } = opts;
    return new ApiClient(opts).json<SecretInfo>('PUT', `/v1/secrets/${encodeURIComponent(name)}`, { json: { value, hosts, ...(header !== undefined ? { header } : {}), ...(format !== undefined ? { format } : {}) } });
  }

  /** The tenant's secrets (never their values). */
  static async list(opts: ConnectionOpts = {}): Promise<SecretInfo[]> {
    return (await new ApiClient(opts).json<{ secrets: SecretInfo[] }>('GET', '/v1/secrets')).secrets;
  }

  /** One secret (never its value). */
  static get(name: string, opts: ConnectionOpts = {}): Promise<SecretInfo> {
    return new ApiClient(opts).json<SecretInfo>('GET', `/v1/secrets/${encodeURIComponent(name)}`);
  }

  /** Deletes a secret; placeholders of it are no longer replaced. */
  static async remove(name: string, opts: ConnectionOpts = {}): Promise<void> {
    await new ApiClient(opts).request('DELETE', `/v1/secrets/${encodeURIComponent(name)}`);
  }
}
