/**
 * Warm pools: per template, a number of sandboxes already restored from the template's image,
 * idle-running and unassigned. A create takes one and only has to give it its identity. Pools
 * refill in the background, one restore at a time (so user creates are never starved of start
 * slots), and shrink when the host runs low on memory or a create needs the room.
 *
 * Pooled sandboxes are idle-running rather than paused: measured here, resuming a paused
 * gVisor sandbox costs a `runsc resume` (~20–40 ms of CLI start-up) on every take, while an
 * idle one costs no CPU and the same memory (see docs/benchmarks.md).
 */
import type { Logger } from '../logger.js';
import type { Template } from '../model.js';
import type { DriverDisks } from '../ports/driver.js';
import { diskSize } from '../validate.js';

/** What the pool needs from the sandbox service. */
export interface PoolHooks {
  /** Restores one unassigned sandbox of the template; resolves to its id once its agent answers. */
  fill(t: Template): Promise<string>;
  /** Destroys a pooled sandbox. */
  discard(id: string): Promise<void>;
  /** Whether one more pooled sandbox of `memoryMb` fits the node now. */
  hasRoom(memoryMb: number): Promise<boolean>;
  /** Whether the host is short of memory (pools shrink). */
  underPressure(): Promise<boolean>;
  /** Whether a pooled sandbox is still alive (its agent connected). */
  alive(id: string): boolean;
}

/** Pool state of one template. */
export interface PoolStatus {
  /** Configured size. */
  size: number;
  /** Sandboxes ready now. */
  ready: number;
}

interface Entry {
  id: string;
  memoryMb: number;
  since: number;
}

/** Memory of one pooled sandbox (the default sandbox size; other sizes restore instead). */
export const POOL_MEMORY_MB = 512;

/** Disk of pooled sandboxes and template images, MiB: the default size (undefined without disks). */
export const poolDiskMb = (disks: DriverDisks | undefined, templateBytes?: number): number | undefined => diskSize(undefined, disks, templateBytes);

/**
 * A template's key among the pools (and in a node's heartbeat, {@link WarmPool.readyCounts}):
 * `TENANT/NAME`, `/NAME` for a built-in template.
 *
 * @example poolKey({ tenantId: '', name: 'minimal' }) // '/minimal'
 */
export const poolKey = (t: Pick<Template, 'tenantId' | 'name'>): string => `${t.tenantId}/${t.name}`;

/**
 * The warm pools of every template.
 *
 * @example
 * const pool = new WarmPool(hooks, logger);
 * pool.configure(template); // size from template.poolSize
 * const id = pool.take(template); // undefined when empty: restore instead
 */
export class WarmPool {
  private readonly entries = new Map<string, Entry[]>();
  private readonly targets = new Map<string, Template>();
  private readonly failures = new Map<string, number>();
  private filling = false;
  private inFlight = 0;
  private stopped = false;
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly hooks: PoolHooks,
    private readonly log: Logger,
    /** How often memory pressure is checked, ms. */
    private readonly checkEveryMs = 5000,
    /**
     * How long a refill waits after a take. A restore keeps both cores of a small host busy
     * for ~0.3 s; starting it at once would slow the first commands of the sandbox just
     * handed out, which is what the pool exists to make fast.
     */
    private readonly refillDelayMs = 250,
  ) {}

  private static ref(t: Pick<Template, 'tenantId' | 'name'>): string {
    return poolKey(t);
  }

  /** Sets a template's pool size (from `t.poolSize`) and starts refilling or draining. */
  configure(t: Template): void {
    const ref = WarmPool.ref(t);
    if (t.poolSize > 0) this.targets.set(ref, t);
    else this.targets.delete(ref);
    this.failures.delete(ref);
    const list = this.entries.get(ref) ?? [];
    while (list.length > t.poolSize) this.drop(list.shift()!, 'pool shrunk');
    this.kick();
    if (!this.timer && !this.stopped) {
      this.timer = setInterval(() => void this.checkPressure(), this.checkEveryMs);
      this.timer.unref();
    }
  }

  /** Takes a ready sandbox of the template, if there is one. */
  take(t: Pick<Template, 'tenantId' | 'name'>): string | undefined {
    const list = this.entries.get(WarmPool.ref(t)) ?? [];
    let e: Entry | undefined;
    while ((e = list.shift())) {
      if (this.hooks.alive(e.id)) break;
      this.drop(e, 'pooled sandbox died');
    }
    setTimeout(() => this.kick(), this.refillDelayMs).unref();
    return e?.id;
  }

  /** Pool state of a template. */
  status(t: Pick<Template, 'tenantId' | 'name' | 'poolSize'>): PoolStatus {
    return { size: t.poolSize, ready: this.entries.get(WarmPool.ref(t))?.length ?? 0 };
  }

  /**
   * Sandboxes ready now, per template ({@link poolKey}), of the pools that have any: what a
   * node tells the cluster in its heartbeat, so creates elsewhere can come for them.
   *
   * @example pool.readyCounts() // { '/minimal': 2, 'tn3k…/tools': 1 }
   */
  readyCounts(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const [ref, l] of this.entries) if (l.length) out[ref] = l.length;
    return out;
  }

  /** Pooled sandboxes on the node. */
  count(): number {
    let n = 0;
    for (const l of this.entries.values()) n += l.length;
    return n;
  }

  /** Pooled sandboxes being restored right now (0 or 1). */
  pending(): number {
    return this.inFlight;
  }

  /** Memory reserved by pooled sandboxes, MiB. */
  memoryMb(): number {
    let n = 0;
    for (const l of this.entries.values()) for (const e of l) n += e.memoryMb;
    return n;
  }

  /** Frees one pooled sandbox (the oldest of the fullest pool) for a create that needs the room. */
  evictOne(): boolean {
    let best: Entry[] | undefined;
    for (const l of this.entries.values()) if (l.length && (!best || l.length > best.length)) best = l;
    const e = best?.shift();
    if (!e) return false;
    this.drop(e, 'room needed for a create');
    return true;
  }

  /** Ids of every pooled sandbox (so the daemon does not treat them as orphans). */
  ids(): Set<string> {
    const s = new Set<string>();
    for (const l of this.entries.values()) for (const e of l) s.add(e.id);
    return s;
  }

  /** Stops refilling and destroys every pooled sandbox. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.timer);
    const all = [...this.entries.values()].flat();
    this.entries.clear();
    await Promise.all(all.map((e) => this.hooks.discard(e.id).catch(() => {})));
  }

  private drop(e: Entry, why: string): void {
    this.log.debug({ sandboxId: e.id, why }, 'pooled sandbox discarded');
    void this.hooks.discard(e.id).catch((err) => this.log.warn({ err, sandboxId: e.id }, 'discarding a pooled sandbox failed'));
  }

  private async checkPressure(): Promise<void> {
    if (this.count() === 0) return;
    if (await this.hooks.underPressure()) {
      this.log.warn({ pooled: this.count() }, 'host memory is low: shrinking warm pools');
      this.evictOne();
    }
  }

  /** The next template whose pool is short, if it may grow now. */
  private nextShort(): Template | undefined {
    for (const [ref, t] of this.targets) {
      if ((this.entries.get(ref)?.length ?? 0) >= t.poolSize) continue;
      if ((this.failures.get(ref) ?? 0) > Date.now()) continue;
      return t;
    }
    return undefined;
  }

  private kick(): void {
    if (this.filling || this.stopped) return;
    this.filling = true;
    void this.fillLoop().finally(() => {
      this.filling = false;
    });
  }

  private async fillLoop(): Promise<void> {
    for (;;) {
      if (this.stopped) return;
      const t = this.nextShort();
      if (!t || !(await this.hooks.hasRoom(POOL_MEMORY_MB)) || (await this.hooks.underPressure())) return;
      const ref = WarmPool.ref(t);
      this.inFlight++;
      try {
        const id = await this.hooks.fill(t);
        const cur = this.targets.get(ref);
        const list = this.entries.get(ref) ?? [];
        if (this.stopped || !cur || list.length >= cur.poolSize) {
          this.drop({ id, memoryMb: POOL_MEMORY_MB, since: Date.now() }, 'no longer wanted');
          continue;
        }
        list.push({ id, memoryMb: POOL_MEMORY_MB, since: Date.now() });
        this.entries.set(ref, list);
      } catch (err) {
        // Back off for a while; a create will still work (it restores or boots).
        this.failures.set(ref, Date.now() + 30_000);
        this.log.warn({ err, template: t.name, tenantId: t.tenantId }, 'warm pool refill failed; retrying in 30 s');
      } finally {
        this.inFlight--;
      }
    }
  }
}
