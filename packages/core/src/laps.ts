/**
 * Where an operation's milliseconds went, step by step: what wake, snapshot and hibernate
 * events and logs report (issue 17's profile, from any daemon).
 */

/**
 * A stopwatch with named laps; a lap's name may repeat (its times add up).
 * @example
 * const laps = new Laps();
 * await fetch(); laps.lap('fetch');
 * await restore(); laps.lap('restore');
 * laps.toString(); // "fetch 120, restore 412"
 */
export class Laps {
  /** Milliseconds per step, in the order the steps first ended. */
  readonly ms: Record<string, number> = {};
  private last = performance.now();

  /** Ends the current step as `name`, starting the next; returns its milliseconds. */
  lap(name: string): number {
    const now = performance.now();
    const ms = now - this.last;
    this.add(name, ms);
    this.last = now;
    return ms;
  }

  /**
   * Ends the current step, recorded as the `parts` someone measured inside it (e.g. a driver's
   * `{ network: 40, runtime: 300 }`) and what is left of it as `rest`.
   */
  split(rest: string, parts: Record<string, number | undefined>): void {
    const now = performance.now();
    let left = now - this.last;
    for (const [k, v] of Object.entries(parts)) {
      if (v === undefined) continue;
      this.add(k, v);
      left -= v;
    }
    if (left >= 0.5) this.add(rest, left);
    this.last = now;
  }

  /** Adds a step measured elsewhere (not counted against the current step's clock). */
  add(name: string, ms: number): void {
    this.ms[name] = Math.round((this.ms[name] ?? 0) + ms);
  }

  /** `"fetch 120, restore 412"`: steps in milliseconds, for events and logs. */
  toString(): string {
    return Object.entries(this.ms).map(([k, v]) => `${k} ${v}`).join(', ');
  }
}
