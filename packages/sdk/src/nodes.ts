/** The deployment's nodes (admin keys). */
import type { DrainResult, NodeInfo, NodeState } from '@space/api';
import { ApiClient, type ConnectionOpts } from './client.js';

export type { DrainResult, NodeInfo, NodeState };

/**
 * @example
 * for (const n of await Nodes.list({ apiKey: adminKey })) console.log(n.name, n.state, n.sandboxes);
 */
export class Nodes {
  /** Every node of the deployment: state, capacity, sandboxes running, last heartbeat. `FORBIDDEN` without an admin key. */
  static async list(opts: ConnectionOpts = {}): Promise<NodeInfo[]> {
    return (await new ApiClient(opts).json<{ nodes: NodeInfo[] }>('GET', '/v1/nodes')).nodes;
  }

  /**
   * Drains node `name` (admin key): no new sandbox is placed there and every session it runs is
   * moved to the node with most room — hibernated, then woken there if it ran. Resolves once
   * each has moved (or says why it stayed).
   *
   * @example
   * const r = await Nodes.drain('node-b'); // r.moved: [{ id, node: 'node-a' }], r.stayed: []
   */
  static async drain(name: string, opts: ConnectionOpts = {}): Promise<DrainResult> {
    return new ApiClient(opts).json<DrainResult>('POST', `/v1/nodes/${encodeURIComponent(name)}/drain`, { timeoutMs: 3_600_000 });
  }

  /** Ends a drain of node `name` (admin key): it takes new sandboxes again. */
  static async undrain(name: string, opts: ConnectionOpts = {}): Promise<DrainResult> {
    return new ApiClient(opts).json<DrainResult>('POST', `/v1/nodes/${encodeURIComponent(name)}/undrain`);
  }
}
