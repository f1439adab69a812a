/**
 * This daemon as a node of its deployment: it registers in the metadata store at start,
 * heartbeats while it runs and says when it stops; `GET /v1/nodes` reads every node's record
 * and derives its state. With the embedded stores a deployment has one node; nodes that share
 * a PostgreSQL database see each other (the cluster's placement and ownership build on this).
 */
import type { NodeInfo } from '@space/api';
import { loadavg } from 'node:os';
import { LIMITS, SpaceError, type Logger, type MetadataStore, type NodeRecord, type SandboxService } from '@space/core';

/**
 * What runs with a node's heartbeats: `afterBeat` right after each one (quick: it must never
 * delay the next beat), `duties` after a beat too but on their own — a beat that finds the
 * previous duties still running (a lost node's sandboxes being restored can take a while) skips
 * them, and the next beat comes on time: a node busy with duties must not look lost.
 */
export interface HeartbeatDuties {
  afterBeat?: (beatOk: boolean) => Promise<void>;
  duties?: (beatOk: boolean) => Promise<void>;
  /** What the node tells with each beat besides its load: its warm pools ({@link NodeInfo.warm}). */
  report?: () => Pick<NodeRecord, 'warm'>;
}

/**
 * Keeps a node's record fresh: `start()` registers, then a heartbeat every `everyMs`;
 * `stop()` records the stop. With `duties` (a cluster's: {@link clusterDuties}), what runs
 * after each beat.
 *
 * @example
 * const hb = new NodeHeartbeat(store, record, logger, 10_000);
 * await hb.start(); … await hb.stop();
 */
export class NodeHeartbeat {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private running: Promise<void> = Promise.resolve();
  private dutiesRunning: Promise<void> | undefined;

  constructor(
    private readonly store: MetadataStore,
    private record: NodeRecord,
    private readonly logger: Logger,
    private readonly everyMs: number,
    private readonly duties: HeartbeatDuties = {},
  ) {}

  /** Registers (a store that does not answer now is logged: the next heartbeat registers) and starts beating. */
  async start(): Promise<void> {
    await this.beat().catch((err: unknown) => this.logger.warn({ err }, 'could not register this node yet; the next heartbeat retries'));
    this.next();
  }

  private next(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.running = (async () => {
        const ok = await this.beat().then(
          () => true,
          (err: unknown) => (this.logger.warn({ err }, 'node heartbeat failed; the next one retries'), false),
        );
        if (this.stopped) return;
        await this.duties.afterBeat?.(ok).catch((err: unknown) => this.logger.error({ err }, 'work after the heartbeat failed'));
        const duties = this.duties.duties;
        if (duties && !this.dutiesRunning) {
          this.dutiesRunning = duties(ok)
            .catch((err: unknown) => this.logger.error({ err }, 'cluster duties after the heartbeat failed'))
            .finally(() => (this.dutiesRunning = undefined));
        }
      })().finally(() => this.next());
    }, this.everyMs);
    this.timer.unref();
  }

  private async beat(): Promise<void> {
    const { warm: _, ...rest } = this.record;
    const warm = this.duties.report?.().warm;
    this.record = { ...rest, ...(warm && Object.keys(warm).length ? { warm } : {}), heartbeatAt: new Date().toISOString(), load: Math.round(loadavg()[0]! * 100) / 100 };
    delete this.record.stoppedAt;
    await this.store.putNode(this.record);
  }

  /** Whether the node is drained (kept in its record, so across restarts). */
  get draining(): boolean {
    return !!this.record.draining;
  }

  /** Drains the node (or ends that) and says so in its record at once. */
  async setDraining(on: boolean): Promise<void> {
    const { draining: _, ...rest } = this.record;
    this.record = { ...rest, ...(on ? { draining: true } : {}) };
    await this.beat();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.running;
    await this.dutiesRunning;
    const at = new Date().toISOString();
    await this.store.putNode({ ...this.record, heartbeatAt: at, stoppedAt: at }).catch((err: unknown) => this.logger.warn({ err }, 'could not record this node\'s stop'));
  }
}

/**
 * A cluster node's duties after each heartbeat ({@link NodeHeartbeat}'s `duties`): its lease —
 * its sandboxes paused while it cannot heartbeat for half the time after which the others count
 * it lost (and by its lease keeper if the daemon dies or hangs), the copies taken over meanwhile
 * removed once it can — the sessions moved here to wake, and the sandboxes of lost nodes
 * restored here (docs/cluster.md).
 *
 * @example
 * const hb = new NodeHeartbeat(store, record, logger, 10_000, clusterDuties({ service, store, nodeName: 'n1', lostAfterMs: 30_000, logger }));
 * // afterBeat renews the lease at once; duties run beside the beats, never delaying them
 */
export function clusterDuties(c: {
  service: Pick<SandboxService, 'leaseLost' | 'leaseRenewed' | 'wakeArrivals' | 'adoptLost'>;
  store: MetadataStore;
  nodeName: string;
  lostAfterMs: number;
  logger: Logger;
  /** The node's lease keeper (lease-keeper.ts): renewed after each good beat; says what it paused meanwhile. */
  keeper?: { renewed(): Promise<string[]> };
}): HeartbeatDuties {
  let beatOkAt = Date.now();
  /** What the keeper paused (the daemon was hung or cut off), for the next duties to resume or remove. */
  const pausedByKeeper: string[] = [];
  return {
    afterBeat: async (ok) => {
      if (!ok) return;
      beatOkAt = Date.now();
      if (c.keeper) pausedByKeeper.push(...(await c.keeper.renewed()));
    },
    duties: async (ok) => {
      if (!ok) {
        if (Date.now() - beatOkAt > c.lostAfterMs / 2) await c.service.leaseLost();
        return;
      }
      const paused = pausedByKeeper.splice(0);
      if (paused.length) c.logger.warn({ paused: paused.length }, 'the lease keeper paused this node\'s sandboxes (no good heartbeat for too long): resuming its own');
      await c.service.leaseRenewed(paused);
      await c.service.wakeArrivals();
      // Only the silent nodes (an indexed query): reading every node's record after every
      // heartbeat of every node grew with the square of the cluster's size.
      for (const n of await c.store.listNodes({ heartbeatBefore: new Date(Date.now() - c.lostAfterMs).toISOString() })) {
        if (n.stoppedAt || n.name === c.nodeName) continue;
        const r = await c.service.adoptLost(n.name);
        if (r.restored || r.ended) c.logger.warn({ node: n.name, ...r }, 'took over the sandboxes of a lost node');
      }
    },
  };
}

/**
 * Every node with its state — `stopped` if it said so, `lost` when its last heartbeat is older
 * than `lostAfterMs`, else `up` — and how many sandboxes run on it.
 *
 * @example const nodes = await nodeViews(store, 30_000);
 */
export async function nodeViews(store: MetadataStore, lostAfterMs: number, now = Date.now()): Promise<NodeInfo[]> {
  // Two queries whatever the cluster's size: the nodes, and the live sandboxes per node (count, memory).
  const [nodes, load] = await Promise.all([store.listNodes(), store.sandboxLoadByNode(['starting', 'running', 'paused'])]);
  return nodes.map(({ stoppedAt, ...n }) => ({
    ...n,
    // A node registered before SPACE recorded it: the default.
    maxMemoryMb: n.maxMemoryMb ?? n.memoryMb * 2,
    state: nodeState({ heartbeatAt: n.heartbeatAt, ...(stoppedAt ? { stoppedAt } : {}) }, lostAfterMs, now),
    sandboxes: load[n.name]?.sandboxes ?? 0,
    memoryReservedMb: load[n.name]?.memoryMb ?? 0,
  }));
}

/**
 * Every node's name, URL and state, without counting sandboxes (one small query: what
 * forwarding asks on each request for another node's sandbox).
 *
 * @example const up = (await nodeStates(store, 30_000)).filter((n) => n.state === 'up');
 */
export async function nodeStates(store: MetadataStore, lostAfterMs: number, now = Date.now()): Promise<Pick<NodeInfo, 'name' | 'url' | 'e2bUrl' | 'ingressUrl' | 'state' | 'heartbeatAt' | 'draining' | 'drivers' | 'warm'>[]> {
  return (await store.listNodes()).map((n) => ({ name: n.name, url: n.url, ...(n.e2bUrl ? { e2bUrl: n.e2bUrl } : {}), ...(n.ingressUrl ? { ingressUrl: n.ingressUrl } : {}), heartbeatAt: n.heartbeatAt, state: nodeState(n, lostAfterMs, now), drivers: n.drivers, ...(n.draining ? { draining: true } : {}), ...(n.warm ? { warm: n.warm } : {}) }));
}

/** What a sandbox to be placed needs of a node. */
export interface PlacementNeed {
  /** Its driver; any node runs the default one when absent. */
  driver?: string;
  /** Its memory limit, MiB. @default LIMITS.memoryMb.default */
  memoryMb?: number;
}

/**
 * How full `n` would be with one more sandbox of `memoryMb`, plus how busy its host is: the
 * larger of its places and its memory reserved, as fractions of its limits, plus half its load
 * per CPU (capped at 2, so a saturated host weighs as a node half full). Lower is better.
 *
 * @example placementCost({ sandboxes: 3, maxSandboxes: 64, memoryReservedMb: 1536, maxMemoryMb: 48000, load: 1, cpus: 2 }, 512) // 4/64 + (1/2)/2/2 = 0.1875
 */
export function placementCost(n: Pick<NodeInfo, 'sandboxes' | 'maxSandboxes' | 'memoryReservedMb' | 'maxMemoryMb' | 'load' | 'cpus'>, memoryMb: number): number {
  const fill = Math.max((n.sandboxes + 1) / n.maxSandboxes, (n.memoryReservedMb + memoryMb) / n.maxMemoryMb);
  const busy = Math.min((n.load ?? 0) / Math.max(1, n.cpus), 2) / 2;
  return fill + busy / 2;
}

/**
 * The node a sandbox leaving `self` (a drain) or a create it has no room for goes to: up, not
 * drained, running the driver, with a free place and room for its memory — of those, the one
 * with the lowest {@link placementCost}; undefined when none.
 *
 * @example const target = pickNode(await nodeViews(store, 30_000), 'n1', { driver: 'gvisor', memoryMb: 1024 });
 */
export function pickNode(nodes: NodeInfo[], self: string, need: PlacementNeed = {}): NodeInfo | undefined {
  const memoryMb = need.memoryMb ?? LIMITS.memoryMb.default;
  let best: { node: NodeInfo; cost: number } | undefined;
  for (const n of nodes) {
    if (n.name === self || n.state !== 'up' || n.draining || n.sandboxes >= n.maxSandboxes || n.memoryReservedMb + memoryMb > n.maxMemoryMb || (need.driver && !n.drivers.includes(need.driver))) continue;
    const cost = placementCost(n, memoryMb);
    if (!best || cost < best.cost) best = { node: n, cost };
  }
  return best?.node;
}

/**
 * The node a pool-shaped create goes to when `self`'s pool of its template is empty: up, not
 * drained, with `driver` as its default one (the driver its pools restore on), and the most
 * sandboxes of the template ready as of its last heartbeat (ties: the first listed). A pooled
 * sandbox is counted on its node already, so no room is asked. Undefined when none has one:
 * the create restores here. A heartbeat can be seconds old: the node chosen may have given its
 * last one away meanwhile, and then restores, as this node would have.
 *
 * @example pickWarmNode(await nodeStates(store, 30_000), 'n1', '/minimal', 'gvisor')?.name // 'n2'
 */
export function pickWarmNode<N extends Pick<NodeInfo, 'name' | 'state' | 'draining' | 'drivers' | 'warm'>>(nodes: N[], self: string, key: string, driver: string): N | undefined {
  let best: { node: N; ready: number } | undefined;
  for (const n of nodes) {
    const ready = n.warm?.[key] ?? 0;
    if (n.name === self || n.state !== 'up' || n.draining || n.drivers[0] !== driver || ready < 1) continue;
    if (!best || ready > best.ready) best = { node: n, ready };
  }
  return best?.node;
}

/**
 * Where each of a draining node's sessions goes: one after the other by {@link pickNode},
 * counting the places and memory of those already sent (a moved session is hibernated until
 * woken there, so the store's counts do not show it yet). Sessions no node can take map to
 * undefined.
 *
 * @example const plan = planDrain(await nodeViews(store, 30_000), 'n1', mine); // Map { 'sb1' => 'n2', 'sb2' => 'n3' }
 */
export function planDrain(nodes: NodeInfo[], self: string, sessions: { id: string; driver: string; memoryMb: number }[]): Map<string, string | undefined> {
  const load = nodes.map((n) => ({ ...n }));
  const plan = new Map<string, string | undefined>();
  for (const sb of sessions) {
    const target = pickNode(load, self, { driver: sb.driver, memoryMb: sb.memoryMb });
    if (target) {
      target.sandboxes++;
      target.memoryReservedMb += sb.memoryMb;
    }
    plan.set(sb.id, target?.name);
  }
  return plan;
}

/** `stopped` if it said so, `lost` when its last heartbeat is older than `lostAfterMs`, else `up`. */
function nodeState(n: { stoppedAt?: string; heartbeatAt: string }, lostAfterMs: number, now: number): NodeInfo['state'] {
  return n.stoppedAt ? 'stopped' : now - Date.parse(n.heartbeatAt) > lostAfterMs ? 'lost' : 'up';
}

/** Checks a node name: what a host name may be (letters, digits, `-`, `.`), 1–63 characters. */
export function checkNodeName(name: string): string {
  if (!/^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$/i.test(name)) throw new SpaceError('CONFIG_INVALID', `Invalid --node-name ${JSON.stringify(name)}: 1-63 letters, digits, '-' and '.', starting and ending with a letter or digit`);
  return name;
}
