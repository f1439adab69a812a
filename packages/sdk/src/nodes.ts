/** The deployment's nodes (admin keys). */
import type { NodeInfo, NodeState } from '@space/api';
import { ApiClient, type ConnectionOpts } from './client.js';

export type { NodeInfo, NodeState };

/**
 * @example
 * for (const n of await Nodes.list({ apiKey: adminKey })) console.log(n.name, n.state, n.sandboxes);
 */
export class Nodes {
  /** Every node of the deployment: state, capacity, sandboxes running, last heartbeat. `FORBIDDEN` without an admin key. */
  static async list(opts: ConnectionOpts = {}): Promise<NodeInfo[]> {
    return (await new ApiClient(opts).json<{ nodes: NodeInfo[] }>('GET', '/v1/nodes')).nodes;
  }
}
