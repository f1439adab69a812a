/**
 * SandboxService: the lifecycle of sandboxes across a driver, the metadata store and the
 * agents' connections. The HTTP API is a thin layer over it. Tenancy is enforced here: a
 * sandbox of another tenant is indistinguishable from one that does not exist.
 */
import type { Duplex } from 'node:stream';
import { PROTOCOL_VERSION, type AgentRequest } from '@space/protocol';
import { AgentChannel, type AgentCall } from './agent-channel.js';
import type { SandboxDriver } from './driver.js';
import { SpaceError } from './errors.js';
import { LIMITS, TERMINAL_STATES, assertAllowed, newSandboxId, type EndReason, type Sandbox, type SandboxAction } from './model.js';
import type { MetadataStore, SandboxPage } from './store.js';

/** Structured logger (pino-compatible subset). */
export interface Logger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
  debug(obj: object, msg?: string): void;
}

/** Options of {@link SandboxService}. */
export interface SandboxServiceOptions {
  store: MetadataStore;
  driver: SandboxDriver;
  logger: Logger;
  /** Most sandboxes alive at once on this node. @default 64 */
  maxSandboxes?: number;
  /** How long a new sandbox may take until its agent answers. @default 30000 */
  startTimeoutMs?: number;
  /** How long a call waits for an agent that is reconnecting. @default 10000 */
  reconnectWaitMs?: number;
}

/** What a client asks for when creating a sandbox. */
export interface CreateSandboxOpts {
  /** Template. @default "minimal" */
  template?: string;
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
}

/** Filter of {@link SandboxService.list}. */
export interface ListSandboxesOpts {
  states?: Sandbox['state'][];
  metadata?: Record<string, string>;
  limit?: number;
  cursor?: string;
}

const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]{0,255}$/;
const LABEL_KEY = /^[A-Za-z0-9_.\-/]{1,128}$/;

function checkMap(kind: 'env' | 'metadata', m: Record<string, string> | undefined, max: number): Record<string, string> {
  const out: Record<string, string> = {};
  if (!m) return out;
  const entries = Object.entries(m);
  if (entries.length > max) throw new SpaceError('BAD_REQUEST', `At most ${max} ${kind} entries are allowed (got ${entries.length})`);
  for (const [k, v] of entries) {
    if (!(kind === 'env' ? ENV_KEY : LABEL_KEY).test(k)) throw new SpaceError('BAD_REQUEST', `Invalid ${kind} key ${JSON.stringify(k)}`);
    if (typeof v !== 'string' || v.length > 32768 || v.includes('\0')) throw new SpaceError('BAD_REQUEST', `Invalid ${kind} value for ${k}: a string up to 32 KiB without NUL bytes is required`);
    out[k] = v;
  }
  return out;
}

function range(name: 'cpu' | 'memoryMb' | 'timeoutMs', v: number | undefined): number {
  const l = LIMITS[name];
  if (v === undefined) return l.default;
  if (name === 'timeoutMs' && v === 0) return 0;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < l.min || v > l.max) {
    throw new SpaceError('INVALID_LIMITS', `${name} must be between ${l.min} and ${l.max}${name === 'timeoutMs' ? ' (or 0 for no timeout)' : ''}; got ${v}`, { details: { field: name, min: l.min, max: l.max } });
  }
  return name === 'cpu' ? v : Math.floor(v);
}

/** Validates a path sent by a client. */
export function checkPath(p: unknown, field = 'path'): string {
  if (typeof p !== 'string' || p.length === 0 || p.length > 4096 || p.includes('\0')) {
    throw new SpaceError('INVALID_PATH', `${field} must be a non-empty path of at most 4096 bytes without NUL bytes`);
  }
  return p;
}

interface Live {
  channel?: AgentChannel;
  waiters: ((ch: AgentChannel | undefined) => void)[];
  timer?: NodeJS.Timeout;
  killing?: boolean;
}

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
  private readonly live = new Map<string, Live>();
  private readonly store: MetadataStore;
  private readonly driver: SandboxDriver;
  private readonly log: Logger;
  private readonly maxSandboxes: number;
  private readonly startTimeoutMs: number;
  private readonly reconnectWaitMs: number;
  private creating = 0;
  private stopping = false;

  constructor(opts: SandboxServiceOptions) {
    this.store = opts.store;
    this.driver = opts.driver;
    this.log = opts.logger;
    this.maxSandboxes = opts.maxSandboxes ?? 64;
    this.startTimeoutMs = opts.startTimeoutMs ?? 30_000;
    this.reconnectWaitMs = opts.reconnectWaitMs ?? 10_000;
  }

  /** Prepares the driver, re-adopts sandboxes that still run, marks the rest dead, removes orphans. */
  async start(): Promise<void> {
    this.driver.bind({ agentConnected: (id, s) => this.onAgent(id, s) });
    await this.driver.init();
    const active = await this.store.sandboxesInStates(['starting', 'running']);
    const known = new Set(active.map((s) => s.id));
    for (const sb of active) {
      const entry = this.entry(sb.id);
      let alive = false;
      try {
        alive = sb.state === 'running' && (await this.driver.adopt(sb.id));
      } catch (err) {
        this.log.warn({ err, sandboxId: sb.id }, 'adopt failed');
      }
      if (alive) {
        this.log.info({ sandboxId: sb.id }, 're-adopted running sandbox');
        this.schedule(sb, entry);
      } else {
        const st = await this.driver.status(sb.id).catch(() => ({ running: false, reason: undefined, detail: undefined }));
        await this.driver.destroy(sb.id).catch((err) => this.log.error({ err, sandboxId: sb.id }, 'cleanup of dead sandbox failed'));
        await this.end(sb.id, 'dead', st.reason ?? (sb.state === 'starting' ? 'start-failed' : 'lost'), st.detail ?? 'the sandbox was gone when the daemon started');
      }
    }
    for (const id of await this.driver.list()) {
      if (!known.has(id)) {
        this.log.warn({ sandboxId: id }, 'removing orphaned runtime sandbox');
        await this.driver.destroy(id).catch((err) => this.log.error({ err, sandboxId: id }, 'orphan removal failed'));
      }
    }
  }

  /** Stops accepting work and detaches from sandboxes; they keep running and are re-adopted on the next start. */
  async shutdown(): Promise<void> {
    this.stopping = true;
    for (const e of this.live.values()) {
      clearTimeout(e.timer);
      e.channel?.destroy();
    }
    await this.driver.close();
  }

  /** Creates and boots a sandbox; resolves when its agent answers. */
  async create(tenantId: string, opts: CreateSandboxOpts, signal?: AbortSignal): Promise<Sandbox> {
    if (this.stopping) throw new SpaceError('DAEMON_SHUTTING_DOWN');
    const template = opts.template ?? 'minimal';
    const templates = await this.driver.templates();
    if (!templates.includes(template)) {
      throw new SpaceError('TEMPLATE_NOT_FOUND', `No template ${JSON.stringify(template)}; available: ${templates.join(', ')}`, { details: { template, available: templates } });
    }
    const cpu = range('cpu', opts.cpu);
    const memoryMb = range('memoryMb', opts.memoryMb);
    const timeoutMs = range('timeoutMs', opts.timeoutMs);
    const env = checkMap('env', opts.env, LIMITS.envEntries);
    const metadata = checkMap('metadata', opts.metadata, LIMITS.metadataEntries);
    const alive = (await this.store.sandboxesInStates(['starting', 'running'])).length;
    if (alive + this.creating >= this.maxSandboxes) {
      throw new SpaceError('CAPACITY_EXHAUSTED', `This node runs its maximum of ${this.maxSandboxes} sandboxes`, { details: { retryAfterS: 5, maxSandboxes: this.maxSandboxes } });
    }
    const now = new Date();
    const sb: Sandbox = {
      id: newSandboxId(),
      tenantId,
      template,
      driver: this.driver.name,
      state: 'starting',
      cpu,
      memoryMb,
      timeoutMs,
      env,
      metadata,
      createdAt: now.toISOString(),
      ...(timeoutMs ? { expiresAt: new Date(now.getTime() + timeoutMs).toISOString() } : {}),
    };
    this.creating++;
    try {
      await this.store.insertSandbox(sb);
      const entry = this.entry(sb.id);
      const connected = this.waitAgent(sb.id, this.startTimeoutMs);
      try {
        await this.driver.create({ id: sb.id, template, cpu, memoryMb, env }, signal);
        const ch = await connected;
        if (!ch) throw new SpaceError('TIMEOUT', `The sandbox agent did not connect within ${this.startTimeoutMs} ms`);
      } catch (err) {
        this.log.error({ err, sandboxId: sb.id }, 'sandbox failed to start');
        await this.driver.destroy(sb.id).catch(() => {});
        await this.end(sb.id, 'dead', 'start-failed', err instanceof Error ? err.message : String(err));
        if (err instanceof SpaceError) throw err;
        throw new SpaceError('DRIVER_FAILED', `Sandbox failed to start: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
      }
      const running = await this.store.updateSandbox(sb.id, { state: 'running', startedAt: new Date().toISOString() });
      this.schedule(running, entry);
      this.log.info({ sandboxId: sb.id, tenantId, template }, 'sandbox running');
      return running;
    } finally {
      this.creating--;
    }
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
    return this.store.listSandboxes({ tenantId, limit, ...(q.states ? { states: q.states } : {}), ...(q.metadata ? { metadata: q.metadata } : {}), ...(q.cursor ? { cursor: q.cursor } : {}) });
  }

  /** Kills a sandbox and frees everything it had on the host. */
  async kill(tenantId: string, id: string): Promise<Sandbox> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, 'kill');
    return this.terminate(sb.id, 'killed', 'killed', 'killed on request');
  }

  /** Opens a call to the sandbox's agent after checking tenancy and state. */
  async call(tenantId: string, id: string, action: SandboxAction, req: AgentRequest): Promise<AgentCall> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, action);
    const ch = await this.channel(sb.id);
    return ch.call(req);
  }

  /** A unary agent call (stat, list, mkdir, ...). */
  async unary(tenantId: string, id: string, action: SandboxAction, req: AgentRequest, timeoutMs = 30_000): Promise<Record<string, unknown>> {
    const sb = await this.get(tenantId, id);
    assertAllowed(sb, action);
    return (await this.channel(sb.id)).unary(req, timeoutMs);
  }

  /** Host resources of a sandbox. */
  async usage(tenantId: string, id: string) {
    const sb = await this.get(tenantId, id);
    if (TERMINAL_STATES.includes(sb.state)) return { rssBytes: 0 };
    return this.driver.usage(sb.id);
  }

  private entry(id: string): Live {
    let e = this.live.get(id);
    if (!e) this.live.set(id, (e = { waiters: [] }));
    return e;
  }

  private async channel(id: string): Promise<AgentChannel> {
    const e = this.entry(id);
    if (e.channel && !e.channel.closed) return e.channel;
    const ch = await this.waitAgent(id, this.reconnectWaitMs);
    if (!ch) {
      const sb = await this.store.getSandbox(id);
      if (sb && TERMINAL_STATES.includes(sb.state)) assertAllowed(sb, 'exec');
      throw new SpaceError('AGENT_UNAVAILABLE', `The agent of sandbox ${id} did not reconnect within ${this.reconnectWaitMs} ms`);
    }
    return ch;
  }

  private waitAgent(id: string, ms: number): Promise<AgentChannel | undefined> {
    const e = this.entry(id);
    if (e.channel && !e.channel.closed) return Promise.resolve(e.channel);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        e.waiters = e.waiters.filter((w) => w !== done);
        resolve(undefined);
      }, ms);
      const done = (ch: AgentChannel | undefined) => {
        clearTimeout(t);
        resolve(ch);
      };
      e.waiters.push(done);
    });
  }

  private onAgent(id: string, stream: Duplex): void {
    const ch = new AgentChannel(stream);
    const hello = setTimeout(() => ch.destroy(new Error('no hello within 10 s')), 10_000);
    ch.once('event', (ev) => {
      clearTimeout(hello);
      if (ev.event !== 'hello' || ev.sandboxId !== id || ev.version !== PROTOCOL_VERSION) {
        this.log.warn({ sandboxId: id, hello: JSON.stringify(ev).slice(0, 200) }, 'agent sent a bad hello; dropping it');
        ch.destroy(new Error('bad hello'));
        return;
      }
      const e = this.entry(id);
      e.channel?.destroy();
      e.channel = ch;
      this.log.debug({ sandboxId: id }, 'agent connected');
      for (const w of e.waiters.splice(0)) w(ch);
      ch.on('close', () => void this.onAgentClose(id, ch));
    });
  }

  private async onAgentClose(id: string, ch: AgentChannel): Promise<void> {
    const e = this.live.get(id);
    if (!e || e.channel !== ch || e.killing || this.stopping) return;
    e.channel = undefined;
    // The agent went away: either the sandbox died (OOM, crash) or the agent is reconnecting.
    const st = await this.driver.status(id).catch(() => ({ running: false, reason: 'crashed' as EndReason, detail: 'runtime status unavailable' }));
    if (st.running) return;
    const sb = await this.store.getSandbox(id);
    if (!sb || TERMINAL_STATES.includes(sb.state)) return;
    this.log.warn({ sandboxId: id, reason: st.reason, detail: st.detail }, 'sandbox died');
    await this.terminate(id, 'dead', st.reason ?? 'crashed', st.detail ?? 'the sandbox stopped unexpectedly');
  }

  private schedule(sb: Sandbox, e: Live): void {
    clearTimeout(e.timer);
    if (!sb.expiresAt) return;
    const ms = Math.max(0, Date.parse(sb.expiresAt) - Date.now());
    // setTimeout caps at ~24.8 days; re-arm for longer timeouts.
    e.timer = setTimeout(() => {
      if (Date.parse(sb.expiresAt!) > Date.now() + 1000) return this.schedule(sb, e);
      void this.terminate(sb.id, 'killed', 'timeout', `timeout of ${sb.timeoutMs} ms reached`).catch((err) => this.log.error({ err, sandboxId: sb.id }, 'timeout kill failed'));
    }, Math.min(ms, 2 ** 31 - 1));
    e.timer.unref();
  }

  private async terminate(id: string, state: 'killed' | 'dead', reason: EndReason, detail: string): Promise<Sandbox> {
    const e = this.entry(id);
    e.killing = true;
    clearTimeout(e.timer);
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
    for (const w of e.waiters.splice(0)) w(undefined);
    this.live.delete(id);
    this.log.info({ sandboxId: id, state, reason: finalReason }, 'sandbox ended');
    return sb;
  }

  private end(id: string, state: 'killed' | 'dead', endReason: EndReason, endDetail: string): Promise<Sandbox> {
    return this.store.updateSandbox(id, { state, endReason, endDetail, endedAt: new Date().toISOString() });
  }
}


