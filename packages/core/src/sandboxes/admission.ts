/**
 * Admission: whether more sandboxes fit the node (count and memory, pooled ones included,
 * evicting pooled ones if need be), the reservation a create or fork holds while it boots, and
 * the boot slots that bound how many start at once.
 */
import { promises as fs } from 'node:fs';
import { SpaceError } from '../errors.js';
import type { Sandbox } from '../model.js';
import type { SandboxState } from '../model.js';
import { POOL_MEMORY_MB, type WarmPool } from '../templates/warm-pool.js';

/** Limits of {@link Admission}. */
export interface AdmissionLimits {
  maxSandboxes: number;
  maxMemoryMb: number;
  poolMinAvailableMb: number;
  maxConcurrentCreates: number;
  maxQueuedCreates: number;
}

/**
 * @example
 * await admission.admit(1, 512);
 * const release = admission.reserve(1, 512, [id]); // in the same tick as the check
 * try { ... } finally { release(); }
 */
export class Admission {
  private creating = 0;
  private creatingMb = 0;
  private readonly creatingIds = new Set<string>();
  private readonly createQueue: (() => void)[] = [];
  private createsRunning = 0;

  constructor(
    /** This node's sandboxes in these states (a shared store holds other nodes' too). */
    private readonly mine: (states: SandboxState[]) => Promise<Sandbox[]>,
    private readonly pool: () => WarmPool,
    readonly limits: AdmissionLimits,
  ) {}

  /** Sandboxes counted against the node's limits: alive in the store, being created, pooled. */
  private async load(): Promise<{ count: number; memoryMb: number }> {
    const pool = this.pool();
    const alive = (await this.mine(['starting', 'running', 'paused'])).filter((x) => !this.creatingIds.has(x.id));
    return { count: alive.length + this.creating + pool.count() + pool.pending(), memoryMb: alive.reduce((n, x) => n + x.memoryMb, 0) + this.creatingMb + pool.memoryMb() };
  }

  /** Whether `count` more sandboxes of `memoryMb` in all fit without evicting anything. */
  async hasRoom(count: number, memoryMb: number): Promise<boolean> {
    const l = await this.load();
    return l.count + count <= this.limits.maxSandboxes && l.memoryMb + memoryMb <= this.limits.maxMemoryMb;
  }

  /**
   * `count` more sandboxes of `memoryMb` each fit the node, after evicting pooled sandboxes if
   * need be; otherwise `CAPACITY_EXHAUSTED`. Callers {@link reserve} synchronously after it.
   */
  async admit(count: number, memoryMb: number): Promise<void> {
    const { maxSandboxes, maxMemoryMb, maxQueuedCreates } = this.limits;
    const l = await this.load();
    let over = l.count + count - maxSandboxes;
    let overMb = l.memoryMb + count * memoryMb - maxMemoryMb;
    while ((over > 0 || overMb > 0) && this.pool().evictOne()) {
      over--;
      overMb -= POOL_MEMORY_MB;
    }
    if (over > 0) throw new SpaceError('CAPACITY_EXHAUSTED', `This node runs its maximum of ${maxSandboxes} sandboxes`, { details: { retryAfterS: 5, maxSandboxes } });
    if (overMb > 0) throw new SpaceError('CAPACITY_EXHAUSTED', `The node's sandboxes already reserve ${l.memoryMb} of ${maxMemoryMb} MiB`, { details: { retryAfterS: 5, maxMemoryMb } });
    if (this.createQueue.length >= maxQueuedCreates) {
      throw new SpaceError('CAPACITY_EXHAUSTED', `${this.createQueue.length} creates are already waiting on this node`, { details: { retryAfterS: 2, queued: this.createQueue.length } });
    }
  }

  /**
   * Counts `count` sandboxes of `memoryMb` each as being created until the returned release is
   * called; `ids` (once known) are not counted twice when their records appear in the store.
   */
  reserve(count: number, memoryMb: number): { track(id: string): void; release(): void } {
    this.creating += count;
    this.creatingMb += count * memoryMb;
    const ids: string[] = [];
    let released = false;
    return {
      track: (id) => {
        ids.push(id);
        this.creatingIds.add(id);
      },
      release: () => {
        if (released) return;
        released = true;
        this.creating -= count;
        this.creatingMb -= count * memoryMb;
        for (const id of ids) this.creatingIds.delete(id);
      },
    };
  }

  /** Whether the host has less memory available than the pools may leave it. */
  async underPressure(): Promise<boolean> {
    const info = await fs.readFile('/proc/meminfo', 'utf8').catch(() => '');
    const m = /MemAvailable:\s+(\d+) kB/.exec(info);
    return !!m && Number(m[1]) / 1024 < this.limits.poolMinAvailableMb;
  }

  /** Waits for one of the boot slots; returns its release. */
  async slot(): Promise<() => void> {
    if (this.createsRunning >= this.limits.maxConcurrentCreates) await new Promise<void>((r) => this.createQueue.push(r));
    else this.createsRunning++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const next = this.createQueue.shift();
      if (next) next();
      else this.createsRunning--;
    };
  }
}
