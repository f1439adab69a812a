/**
 * Usage over time: a sampler that reads each running sandbox's usage at a fixed interval and
 * keeps the last hour of samples in memory, so clients can ask for a series (E2B's
 * `getMetrics({start, end})`, the console's graphs) rather than one reading.
 */
import type { SandboxUsage } from '../ports/driver.js';

/** One reading of a sandbox's usage. */
export interface UsageSample {
  /** When it was read (ms since epoch). */
  at: number;
  /** CPU used since the previous sample, percent of the sandbox's CPU allowance (0 for the first). */
  cpuPct: number;
  /** Memory charged to the sandbox, bytes. */
  memBytes: number;
  /** What its disk holds, bytes (sandboxes with a disk). */
  diskBytes?: number;
}

/** What the sampler reads. */
export interface UsageSource {
  /** Sandboxes to sample now, with their CPU allowance. */
  running(): Promise<{ id: string; cpu: number }[]>;
  usage(id: string): Promise<SandboxUsage>;
}

interface Series {
  samples: UsageSample[];
  lastCpuNs?: number;
  lastAt?: number;
}

/**
 * Samples usage every `intervalMs` and keeps `keep` samples per sandbox.
 *
 * @example
 * const history = new UsageHistory({ running: async () => [{ id, cpu: 1 }], usage: (id) => driver.usage(id) }, 5000);
 * history.start();
 * history.series(id, { start: Date.now() - 60_000 }); // the last minute
 */
export class UsageHistory {
  private readonly byId = new Map<string, Series>();
  private timer?: NodeJS.Timeout;

  constructor(
    private readonly source: UsageSource,
    readonly intervalMs = 5000,
    private readonly keep = 720,
  ) {}

  start(): void {
    if (this.timer) return;
    // A tick the store cannot answer (PostgreSQL away) is a sample missed, nothing more. A tick
    // that comes while the last one still reads (a loaded host: a CI run's E2B test once got
    // its samples out of order from ticks that overlapped) is skipped.
    let busy = false;
    this.timer = setInterval(() => {
      if (busy) return;
      busy = true;
      void this.sampleAll()
        .catch(() => {})
        .finally(() => (busy = false));
    }, this.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Reads every running sandbox once (the timer's tick); failures skip that sandbox. */
  async sampleAll(now = Date.now()): Promise<void> {
    const running = await this.source.running();
    const ids = new Set(running.map((r) => r.id));
    for (const id of this.byId.keys()) if (!ids.has(id)) this.byId.delete(id);
    await Promise.all(running.map((r) => this.sample(r.id, r.cpu, now).catch(() => {})));
  }

  private async sample(id: string, cpu: number, now: number): Promise<void> {
    const u = await this.source.usage(id);
    let s = this.byId.get(id);
    if (!s) this.byId.set(id, (s = { samples: [] }));
    // A reading that finished after a later one (sampleAll called again meanwhile) is dropped:
    // the series stays oldest first, and CPU is counted over forward intervals only.
    if (s.lastAt !== undefined && now <= s.lastAt) return;
    const cpuPct = s.lastCpuNs !== undefined && u.cpuNs !== undefined && s.lastAt !== undefined ? Math.max(0, Math.round(((u.cpuNs - s.lastCpuNs) / ((now - s.lastAt) * 1e6) / cpu) * 10_000) / 100) : 0;
    s.samples.push({ at: now, cpuPct, memBytes: u.cgroupBytes ?? u.rssBytes, ...(u.diskUsedBytes !== undefined ? { diskBytes: u.diskUsedBytes } : {}) });
    if (s.samples.length > this.keep) s.samples.splice(0, s.samples.length - this.keep);
    s.lastCpuNs = u.cpuNs;
    s.lastAt = now;
  }

  /** The kept samples of a sandbox between `start` and `end` (ms since epoch, inclusive), oldest first. */
  series(id: string, range: { start?: number; end?: number } = {}): UsageSample[] {
    return (this.byId.get(id)?.samples ?? []).filter((x) => (range.start === undefined || x.at >= range.start) && (range.end === undefined || x.at <= range.end));
  }

  /** Forgets a sandbox (it ended). */
  forget(id: string): void {
    this.byId.delete(id);
  }
}
