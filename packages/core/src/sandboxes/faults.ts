/**
 * Fault injection for the crash tests: at a named step boundary of a lifecycle operation the
 * daemon SIGKILLs itself (docs/operations.md lists the points). Never set in production.
 */
import type { Logger } from '../logger.js';

/**
 * @example
 * const faults = new FaultPoints(['snapshot:after-checkpoint'], log);
 * faults.fault('snapshot:after-checkpoint'); // the process dies here
 */
export class FaultPoints {
  private readonly points: Set<string>;

  constructor(points: readonly string[], private readonly log: Logger) {
    this.points = new Set(points);
  }

  /** Whether `point` is armed. */
  has(point: string): boolean {
    return this.points.has(point);
  }

  /** Kills the daemon if `point` is armed. */
  fault(point: string): void {
    if (this.points.has(point)) {
      this.log.error({ point }, 'fault injected: killing the daemon');
      process.kill(process.pid, 'SIGKILL');
    }
  }

  /** While `p` runs (a runtime operation under way): the daemon dies 25 ms into it if `point` is armed. */
  during<T>(point: string, p: Promise<T>): Promise<T> {
    if (this.points.has(point)) setTimeout(() => this.fault(point), 25);
    return p;
  }
}
