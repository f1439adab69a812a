/**
 * Creating a sandbox: checks, admission and its reservation, the record as the intent, then a
 * pooled sandbox, a template restore or a boot.
 */
import type { CreateSandboxOpts } from '@space/api';
import { DEFAULT_EGRESS_POLICY, checkEgressPolicy, checkHeaderRules } from '../security/egress-policy.js';
import { SpaceError } from '../errors.js';
import { LIMITS, newSandboxId, type CreateTimings, type Sandbox, type Template } from '../model.js';
import { POOL_MEMORY_MB, poolDiskMb, poolKey } from '../templates/warm-pool.js';
import { checkMap, diskSize, range } from '../validate.js';
import type { SandboxContext } from './context.js';
import { sendIdentity } from './identity.js';
import { newSandboxRecord } from './record.js';
import type { ResolvedMount } from '../volumes/volumes.js';

export type { CreateSandboxOpts } from '@space/api';

/** Creating a sandbox. Built by the facade (SandboxService), which wires it into the hooks. */
export class Creates {
  constructor(private readonly c: SandboxContext) {}

  /**
   * The warm-pool key ({@link poolKey}) of a create this node would have to restore although
   * it has the pool's shape (default cpu, memory, driver and disk, no volumes): the template's
   * pool here has no sandbox ready. Undefined when the create is not pool-shaped, its pool here
   * has one, or the template is unknown (the create itself then says why). Placement in a
   * cluster asks it, to send such a create to a node whose pool has one ready.
   *
   * @example await creates.poolShortHere(T, { template: 'minimal' }) // '/minimal' (empty here)
   */
  async poolShortHere(tenantId: string, opts: CreateSandboxOpts): Promise<string | undefined> {
    const t = await this.c.templates.resolve(tenantId, opts.template ?? 'minimal').catch(() => undefined);
    if (!t) return undefined;
    let shaped: boolean;
    try {
      const driver = this.c.driver.get(opts.driver).name;
      shaped = this.poolShaped(t, { cpu: range('cpu', opts.cpu), memoryMb: range('memoryMb', opts.memoryMb), driver, diskMb: diskSize(opts.diskMb, this.c.driver.disksOf(driver), t.rootfsBytes), mounts: opts.volumes?.length ?? 0 });
    } catch {
      return undefined; // bad input: the create itself says why
    }
    return shaped && this.c.pool.status(t).ready === 0 ? poolKey(t) : undefined;
  }

  /** Whether a create of these checked values can take a pooled sandbox of `t` (the pool's size, driver and disk; no volumes). */
  private poolShaped(t: Template, v: { cpu: number; memoryMb: number; driver: string; diskMb: number | undefined; mounts: number }): boolean {
    return !v.mounts && v.cpu === LIMITS.cpu.default && v.memoryMb === POOL_MEMORY_MB && v.driver === this.c.driver.name && v.diskMb === poolDiskMb(this.c.driver.disks, t.rootfsBytes);
  }

  /**
   * Creates a sandbox; resolves when its agent answers. It is taken from the template's warm
   * pool if one is ready (and the request has the pool's size), restored from the template's
   * image otherwise, or booted when the template has no image yet.
   */
  async create(tenantId: string, opts: CreateSandboxOpts, signal?: AbortSignal): Promise<Sandbox> {
    if (this.c.stopping()) throw new SpaceError('DAEMON_SHUTTING_DOWN');
    const t = await this.c.templates.resolve(tenantId, opts.template ?? 'minimal');
    const cpu = range('cpu', opts.cpu);
    const memoryMb = range('memoryMb', opts.memoryMb);
    const timeoutMs = range('timeoutMs', opts.timeoutMs);
    const env = checkMap('env', opts.env, LIMITS.envEntries);
    const metadata = checkMap('metadata', opts.metadata, LIMITS.metadataEntries);
    const driver = this.c.driver.get(opts.driver).name;
    const diskMb = diskSize(opts.diskMb, this.c.driver.disksOf(driver), t.rootfsBytes);
    const mounts = await this.checkMounts(tenantId, opts.volumes, driver);
    // A template's start command runs before any volume could be mounted: its snapshot has none.
    if (mounts.length && t.start) throw new SpaceError('VOLUMES_UNAVAILABLE', `Template ${t.name} has a start command: its sandboxes start from its snapshot, which cannot take volumes. Use a template without one`, { details: { field: 'volumes' } });
    const idleTimeoutMs = opts.idleTimeoutMs ?? 0;
    if (opts.autoResume !== undefined && typeof opts.autoResume !== 'boolean') throw new SpaceError('BAD_REQUEST', 'autoResume must be true or false');
    if (!Number.isInteger(idleTimeoutMs) || (idleTimeoutMs !== 0 && (idleTimeoutMs < 1000 || idleTimeoutMs > LIMITS.timeoutMs.max))) {
      throw new SpaceError('INVALID_LIMITS', `idleTimeoutMs must be 0 (never) or between 1000 and ${LIMITS.timeoutMs.max}; got ${idleTimeoutMs}`, { details: { field: 'idleTimeoutMs' } });
    }
    if ((opts.egress !== undefined || opts.secrets !== undefined || opts.headers !== undefined) && !this.c.egress) throw new SpaceError('EGRESS_UNAVAILABLE', 'This daemon runs sandboxes without a network (--egress off): egress policies and secrets are not available');
    const egress = this.c.egress ? checkEgressPolicy(opts.egress ?? DEFAULT_EGRESS_POLICY) : undefined;
    const secrets = this.c.egress && opts.secrets !== undefined ? await this.c.egress.secrets.attach(tenantId, opts.secrets, []) : undefined;
    const headerRules = opts.headers !== undefined ? checkHeaderRules(opts.headers) : [];
    const trust = this.c.egress ? await this.c.egress.trust(tenantId) : undefined;
    const t0 = performance.now();
    const fullEnv = this.c.hooks.egress.envOf(t.env, env, secrets);
    // A pooled sandbox already counts against the node: taking one needs no admission.
    const poolable = this.poolShaped(t, { cpu, memoryMb, driver, diskMb, mounts: mounts.length });
    let pooled = poolable ? this.c.pool.take(t) : undefined;
    let identityMs = 0;
    if (pooled && (Object.keys(env).length || trust)) {
      const tI = performance.now();
      try {
        await sendIdentity(this.c.live.get(pooled)!.channel!, pooled, { env: fullEnv, ...(trust ? { trust } : {}) });
        identityMs = Math.round(performance.now() - tI);
      } catch (err) {
        this.c.log.warn({ err, sandboxId: pooled }, 'pooled sandbox refused its identity; restoring instead');
        this.c.background(this.c.hooks.starts.discardPooled(pooled));
        pooled = undefined;
      }
    }
    if (!pooled) await this.c.admission.admit(1, memoryMb);
    // Reserve in the same synchronous step as the check, so concurrent creates cannot all pass it.
    const reservation = this.c.admission.reserve(1, memoryMb);
    const id = pooled ?? newSandboxId();
    const rules = headerRules.length ? await this.c.hooks.egress.requireEgress().secrets.setRules(tenantId, id, headerRules) : [];
    const sb = newSandboxRecord({
      id,
      tenantId,
      template: t.name,
      driver,
      cpu,
      memoryMb,
      ...(diskMb !== undefined ? { diskMb } : {}),
      timeoutMs,
      env,
      metadata,
      ...(opts.onTimeout === 'hibernate' ? { onTimeout: 'hibernate' as const } : {}),
      idleTimeoutMs,
      ...(opts.autoResume ? { autoResume: true } : {}),
      ...(egress ? { egress } : {}),
      secrets: [...(secrets ?? []), ...rules],
      volumes: mounts.map((m) => ({ volume: m.volume, path: m.path, ...(m.readOnly ? { readOnly: true } : {}) })),
      node: this.c.nodeName,
    });
    reservation.track(sb.id);
    let release: (() => void) | undefined;
    try {
      if (mounts.length) this.c.volumes!.claim(sb.id, mounts);
      // Stored as `starting`: the record is the create's intent (a restart finishes the create).
      await this.c.store.insertSandbox(sb).catch(async (err: unknown) => {
        await this.c.volumes?.release(sb.id);
        throw err;
      });
      await this.c.faults.fault('create:after-record');
      let timings: CreateTimings;
      if (pooled) {
        timings = { source: 'pool', queueMs: 0, agentMs: 0, identityMs, totalMs: Math.round(performance.now() - t0) };
      } else {
        // Starts run at most `maxConcurrentCreates` at a time; the rest wait their turn here.
        release = await this.c.admission.slot();
        const queueMs = Math.round(performance.now() - t0);
        try {
          timings = { queueMs, ...(await this.c.faults.during('create:during-start', this.c.hooks.starts.startSandbox(t, sb, fullEnv, trust, signal))), totalMs: 0 };
        } catch (err) {
          this.c.log.error({ err, sandboxId: sb.id }, 'sandbox failed to start');
          await this.c.driver.destroy(sb.id).catch(() => {});
          await this.c.hooks.endings.end(sb.id, 'dead', 'start-failed', err instanceof Error ? err.message : String(err));
          this.c.live.delete(sb.id);
          if (err instanceof SpaceError) throw err;
          throw new SpaceError('DRIVER_FAILED', `Sandbox failed to start: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
        }
        timings.totalMs = Math.round(performance.now() - t0);
      }
      const running = await this.c.store.updateSandbox(sb.id, { state: 'running', startedAt: new Date().toISOString(), createTimings: timings });
      this.c.hooks.timers.arm(running);
      this.c.log.info({ sandboxId: sb.id, tenantId, template: t.name, ...timings }, 'sandbox running');
      return running;
    } finally {
      release?.();
      reservation.release();
    }
  }

  /** A create's volume mounts, checked (nothing claimed yet). */
  private async checkMounts(tenantId: string, volumes: unknown, driver: string): Promise<ResolvedMount[]> {
    if (volumes === undefined || (Array.isArray(volumes) && !volumes.length)) return [];
    if (!this.c.volumes) throw new SpaceError('VOLUMES_UNAVAILABLE', 'This daemon has no volumes: leave volumes out', { details: { field: 'volumes' } });
    return this.c.volumes.check(tenantId, volumes, this.c.driver.get(driver).mounts === true);
  }
}
