/**
 * SandboxService: the lifecycle of sandboxes across a driver, the metadata store and the
 * agents' connections. The HTTP API is a thin layer over it. Tenancy is enforced here: a
 * sandbox of another tenant is indistinguishable from one that does not exist.
 */
import { existsSync, promises as fs } from 'node:fs';
import { availableParallelism, totalmem } from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { PROTOCOL_VERSION, type AgentRequest } from '@space/protocol';
import { AgentChannel, type AgentCall } from './agent-channel.js';
import { CHECKPOINT_COMPLETE, type DriverCreateSpec, type SandboxDriver } from './driver.js';
import { Journal, type Intent } from './intents.js';
import { UsageHistory, type UsageSample } from './usage-history.js';
import { DriverRouter } from './driver-router.js';
import { SpaceError } from './errors.js';
import type { BlobStore } from './blobs.js';
import { LIMITS, TERMINAL_STATES, assertAllowed, newSandboxId, newSnapshotId, type CreateTimings, type EndReason, type Sandbox, type SandboxAction, type SandboxEvent, type Snapshot, type SnapshotPolicy, type SnapshotTrigger, type Template, type TemplateImage, type TemplateStart } from './model.js';
import { POOL_MEMORY_MB, WarmPool } from './pool.js';
import { Admission } from './sandboxes/admission.js';
import { LiveTable, type LiveSandbox } from './sandboxes/live.js';
import { newSandboxRecord } from './sandboxes/record.js';
import { sendIdentity } from './sandboxes/identity.js';
import type { Progress, RootfsBuilder } from './rootfs.js';
import { TemplateService, templateImageBlobKey, type TemplateImageStore } from './templates.js';
import { packSnapshot, readSnapshot } from './snapshot-format.js';
import { checkMap, range } from './validate.js';
import { DEFAULT_EGRESS_POLICY, checkEgressPolicy, checkHeaderRules, type EgressPolicy, type HeaderRule, type SecretAttachment, type SecretService } from './egress.js';
import type { MetadataStore, SandboxPage } from './store.js';

/** Structured logger (pino-compatible subset). */
import type { Logger } from './logger.js';

export type { Logger } from './logger.js';

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
  /**
   * Fault injection for crash tests: the process SIGKILLs itself at these points (the step
   * boundaries of each lifecycle operation, listed in docs/operations.md, e.g.
   * `snapshot:after-checkpoint`), or a checkpoint fails and takes the container with it
   * (`snapshot:checkpoint-fails`). Never set in production.
   */
  faults?: string[];
  /** How often each running sandbox's usage is sampled for {@link SandboxService.usageSeries}, ms. @default 5000 */
  usageSampleMs?: number;
}

/** What a client asks for when creating a sandbox. */
export interface CreateSandboxOpts {
  /** Template. @default "minimal" */
  template?: string;
  /** Isolation driver, one of the daemon's enabled drivers (`gvisor`, `microvm`). @default the daemon's default */
  driver?: string;
  /** CPU cores (fractions allowed). @default 1 */
  cpu?: number;
  /** Memory limit, MiB. @default 512 */
  memoryMb?: number;
  /** Kill the sandbox this many ms after creation; 0 = never. @default 1800000 (30 min) */
  timeoutMs?: number;
  /** Environment variables of every process. */
  env?: Record<string, string>;
  /** Labels to filter listings by. */
  metadata?: Record<string, string>;
  /** What happens when `timeoutMs` is reached. @default "kill" */
  onTimeout?: 'kill' | 'hibernate';
  /** Hibernate after this many ms without an API call for the sandbox; 0 or absent = never. */
  idleTimeoutMs?: number;
  /** Where it may connect through the egress proxy. @default nothing */
  egress?: Partial<EgressPolicy>;
  /** Names of the tenant's secrets to attach: the sandbox gets placeholders in env vars of those names. */
  secrets?: string[];
  /** Request headers the egress proxy sets on its requests to some hosts; the values never enter the sandbox. */
  headers?: HeaderRule[];
}

/** What the service needs to give sandboxes their egress. */
export interface SandboxEgressOptions {
  secrets: SecretService;
  /** Environment of every sandbox: the proxy variables and where the CA files are. */
  env: Record<string, string>;
  /** The tenant's egress CA certificate (PEM), installed in each of its sandboxes. */
  trust(tenantId: string): Promise<string>;
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

/** How long a restarted daemon waits for a checkpoint or restore its predecessor left running. */
const SETTLE_TIMEOUT_MS = 300_000;

/** Result of one copy of a fork. */
export type ForkResult = { sandbox: Sandbox } | { error: { code: string; message: string } };

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
  private readonly startTimeoutMs: number;
  private readonly reconnectWaitMs: number;
  /** Whether more sandboxes fit, reservations of creates under way, boot slots. */
  private readonly admission: Admission;
  private stopping = false;
  private readonly blobs: BlobStore;
  private readonly workDir: string;
  private readonly maxSnapshotBytes: number;
  private readonly faults: Set<string>;
  /** Intents of lifecycle operations under way, durable (see intents.ts). */
  private readonly journal: Journal;
  /** The last hour of each running sandbox's usage. */
  private readonly usageHistory: UsageHistory;
  private readonly egress: SandboxEgressOptions | undefined;
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

  constructor(opts: SandboxServiceOptions) {
    this.store = opts.store;
    this.driver = new DriverRouter(opts.driver, opts.drivers ?? []);
    this.log = opts.logger;
    this.startTimeoutMs = opts.startTimeoutMs ?? 30_000;
    this.reconnectWaitMs = opts.reconnectWaitMs ?? 10_000;
    this.blobs = opts.blobs;
    this.workDir = opts.workDir;
    this.maxSnapshotBytes = opts.maxSnapshotBytes ?? 32 * 1024 ** 3;
    this.faults = new Set(opts.faults ?? []);
    this.journal = new Journal(this.store);
    this.usageHistory = new UsageHistory(
      { running: async () => (await this.store.sandboxesInStates(['running'])).map((s) => ({ id: s.id, cpu: s.cpu })), usage: (id) => this.driver.usage(id) },
      opts.usageSampleMs ?? 5000,
    );
    this.egress = opts.egress;
    const totalMb = Math.floor(totalmem() / 1048576);
    this.admission = new Admission(this.store, () => this.pool, {
      maxSandboxes: opts.maxSandboxes ?? 64,
      maxMemoryMb: opts.maxMemoryMb ?? totalMb * 2,
      poolMinAvailableMb: opts.poolMinAvailableMb ?? Math.floor(totalMb / 10),
      maxConcurrentCreates: opts.maxConcurrentCreates ?? Math.max(2, availableParallelism()),
      maxQueuedCreates: opts.maxQueuedCreates ?? 256,
    });
    this.templates = new TemplateService({
      store: this.store,
      rootfs: opts.rootfs,
      imagesDir: opts.imagesDir,
      uploadsDir: opts.uploadsDir,
      ...(opts.builtinPools ? { builtinPools: opts.builtinPools } : {}),
      images: this.templateImages(),
      capture: (t, rootfs, key, progress, signal) => this.captureTemplate(t, rootfs, key, progress, signal),
      inUse: async (tenantId, name) => (await this.store.sandboxesInStates(['starting', 'running', 'paused', 'hibernated'])).filter((x) => x.tenantId === tenantId && x.template === name).length,
      driverVersion: () => this.driver.version(),
    });
    this.templates.onChange = (t) => this.preparePool(t);
    this.pool = new WarmPool(
      {
        fill: (t) => this.fillPool(t),
        discard: (id) => {
          const p = this.discardPooled(id);
          this.inBackground(p);
          return p;
        },
        hasRoom: (mb) => this.admission.hasRoom(1, mb),
        underPressure: () => this.admission.underPressure(),
        alive: (id) => !!this.live.get(id)?.openChannel,
      },
      this.log,
    );
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

  private fault(point: string): void {
    if (this.faults.has(point)) {
      this.log.error({ point }, 'fault injected: killing the daemon');
      process.kill(process.pid, 'SIGKILL');
    }
  }

  /** Fault injection while `p` runs (a runtime operation under way): the daemon dies 25 ms into it. */
  private during<T>(point: string, p: Promise<T>): Promise<T> {
    if (this.faults.has(point)) setTimeout(() => this.fault(point), 25);
    return p;
  }

  /**
   * Prepares the driver, finishes or undoes the operations a crash interrupted (the journal),
   * re-adopts sandboxes that still run, restores the others from their newest snapshot (dead
   * only without one), finishes interrupted creates, and removes what no sandbox owns.
   */
  async start(): Promise<void> {
    this.driver.bind({ agentConnected: (id, s) => this.onAgent(id, s) });
    await this.driver.init();
    await this.templates.start();
    // `minimal` needs no download: have it ready (its image follows in the background).
    await this.templates.rootfsOf(await this.templates.resolve('', 'minimal'));
    await fs.mkdir(this.workDir, { recursive: true, mode: 0o700 });
    // Operations a crash interrupted: each is finished or undone first, from what the journal
    // and the runtime say (checkpoint images in the work directory included).
    const intents = await this.journal.list();
    const settled = new Set<string>();
    for (const intent of intents) {
      const sb = await this.store.getSandbox(intent.sandboxId);
      if (sb && !TERMINAL_STATES.includes(sb.state) && !settled.has(sb.id) && (await this.reconcile(sb, intent))) settled.add(sb.id);
      await this.journal.done(intent);
      if (intent.imageDir) await fs.rm(intent.imageDir, { recursive: true, force: true });
    }
    // Whatever else is in the work directory (unpacked snapshots) belonged to finished or undone operations.
    await fs.rm(this.workDir, { recursive: true, force: true });
    await fs.mkdir(this.workDir, { recursive: true, mode: 0o700 });
    const hibernated = await this.store.sandboxesInStates(['hibernated']);
    for (const sb of hibernated) if (!settled.has(sb.id)) this.schedule(sb);
    const active = await this.store.sandboxesInStates(['starting', 'running', 'paused']);
    const known = new Set([...active, ...hibernated].map((s) => s.id));
    for (const sb of active) {
      if (settled.has(sb.id)) continue;
      if (sb.state === 'starting') {
        await this.finishCreate(sb);
        continue;
      }
      let alive = false;
      try {
        // A sandbox of a driver this daemon no longer runs cannot be adopted (nor recovered: it ends dead, saying why).
        this.driver.assign(sb.id, sb.driver);
        alive = await this.adoptRunning(sb);
      } catch (err) {
        this.log.warn({ err, sandboxId: sb.id }, 'adopt failed');
      }
      if (alive) {
        this.log.info({ sandboxId: sb.id }, 're-adopted running sandbox');
      } else if (sb.lastSnapshotId) {
        // Restores it from its last snapshot, or marks it dead if that fails.
        await this.recover(sb, 'the sandbox was gone when the daemon started');
      } else {
        const st = await this.driver.status(sb.id).catch(() => ({ running: false, reason: undefined, detail: undefined }));
        await this.driver.destroy(sb.id).catch((err) => this.log.error({ err, sandboxId: sb.id }, 'cleanup of dead sandbox failed'));
        await this.end(sb.id, 'dead', st.reason ?? 'lost', st.detail ?? 'the sandbox was gone when the daemon started');
      }
    }
    // States as recovery left them (one read).
    const stateNow = new Map((await this.store.sandboxesInStates(['running', 'paused', 'hibernated'])).map((s) => [s.id, s.state]));
    for (const id of await this.driver.list()) {
      if (!known.has(id)) {
        this.log.warn({ sandboxId: id }, 'removing orphaned runtime sandbox');
        await this.driver.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'orphan removal failed'));
      } else if (stateNow.get(id) === 'hibernated') {
        // A hibernated sandbox holds nothing on the host; a crash may have cut its release short.
        await this.driver.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'releasing a hibernated sandbox failed'));
      } else if (stateNow.has(id)) {
        await this.driver.releaseStale(id).catch((err) => this.log.warn({ err, sandboxId: id }, 'releasing stale incarnations failed'));
      }
    }
    for (const t of await this.templates.all()) if (t.poolSize > 0 || (t.tenantId === '' && t.name === 'minimal')) this.preparePool(t);
    this.usageHistory.start();
  }

  /**
   * Sizes the template's pool (a refill takes the image first if it has none) and, for a
   * template without a pool, has its image taken in the background for the next create.
   */
  private preparePool(t: Template): void {
    if (this.stopping || t.state !== 'ready') return;
    this.pool.configure(t);
    if (t.poolSize > 0 || !this.templates.rootfsReady(t)) return;
    void (async () => {
      if (!(await this.templates.usableImage(t))) await this.templates.captureImage(t);
    })().catch((err) => this.log.warn({ err, template: t.name }, 'taking the template snapshot failed'));
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
   * Creates a sandbox; resolves when its agent answers. It is taken from the template's warm
   * pool if one is ready (and the request has the pool's size), restored from the template's
   * image otherwise, or booted when the template has no image yet.
   */
  async create(tenantId: string, opts: CreateSandboxOpts, signal?: AbortSignal): Promise<Sandbox> {
    if (this.stopping) throw new SpaceError('DAEMON_SHUTTING_DOWN');
    const t = await this.templates.resolve(tenantId, opts.template ?? 'minimal');
    const cpu = range('cpu', opts.cpu);
    const memoryMb = range('memoryMb', opts.memoryMb);
    const timeoutMs = range('timeoutMs', opts.timeoutMs);
    const env = checkMap('env', opts.env, LIMITS.envEntries);
    const metadata = checkMap('metadata', opts.metadata, LIMITS.metadataEntries);
    const driver = this.driver.get(opts.driver).name;
    const idleTimeoutMs = opts.idleTimeoutMs ?? 0;
    if (!Number.isInteger(idleTimeoutMs) || (idleTimeoutMs !== 0 && (idleTimeoutMs < 1000 || idleTimeoutMs > LIMITS.timeoutMs.max))) {
      throw new SpaceError('INVALID_LIMITS', `idleTimeoutMs must be 0 (never) or between 1000 and ${LIMITS.timeoutMs.max}; got ${idleTimeoutMs}`, { details: { field: 'idleTimeoutMs' } });
    }
    if ((opts.egress !== undefined || opts.secrets !== undefined || opts.headers !== undefined) && !this.egress) throw new SpaceError('EGRESS_UNAVAILABLE', 'This daemon runs sandboxes without a network (--egress off): egress policies and secrets are not available');
    const egress = this.egress ? checkEgressPolicy(opts.egress ?? DEFAULT_EGRESS_POLICY) : undefined;
    const secrets = this.egress && opts.secrets !== undefined ? await this.egress.secrets.attach(tenantId, opts.secrets, []) : undefined;
    const headerRules = opts.headers !== undefined ? checkHeaderRules(opts.headers) : [];
    const trust = this.egress ? await this.egress.trust(tenantId) : undefined;
    const t0 = performance.now();
    const fullEnv = this.envOf(t.env, env, secrets);
    // A pooled sandbox already counts against the node: taking one needs no admission.
    const poolable = cpu === LIMITS.cpu.default && memoryMb === POOL_MEMORY_MB && driver === this.driver.name;
    let pooled = poolable ? this.pool.take(t) : undefined;
    let identityMs = 0;
    if (pooled && (Object.keys(env).length || trust)) {
      const tI = performance.now();
      try {
        await sendIdentity(this.live.get(pooled)!.channel!, pooled, { env: fullEnv, ...(trust ? { trust } : {}) });
        identityMs = Math.round(performance.now() - tI);
      } catch (err) {
        this.log.warn({ err, sandboxId: pooled }, 'pooled sandbox refused its identity; restoring instead');
        this.inBackground(this.discardPooled(pooled));
        pooled = undefined;
      }
    }
    if (!pooled) await this.admission.admit(1, memoryMb);
    // Reserve in the same synchronous step as the check, so concurrent creates cannot all pass it.
    const reservation = this.admission.reserve(1, memoryMb);
    const id = pooled ?? newSandboxId();
    const rules = headerRules.length ? await this.requireEgress().secrets.setRules(tenantId, id, headerRules) : [];
    const sb = newSandboxRecord({
      id,
      tenantId,
      template: t.name,
      driver,
      cpu,
      memoryMb,
      timeoutMs,
      env,
      metadata,
      ...(opts.onTimeout === 'hibernate' ? { onTimeout: 'hibernate' as const } : {}),
      idleTimeoutMs,
      ...(egress ? { egress } : {}),
      secrets: [...(secrets ?? []), ...rules],
    });
    reservation.track(sb.id);
    let release: (() => void) | undefined;
    try {
      // Stored as `starting`: the record is the create's intent (a restart finishes the create).
      await this.store.insertSandbox(sb);
      this.fault('create:after-record');
      let timings: CreateTimings;
      if (pooled) {
        timings = { source: 'pool', queueMs: 0, agentMs: 0, identityMs, totalMs: Math.round(performance.now() - t0) };
      } else {
        // Starts run at most `maxConcurrentCreates` at a time; the rest wait their turn here.
        release = await this.admission.slot();
        const queueMs = Math.round(performance.now() - t0);
        try {
          timings = { queueMs, ...(await this.during('create:during-start', this.startSandbox(t, sb, fullEnv, trust, signal))), totalMs: 0 };
        } catch (err) {
          this.log.error({ err, sandboxId: sb.id }, 'sandbox failed to start');
          await this.driver.destroy(sb.id).catch(() => {});
          await this.end(sb.id, 'dead', 'start-failed', err instanceof Error ? err.message : String(err));
          this.live.delete(sb.id);
          if (err instanceof SpaceError) throw err;
          throw new SpaceError('DRIVER_FAILED', `Sandbox failed to start: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
        }
        timings.totalMs = Math.round(performance.now() - t0);
      }
      const running = await this.store.updateSandbox(sb.id, { state: 'running', startedAt: new Date().toISOString(), createTimings: timings });
      this.arm(running);
      this.log.info({ sandboxId: sb.id, tenantId, template: t.name, ...timings }, 'sandbox running');
      return running;
    } finally {
      release?.();
      reservation.release();
    }
  }

  /**
   * Starts `sb` from its template: restores the template's image when it has a current one
   * (falling back to a boot if the restore fails), boots otherwise and has the image taken in
   * the background for the next create.
   */
  private async startSandbox(t: Template, sb: Sandbox, env: Record<string, string>, trust: string | undefined, signal?: AbortSignal): Promise<Omit<CreateTimings, 'queueMs' | 'totalMs'>> {
    // Template snapshots are taken on the default driver; another driver boots from the root file system.
    const onDefault = sb.driver === this.driver.name;
    if (!onDefault && t.start) throw new SpaceError('TEMPLATE_NOT_ON_DRIVER', `Template ${t.name} has a start command, whose snapshot exists for the default driver (${this.driver.name}) only; create it without driver`, { details: { field: 'driver' } });
    let image = onDefault ? await this.templates.usableImage(t) : undefined;
    // A start command must have run: without a current image, take one first.
    if (!image && t.start) image = (await this.templates.captureImage(t)).image;
    const rootfs = await this.templates.rootfsOf(t);
    const spec = { id: sb.id, template: t.name, rootfs, cpu: sb.cpu, memoryMb: sb.memoryMb, env, driver: sb.driver };
    if (image) {
      try {
        return await this.restoreTemplate(image, spec, trust, signal);
      } catch (err) {
        if (t.start) throw err;
        this.log.warn({ err, sandboxId: sb.id, template: t.name }, 'restoring the template image failed; booting instead');
        await this.driver.destroy(sb.id).catch(() => {});
      }
    } else if (!this.stopping && onDefault) this.preparePool(t);
    const connected = this.waitAgent(sb.id, this.bootTimeout(sb.driver));
    const tA = performance.now();
    await this.driver.create(spec, signal);
    const tB = performance.now();
    const ch = await connected;
    if (!ch) throw new SpaceError('TIMEOUT', `The sandbox agent did not connect within ${this.bootTimeout(sb.driver)} ms`);
    const agentMs = Math.round(performance.now() - tB);
    if (!trust) return { source: 'boot', bootMs: Math.round(tB - tA), agentMs, identityMs: 0 };
    const tI = performance.now();
    await sendIdentity(ch, sb.id, { trust });
    return { source: 'boot', bootMs: Math.round(tB - tA), agentMs, identityMs: Math.round(performance.now() - tI) };
  }

  /** Restores a new sandbox from a template image and gives its agent the sandbox's identity. */
  private async restoreTemplate(image: TemplateImage, spec: DriverCreateSpec, trust: string | undefined, signal?: AbortSignal): Promise<Omit<CreateTimings, 'queueMs' | 'totalMs'>> {
    const e = this.entry(spec.id);
    e.restoringFrom = image.sourceId;
    e.identity = { hostname: spec.id, env: spec.env, ...(trust ? { trust } : {}) };
    e.identityMs = 0;
    try {
      const connected = this.waitAgent(spec.id, this.bootTimeout(spec.driver));
      const tA = performance.now();
      await this.driver.restore(spec, this.templates.imageDir(image), signal);
      const tB = performance.now();
      if (!(await connected)) throw new SpaceError('TIMEOUT', `The agent of ${spec.id} did not connect within ${this.bootTimeout(spec.driver)} ms after restoring the template image`);
      const identityMs = e.identityMs ?? 0;
      // The agent may connect (and take its identity) before runsc's restore command returns.
      return { source: 'snapshot', restoreMs: Math.round(tB - tA), agentMs: Math.max(0, Math.round(performance.now() - tB - identityMs)), identityMs };
    } finally {
      e.restoringFrom = undefined;
      e.identity = undefined;
    }
  }

  /** Restores one unassigned sandbox for a template's warm pool. */
  private fillPool(t: Template): Promise<string> {
    return this.transientWork(this.fillPoolNow(t));
  }

  private async fillPoolNow(t: Template): Promise<string> {
    if (this.stopping) throw new SpaceError('DAEMON_SHUTTING_DOWN');
    const cur = (await this.templates.usableImage(t)) ? t : await this.templates.captureImage(t);
    const id = newSandboxId();
    const release = await this.admission.slot();
    try {
      await this.restoreTemplate(cur.image!, { id, template: t.name, rootfs: await this.templates.rootfsOf(t), cpu: LIMITS.cpu.default, memoryMb: POOL_MEMORY_MB, env: t.env }, undefined, this.stopAc.signal);
      this.stopAc.signal.throwIfAborted();
      return id;
    } catch (err) {
      await this.discardPooled(id);
      throw err;
    } finally {
      release();
    }
  }

  private async discardPooled(id: string): Promise<void> {
    const e = this.live.get(id);
    if (e) e.killing = true;
    e?.channel?.destroy();
    this.live.delete(id);
    await this.driver.destroy(id);
  }

  /**
   * Template images at rest: packed like snapshots (the default driver's image codec included)
   * into the blob store under the template's tenant, so they are encrypted with its key and
   * deduplicated with its snapshots.
   */
  private templateImages(): TemplateImageStore {
    return {
      save: async (t, image, dir) => {
        const { stream } = await packSnapshot(
          dir,
          { id: image.key, sandboxId: image.sourceId, tenantId: t.tenantId || '_builtin', template: t.name, driver: this.driver.name, driverVersion: await this.driver.version(), createdAt: image.createdAt },
          this.driver.codecOf(this.driver.name),
        );
        await this.blobs.put(templateImageBlobKey(t.tenantId, image.key), stream);
      },
      load: async (t, image, dir) => {
        const key = templateImageBlobKey(t.tenantId, image.key);
        if (!(await this.blobs.stat(key))) return false;
        try {
          await readSnapshot(image.key, await this.blobs.get(key), dir, this.maxSnapshotBytes, (name) => this.driver.codecNamed(name));
          return true;
        } catch (err) {
          if (err instanceof SpaceError && (err.code === 'KEY_REVOKED' || err.code === 'KEY_DESTROYED')) throw err;
          this.log.warn({ err, template: t.name, tenantId: t.tenantId }, 'the stored template image is unusable; it will be taken again');
          return false;
        }
      },
      drop: (t, image) => this.blobs.delete(templateImageBlobKey(t.tenantId, image.key)),
    };
  }

  /**
   * Boots a template once, runs its start command until ready, and checkpoints it into the
   * image `key`. The sandbox is removed afterwards; a failure leaves no image.
   */
  private captureTemplate(t: Template, rootfs: string, key: string, progress: Progress, signal?: AbortSignal): Promise<TemplateImage> {
    if (this.stopping) return Promise.reject(new SpaceError('DAEMON_SHUTTING_DOWN'));
    return this.transientWork(this.captureTemplateNow(t, rootfs, key, progress, signal ? AbortSignal.any([signal, this.stopAc.signal]) : this.stopAc.signal));
  }

  private async captureTemplateNow(t: Template, rootfs: string, key: string, progress: Progress, signal: AbortSignal): Promise<TemplateImage> {
    const id = newSandboxId();
    const dir = this.templates.imageDir({ key } as TemplateImage);
    const tmp = `${dir}.tmp-${id}`;
    const t0 = performance.now();
    const release = await this.admission.slot();
    try {
      progress(0, 'booting the template');
      const connected = this.waitAgent(id, this.bootTimeout(undefined));
      await this.driver.create({ id, template: t.name, rootfs, cpu: LIMITS.cpu.default, memoryMb: POOL_MEMORY_MB, env: t.env }, signal);
      const ch = await connected;
      if (!ch) throw new SpaceError('TIMEOUT', `The template's agent did not connect within ${this.bootTimeout(undefined)} ms`);
      if (t.start) await this.startAndWait(ch, t.start, progress, signal);
      signal.throwIfAborted();
      progress(80, 'taking the template snapshot');
      await this.assertSnapshottable(ch, id, `template ${t.name}`);
      await this.quiesceAndCheckpoint(id, ch, tmp, false);
      await fs.writeFile(path.join(tmp, '.space-complete'), new Date().toISOString());
      await fs.rm(dir, { recursive: true, force: true });
      await fs.rename(tmp, dir);
      progress(100, 'template snapshot taken');
      let sizeBytes = 0;
      for (const f of await fs.readdir(dir)) sizeBytes += (await fs.stat(path.join(dir, f))).size;
      return { key, sourceId: id, sizeBytes, captureMs: Math.round(performance.now() - t0), createdAt: new Date().toISOString() };
    } finally {
      release();
      await fs.rm(tmp, { recursive: true, force: true });
      this.live.get(id)?.channel?.destroy();
      this.live.delete(id);
      // runsc takes a second or two to let go of a checkpointed container.
      this.inBackground(this.driver.destroy(id));
    }
  }

  /** Runs a template's start command in the background and waits for its ready command to succeed. */
  private async startAndWait(ch: AgentChannel, start: TemplateStart, progress: Progress, signal?: AbortSignal): Promise<void> {
    progress(30, `starting: ${start.cmd.slice(0, 60)}`);
    const call = ch.call({ op: 'exec', shell: start.cmd, background: true });
    const { pid } = (await call.reply) as { pid: number };
    call.cancel('background');
    if (!start.readyCmd) return;
    progress(40, `waiting for: ${start.readyCmd.slice(0, 60)}`);
    const deadline = Date.now() + start.readyTimeoutMs;
    for (;;) {
      signal?.throwIfAborted();
      const ready = await this.runToExit(ch, start.readyCmd, Math.min(10_000, start.readyTimeoutMs));
      if (ready.exitCode === 0) return;
      const procs = ((await ch.unary({ op: 'ps' })).processes ?? []) as { pid: number; running: boolean; exitCode: number | null }[];
      const p = procs.find((x) => x.pid === pid);
      if (!p || !p.running) {
        const out = await this.outputOf(ch, pid);
        throw new SpaceError('TEMPLATE_START_FAILED', `The start command exited (code ${p?.exitCode ?? '?'}) before "${start.readyCmd}" succeeded${out ? `; its last output: ${out}` : ''}`, { details: { step: 'start' } });
      }
      if (Date.now() >= deadline) throw new SpaceError('TEMPLATE_START_TIMEOUT', `"${start.readyCmd}" did not succeed within ${start.readyTimeoutMs} ms of starting "${start.cmd}" (last exit code ${ready.exitCode}${ready.output ? `, output: ${ready.output}` : ''})`, { details: { step: 'ready' } });
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** Runs a shell command to completion; its exit code and the end of its output. */
  private async runToExit(ch: AgentChannel, shell: string, timeoutMs: number): Promise<{ exitCode: number | null; output: string }> {
    const call = ch.call({ op: 'exec', shell, timeoutMs });
    await call.reply;
    let output = '';
    for await (const c of call.output()) output = (output + c.data.toString()).slice(-500);
    const done = await call.done;
    return { exitCode: typeof done.exitCode === 'number' ? done.exitCode : null, output: output.trim() };
  }

  /** The kept output of a finished background process. */
  private async outputOf(ch: AgentChannel, pid: number): Promise<string> {
    try {
      const call = ch.call({ op: 'attach', pid });
      await call.reply;
      let out = '';
      for await (const c of call.output()) out = (out + c.data.toString()).slice(-500);
      return out.trim();
    } catch {
      return '';
    }
  }

  /** The environment of a sandbox's processes: template, request, proxy settings, placeholders. */
  private envOf(templateEnv: Record<string, string>, env: Record<string, string>, secrets: SecretAttachment[] | undefined): Record<string, string> {
    return { ...templateEnv, ...env, ...(this.egress?.env ?? {}), ...Object.fromEntries((secrets ?? []).filter((a) => !a.rule).map((a) => [a.name, a.placeholder])) };
  }

  private requireEgress(): SandboxEgressOptions {
    if (!this.egress) throw new SpaceError('EGRESS_UNAVAILABLE', 'This daemon runs sandboxes without a network (--egress off)');
    return this.egress;
  }

  /** Replaces a sandbox's egress policy; the proxy applies it from the next request on. */
  setEgress(tenantId: string, id: string, policy: unknown): Promise<Sandbox> {
    this.requireEgress();
    const egress = checkEgressPolicy(policy);
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'setEgress');
      return this.store.updateSandbox(id, { egress });
    });
  }

  /**
   * Attaches secrets to a running sandbox: each gets a placeholder, in an env var of its name
   * for every process started from now on. The proxy swaps it from the next request on.
   */
  attachSecrets(tenantId: string, id: string, names: unknown): Promise<Sandbox> {
    const eg = this.requireEgress();
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'attachSecrets');
      if (sb.state !== 'running') throw new SpaceError('SANDBOX_INVALID_STATE', `Secrets are attached to running sandboxes; ${id} is ${sb.state}: resume or wake it first`);
      const secrets = await eg.secrets.attach(tenantId, names, sb.secrets ?? []);
      const updated = await this.store.updateSandbox(id, { secrets });
      await this.pushEnv(updated);
      return updated;
    });
  }

  /** Detaches a secret: from the next request on, the proxy no longer swaps its placeholder. */
  detachSecret(tenantId: string, id: string, name: string): Promise<Sandbox> {
    this.requireEgress();
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      if (!(sb.secrets ?? []).some((a) => a.name === name)) throw new SpaceError('SECRET_NOT_FOUND', `Secret ${JSON.stringify(name)} is not attached to ${id}`, { details: { name } });
      const updated = await this.store.updateSandbox(id, { secrets: (sb.secrets ?? []).filter((a) => a.name !== name) });
      if (updated.state === 'running') await this.pushEnv(updated).catch((err) => this.log.warn({ err, sandboxId: id }, 'could not update the environment after detaching a secret'));
      return updated;
    });
  }

  /**
   * Replaces a sandbox's header rules (request headers the proxy sets for some hosts); an
   * empty list removes them. Applied from the next request on.
   *
   * @example
   * await svc.setHeaderRules('tenant1', id, [{ hosts: ['api.example.com'], header: 'Authorization', value: 'Bearer sk-…' }]);
   */
  setHeaderRules(tenantId: string, id: string, rules: unknown): Promise<Sandbox> {
    const eg = this.requireEgress();
    const checked = checkHeaderRules(rules);
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'setHeaderRules');
      const kept = (sb.secrets ?? []).filter((a) => !a.rule);
      const added = checked.length ? await eg.secrets.setRules(tenantId, id, checked) : (await eg.secrets.removeOwned(tenantId, id), []);
      return this.store.updateSandbox(id, { secrets: [...kept, ...added] });
    });
  }

  /** Gives the agent the sandbox's current environment (for processes started afterwards). */
  private async pushEnv(sb: Sandbox): Promise<void> {
    const t = await this.templates.resolve(sb.tenantId, sb.template).catch(() => undefined);
    await this.withChannel(sb.id, (ch) => sendIdentity(ch, sb.id, { env: this.envOf(t?.env ?? {}, sb.env, sb.secrets) }));
  }

  /** What the egress proxy needs of a live sandbox (undefined once it has ended). */
  async egressContext(id: string): Promise<{ sandboxId: string; tenantId: string; policy: EgressPolicy; secrets: SecretAttachment[] } | undefined> {
    const sb = await this.store.getSandbox(id);
    if (!sb || TERMINAL_STATES.includes(sb.state)) return undefined;
    return { sandboxId: sb.id, tenantId: sb.tenantId, policy: sb.egress ?? DEFAULT_EGRESS_POLICY, secrets: sb.secrets ?? [] };
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
      this.schedule(updated);
      return updated;
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
    return (await this.store.sandboxesInStates(['running', 'paused', 'hibernated'])).map((s) => ({ id: s.id, tenantId: s.tenantId }));
  }

  /** Gets a tenant's sandbox. */
  async get(tenantId: string, id: string): Promise<Sandbox> {
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

  /** Kills a sandbox and frees everything it had on the host. */
  async kill(tenantId: string, id: string): Promise<Sandbox> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, 'kill');
    return this.terminate(sb.id, 'killed', 'killed', 'killed on request');
  }

  /** Opens a call to the sandbox's agent after checking tenancy and state. */
  async call(tenantId: string, id: string, action: SandboxAction, req: AgentRequest): Promise<AgentCall> {
    const sb = await this.awake(tenantId, id, action);
    return this.withChannel(sb.id, (ch) => ch.call(req));
  }

  /**
   * Runs `use` on the sandbox's agent channel once no checkpoint is under way, in the same
   * tick as that check: a call can never slip in between a snapshot's "no open calls" check
   * and its quiesce (which would cut it).
   */
  private async withChannel<T>(id: string, use: (ch: AgentChannel) => T): Promise<T> {
    for (;;) {
      const gate = this.live.get(id)?.gate;
      if (gate) {
        await gate;
        continue;
      }
      const ch = await this.channel(id);
      if (!this.live.get(id)?.gate) return use(ch);
    }
  }

  /** Checks the action against the state; a hibernated sandbox is woken first (on demand). */
  private async awake(tenantId: string, id: string, action: SandboxAction): Promise<Sandbox> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, action);
    this.entry(id).lastActive = Date.now();
    if (sb.state === 'hibernated') return this.wake(tenantId, id);
    return sb;
  }

  /** Hibernates a sandbox once no API call has touched it for `idleTimeoutMs`. */
  private scheduleIdle(sb: Sandbox): void {
    const e = this.entry(sb.id);
    clearTimeout(e.idleTimer);
    if (!sb.idleTimeoutMs || this.stopping) return;
    e.lastActive ??= Date.now();
    const due = e.lastActive + sb.idleTimeoutMs - Date.now();
    e.idleTimer = setTimeout(async () => {
      const cur = await this.store.getSandbox(sb.id);
      if (!cur || cur.state !== 'running') return;
      if (Date.now() - (e.lastActive ?? 0) < sb.idleTimeoutMs!) return this.scheduleIdle(cur);
      await this.event(sb.id, 'idle', `no API call for ${sb.idleTimeoutMs} ms: hibernating`);
      await this.hibernate(cur.tenantId, cur.id).catch((err) => this.log.error({ err, sandboxId: sb.id }, 'idle hibernate failed'));
    }, Math.max(0, due));
    e.idleTimer.unref();
  }

  /** A unary agent call (stat, list, mkdir, ...). */
  async unary(tenantId: string, id: string, action: SandboxAction, req: AgentRequest, timeoutMs = 30_000): Promise<Record<string, unknown>> {
    const sb = await this.awake(tenantId, id, action);
    return this.withChannel(sb.id, (ch) => ch.unary(req, timeoutMs));
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

  /** Host resources of a sandbox. */
  async usage(tenantId: string, id: string) {
    const sb = await this.get(tenantId, id);
    if (TERMINAL_STATES.includes(sb.state)) return { rssBytes: 0 };
    return this.driver.usage(sb.id);
  }


  // ---------------------------------------------------------------- stateful sessions

  /** Runs `fn` after every earlier lifecycle action on the same sandbox has finished. */
  private withLock<T>(id: string, fn: () => Promise<T>): Promise<T> {
    return this.entry(id).withLock(fn);
  }

  private async event(sandboxId: string, type: string, message: string): Promise<void> {
    const ev: SandboxEvent = { sandboxId, at: new Date().toISOString(), type, message };
    await this.store.insertEvent(ev).catch((err) => this.log.error({ err, sandboxId }, 'event not recorded'));
    this.log.info({ sandboxId, event: type }, message);
  }

  /** A sandbox's event log, oldest first. */
  async events(tenantId: string, id: string): Promise<SandboxEvent[]> {
    await this.get(tenantId, id);
    return this.store.listEvents(id, 500);
  }

  /** Freezes a running sandbox in memory (no disk). */
  pause(tenantId: string, id: string): Promise<Sandbox> {
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'pause');
      await this.driver.pause(id);
      await this.event(id, 'paused', 'paused in memory');
      return this.store.updateSandbox(id, { state: 'paused' });
    });
  }

  /** Unfreezes a paused sandbox. */
  resume(tenantId: string, id: string): Promise<Sandbox> {
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'resume');
      await this.driver.resume(id);
      await this.event(id, 'resumed', 'resumed');
      return this.store.updateSandbox(id, { state: 'running' });
    });
  }

  /** Takes a snapshot now; the sandbox keeps running (it is stopped for the checkpoint's duration). */
  snapshot(tenantId: string, id: string, opts: { name?: string } = {}): Promise<Snapshot> {
    if (opts.name !== undefined && (typeof opts.name !== 'string' || opts.name.length > 128)) throw new SpaceError('BAD_REQUEST', 'Snapshot name must be a string of at most 128 characters');
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'snapshot');
      const { snapshot, imageDir } = await this.takeSnapshot(sb, 'manual', opts.name, true);
      await fs.rm(imageDir, { recursive: true, force: true });
      return snapshot;
    });
  }

  /** A sandbox's snapshots, oldest first. */
  async snapshots(tenantId: string, id: string): Promise<Snapshot[]> {
    await this.get(tenantId, id);
    return this.store.listSnapshots(id);
  }

  /** A tenant's snapshot by id; another tenant's is as unknown as a missing one. */
  async getSnapshot(tenantId: string, snapshotId: string): Promise<Snapshot> {
    const snap = typeof snapshotId === 'string' && snapshotId.length < 64 ? await this.store.getSnapshot(snapshotId) : undefined;
    if (!snap || snap.tenantId !== tenantId) throw new SpaceError('SNAPSHOT_NOT_FOUND', `No snapshot ${JSON.stringify(snapshotId)} for this API key`, { details: { snapshotId } });
    return snap;
  }

  /**
   * Deletes one snapshot. The snapshot a hibernated sandbox sleeps in holds its state and is
   * refused (`SANDBOX_INVALID_STATE`); deleting a running sandbox's newest snapshot makes the
   * one before it the point a crash recovers to.
   *
   * @example
   * await svc.removeSnapshot('tenant1', 'sn0123456789abcdefgh');
   */
  async removeSnapshot(tenantId: string, snapshotId: string): Promise<void> {
    const snap = await this.getSnapshot(tenantId, snapshotId);
    await this.withLock(snap.sandboxId, async () => {
      const sb = await this.get(tenantId, snap.sandboxId);
      if (sb.lastSnapshotId === snap.id && sb.state === 'hibernated') throw new SpaceError('SANDBOX_INVALID_STATE', `Snapshot ${snap.id} holds hibernated sandbox ${sb.id}: wake or kill the sandbox first`);
      if (sb.lastSnapshotId === snap.id) {
        const rest = (await this.store.listSnapshots(sb.id)).filter((x) => x.id !== snap.id);
        await this.store.updateSandbox(sb.id, { lastSnapshotId: rest.at(-1)?.id });
      }
      await this.deleteSnapshot(snap);
      await this.event(sb.id, 'snapshot-deleted', `snapshot ${snap.id} deleted`);
    });
  }

  /** Saves the whole sandbox to a snapshot and releases every host resource. */
  hibernate(tenantId: string, id: string): Promise<Sandbox> {
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'hibernate');
      const t0 = Date.now();
      const { snapshot, imageDir, intent } = await this.takeSnapshot(sb, 'hibernate', undefined, false);
      await fs.rm(imageDir, { recursive: true, force: true });
      this.fault('hibernate:after-snapshot');
      const e = this.entry(id);
      clearTimeout(e.policyTimer);
      clearTimeout(e.idleTimer);
      await this.driver.retire(id);
      e.quiescing = false;
      await this.event(id, 'hibernated', `hibernated to snapshot ${snapshot.id} in ${Date.now() - t0} ms`);
      const r = await this.store.updateSandbox(id, { state: 'hibernated' });
      await this.journal.done(intent);
      return r;
    });
  }

  /** Restores a hibernated sandbox from its snapshot. */
  wake(tenantId: string, id: string): Promise<Sandbox> {
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'wake');
      const snap = sb.lastSnapshotId ? await this.store.getSnapshot(sb.lastSnapshotId) : undefined;
      if (!snap) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Sandbox ${id} has no snapshot to wake from`);
      const t0 = Date.now();
      const intent = await this.journal.begin(id, 'wake', { step: 'restore', snapshotId: snap.id });
      this.fault('wake:after-intent');
      try {
        await this.during('wake:during-restore', this.restoreFrom(snap, sb));
      } catch (err) {
        // Still hibernated in its snapshot: whatever the restore left is removed.
        await this.driver.destroy(id).catch((e) => this.log.warn({ err: e, sandboxId: id }, 'cleanup after a failed wake failed'));
        await this.journal.done(intent);
        throw err;
      }
      this.fault('wake:after-restore');
      await this.event(id, 'woken', `woken from snapshot ${snap.id} in ${Date.now() - t0} ms`);
      const woke = await this.markWoken(sb);
      await this.journal.done(intent);
      return woke;
    });
  }

  /** Records a woken sandbox as running; the timeout starts afresh (like creating), or a timeout that hibernated it would fire at once. */
  private async markWoken(sb: Sandbox): Promise<Sandbox> {
    const woke = await this.store.updateSandbox(sb.id, { state: 'running', ...(sb.timeoutMs ? { expiresAt: new Date(Date.now() + sb.timeoutMs).toISOString() } : {}) });
    this.arm(woke);
    return woke;
  }

  /** Rolls a sandbox back to one of its snapshots, in place. The snapshot is verified before anything changes. */
  rollback(tenantId: string, id: string, snapshotId: string): Promise<Sandbox> {
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'rollback');
      const snap = await this.ownSnapshot(sb, snapshotId);
      const intent = await this.journal.begin(id, 'rollback', { step: 'verify', snapshotId: snap.id });
      // Verified (and decrypted) before anything changes: a corrupt snapshot or a revoked key is refused as is.
      const dir = await this.unpack(snap).catch(async (err) => {
        await this.journal.done(intent);
        throw err;
      });
      this.fault('rollback:after-verify');
      try {
        await this.journal.step(intent, 'restore');
        await this.during('rollback:during-restore', this.restoreFrom(snap, sb, dir));
      } catch (err) {
        // A restore that fails now may have lost the old incarnation.
        const msg = err instanceof Error ? err.message : String(err);
        if (!(await this.runtimeRuns(id))) await this.recover(sb, `rollback to ${snap.id} failed: ${msg}`);
        await this.journal.done(intent);
        throw new SpaceError('SNAPSHOT_FAILED', `Rollback of ${id} to ${snap.id} failed: ${msg}`, { cause: err });
      } finally {
        await fs.rm(dir, { recursive: true, force: true });
      }
      this.fault('rollback:after-restore');
      await this.event(id, 'rolled-back', `rolled back to snapshot ${snap.id} (${snap.createdAt})`);
      const r = await this.store.updateSandbox(id, { state: 'running', fromSnapshotId: snap.id });
      this.schedulePolicy(r);
      await this.journal.done(intent);
      return r;
    });
  }

  /**
   * Copies a sandbox into `count` new ones: from a snapshot taken now (the parent keeps
   * running), or from one of its snapshots. Each copy has its own id, socket directory and
   * network namespace, and diverges from then on.
   */
  async fork(tenantId: string, id: string, opts: { count?: number; snapshotId?: string } = {}): Promise<ForkResult[]> {
    const count = opts.count ?? 1;
    if (!Number.isInteger(count) || count < 1 || count > 32) throw new SpaceError('BAD_REQUEST', 'count must be an integer from 1 to 32');
    const parent = await this.get(tenantId, id);
    assertAllowed(parent, 'fork');
    await this.admission.admit(count, parent.memoryMb);
    let snap: Snapshot;
    let imageDir: string;
    if (opts.snapshotId) {
      snap = await this.ownSnapshot(parent, opts.snapshotId);
      imageDir = await this.unpack(snap);
    } else {
      if (parent.state === 'hibernated') throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${id} is hibernated: fork one of its snapshots (snapshotId) or wake it first`);
      ({ snapshot: snap, imageDir } = await this.withLock(id, async () => this.takeSnapshot(await this.get(tenantId, id), 'fork', undefined, true)));
    }
    const reservation = this.admission.reserve(count, parent.memoryMb);
    try {
      const out: ForkResult[] = [];
      for (let i = 0; i < count; i++) {
        const childId = newSandboxId();
        // Placeholders stay valid for the copy (its processes hold the parent's); header rules become its own.
        const childSecrets = parent.secrets && this.egress ? await this.egress.secrets.copyRules(tenantId, parent.secrets, childId) : parent.secrets;
        const child = newSandboxRecord({
          id: childId,
          tenantId,
          template: parent.template,
          driver: parent.driver,
          cpu: parent.cpu,
          memoryMb: parent.memoryMb,
          timeoutMs: parent.timeoutMs,
          env: parent.env,
          metadata: parent.metadata,
          ...(parent.onTimeout ? { onTimeout: parent.onTimeout } : {}),
          ...(parent.egress ? { egress: parent.egress } : {}),
          ...(childSecrets ? { secrets: childSecrets } : {}),
          parentId: parent.id,
          fromSnapshotId: snap.id,
        });
        reservation.track(child.id);
        await this.store.insertSandbox(child);
        this.fault('fork:after-record');
        try {
          await this.during('fork:during-restore', this.restoreFrom(snap, child, imageDir));
          const running = await this.store.updateSandbox(child.id, { state: 'running', startedAt: new Date().toISOString() });
          this.arm(running);
          await this.event(child.id, 'forked', `forked from ${parent.id} at snapshot ${snap.id}`);
          out.push({ sandbox: running });
        } catch (err) {
          await this.driver.destroy(child.id).catch(() => {});
          await this.end(child.id, 'dead', 'start-failed', err instanceof Error ? err.message : String(err));
          const e = err instanceof SpaceError ? err : new SpaceError('DRIVER_FAILED', String(err), { cause: err });
          out.push({ error: { code: e.code, message: e.message } });
        }
      }
      await this.event(parent.id, 'fork', `forked into ${out.filter((r) => 'sandbox' in r).length} of ${count} copies from snapshot ${snap.id}`);
      return out;
    } finally {
      reservation.release();
      await fs.rm(imageDir, { recursive: true, force: true });
    }
  }

  /** Sets (or with `null` removes) the rolling snapshot policy. */
  setSnapshotPolicy(tenantId: string, id: string, policy: SnapshotPolicy | null): Promise<Sandbox> {
    if (policy && (!Number.isInteger(policy.intervalMs) || policy.intervalMs < 1000 || policy.intervalMs > 7 * 86_400_000 || !Number.isInteger(policy.keep) || policy.keep < 1 || policy.keep > 1000)) {
      throw new SpaceError('BAD_REQUEST', 'Snapshot policy needs intervalMs from 1000 to 604800000 and keep from 1 to 1000');
    }
    return this.withLock(id, async () => {
      const sb = await this.get(tenantId, id);
      assertAllowed(sb, 'setPolicy');
      const updated = await this.store.updateSandbox(id, policy ? { snapshotPolicy: { intervalMs: policy.intervalMs, keep: policy.keep } } : { snapshotPolicy: undefined });
      this.schedulePolicy(updated);
      return updated;
    });
  }

  private schedulePolicy(sb: Sandbox): void {
    this.scheduleIdle(sb);
    const e = this.entry(sb.id);
    clearTimeout(e.policyTimer);
    if (!sb.snapshotPolicy || this.stopping) return;
    e.policyTimer = setTimeout(() => void this.scheduledSnapshot(sb.id), sb.snapshotPolicy.intervalMs);
    e.policyTimer.unref();
  }

  /** One tick of the rolling policy: snapshot, expire the oldest scheduled ones, re-arm. A refusal is recorded and retried next tick. */
  private async scheduledSnapshot(id: string): Promise<void> {
    await this.withLock(id, async () => {
      const sb = await this.store.getSandbox(id);
      if (!sb?.snapshotPolicy || sb.state !== 'running' || this.stopping) return;
      // A checkpoint disconnects the agent, which would cut a client's open command stream.
      const open = this.live.get(id)?.channel?.openCalls ?? 0;
      if (open > 0) {
        await this.event(id, 'snapshot-deferred', `scheduled snapshot deferred: ${open} call(s) open; retrying in ${sb.snapshotPolicy.intervalMs} ms`);
        return;
      }
      const release = this.entry(id).closeGate();
      try {
        const { imageDir } = await this.takeSnapshot(sb, 'schedule', undefined, true);
        await fs.rm(imageDir, { recursive: true, force: true });
      } catch (err) {
        const e = err instanceof SpaceError ? err : undefined;
        await this.event(id, 'snapshot-refused', `scheduled snapshot not taken: ${e?.code ?? 'ERROR'}: ${err instanceof Error ? err.message : String(err)}; retrying in ${sb.snapshotPolicy.intervalMs} ms`);
      } finally {
        release();
      }
      const scheduled = (await this.store.listSnapshots(id)).filter((s) => s.trigger === 'schedule');
      for (const old of scheduled.slice(0, Math.max(0, scheduled.length - sb.snapshotPolicy.keep))) await this.deleteSnapshot(old);
    }).catch((err) => this.log.error({ err, sandboxId: id }, 'scheduled snapshot failed'));
    const cur = await this.store.getSandbox(id);
    if (cur && (cur.state === 'running' || cur.state === 'paused')) this.schedulePolicy(cur);
  }

  /** A snapshot of `sb`; another sandbox's (or tenant's) is as unknown as a missing one. */
  private async ownSnapshot(sb: Sandbox, snapshotId: string): Promise<Snapshot> {
    const snap = await this.store.getSnapshot(String(snapshotId));
    if (!snap || snap.sandboxId !== sb.id) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Sandbox ${sb.id} has no snapshot ${JSON.stringify(snapshotId)}`, { details: { snapshotId } });
    return snap;
  }

  private async deleteSnapshot(sn: Snapshot): Promise<void> {
    // Record first, bytes second: a crash in between leaves an unreferenced blob, never a listed snapshot without bytes.
    await this.store.deleteSnapshot(sn.id);
    await this.blobs.delete(sn.blobKey);
  }

  /** How long a start or restore on driver `name` may take until the agent answers (emulated VMs boot slowly). */
  private bootTimeout(name: string | undefined): number {
    return Math.max(this.startTimeoutMs, this.driver.get(name).bootTimeoutMs ?? 0);
  }

  private async spec(sb: Sandbox): Promise<DriverCreateSpec> {
    const t = await this.templates.resolve(sb.tenantId, sb.template);
    return { id: sb.id, template: sb.template, rootfs: await this.templates.rootfsOf(t), cpu: sb.cpu, memoryMb: sb.memoryMb, env: { ...t.env, ...sb.env }, driver: sb.driver };
  }

  /** Refuses (SNAPSHOT_UNSUPPORTED_STATE, naming the process) what this runtime cannot checkpoint; changes nothing. */
  private async assertSnapshottable(ch: AgentChannel, id: string, what: string): Promise<void> {
    if (this.driver.checkpointsAnyStateOf(id)) return;
    const check = await ch.unary({ op: 'snapshot-check' }, 30_000);
    const blockers = (Array.isArray(check.blockers) ? check.blockers : []).slice(0, 20) as { pid?: unknown; command?: unknown; socket?: unknown; reason?: unknown }[];
    if (!blockers.length) return;
    const b = blockers[0]!;
    throw new SpaceError('SNAPSHOT_UNSUPPORTED_STATE', `Cannot snapshot ${what}: process ${String(b.pid)} (${String(b.command).slice(0, 100)}) holds a ${String(b.socket).slice(0, 100)}: ${String(b.reason).slice(0, 200)}. The sandbox keeps running.`, {
      details: { blockers: blockers.map((x) => ({ pid: Number(x.pid), command: String(x.command).slice(0, 200), socket: String(x.socket).slice(0, 200), reason: String(x.reason).slice(0, 200) })) },
    });
  }

  /**
   * Disconnects the agent for good (a unix socket to the host cannot be checkpointed) and
   * checkpoints the sandbox into `imageDir`. Leaves `quiescing` set: the caller restores or retires.
   */
  private async quiesceAndCheckpoint(id: string, ch: AgentChannel, imageDir: string, injectFaults = true): Promise<void> {
    const e = this.entry(id);
    e.quiescing = true;
    await this.driver.detachAgent(id);
    const closed = new Promise<void>((r) => (ch.closed ? r() : ch.once('close', () => r())));
    await ch.unary({ op: 'quiesce' }, 10_000);
    await Promise.race([closed, new Promise((r) => setTimeout(r, 5_000))]);
    ch.destroy();
    e.channel = undefined;
    if (injectFaults) this.fault('snapshot:after-quiesce');
    if (injectFaults && this.faults.has('snapshot:checkpoint-fails')) {
      // What a failed checkpoint does in this runsc: the container is gone.
      await this.driver.destroy(id);
      throw new Error('injected checkpoint failure');
    }
    await this.during(injectFaults ? 'snapshot:during-checkpoint' : '', this.driver.checkpoint(id, imageDir));
  }

  /**
   * Checks the sandbox can be checkpointed, quiesces its agent, checkpoints it, and (when
   * `keepRunning`) restores it at once. The snapshot is stored and listed only when complete.
   * If the checkpoint fails and kills the sandbox, it is restored from its last good snapshot.
   *
   * The operation is journalled: with `keepRunning` its intent is done when this returns;
   * without (hibernate), the caller finishes the returned intent once the sandbox is retired.
   */
  private async takeSnapshot(sb: Sandbox, trigger: SnapshotTrigger, name: string | undefined, keepRunning: boolean): Promise<{ snapshot: Snapshot; imageDir: string; intent: Intent }> {
    const wasPaused = sb.state === 'paused';
    if (wasPaused) await this.driver.resume(sb.id);
    // Refuse before stopping anything if the snapshot could not be stored (e.g. a revoked key).
    await this.blobs.assertWritable?.(`snapshots/${sb.tenantId}/check`).catch(async (err) => {
      if (wasPaused) await this.driver.pause(sb.id);
      throw err;
    });
    const ch = await this.channel(sb.id);
    const release = this.entry(sb.id).closeGate();
    try {
      return await this.takeSnapshotGated(sb, ch, trigger, name, keepRunning, wasPaused);
    } finally {
      release();
    }
  }

  private async takeSnapshotGated(sb: Sandbox, ch: AgentChannel, trigger: SnapshotTrigger, name: string | undefined, keepRunning: boolean, wasPaused: boolean): Promise<{ snapshot: Snapshot; imageDir: string; intent: Intent }> {
    try {
      await this.assertSnapshottable(ch, sb.id, `sandbox ${sb.id}`);
    } catch (err) {
      if (wasPaused) await this.driver.pause(sb.id);
      throw err;
    }
    const id = newSnapshotId();
    const imageDir = path.join(this.workDir, id);
    const e = this.entry(sb.id);
    const intent = await this.journal.begin(sb.id, keepRunning ? 'snapshot' : 'hibernate', { step: 'checkpoint', snapshotId: id, imageDir, trigger, ...(name ? { name } : {}), keepRunning, wasPaused });
    this.fault('snapshot:after-intent');
    const t0 = performance.now();
    try {
      await this.quiesceAndCheckpoint(sb.id, ch, imageDir);
      this.log.debug({ sandboxId: sb.id, ms: Math.round(performance.now() - t0) }, 'checkpointed');
      this.fault('snapshot:after-checkpoint');
    } catch (err) {
      await fs.rm(imageDir, { recursive: true, force: true });
      if (await this.runtimeRuns(sb.id)) {
        // The checkpoint did not happen and the sandbox still runs: let the agent back in.
        await this.driver.adopt(sb.id).catch(() => {});
        e.quiescing = false;
      } else {
        e.quiescing = false;
        await this.recover(sb, `checkpoint failed: ${err instanceof Error ? err.message : String(err)}`);
      }
      await this.journal.done(intent);
      throw new SpaceError('SNAPSHOT_FAILED', `Snapshot of ${sb.id} failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    await this.journal.step(intent, 'checkpointed');
    let downtimeMs = Math.round(performance.now() - t0);
    if (keepRunning) {
      try {
        await this.during('snapshot:during-restore', this.bootFromImage(sb, imageDir));
        this.log.debug({ sandboxId: sb.id, ms: Math.round(performance.now() - t0) }, 'restored');
        if (wasPaused) await this.driver.pause(sb.id);
      } finally {
        e.quiescing = false;
      }
      downtimeMs = Math.round(performance.now() - t0);
      this.fault('snapshot:after-restore');
    }
    let snapshot: Snapshot;
    try {
      snapshot = await this.storeImage(sb, intent, imageDir, downtimeMs);
    } catch (err) {
      // The failure changes nothing of the sandbox: it runs on, or (hibernating) goes on from its image.
      if (!keepRunning) await this.continueFromImage(sb, imageDir, err);
      await fs.rm(imageDir, { recursive: true, force: true });
      await this.journal.done(intent);
      throw err;
    }
    if (keepRunning) await this.journal.done(intent);
    else await this.journal.step(intent, 'stored');
    return { snapshot, imageDir, intent };
  }

  /** A hibernate whose snapshot could not be stored: the sandbox goes on from its checkpoint image. */
  private async continueFromImage(sb: Sandbox, imageDir: string, cause: unknown): Promise<void> {
    this.log.warn({ err: cause, sandboxId: sb.id }, 'the hibernate snapshot could not be stored; the sandbox goes on from its checkpoint');
    const e = this.entry(sb.id);
    try {
      await this.bootFromImage(sb, imageDir);
    } catch (err) {
      e.quiescing = false;
      await this.recover(sb, `storing the hibernate snapshot failed (${cause instanceof Error ? cause.message : String(cause)}) and so did going on from its checkpoint (${err instanceof Error ? err.message : String(err)})`);
      return;
    }
    e.quiescing = false;
  }

  /**
   * Packs a complete checkpoint image into the blob store as the snapshot `intent` names,
   * records it and makes it the sandbox's newest. Idempotent: a snapshot already recorded is
   * returned as it is (recovery may call it twice).
   */
  private async storeImage(sb: Sandbox, intent: Intent, imageDir: string, downtimeMs: number): Promise<Snapshot> {
    const id = intent.snapshotId!;
    const existing = await this.store.getSnapshot(id);
    if (existing) {
      if (sb.lastSnapshotId !== id) await this.store.updateSandbox(sb.id, { lastSnapshotId: id });
      return existing;
    }
    const createdAt = new Date().toISOString();
    const { stream, meta } = await packSnapshot(imageDir, {
      id,
      sandboxId: sb.id,
      tenantId: sb.tenantId,
      template: sb.template,
      driver: sb.driver,
      driverVersion: await this.driver.versionOf(sb.driver),
      ...(sb.fromSnapshotId ? { parentSnapshotId: sb.fromSnapshotId } : {}),
      createdAt,
    }, this.driver.codecOf(sb.driver));
    const blobKey = `snapshots/${sb.tenantId}/${id}`;
    const sizeBytes = await this.blobs.put(blobKey, stream);
    this.fault('snapshot:after-blob');
    const trigger = intent.trigger ?? 'manual';
    const snapshot: Snapshot = {
      id,
      sandboxId: sb.id,
      tenantId: sb.tenantId,
      ...(intent.name ? { name: intent.name } : {}),
      trigger,
      createdAt,
      sizeBytes,
      ...(meta.parentSnapshotId ? { parentSnapshotId: meta.parentSnapshotId } : {}),
      downtimeMs,
      template: sb.template,
      driver: sb.driver,
      blobKey,
    };
    await this.store.insertSnapshot(snapshot);
    this.fault('snapshot:after-record');
    await this.store.updateSandbox(sb.id, { lastSnapshotId: id });
    await this.event(sb.id, 'snapshot', `snapshot ${id} (${trigger}${intent.name ? `, "${intent.name}"` : ''}): ${sizeBytes} bytes, ${downtimeMs} ms downtime`);
    return snapshot;
  }

  /** Restores `target` from an image directory and waits for its agent. */
  private async bootFromImage(target: Sandbox, imageDir: string): Promise<void> {
    const connected = this.waitAgent(target.id, this.bootTimeout(target.driver));
    await this.driver.restore(await this.spec(target), imageDir);
    if (!(await connected)) throw new SpaceError('TIMEOUT', `The agent of ${target.id} did not reconnect within ${this.bootTimeout(target.driver)} ms after the restore`);
  }

  /** Fetches a snapshot and unpacks it into a scratch directory, verifying it (SNAPSHOT_CORRUPT). */
  private async unpack(snap: Snapshot): Promise<string> {
    const dir = path.join(this.workDir, `r-${snap.id}-${Math.random().toString(36).slice(2, 8)}`);
    try {
      await readSnapshot(snap.id, await this.blobs.get(snap.blobKey), dir, this.maxSnapshotBytes, (name) => this.driver.codecNamed(name));
      return dir;
    } catch (err) {
      await fs.rm(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** Verifies `snap`, then replaces whatever runs as `target` with it. */
  private async restoreFrom(snap: Snapshot, target: Sandbox, imageDir?: string): Promise<void> {
    const dir = imageDir ?? (await this.unpack(snap));
    const e = this.entry(target.id);
    e.quiescing = true;
    if (snap.sandboxId !== target.id) {
      e.restoringFrom = snap.sandboxId;
      e.identity = { hostname: target.id };
    }
    try {
      e.channel?.destroy();
      e.channel = undefined;
      await this.bootFromImage(target, dir);
    } finally {
      e.quiescing = false;
      e.restoringFrom = undefined;
      e.identity = undefined;
      if (!imageDir) await fs.rm(dir, { recursive: true, force: true });
    }
  }

  /**
   * Brings a sandbox that died (failed checkpoint, lost while the daemon was down) back from
   * its last good snapshot and records what was lost. Returns false when that is impossible.
   */
  private async recover(sb: Sandbox, why: string): Promise<boolean> {
    const snap = sb.lastSnapshotId ? await this.store.getSnapshot(sb.lastSnapshotId) : undefined;
    if (!snap) {
      await this.terminate(sb.id, 'dead', 'crashed', why);
      return false;
    }
    try {
      await this.restoreFrom(snap, sb);
    } catch (err) {
      await this.event(sb.id, 'recovery-failed', `could not restore snapshot ${snap.id}: ${err instanceof Error ? err.message : String(err)}`);
      await this.terminate(sb.id, 'dead', 'crashed', `${why}; recovery from ${snap.id} failed`);
      return false;
    }
    const lostS = Math.round((Date.now() - Date.parse(snap.createdAt)) / 1000);
    await this.event(sb.id, 'recovered', `${why}; rolled back to snapshot ${snap.id}, its newest complete state, losing the last ${lostS} s`);
    const r = await this.store.updateSandbox(sb.id, { state: 'running', fromSnapshotId: snap.id });
    this.arm(r);
    return true;
  }

  // ---------------------------------------------------------------- crash recovery

  /** Whether the runtime still runs (or holds paused) the sandbox; an unanswered question counts as no. */
  private async runtimeRuns(id: string): Promise<boolean> {
    return (await this.driver.status(id).catch(() => ({ running: false }))).running;
  }

  /**
   * Re-attaches to a sandbox whose runtime still runs, and makes the runtime's state match the
   * session's: a crash mid-checkpoint can leave a running session's runtime paused. False when
   * the runtime is gone.
   */
  private async adoptRunning(sb: Sandbox): Promise<boolean> {
    if (sb.state === 'starting' || !(await this.driver.adopt(sb.id))) return false;
    if (sb.state === 'paused') await this.driver.pause(sb.id).catch(() => {});
    else await this.driver.resume(sb.id).catch(() => {});
    this.arm(sb);
    return true;
  }

  /**
   * Finishes or undoes one operation a crash interrupted, from its intent and what the runtime
   * holds: rolls forward when the runtime's output is complete, back otherwise, and never to
   * an older snapshot while newer complete state exists. Records what it did as a `recovered`
   * event. Returns false when the sandbox is left to the ordinary start-up path (adopt, or
   * restore from its newest snapshot). Never throws.
   */
  private async reconcile(sb: Sandbox, intent: Intent): Promise<boolean> {
    const what = `the daemon stopped during ${intent.op === 'snapshot' ? `a ${intent.trigger ?? 'manual'} snapshot` : `a ${intent.op}`} (step ${intent.step}, begun ${intent.startedAt})`;
    try {
      this.driver.assign(sb.id, sb.driver);
      // A checkpoint or restore the dead daemon started may still be running: let it end (bounded).
      await this.driver.settle(sb.id, SETTLE_TIMEOUT_MS);
      switch (intent.op) {
        case 'snapshot':
        case 'hibernate':
          return await this.reconcileSnapshot(sb, intent, what);
        case 'wake':
          return await this.reconcileWake(sb, intent, what);
        case 'rollback':
          return await this.reconcileRollback(sb, intent, what);
        default:
          return false;
      }
    } catch (err) {
      this.log.error({ err, sandboxId: sb.id, intent }, 'reconciling an interrupted operation failed');
      await this.event(sb.id, 'recovery-failed', `${what}; finishing it failed: ${err instanceof Error ? err.message : String(err)}`);
      return false;
    }
  }

  private async reconcileSnapshot(sb: Sandbox, intent: Intent, what: string): Promise<boolean> {
    const stored = intent.snapshotId ? await this.store.getSnapshot(intent.snapshotId) : undefined;
    const complete = !!stored || (!!intent.imageDir && existsSync(path.join(intent.imageDir, CHECKPOINT_COMPLETE)));
    const running = await this.runtimeRuns(sb.id);
    if (intent.op === 'hibernate' && sb.state === 'hibernated') {
      // Only the journal's last word was missing.
      await this.driver.destroy(sb.id);
      this.schedule(sb);
      return true;
    }
    if (!complete) {
      if (running && (await this.adoptRunning(sb))) {
        await this.event(sb.id, 'recovered', `${what}: the checkpoint was not complete, so it was rolled back; the sandbox ran on untouched, nothing lost`);
        return true;
      }
      // Stopped without a complete image: the newest complete state is its last snapshot (none: it is lost).
      return false;
    }
    // The checkpoint is complete: it becomes the snapshot it was meant to be.
    const snap = await this.storeImage(sb, intent, intent.imageDir!, Date.now() - Date.parse(intent.startedAt));
    if (intent.op === 'hibernate') {
      if (running && (await this.adoptRunning(sb))) {
        await this.event(sb.id, 'recovered', `${what}: rolled forward, snapshot ${snap.id} is stored; the sandbox still ran, so it runs on; nothing lost`);
        return true;
      }
      await this.driver.destroy(sb.id);
      const r = await this.store.updateSandbox(sb.id, { state: 'hibernated' });
      this.schedule(r);
      await this.event(sb.id, 'recovered', `${what}: rolled forward, hibernated in snapshot ${snap.id} (its checkpoint was complete); nothing lost`);
      return true;
    }
    if (running && (await this.adoptRunning(sb))) {
      await this.event(sb.id, 'recovered', `${what}: rolled forward, the complete checkpoint is stored as snapshot ${snap.id} and the sandbox ran on; nothing lost`);
      return true;
    }
    await this.restoreFrom(snap, sb, intent.imageDir);
    const r = await this.store.getSandbox(sb.id);
    if (r?.state === 'paused') await this.driver.pause(sb.id).catch(() => {});
    this.arm(r ?? sb);
    await this.event(sb.id, 'recovered', `${what}: rolled forward, the complete checkpoint is stored as snapshot ${snap.id} and the sandbox restored from it; nothing lost`);
    return true;
  }

  private async reconcileWake(sb: Sandbox, intent: Intent, what: string): Promise<boolean> {
    if (sb.state !== 'hibernated') return false;
    const running = await this.runtimeRuns(sb.id);
    if (running && (await this.driver.adopt(sb.id).catch(() => false))) {
      await this.markWoken(sb);
      await this.event(sb.id, 'recovered', `${what}: rolled forward, the restore from snapshot ${intent.snapshotId} had completed; woken, nothing lost`);
      return true;
    }
    await this.driver.destroy(sb.id);
    this.schedule(sb);
    await this.event(sb.id, 'recovered', `${what}: rolled back, still hibernated in snapshot ${intent.snapshotId}; nothing lost (wake it again)`);
    return true;
  }

  private async reconcileRollback(sb: Sandbox, intent: Intent, what: string): Promise<boolean> {
    const snap = intent.snapshotId ? await this.store.getSnapshot(intent.snapshotId) : undefined;
    if (intent.step === 'verify' || !snap) {
      // Nothing had changed yet: the sandbox is as it was before the request.
      await this.event(sb.id, 'recovered', `${what}: the rollback to ${intent.snapshotId} had not begun, so it was dropped; the sandbox is as before`);
      return false;
    }
    // The old incarnation may be gone already: finish what was asked, from the snapshot asked for.
    await this.restoreFrom(snap, sb);
    const r = await this.store.updateSandbox(sb.id, { state: 'running', fromSnapshotId: snap.id });
    this.arm(r);
    await this.event(sb.id, 'recovered', `${what}: rolled forward, rolled back to snapshot ${snap.id} as asked`);
    return true;
  }

  /**
   * A sandbox still `starting` after a crash: its create (or fork copy) never returned. It is
   * finished afresh: from its template, or from the snapshot a fork copy comes from.
   */
  private async finishCreate(sb: Sandbox): Promise<void> {
    try {
      this.driver.assign(sb.id, sb.driver);
      await this.driver.settle(sb.id, SETTLE_TIMEOUT_MS);
      await this.driver.destroy(sb.id);
      let from: string;
      if (sb.parentId && sb.fromSnapshotId) {
        const snap = await this.store.getSnapshot(sb.fromSnapshotId);
        if (!snap) throw new SpaceError('SNAPSHOT_NOT_FOUND', `snapshot ${sb.fromSnapshotId} it is copied from is gone`);
        await this.restoreFrom(snap, sb);
        from = `snapshot ${snap.id} of ${sb.parentId}`;
      } else {
        const t = await this.templates.resolve(sb.tenantId, sb.template);
        const trust = this.egress ? await this.egress.trust(sb.tenantId) : undefined;
        const release = await this.admission.slot();
        try {
          await this.startSandbox(t, sb, this.envOf(t.env, sb.env, sb.secrets), trust);
        } finally {
          release();
        }
        from = `template ${t.name}`;
      }
      const r = await this.store.updateSandbox(sb.id, { state: 'running', startedAt: new Date().toISOString() });
      this.arm(r);
      await this.event(sb.id, 'recovered', `the daemon stopped while creating it: rolled forward, started afresh from ${from}`);
    } catch (err) {
      this.log.error({ err, sandboxId: sb.id }, 'finishing an interrupted create failed');
      await this.driver.destroy(sb.id).catch(() => {});
      await this.end(sb.id, 'dead', 'start-failed', `the daemon stopped while creating it, and starting it again failed: ${err instanceof Error ? err.message : String(err)}`);
      this.live.delete(sb.id);
    }
  }

  private entry(id: string): LiveSandbox {
    return this.live.entry(id);
  }

  private async channel(id: string): Promise<AgentChannel> {
    const e = this.entry(id);
    if (e.openChannel) return e.openChannel;
    const ch = await e.waitAgent(this.reconnectWaitMs);
    if (!ch) {
      const sb = await this.store.getSandbox(id);
      if (sb && TERMINAL_STATES.includes(sb.state)) assertAllowed(sb, 'exec');
      throw new SpaceError('AGENT_UNAVAILABLE', `The agent of sandbox ${id} did not reconnect within ${this.reconnectWaitMs} ms`);
    }
    return ch;
  }

  private waitAgent(id: string, ms: number): Promise<AgentChannel | undefined> {
    return this.entry(id).waitAgent(ms);
  }

  private onAgent(id: string, stream: Duplex): void {
    const ch = new AgentChannel(stream);
    const hello = setTimeout(() => ch.destroy(new Error('no hello within 10 s')), 10_000);
    ch.once('event', (ev) => {
      clearTimeout(hello);
      const e = this.entry(id);
      // A fork's agent was restored from another sandbox's snapshot and still says that id.
      const fromSnapshotOf = e.restoringFrom;
      if (ev.event !== 'hello' || (ev.sandboxId !== id && ev.sandboxId !== fromSnapshotOf) || ev.version !== PROTOCOL_VERSION) {
        this.log.warn({ sandboxId: id, hello: JSON.stringify(ev).slice(0, 200) }, 'agent sent a bad hello; dropping it');
        ch.destroy(new Error('bad hello'));
        return;
      }
      const accept = () => {
        e.accept(ch);
        this.log.debug({ sandboxId: id }, 'agent connected');
        ch.on('close', () => void this.onAgentClose(id, ch));
      };
      if (ev.sandboxId === id) return accept();
      const t0 = performance.now();
      const ident = e.identity;
      sendIdentity(ch, id, ident).then(() => {
        e.identityMs = Math.round(performance.now() - t0);
        accept();
      }, (err) => {
        this.log.warn({ err, sandboxId: id }, 'agent did not take its new identity');
        ch.destroy();
      });
    });
  }

  private async onAgentClose(id: string, ch: AgentChannel): Promise<void> {
    const e = this.live.get(id);
    if (!e || e.channel !== ch || e.killing || e.quiescing || this.stopping) return;
    e.channel = undefined;
    // The agent went away: either the sandbox died (OOM, crash) or the agent is reconnecting.
    const st = await this.driver.status(id).catch(() => ({ running: false, reason: 'crashed' as EndReason, detail: 'runtime status unavailable' }));
    if (st.running) return;
    const sb = await this.store.getSandbox(id);
    if (!sb || TERMINAL_STATES.includes(sb.state)) return;
    this.log.warn({ sandboxId: id, reason: st.reason, detail: st.detail }, 'sandbox died');
    // A crash (not an overrun of its own limits) is survivable when there is a snapshot to go back to.
    if (st.reason !== 'oom' && sb.lastSnapshotId) {
      await this.driver.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'cleanup of the crashed runtime failed'));
      await this.recover(sb, `the sandbox crashed (${st.detail ?? 'the runtime stopped'})`);
      return;
    }
    await this.terminate(id, 'dead', st.reason ?? 'crashed', st.detail ?? 'the sandbox stopped unexpectedly');
  }

  /** Arms every timer of a running sandbox: its timeout, rolling snapshots and idle hibernation. */
  private arm(sb: Sandbox): void {
    this.schedule(sb);
    this.schedulePolicy(sb);
  }

  private schedule(sb: Sandbox): void {
    const e = this.entry(sb.id);
    clearTimeout(e.timer);
    if (!sb.expiresAt || (sb.onTimeout === 'hibernate' && sb.state === 'hibernated')) return;
    const ms = Math.max(0, Date.parse(sb.expiresAt) - Date.now());
    // setTimeout caps at ~24.8 days; re-arm for longer timeouts.
    e.timer = setTimeout(() => {
      if (Date.parse(sb.expiresAt!) > Date.now() + 1000) return this.schedule(sb);
      const act =
        sb.onTimeout === 'hibernate'
          ? this.store.getSandbox(sb.id).then((cur) => (cur && (cur.state === 'running' || cur.state === 'paused') ? this.hibernate(cur.tenantId, cur.id) : undefined))
          : this.terminate(sb.id, 'killed', 'timeout', `timeout of ${sb.timeoutMs} ms reached`);
      void act.catch((err) => this.log.error({ err, sandboxId: sb.id }, 'timeout action failed'));
    }, Math.min(ms, 2 ** 31 - 1));
    e.timer.unref();
  }

  private async terminate(id: string, state: 'killed' | 'dead', reason: EndReason, detail: string): Promise<Sandbox> {
    const e = this.entry(id);
    e.killing = true;
    e.clearTimers();
    // Read the end reason before the runtime forgets it (e.g. OOM counters live in the cgroup).
    let finalReason = reason;
    let finalDetail = detail;
    if (state === 'killed') {
      const st = await this.driver.status(id).catch(() => undefined);
      if (st && !st.running && st.reason === 'oom') {
        state = 'dead';
        finalReason = 'oom';
        finalDetail = st.detail ?? detail;
      }
    }
    e.channel?.destroy();
    await this.driver.destroy(id);
    const sb = await this.end(id, state, finalReason, finalDetail);
    // An ended sandbox's snapshots are deleted with it (they hold its whole memory).
    for (const sn of await this.store.listSnapshots(id)) await this.deleteSnapshot(sn);
    e.abandon();
    this.live.delete(id);
    this.log.info({ sandboxId: id, state, reason: finalReason }, 'sandbox ended');
    return sb;
  }

  private async end(id: string, state: 'killed' | 'dead', endReason: EndReason, endDetail: string): Promise<Sandbox> {
    const sb = await this.store.updateSandbox(id, { state, endReason, endDetail, endedAt: new Date().toISOString() });
    // Its header rules' values go with it.
    if (sb.secrets?.some((a) => a.rule)) await this.egress?.secrets.removeOwned(sb.tenantId, id).catch((err) => this.log.warn({ err, sandboxId: id }, 'deleting the header rules of an ended sandbox failed'));
    return sb;
  }
}


