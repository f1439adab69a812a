/**
 * A node: one `spaced` of a deployment, as `GET /v1/nodes` (admin keys) and `space nodes`
 * show it. A deployment on the embedded stores has one; nodes that share a PostgreSQL database
 * and an object store list each other (issue 22).
 */

/** How a node is doing: `up` (heartbeats arrive), `stopped` (it said so), `lost` (silent too long). */
export type NodeState = 'up' | 'stopped' | 'lost';

/**
 * @example
 * { name: 'node-a', state: 'up', url: 'http://10.0.0.5:7070', drivers: ['gvisor'], cpus: 2, memoryMb: 24000, maxSandboxes: 64, maxMemoryMb: 48000, sandboxes: 3, memoryReservedMb: 1536, load: 0.4, … }
 */
export interface NodeInfo {
  /** `--node-name` (default: the host name). */
  name: string;
  state: NodeState;
  /** Its API, where the other nodes reach it (`--advertise-url`, default as it listens). */
  url: string;
  /** Its E2B-compatible API, when it runs one (same host as {@link url}). */
  e2bUrl?: string;
  /** Its ingress listener, when it runs one (same host as {@link url}). */
  ingressUrl?: string;
  /** SPACE's version on it. */
  version: string;
  /** Isolation drivers it runs. */
  drivers: string[];
  cpus: number;
  /** The host's memory, MiB. */
  memoryMb: number;
  /** Most sandboxes at once (`--max-sandboxes`). */
  maxSandboxes: number;
  /**
   * Most memory its sandboxes may reserve in all, MiB: the sum of their memory limits
   * (`--max-memory`; default twice the host's memory, since limits are ceilings seldom reached).
   */
  maxMemoryMb: number;
  /** Its sandboxes that run now (starting, running or paused). */
  sandboxes: number;
  /** The memory limits of those sandboxes, summed, MiB. */
  memoryReservedMb: number;
  /** The host's 1-minute load average at its last heartbeat (runnable tasks; compare with {@link cpus}). */
  load?: number;
  startedAt: string;
  /** Its last heartbeat (ISO time). */
  heartbeatAt: string;
  /** Drained (`space node drain`): no new sandbox is placed there and its sessions were moved off. */
  draining?: boolean;
  /**
   * Sandboxes ready in its warm pools, per template (`TENANT/NAME`; `/NAME` for a built-in
   * one), as of its last heartbeat: a pool-shaped create that finds its node's pool empty goes
   * to a node that has one ready. Absent: none ready (or a node on its own).
   */
  warm?: Record<string, number>;
}

/**
 * What a drain did (`POST /v1/nodes/{name}/drain`): the sessions moved (and where), and those
 * that stayed (and why).
 *
 * @example { node: 'node-b', draining: true, moved: [{ id: 'sb3k9x…', node: 'node-a' }], stayed: [] }
 */
export interface DrainResult {
  node: string;
  draining: boolean;
  moved: { id: string; node: string }[];
  stayed: { id: string; reason: string }[];
}

/**
 * One line of a drain's progress (`POST /v1/nodes/{name}/drain` with `Accept:
 * application/x-ndjson`): the plan, then each session as it moved or stayed, then the result
 * (or an error). A client that goes away does not stop the drain.
 *
 * @example
 * {"type":"plan","sessions":4}
 * {"type":"moved","id":"sb3k9x…","node":"node-a","done":1,"sessions":4}
 * {"type":"done","result":{"node":"node-b","draining":true,"moved":[…],"stayed":[]}}
 */
export type DrainEvent =
  | { type: 'plan'; sessions: number }
  | { type: 'moved'; id: string; node: string; done: number; sessions: number }
  | { type: 'stayed'; id: string; reason: string; done: number; sessions: number }
  | { type: 'done'; result: DrainResult }
  | { type: 'error'; code: string; message: string };
