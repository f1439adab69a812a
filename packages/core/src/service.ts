/**
 * SandboxService: the facade of the sandbox lifecycle across a driver, the metadata store and
 * the agents' connections. The HTTP API is a thin layer over it. Tenancy is enforced here: a
 * sandbox of another tenant is indistinguishable from one that does not exist.
 *
 * The work is done by the parts in ./sandboxes/ — creates, forks, sessions (pause, snapshots,
 * hibernate, rollback), checkpoints, recovery, template starts and pools, egress settings,
 * agents' connections, timers, endings — each built here with one shared context and wired to
 * the others through explicit hooks (sandboxes/context.ts). docs/architecture.md has the map.
 */
import { promises as fs } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import type { AgentRequest } from '@space/protocol';
import type { AgentCall } from './agent/channel.js';
import type { BlobStore } from './ports/blob-store.js';
import type { SandboxDriver } from './ports/driver.js';
import { DriverRouter } from './ports/driver-router.js';
import { SpaceError } from './errors.js';
import { Journal } from './ports/intent-journal.js';
import type { Logger } from './logger.js';
import { TERMINAL_STATES, assertAllowed, type Sandbox, type SandboxAction, type SandboxState, type SandboxEvent, type Snapshot, type SnapshotPolicy } from './model.js';
import { WarmPool } from './templates/warm-pool.js';
import type { EgressPolicy, IngressLogEntry, IngressLogPage, PortExposure, SecretAttachment } from './records.js';
import type { RootfsBuilder } from './ports/rootfs-builder.js';
import type { MetadataStore, SandboxExpectation, SandboxPage } from './ports/metadata-store.js';
import { TemplateService } from './templates/template-service.js';
import { UsageHistory, type UsageSample } from './sandboxes/usage-history.js';
import { range } from './validate.js';
import { Admission } from './sandboxes/admission.js';
import { AgentLinks } from './sandboxes/agents.js';
import { Checkpoints } from './sandboxes/checkpoint.js';
import type { LifecycleHooks, SandboxContext, SandboxEgressOptions } from './sandboxes/context.js';
import { Creates, type CreateSandboxOpts } from './sandboxes/create.js';
import { EgressSettings } from './sandboxes/egress-settings.js';
import { Ports, type ExposeEveryRequest, type ExposeRequest } from './sandboxes/ports.js';
import { Endings } from './sandboxes/endings.js';
import { FaultPoints, type FaultAction } from './sandboxes/faults.js';
import { Forks, type ForkResult } from './sandboxes/fork.js';
import { LiveTable, type LiveSandbox } from './sandboxes/live.js';
import { Recovery } from './sandboxes/recovery.js';
import { Sessions } from './sandboxes/sessions.js';
import { TemplateStarts } from './sandboxes/template-starts.js';
import { Timers } from './sandboxes/timers.js';
import type { Volumes } from './volumes/volumes.js';

export type { Logger } from './logger.js';
export type { CreateSandboxOpts } from './sandboxes/create.js';
export type { ForkResult } from './sandboxes/fork.js';
export type { SandboxEgressOptions } from './sandboxes/context.js';

/** Options of {@link SandboxService}. */
export interface SandboxServiceOptions {
  store: MetadataStore;
  /** The default driver: templates are snapshotted and pooled on it. */
  driver: SandboxDriver;
  /** More drivers a sandbox may choose at creation (`driver: "microvm"`); they boot from the template without a template snapshot. */
  drivers?: SandboxDriver[];
  logger: Logger;
  /** Most sandboxes alive at once on this node. @default 64 */
  maxSandboxes?: number;
  /** How long a new sandbox may take until its agent answers. @default 30000 */
  startTimeoutMs?: number;
  /** How long a call waits for an agent that is reconnecting. @default 10000 */
  reconnectWaitMs?: number;
  /** Where snapshots are stored. */
  blobs: BlobStore;
  /** Template root file systems. */
  rootfs: RootfsBuilder;
  /** Where template images (checkpoints of booted templates) live. */
  imagesDir: string;
  /** Where template uploads wait for their build. */
  uploadsDir: string;
  /** Warm pool sizes of the built-in templates, e.g. `{ minimal: 2 }`. */
  builtinPools?: Record<string, number>;
  /**
   * Sum of the memory limits of the node's sandboxes (pooled ones included), MiB. Limits are
   * ceilings that sandboxes seldom reach, so the default overcommits: twice the host's memory.
   */
  maxMemoryMb?: number;
  /** Pools shrink while the host has less memory available than this, MiB. @default 10% of the host's memory */
  poolMinAvailableMb?: number;
  /** Scratch directory for checkpoint images (removed after use). */
  workDir: string;
  /** This node's name (`--node-name`), recorded on every sandbox it makes. */
  nodeName?: string;
  /**
   * The metadata store is shared with other nodes (a cluster on PostgreSQL): this node acts
   * only on the sandboxes it runs (their `node` is its name) — recovery, timers, pools and
   * admission leave the others alone, and {@link SandboxService.get} refuses them with
   * `SANDBOX_ON_OTHER_NODE` (the API forwards their requests to their node). Without it the
   * daemon is the store's only one and takes every sandbox in it for its own (a renamed host's
   * included). @default false
   */
  shared?: boolean;
  /**
   * With {@link shared}: whether a node is up (heartbeating). A hibernated sandbox whose node is
   * not is taken over by this node when asked for (and woken here); absent: never.
   */
  nodeUp?: (name: string) => Promise<boolean>;
  /** Largest snapshot payload accepted on restore, bytes. @default 32 GiB */
  maxSnapshotBytes?: number;
  /** Sandboxes booting at once; more creates wait in a queue. @default the number of CPUs (at least 2) */
  maxConcurrentCreates?: number;
  /** Creates allowed to wait; beyond it creates get `CAPACITY_EXHAUSTED`. @default 256 */
  maxQueuedCreates?: number;
  /**
   * Sandbox networking through the egress proxy. Absent: sandboxes have no network at all,
   * and egress policies and secrets are refused with `EGRESS_UNAVAILABLE`.
   */
  egress?: SandboxEgressOptions;
  /** The node's volumes (`@space/volume-ext4` behind {@link Volumes}); absent: sandboxes cannot mount volumes. */
  volumes?: Volumes;
  /**
   * Fault injection for crash tests: the process SIGKILLs itself at these points (the step
   * boundaries of each lifecycle operation, listed in docs/operations.md, e.g.
   * `snapshot:after-checkpoint`), or a checkpoint fails and takes the container with it
   * (`snapshot:checkpoint-fails`). Never set in production.
   */
  faults?: string[];
  /**
   * What an armed fault point does: by default the process SIGKILLs itself. The fast lane's crash
   * tests pass an action that freezes the service where it stands and cuts it off from the
   * store, the blobs and the driver, then start a new service over them. Never set in production.
   */
  faultAction?: FaultAction;
  /** How often each running sandbox's usage is sampled for {@link SandboxService.usageSeries}, ms. @default 5000 */
  usageSampleMs?: number;
}

/** Filter of {@link SandboxService.list}. */
export interface ListSandboxesOpts {
  states?: Sandbox['state'][];
  metadata?: Record<string, string>;
  /** Only sandboxes of this template. */
  template?: string;
  /** Only sandboxes created at or after this time (ISO 8601). */
  createdAfter?: string;
  /** Only sandboxes created at or before this time (ISO 8601). */
  createdBefore?: string;
  /** Newest first (`desc`, the default) or oldest first. */
  order?: 'asc' | 'desc';
  limit?: number;
  cursor?: string;
}

/** `store` whose sandbox updates require the record to be `node`'s (unless they say otherwise). */
function fenced(store: MetadataStore, node: string): MetadataStore {
  return new Proxy(store, {
    get(target, key) {
      const v = Reflect.get(target, key, target) as unknown;
      if (key === 'updateSandbox') return (id: string, patch: Parameters<MetadataStore['updateSandbox']>[1], expect?: SandboxExpectation) => target.updateSandbox(id, patch, expect ?? { node });
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

/** A store that tells `changed` each sandbox record it inserts or updates, once written. */
function watched(store: MetadataStore, changed: (sb: Sandbox) => void): MetadataStore {
  return new Proxy(store, {
    get(target, key) {
      if (key === 'insertSandbox') return async (sb: Sandbox) => (await target.insertSandbox(sb), changed(sb));
      if (key === 'updateSandbox') {
        return async (...a: Parameters<MetadataStore['updateSandbox']>) => {
          const sb = await target.updateSandbox(...a);
          changed(sb);
          return sb;
        };
      }
      const v = Reflect.get(target, key, target) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

/** A change {@link SandboxService.onChange} reports: a sandbox record as written, or an event recorded. */
export type SandboxChange = { kind: 'sandbox'; sandbox: Sandbox } | { kind: 'event'; event: SandboxEvent };

/** The states whose sandboxes a credential that names no sandbox may belong to (signed file URLs). */
const UNENDED: SandboxState[] = ['running', 'paused', 'hibernated'];

/**
 * Lifecycle orchestration.
 *
 * @example
 * const svc = new SandboxService({ store, driver, logger });
 * await svc.start();
 * const sb = await svc.create('tenant1', { template: 'minimal' });
 * const call = await svc.call('tenant1', sb.id, 'exec', { op: 'exec', argv: ['true'] });
 */
export class SandboxService {
  private readonly live = new LiveTable();
  private readonly store: MetadataStore;
  private readonly driver: DriverRouter;
  private readonly log: Logger;
  private readonly workDir: string;
  private stopping = false;
  /** Whether this node acts on the sandbox (see {@link SandboxServiceOptions.shared}). */
  readonly owns: (sb: Pick<Sandbox, 'node'>) => boolean;
  /** This node's sandboxes in these states (all of them when the store is not shared). */
  private readonly mine: (states: SandboxState[]) => Promise<Sandbox[]>;
  private readonly nodeName: string | undefined;
  private readonly nodeUp: ((name: string) => Promise<boolean>) | undefined;
  /** Sandboxes paused because the heartbeat could not be renewed (see leaseLost). */
  private frozenByLease: Set<string> | undefined;
  /** The last hour of each running sandbox's usage. */
  private readonly usageHistory: UsageHistory;
  /** Clean-ups running in the background (awaited by {@link shutdown}). */
  private readonly background = new Set<Promise<unknown>>();
  /** Template captures and pool refills in flight: they own sandboxes nobody else knows of. */
  private readonly transient = new Set<Promise<unknown>>();
  /** Aborted by {@link shutdown}: stops captures and refills. */
  private readonly stopAc = new AbortController();
  /** Templates: registry, builds and their images. */
  readonly templates: TemplateService;
  /** Warm pools of restored, unassigned sandboxes. */
  readonly pool: WarmPool;
  /** The node's volumes, when it has them. */
  readonly volumes: Volumes | undefined;
  /**
   * What this node admits: most sandboxes at once, and most memory their limits may add up to
   * (MiB). A cluster's nodes register it for placement.
   * @example svc.capacity // { maxSandboxes: 64, maxMemoryMb: 48000 }
   */
  readonly capacity: { maxSandboxes: number; maxMemoryMb: number };
  // The parts (./sandboxes/), each with one job.
  private readonly creates: Creates;
  private readonly forks: Forks;
  private readonly sessions: Sessions;
  private readonly egressSettings: EgressSettings;
  private readonly ports: Ports;
  private readonly checkpoints: Checkpoints;
  private readonly recovery: Recovery;
  private readonly starts: TemplateStarts;
  private readonly agents: AgentLinks;
  private readonly timers: Timers;
  private readonly endings: Endings;

  constructor(opts: SandboxServiceOptions) {
    // With a shared store every write of a sandbox record says whose it must still be: a node
    // that lost a sandbox to another (a move, a takeover) cannot write over the new owner's.
    const store = opts.shared && opts.nodeName ? fenced(opts.store, opts.nodeName) : opts.store;
    this.store = watched(store, (sandbox) => this.notify({ kind: 'sandbox', sandbox }));
    this.nodeUp = opts.nodeUp;
    this.driver = new DriverRouter(opts.driver, opts.drivers ?? []);
    this.log = opts.logger;
    this.workDir = opts.workDir;
    this.volumes = opts.volumes;
    const shared = !!opts.shared;
    this.nodeName = opts.nodeName;
    this.owns = (sb) => !shared || (sb.node !== undefined && sb.node === opts.nodeName);
    // A node's own records: on a shared store one indexed query for its name, never a read of
    // every node's (that grew with the cluster: each create and usage sample read them all).
    const node = shared && opts.nodeName ? { node: opts.nodeName } : {};
    this.mine = async (states) => (await this.store.sandboxesInStates(states, node)).filter(this.owns);
    const startTimeoutMs = opts.startTimeoutMs ?? 30_000;
    this.usageHistory = new UsageHistory(
      { running: async () => (await this.mine(['running'])).map((s) => ({ id: s.id, cpu: s.cpu })), usage: (id) => this.driver.usage(id) },
      opts.usageSampleMs ?? 5000,
    );
    const totalMb = Math.floor(totalmem() / 1048576);
    const admission = new Admission(this.mine, () => this.pool, {
      maxSandboxes: opts.maxSandboxes ?? 64,
      maxMemoryMb: opts.maxMemoryMb ?? totalMb * 2,
      poolMinAvailableMb: opts.poolMinAvailableMb ?? Math.floor(totalMb / 10),
      maxConcurrentCreates: opts.maxConcurrentCreates ?? Math.max(2, availableParallelism()),
      maxQueuedCreates: opts.maxQueuedCreates ?? 256,
    });
    this.capacity = { maxSandboxes: admission.limits.maxSandboxes, maxMemoryMb: admission.limits.maxMemoryMb };
    // The parts call each other through these hooks, filled in once all are built.
    const hooks = {} as LifecycleHooks;
    this.templates = new TemplateService({
      store: this.store,
      rootfs: opts.rootfs,
      ...(opts.nodeName ? { nodeName: opts.nodeName } : {}),
      shared,
      imagesDir: opts.imagesDir,
      uploadsDir: opts.uploadsDir,
      ...(opts.builtinPools ? { builtinPools: opts.builtinPools } : {}),
      images: { save: (...a) => this.starts.templateImages().save(...a), load: (...a) => this.starts.templateImages().load(...a), drop: (...a) => this.starts.templateImages().drop(...a) },
      capture: (t, rootfs, key, progress, signal) => this.starts.captureTemplate(t, rootfs, key, progress, signal),
      inUse: async (tenantId, name) => (await this.store.sandboxesInStates(['starting', 'running', 'paused', 'hibernated'])).filter((x) => x.tenantId === tenantId && x.template === name).length,
      driverVersion: () => this.driver.version(),
    });
    this.templates.onChange = (t) => this.starts.preparePool(t);
    this.pool = new WarmPool(
      {
        fill: (t) => this.starts.fillPool(t),
        discard: (id) => {
          const p = this.starts.discardPooled(id);
          this.inBackground(p);
          return p;
        },
        hasRoom: (mb) => admission.hasRoom(1, mb),
        underPressure: () => admission.underPressure(),
        alive: (id) => !!this.live.get(id)?.openChannel,
      },
      this.log,
    );
    const c: SandboxContext = {
      store: this.store,
      driver: this.driver,
      log: this.log,
      blobs: opts.blobs,
      workDir: opts.workDir,
      nodeName: opts.nodeName,
      shared,
      owns: this.owns,
      maxSnapshotBytes: opts.maxSnapshotBytes ?? 32 * 1024 ** 3,
      journal: new Journal(this.store),
      egress: opts.egress,
      volumes: opts.volumes,
      templates: this.templates,
      pool: this.pool,
      live: this.live,
      admission,
      faults: new FaultPoints(opts.faults ?? [], this.log, opts.faultAction),
      reconnectWaitMs: opts.reconnectWaitMs ?? 10_000,
      stopSignal: this.stopAc.signal,
      stopping: () => this.stopping,
      background: (p) => this.inBackground(p),
      transient: (p) => this.transientWork(p),
      event: (id, type, message) => this.event(id, type, message),
      withLock: (id, fn) => this.withLock(id, fn),
      bootTimeout: (name) => Math.max(startTimeoutMs, this.driver.get(name).bootTimeoutMs ?? 0),
      hooks,
    };
    this.creates = new Creates(c);
    this.forks = new Forks(c);
    this.sessions = new Sessions(c);
    this.egressSettings = new EgressSettings(c);
    this.ports = new Ports(c);
    this.checkpoints = new Checkpoints(c);
    this.recovery = new Recovery(c);
    this.starts = new TemplateStarts(c);
    this.agents = new AgentLinks(c);
    this.timers = new Timers(c);
    this.endings = new Endings(c);
    Object.assign(hooks, {
      checkpoints: this.checkpoints,
      recovery: this.recovery,
      timers: this.timers,
      endings: this.endings,
      agents: this.agents,
      sessions: this.sessions,
      starts: this.starts,
      egress: this.egressSettings,
      get: (tenantId: string, id: string) => this.get(tenantId, id),
    } satisfies LifecycleHooks);
  }

  /** Tracks work that owns sandboxes outside the database; {@link shutdown} waits for it. */
  private transientWork<T>(p: Promise<T>): Promise<T> {
    this.transient.add(p);
    void p.finally(() => this.transient.delete(p)).catch(() => {});
    return p;
  }

  /** Runs a clean-up in the background; {@link shutdown} waits for it. */
  private inBackground(p: Promise<unknown>): void {
    const q = p.catch((err) => this.log.warn({ err }, 'background clean-up failed')).finally(() => this.background.delete(q));
    this.background.add(q);
  }

  /** Runs `fn` after every earlier lifecycle action on the same sandbox has finished. */
  private withLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.live.entry(id).withLock(fn);
  }

  private async event(sandboxId: string, type: string, message: string): Promise<void> {
    const ev: SandboxEvent = { sandboxId, at: new Date().toISOString(), type, message };
    await this.store.insertEvent(ev).catch((err) => this.log.error({ err, sandboxId }, 'event not recorded'));
    this.log.info({ sandboxId, event: type }, message);
    this.notify({ kind: 'event', event: ev });
  }

  private readonly changeListeners = new Set<(c: SandboxChange) => void>();

  private notify(c: SandboxChange): void {
    for (const l of this.changeListeners) {
      try {
        l(c);
      } catch (err) {
        this.log.warn({ err }, 'change listener failed');
      }
    }
  }

  /**
   * Calls `listener` with every change of a sandbox record this node writes and every event it
   * records, from now on, after they are stored (every tenant's: filter by `tenantId` — an
   * event's tenant is its sandbox's). Other nodes' writes are not seen. Returns the function
   * that stops it.
   *
   * @example
   * const stop = service.onChange((c) => console.log(c.kind, c.kind === 'sandbox' ? c.sandbox.state : c.event.type));
   * stop();
   */
  onChange(listener: (c: SandboxChange) => void): () => void {
    this.changeListeners.add(listener);
    return () => this.changeListeners.delete(listener);
  }

  /**
   * Prepares the driver, finishes or undoes the operations a crash interrupted (the journal),
   * re-adopts sandboxes that still run, restores the others from their newest snapshot (dead
   * only without one), finishes interrupted creates, and removes what no sandbox owns.
   */
  async start(): Promise<void> {
    this.driver.bind({ agentConnected: (id, s) => this.agents.onAgent(id, s) });
    await this.driver.init();
    await this.templates.start();
    // `minimal` needs no download: have it ready (its image follows in the background).
    await this.templates.rootfsOf(await this.templates.resolve('', 'minimal'));
    await fs.mkdir(this.workDir, { recursive: true, mode: 0o700 });
    // Volumes first: recovering sandboxes open the volumes they hold.
    await this.volumes?.recover();
    await this.recovery.startUp();
    for (const t of await this.templates.all()) if (t.poolSize > 0 || (t.tenantId === '' && t.name === 'minimal')) this.starts.preparePool(t);
    this.usageHistory.start();
  }

  /** Stops accepting work and detaches from sandboxes; they keep running and are re-adopted on the next start. */
  async shutdown(): Promise<void> {
    this.stopping = true;
    this.usageHistory.stop();
    // Pooled sandboxes and template captures belong to no one: remove them rather than leave
    // them to the next start (which may never come for this data directory).
    this.stopAc.abort(new SpaceError('DAEMON_SHUTTING_DOWN'));
    await this.pool.stop();
    await Promise.allSettled([...this.transient]);
    for (const e of this.live.values()) {
      e.clearTimers();
      e.channel?.destroy();
    }
    await Promise.all([...this.background]);
    await this.driver.close();
  }

  /**
   * Gets a tenant's sandbox that this node runs; `SANDBOX_ON_OTHER_NODE` for one another node
   * of the cluster runs (its record: {@link find}).
   */
  async get(tenantId: string, id: string): Promise<Sandbox> {
    const sb = await this.find(tenantId, id);
    if (this.owns(sb)) return sb;
    // A hibernated sandbox holds nothing on its node: when that node is down, this one takes it.
    if (sb.state === 'hibernated' && sb.node !== undefined && this.nodeUp && !(await this.nodeUp(sb.node))) return this.sessions.takeOver(sb, `its node ${sb.node} is down`);
    throw new SpaceError('SANDBOX_ON_OTHER_NODE', `Sandbox ${sb.id} runs on node ${sb.node ?? '(none recorded)'}, not on this one (${this.nodeName ?? 'unnamed'})`, { details: { sandboxId: sb.id, node: sb.node } });
  }

  /**
   * A tenant's sandbox record, wherever it runs (reads only: acting on it is its node's job).
   *
   * @example
   * const sb = await svc.find('tenant1', 'sb3k9x');
   * if (!svc.owns(sb)) console.log(`runs on ${sb.node}`);
   */
  async find(tenantId: string, id: string): Promise<Sandbox> {
    const sb = typeof id === 'string' && id.length < 64 ? await this.store.getSandbox(id) : undefined;
    if (!sb || sb.tenantId !== tenantId) throw new SpaceError('SANDBOX_NOT_FOUND', `No sandbox ${JSON.stringify(id)} for this API key`, { details: { sandboxId: id } });
    return sb;
  }

  /** Lists a tenant's sandboxes. */
  async list(tenantId: string, q: ListSandboxesOpts = {}): Promise<SandboxPage> {
    const limit = q.limit ?? 50;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new SpaceError('BAD_REQUEST', 'limit must be an integer from 1 to 1000');
    const time = (v: string | undefined, field: string): string | undefined => {
      if (v === undefined) return undefined;
      const t = Date.parse(v);
      if (!Number.isFinite(t)) throw new SpaceError('BAD_REQUEST', `${field} must be a time in ISO 8601, e.g. 2026-12-01T10:00:00Z; got ${JSON.stringify(v)}`);
      return new Date(t).toISOString();
    };
    if (q.order !== undefined && q.order !== 'asc' && q.order !== 'desc') throw new SpaceError('BAD_REQUEST', 'order must be asc or desc');
    const createdAfter = time(q.createdAfter, 'createdAfter');
    const createdBefore = time(q.createdBefore, 'createdBefore');
    return this.store.listSandboxes({
      tenantId,
      limit,
      ...(q.states ? { states: q.states } : {}),
      ...(q.metadata ? { metadata: q.metadata } : {}),
      ...(q.template !== undefined ? { template: q.template } : {}),
      ...(createdAfter ? { createdAfter } : {}),
      ...(createdBefore ? { createdBefore } : {}),
      ...(q.order ? { order: q.order } : {}),
      ...(q.cursor ? { cursor: q.cursor } : {}),
    });
  }

  /**
   * Every sandbox not ended, across tenants: id and tenant only. For credentials that name no
   * sandbox and must be matched against each (the E2B API's signed file URLs).
   *
   * @example
   * const owner = (await svc.unendedSandboxes()).find((s) => matches(s));
   */
  async unendedSandboxes(): Promise<{ id: string; tenantId: string }[]> {
    return (await this.store.sandboxesInStates(UNENDED)).map((s) => ({ id: s.id, tenantId: s.tenantId }));
  }

  /**
   * One sandbox by id, across tenants, if it has not ended: id and tenant only. For a credential
   * that names its sandbox by a hint to be checked (the E2B API's signed file URLs, forwarded).
   *
   * @example
   * const c = await svc.unendedSandbox('sb3k9x');
   */
  async unendedSandbox(id: string): Promise<{ id: string; tenantId: string } | undefined> {
    const sb = await this.store.getSandbox(id);
    return sb && UNENDED.includes(sb.state) ? { id: sb.id, tenantId: sb.tenantId } : undefined;
  }

  /** Kills a sandbox and frees everything it had on the host. */
  async kill(tenantId: string, id: string): Promise<Sandbox> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, 'kill');
    return this.endings.terminate(sb.id, 'killed', 'killed', 'killed on request');
  }

  /** Opens a call to the sandbox's agent after checking tenancy and state. */
  async call(tenantId: string, id: string, action: SandboxAction, req: AgentRequest): Promise<AgentCall> {
    const sb = await this.awake(tenantId, id, action);
    return this.agents.withChannel(sb.id, (ch) => ch.call(req));
  }

  /** A unary agent call (stat, list, mkdir, ...). */
  async unary(tenantId: string, id: string, action: SandboxAction, req: AgentRequest, timeoutMs = 30_000): Promise<Record<string, unknown>> {
    const sb = await this.awake(tenantId, id, action);
    return this.agents.withChannel(sb.id, (ch) => ch.unary(req, timeoutMs));
  }

  /** Checks the action against the state; a hibernated sandbox is woken first (on demand). */
  private async awake(tenantId: string, id: string, action: SandboxAction): Promise<Sandbox> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, action);
    this.live.entry(id).lastActive = Date.now();
    if (sb.state === 'hibernated') return this.sessions.awaken(tenantId, id);
    return sb;
  }

  /** A sandbox's event log, oldest first. */
  async events(tenantId: string, id: string): Promise<SandboxEvent[]> {
    await this.get(tenantId, id);
    return this.store.listEvents(id, 500);
  }

  /** Host resources of a sandbox. */
  async usage(tenantId: string, id: string) {
    const sb = await this.get(tenantId, id);
    if (TERMINAL_STATES.includes(sb.state)) return { rssBytes: 0 };
    return this.driver.usage(sb.id);
  }

  /**
   * A running sandbox's usage over time: one sample every `usageSampleMs` (5 s) for the last
   * hour, between `start` and `end` (ms since epoch) when given, oldest first.
   *
   * @example
   * const lastMinute = await svc.usageSeries('tenant1', id, { start: Date.now() - 60_000 });
   */
  async usageSeries(tenantId: string, id: string, range: { start?: number; end?: number } = {}): Promise<UsageSample[]> {
    const sb = await this.get(tenantId, id);
    return this.usageHistory.series(sb.id, range);
  }

  /**
   * Sets a new timeout, counted from now (`0` = none). A hibernated sandbox keeps it for when
   * it wakes.
   */
  setTimeout(tenantId: string, id: string, timeoutMs: number): Promise<Sandbox> {
    const ms = range('timeoutMs', timeoutMs);
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'setTimeout');
      const updated = await this.store.updateSandbox(id, { timeoutMs: ms, expiresAt: ms ? new Date(Date.now() + ms).toISOString() : undefined });
      this.timers.schedule(updated);
      return updated;
    });
  }

  // ---------------------------------------------------------------- the parts' public work

  /**
   * Creates a sandbox; resolves when its agent answers. It is taken from the template's warm
   * pool if one is ready (and the request has the pool's size), restored from the template's
   * image otherwise, or booted when the template has no image yet.
   */
  create(tenantId: string, opts: CreateSandboxOpts, signal?: AbortSignal): Promise<Sandbox> {
    return this.creates.create(tenantId, opts, signal);
  }

  /**
   * The warm-pool key of a pool-shaped create that this node's pool cannot serve now (see
   * {@link Creates.poolShortHere}): placement sends it to a node whose pool can.
   *
   * @example await svc.poolShortHere(T, { template: 'minimal' }) // '/minimal' or undefined
   */
  poolShortHere(tenantId: string, opts: CreateSandboxOpts): Promise<string | undefined> {
    return this.creates.poolShortHere(tenantId, opts);
  }

  /**
   * Copies a sandbox into `count` new ones: from a snapshot taken now (the parent keeps
   * running), or from one of its snapshots. Each copy has its own id, socket directory and
   * network namespace, and diverges from then on.
   */
  fork(tenantId: string, id: string, opts: { count?: number; snapshotId?: string } = {}): Promise<ForkResult[]> {
    return this.forks.fork(tenantId, id, opts);
  }

  /** Freezes a running sandbox in memory (no disk). */
  pause(tenantId: string, id: string): Promise<Sandbox> {
    return this.sessions.pause(tenantId, id);
  }

  /** Unfreezes a paused sandbox. */
  resume(tenantId: string, id: string): Promise<Sandbox> {
    return this.sessions.resume(tenantId, id);
  }

  /** Takes a snapshot now; the sandbox keeps running (it is stopped for the checkpoint's duration). */
  snapshot(tenantId: string, id: string, opts: { name?: string } = {}): Promise<Snapshot> {
    return this.sessions.snapshot(tenantId, id, opts);
  }

  /** A sandbox's snapshots, oldest first. */
  snapshots(tenantId: string, id: string): Promise<Snapshot[]> {
    return this.sessions.snapshots(tenantId, id);
  }

  /** A tenant's snapshot by id; another tenant's is as unknown as a missing one. */
  getSnapshot(tenantId: string, snapshotId: string): Promise<Snapshot> {
    return this.sessions.getSnapshot(tenantId, snapshotId);
  }

  /**
   * Deletes one snapshot. The snapshot a hibernated sandbox sleeps in holds its state and is
   * refused (`SANDBOX_INVALID_STATE`); deleting a running sandbox's newest snapshot makes the
   * one before it the point a crash recovers to.
   *
   * @example
   * await svc.removeSnapshot('tenant1', 'sn0123456789abcdefgh');
   */
  removeSnapshot(tenantId: string, snapshotId: string): Promise<void> {
    return this.sessions.removeSnapshot(tenantId, snapshotId);
  }

  /**
   * Node `lost` of the cluster stopped heartbeating: its sandboxes are restored here from their
   * newest snapshots, or end `dead` (`node-lost`) without one (see Recovery.adoptLost).
   *
   * @example
   * for (const n of nodes) if (n.state === 'lost') await svc.adoptLost(n.name);
   */
  adoptLost(lost: string): Promise<{ restored: number; ended: number }> {
    return this.recovery.adoptLost(lost);
  }

  /**
   * This node could not renew its place in the cluster (heartbeat) for long enough that the
   * others may soon take its sandboxes over: every sandbox its runtime runs is paused, so that
   * none goes on here while another node restores it. No record is written (the store is likely
   * what cannot be reached). {@link leaseRenewed} undoes it. Returns how many were paused.
   */
  async leaseLost(): Promise<number> {
    if (this.frozenByLease) return 0;
    const frozen = new Set<string>();
    this.frozenByLease = frozen;
    for (const id of await this.driver.list()) {
      if (await this.driver.pause(id).then(() => true, () => false)) frozen.add(id);
    }
    this.log.error({ paused: frozen.size }, 'this node cannot renew its heartbeat: its sandboxes are paused until it can (other nodes may take them over)');
    return frozen.size;
  }

  /**
   * The heartbeat went through (called after each): sandboxes this node's runtime holds whose
   * record is now another node's — taken over while this one was cut off — are removed, and the
   * ones {@link leaseLost} (or the node's lease keeper: `alsoPaused`) paused that are still this
   * node's and running run again.
   */
  async leaseRenewed(alsoPaused: string[] = []): Promise<{ resumed: number; removed: number }> {
    // `alsoPaused`: what the node's lease keeper (a process of its own) paused meanwhile.
    const frozen = this.frozenByLease || alsoPaused.length ? new Set([...(this.frozenByLease ?? []), ...alsoPaused]) : undefined;
    const out = { resumed: 0, removed: 0 };
    // One query for the node's own records; only a copy whose record is not among them (taken
    // over, or gone) is looked up alone.
    const own = new Map((await this.mine(['starting', 'running', 'paused', 'hibernated'])).map((sb) => [sb.id, sb]));
    for (const id of await this.driver.list()) {
      const sb = own.get(id) ?? (await this.store.getSandbox(id));
      // A copy that still runs here: one a move left is stopped (its release is under way) and
      // goes by itself; removing it would also reach the new node's names if it shared the host.
      if (sb && !this.owns(sb) && (await this.driver.status(id).catch(() => ({ running: false }))).running) {
        await this.withLock(id, async () => {
          const e = this.live.get(id);
          if (e) e.killing = true;
          e?.clearTimers();
          e?.channel?.destroy();
          this.live.delete(id);
          await this.driver.destroy(id);
        });
        this.log.warn({ sandboxId: id, node: sb.node }, 'removed this node\'s copy of a sandbox another node took over');
        out.removed++;
      } else if (frozen?.has(id) && (!sb || sb.state === 'running' || sb.state === 'starting')) {
        await this.driver.resume(id).catch((err) => this.log.warn({ err, sandboxId: id }, 'resuming after the heartbeat came back failed'));
        out.resumed++;
      }
    }
    if (frozen) this.log.warn({ resumed: out.resumed, removed: out.removed }, 'heartbeat back: this node\'s sandboxes run again');
    this.frozenByLease = undefined;
    return out;
  }

  /**
   * Hibernates the sandbox here (when it runs) and hands it to node `to`, which wakes it on the
   * next request (or at once, asked by the API when it ran before). A disk goes with it (the
   * snapshot holds it, and the template files it grew from); sandboxes with volumes, and a
   * tenant template's sandboxes where `to` lacks its files, do not move.
   *
   * @example
   * const { sandbox } = await svc.move('tenant1', 'sb3k9x', 'node-b'); // sandbox.node === 'node-b'
   */
  move(tenantId: string, id: string, to: string, opts: { wakeThere?: boolean } = {}): Promise<{ sandbox: Sandbox; wasRunning: boolean }> {
    return this.sessions.move(tenantId, id, to, opts);
  }

  /**
   * Wakes the sandboxes moved here while running by another node (a drain: `wakeThere`).
   * Called after each heartbeat of a cluster node. Returns how many it woke.
   */
  async wakeArrivals(): Promise<number> {
    let woken = 0;
    for (const sb of await this.mine(['hibernated'])) {
      if (!sb.wakeOnArrival) continue;
      try {
        await this.sessions.wake(sb.tenantId, sb.id);
        woken++;
      } catch (err) {
        this.log.warn({ err, sandboxId: sb.id }, 'waking a sandbox moved here failed; it wakes on its next request');
      }
      await this.store.updateSandbox(sb.id, { wakeOnArrival: undefined }).catch(() => {});
    }
    return woken;
  }

  /** Saves the whole sandbox to a snapshot and releases every host resource. */
  hibernate(tenantId: string, id: string): Promise<Sandbox> {
    return this.sessions.hibernate(tenantId, id);
  }

  /** Restores a hibernated sandbox from its snapshot. */
  wake(tenantId: string, id: string): Promise<Sandbox> {
    return this.sessions.wake(tenantId, id);
  }

  /** Rolls a sandbox back to one of its snapshots, in place. The snapshot is verified before anything changes. */
  rollback(tenantId: string, id: string, snapshotId: string): Promise<Sandbox> {
    return this.sessions.rollback(tenantId, id, snapshotId);
  }

  /** Sets (or with `null` removes) the rolling snapshot policy. */
  setSnapshotPolicy(tenantId: string, id: string, policy: SnapshotPolicy | null): Promise<Sandbox> {
    return this.sessions.setSnapshotPolicy(tenantId, id, policy);
  }

  /** Replaces a sandbox's egress policy; the proxy applies it from the next request on. */
  setEgress(tenantId: string, id: string, policy: unknown): Promise<Sandbox> {
    return this.egressSettings.setEgress(tenantId, id, policy);
  }

  /**
   * Attaches secrets to a running sandbox: each gets a placeholder, in an env var of its name
   * for every process started from now on. The proxy swaps it from the next request on.
   */
  attachSecrets(tenantId: string, id: string, names: unknown): Promise<Sandbox> {
    return this.egressSettings.attachSecrets(tenantId, id, names);
  }

  /** Detaches a secret: from the next request on, the proxy no longer swaps its placeholder. */
  detachSecret(tenantId: string, id: string, name: string): Promise<Sandbox> {
    return this.egressSettings.detachSecret(tenantId, id, name);
  }

  /**
   * Replaces a sandbox's header rules (request headers the proxy sets for some hosts); an
   * empty list removes them. Applied from the next request on.
   *
   * @example
   * await svc.setHeaderRules('tenant1', id, [{ hosts: ['api.example.com'], header: 'Authorization', value: 'Bearer sk-…' }]);
   */
  setHeaderRules(tenantId: string, id: string, rules: unknown): Promise<Sandbox> {
    return this.egressSettings.setHeaderRules(tenantId, id, rules);
  }

  /**
   * Exposes a port of a sandbox through the ingress (again: with a new token). The token is
   * returned once and not kept.
   * @example const { exposure, token } = await svc.exposePort('tenant1', id, { port: 8000 });
   */
  exposePort(tenantId: string, id: string, req: ExposeRequest): Promise<{ exposure: PortExposure; token: string }> {
    return this.ports.expose(tenantId, id, req);
  }

  /**
   * Opens every port of a sandbox through the ingress (E2B's model), public or behind `token`.
   * @example await svc.exposeEveryPort('tenant1', id, { public: false, token });
   */
  exposeEveryPort(tenantId: string, id: string, req: ExposeEveryRequest): Promise<PortExposure> {
    return this.ports.exposeEvery(tenantId, id, req);
  }

  /** A sandbox's exposed ports (unexpired). */
  exposedPorts(tenantId: string, id: string): Promise<PortExposure[]> {
    return this.ports.list(tenantId, id);
  }

  /** Stops exposing a port. */
  unexposePort(tenantId: string, id: string, port: number): Promise<void> {
    return this.ports.unexpose(tenantId, id, port);
  }

  /** For the ingress: records one request in the audit log. */
  recordIngress(e: IngressLogEntry): Promise<void> {
    return this.ports.audit(e);
  }

  /**
   * Every request through the ingress to a sandbox's ports, newest first.
   * @example const { items, nextCursor } = await svc.ingressLog('tenant1', id, 100);
   */
  ingressLog(tenantId: string, id: string, limit: number, cursor?: string): Promise<IngressLogPage> {
    return this.ports.log(tenantId, id, limit, cursor);
  }

  /** For the ingress, before forwarding: the sandbox {@link ingressRoute} found, running (woken if it sleeps and has autoResume), or a SpaceError. */
  ingressReady(found: Sandbox): Promise<Sandbox> {
    return this.ports.ready(found);
  }

  /** For the ingress: an exposed port of a live sandbox, or undefined. */
  ingressRoute(id: string, port: number): Promise<{ exposure: PortExposure; sandbox: Sandbox } | undefined> {
    return this.ports.route(id, port);
  }

  /** What the egress proxy needs of a live sandbox (undefined once it has ended). */
  egressContext(id: string): Promise<{ sandboxId: string; tenantId: string; policy: EgressPolicy; secrets: SecretAttachment[] } | undefined> {
    return this.egressSettings.egressContext(id);
  }
}
