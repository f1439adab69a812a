/** The deployment's nodes (admin keys). */
import { isErrorCode, type DrainEvent, type DrainResult, type NodeInfo, type NodeState } from '@space/api';
import { ApiClient, SpaceError, ndjson, type ConnectionOpts } from './client.js';

export type { DrainEvent, DrainResult, NodeInfo, NodeState };

/** Options of {@link Nodes.drain}. */
export interface DrainOpts extends ConnectionOpts {
  /** Told the plan, then each session as it moves (or stays). */
  onProgress?: (ev: DrainEvent) => void;
}

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
   * const r = await Nodes.drain('node-b', { onProgress: (ev) => ev.type === 'moved' && console.log(ev.id, '→', ev.node) });
   * // r.moved: [{ id, node: 'node-a' }], r.stayed: []
   */
  static async drain(name: string, opts: DrainOpts = {}): Promise<DrainResult> {
    const res = await new ApiClient(opts).request('POST', `/v1/nodes/${encodeURIComponent(name)}/drain`, { timeoutMs: 3_600_000, headers: { accept: 'application/x-ndjson, application/json' } });
    // A daemon that does not stream answers with the result alone.
    if (!res.header('content-type')?.includes('application/x-ndjson')) return (await res.json()) as DrainResult;
    for await (const ev of ndjson(res)) {
      const e = ev as DrainEvent;
      if (e.type === 'done') return e.result;
      if (e.type === 'error') throw new SpaceError(isErrorCode(e.code) ? e.code : 'INTERNAL', e.message);
      opts.onProgress?.(e);
    }
    throw new SpaceError('INTERNAL', `The drain of node ${name} ended without a result (the connection was cut; the node stays drained: \`space nodes\` shows what is left on it)`);
  }

  /** Ends a drain of node `name` (admin key): it takes new sandboxes again. */
  static async undrain(name: string, opts: ConnectionOpts = {}): Promise<DrainResult> {
    return new ApiClient(opts).json<DrainResult>('POST', `/v1/nodes/${encodeURIComponent(name)}/undrain`);
  }
}
