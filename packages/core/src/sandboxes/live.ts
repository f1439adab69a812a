/**
 * What the daemon holds in memory for one sandbox between calls — its agent connection, the
 * lock that orders its lifecycle actions, the gate that holds calls during a checkpoint, its
 * timers — passed whole to the code that acts on it.
 */
import type { AgentChannel } from '../agent/channel.js';
import type { IdentityChange } from './identity.js';

/** The identity the agent of a restored copy is given when it connects (its hostname always). */
export type AgentIdentity = IdentityChange & { hostname: string };

/**
 * One sandbox's live state.
 *
 * @example
 * const e = live.entry(id);
 * await e.withLock(async () => { ... });
 */
export class LiveSandbox {
  channel?: AgentChannel;
  /** Callers waiting for the agent to connect (see {@link waitAgent}): given the channel, undefined (none will come) or the error that stopped it. */
  waiters: ((ch: AgentChannel | undefined | Error) => void)[] = [];
  timer?: NodeJS.Timeout;
  policyTimer?: NodeJS.Timeout;
  idleTimer?: NodeJS.Timeout;
  /** Last API call for this sandbox (ms since epoch). */
  lastActive?: number;
  killing?: boolean;
  /** Set while the agent is deliberately disconnected for a checkpoint or restore. */
  quiescing?: boolean;
  /** While restoring a snapshot of another sandbox (fork, template): that sandbox's id, which the agent still reports. */
  restoringFrom?: string;
  /** The identity the agent of a restored copy is given when it connects. */
  identity?: AgentIdentity;
  /** How long giving it that identity took, ms. */
  identityMs?: number;
  /** Serialises lifecycle actions on this sandbox. */
  private lock: Promise<unknown> = Promise.resolve();
  /** Set while a checkpoint is under way: new calls wait for it. */
  gate?: Promise<void>;

  constructor(readonly id: string) {}

  /** The agent's connection if it is open. */
  get openChannel(): AgentChannel | undefined {
    return this.channel && !this.channel.closed ? this.channel : undefined;
  }

  /** Runs `fn` after every earlier lifecycle action on this sandbox has finished. */
  withLock<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.lock.then(fn, fn);
    this.lock = next.catch(() => {});
    return next;
  }

  /** Holds new calls until the returned release is called (during a checkpoint). */
  closeGate(): () => void {
    if (this.gate) return () => {};
    let open!: () => void;
    const gate = (this.gate = new Promise<void>((r) => (open = r)));
    // Idempotent: a second call must not open a gate closed since by someone else.
    return () => {
      if (this.gate === gate) this.gate = undefined;
      open();
    };
  }

  /** Stops its timeout, rolling-snapshot and idle timers. */
  clearTimers(): void {
    clearTimeout(this.timer);
    clearTimeout(this.policyTimer);
    clearTimeout(this.idleTimer);
  }

  /**
   * The agent's connection: the open one, or the next within `ms` (undefined if none comes).
   * Rejects with the error {@link fail} is given: the agent connected but could not take its
   * sandbox's identity. (Such a rejection is never reported as unhandled: a caller may start
   * waiting before it starts the restore that the agent comes from.)
   */
  waitAgent(ms: number): Promise<AgentChannel | undefined> {
    const open = this.openChannel;
    if (open) return Promise.resolve(open);
    const p = new Promise<AgentChannel | undefined>((resolve, reject) => {
      // (Unref'd: waiting for an agent keeps nothing alive; the daemon's listeners do.)
      const t = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== done);
        resolve(undefined);
      }, ms).unref();
      const done = (ch: AgentChannel | undefined | Error) => {
        clearTimeout(t);
        if (ch instanceof Error) reject(ch);
        else resolve(ch);
      };
      this.waiters.push(done);
    });
    p.catch(() => {});
    return p;
  }

  /** Makes `ch` the agent's connection and hands it to everyone waiting. */
  accept(ch: AgentChannel): void {
    this.channel?.destroy();
    this.channel = ch;
    for (const w of this.waiters.splice(0)) w(ch);
  }

  /** Tells everyone waiting that no agent will come (the sandbox ended). */
  abandon(): void {
    for (const w of this.waiters.splice(0)) w(undefined);
  }

  /** Fails everyone waiting with `err` (the agent connected but refused its identity). */
  fail(err: Error): void {
    for (const w of this.waiters.splice(0)) w(err);
  }
}

/** The live sandboxes of this daemon, by id. */
export class LiveTable {
  private readonly map = new Map<string, LiveSandbox>();

  /** The entry of `id`, made on first use. */
  entry(id: string): LiveSandbox {
    let e = this.map.get(id);
    if (!e) this.map.set(id, (e = new LiveSandbox(id)));
    return e;
  }

  /** The entry of `id` if it has one. */
  get(id: string): LiveSandbox | undefined {
    return this.map.get(id);
  }

  delete(id: string): void {
    this.map.delete(id);
  }

  values(): IterableIterator<LiveSandbox> {
    return this.map.values();
  }
}
