/**
 * Fault injection for the crash tests: at a named step boundary of a lifecycle operation the
 * daemon dies (docs/operations.md lists the points). By default the process SIGKILLs itself;
 * the fast lane passes an action that stops the service where it stands instead
 * (`test/crash-fake.test.mjs`). Never set in production.
 */
import type { Logger } from '../logger.js';

/** What happens at an armed point: never returns (the process is gone, or the operation is frozen). */
export type FaultAction = (point: string) => Promise<never>;

const sigkill: FaultAction = () => {
  process.kill(process.pid, 'SIGKILL');
  return new Promise<never>(() => {});
};

/**
 * Points are names, each armed for its first pass, or `NAME#N` for the N-th pass (the ones
 * before it go by: a session can take a good snapshot and die in its second).
 *
 * @example
 * const faults = new FaultPoints(['snapshot:after-checkpoint#2'], log);
 * await faults.fault('snapshot:after-checkpoint'); // passes
 * await faults.fault('snapshot:after-checkpoint'); // the process dies here
 */
export class FaultPoints {
  /** Passes left before each armed point fires (1: the next one). */
  private readonly points = new Map<string, number>();

  constructor(points: readonly string[], private readonly log: Logger, private readonly action: FaultAction = sigkill) {
    for (const p of points) {
      const m = /^(.*)#([1-9][0-9]*)$/.exec(p);
      this.points.set(m ? m[1]! : p, m ? Number(m[2]) : 1);
    }
  }

  /** Whether `point` is armed. */
  has(point: string): boolean {
    return this.points.has(point);
  }

  /** Kills the daemon if `point` is armed and this is its pass (the returned promise then never settles). */
  async fault(point: string): Promise<void> {
    const left = this.points.get(point);
    if (left === undefined) return;
    if (left > 1) {
      this.points.set(point, left - 1);
      return;
    }
    this.log.error({ point }, 'fault injected: killing the daemon');
    await this.action(point);
  }

  /**
   * While `p` runs (a runtime operation under way): if `point` is armed the daemon dies 25 ms
   * into it, and `p` carries on without it, as a detached runtime call does.
   */
  async during<T>(point: string, p: Promise<T>): Promise<T> {
    if (this.points.get(point) !== 1) {
      await this.fault(point); // counts the pass
      return p;
    }
    p.catch(() => {}); // its outcome is nobody's once the daemon is gone
    await new Promise((r) => setTimeout(r, 25));
    await this.fault(point);
    return p;
  }
}
