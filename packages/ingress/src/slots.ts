/**
 * How many connections the ingress holds open to one sandbox at once (requests in flight and
 * WebSockets), and the requests waiting for one: a burst is served in turn, not all at once,
 * and one sandbox's clients cannot take every descriptor of the daemon.
 */
import { SpaceError } from '@space/api';

/** Limits of {@link SandboxSlots}. */
export interface SlotLimits {
  /** Connections to one sandbox at once. */
  max: number;
  /** Requests that may wait for one of them; beyond, INGRESS_BUSY at once. */
  maxQueued: number;
  /** How long a request waits for one; then INGRESS_BUSY. */
  queueTimeoutMs: number;
}

interface Waiter {
  grant: () => void;
}

interface Sandbox {
  active: number;
  waiting: Waiter[];
}

/**
 * @example
 * const slots = new SandboxSlots({ max: 256, maxQueued: 1024, queueTimeoutMs: 30_000 });
 * const release = await slots.acquire('sb123', req.signal); // waits while 256 are open
 * try { await forward(); } finally { release(); }
 */
export class SandboxSlots {
  private readonly sandboxes = new Map<string, Sandbox>();

  constructor(private readonly limits: SlotLimits) {
    for (const [k, v] of Object.entries(limits)) if (!Number.isInteger(v) || v < (k === 'maxQueued' ? 0 : 1)) throw new SpaceError('CONFIG_INVALID', `Ingress limit ${k} must be a whole number ${k === 'maxQueued' ? '>= 0' : '>= 1'}; got ${v}`);
  }

  /** Connections open to `sandboxId` now, and requests waiting for one. */
  usage(sandboxId: string): { active: number; waiting: number } {
    const s = this.sandboxes.get(sandboxId);
    return { active: s?.active ?? 0, waiting: s?.waiting.length ?? 0 };
  }

  /**
   * Resolves, once `sandboxId` has a connection free, to the function that gives it back (which
   * may be called more than once). Throws INGRESS_BUSY when its queue is full or the wait runs
   * out; rejects with the signal's reason when `signal` aborts meanwhile (the client left).
   */
  acquire(sandboxId: string, signal?: AbortSignal): Promise<() => void> {
    const s = this.sandboxes.get(sandboxId) ?? { active: 0, waiting: [] };
    this.sandboxes.set(sandboxId, s);
    if (s.active < this.limits.max) {
      s.active++;
      return Promise.resolve(this.releaser(sandboxId, s));
    }
    if (s.waiting.length >= this.limits.maxQueued) return Promise.reject(this.busy(sandboxId, 'and as many requests wait'));
    return new Promise((resolve, reject) => {
      const leave = (err: unknown) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
        const i = s.waiting.indexOf(w);
        if (i >= 0) s.waiting.splice(i, 1);
        this.forget(sandboxId, s);
        reject(err);
      };
      const onAbort = () => leave(signal!.reason);
      const w: Waiter = {
        grant: () => {
          clearTimeout(timer);
          signal?.removeEventListener('abort', onAbort);
          resolve(this.releaser(sandboxId, s));
        },
      };
      const timer = setTimeout(() => leave(this.busy(sandboxId, `for ${this.limits.queueTimeoutMs} ms`)), this.limits.queueTimeoutMs);
      signal?.addEventListener('abort', onAbort, { once: true });
      s.waiting.push(w);
    });
  }

  /** A connection given back goes to the first request waiting (its count stays), else is freed. */
  private releaser(sandboxId: string, s: Sandbox): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const next = s.waiting.shift();
      if (next) next.grant();
      else {
        s.active--;
        this.forget(sandboxId, s);
      }
    };
  }

  private forget(sandboxId: string, s: Sandbox): void {
    if (s.active === 0 && s.waiting.length === 0 && this.sandboxes.get(sandboxId) === s) this.sandboxes.delete(sandboxId);
  }

  private busy(sandboxId: string, why: string): SpaceError {
    return new SpaceError('INGRESS_BUSY', `Sandbox ${sandboxId} has ${this.limits.max} connections open through the ingress ${why}: retry in a moment`, { details: { sandboxId, maxConnections: this.limits.max } });
  }
}
