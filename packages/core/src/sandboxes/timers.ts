/**
 * A sandbox's timers: its timeout (kill or hibernate), rolling snapshots, and hibernation when
 * idle.
 */
import { promises as fs } from 'node:fs';
import { SpaceError } from '../errors.js';
import type { Sandbox } from '../model.js';
import type { SandboxContext, TimerHooks } from './context.js';

/** A sandbox's timers. Built by the facade (SandboxService), which wires it into the hooks. */
export class Timers implements TimerHooks {
  constructor(private readonly c: SandboxContext) {}

  /** Arms every timer of a running sandbox: its timeout, rolling snapshots and idle hibernation. */
  arm(sb: Sandbox): void {
    this.schedule(sb);
    this.schedulePolicy(sb);
  }

  schedule(sb: Sandbox): void {
    const e = this.c.live.entry(sb.id);
    clearTimeout(e.timer);
    if (!sb.expiresAt || (sb.onTimeout === 'hibernate' && sb.state === 'hibernated')) return;
    const ms = Math.max(0, Date.parse(sb.expiresAt) - Date.now());
    // setTimeout caps at ~24.8 days; re-arm for longer timeouts.
    e.timer = setTimeout(() => {
      if (Date.parse(sb.expiresAt!) > Date.now() + 1000) return this.schedule(sb);
      const act =
        sb.onTimeout === 'hibernate'
          ? this.c.store.getSandbox(sb.id).then((cur) => (cur && (cur.state === 'running' || cur.state === 'paused') ? this.c.hooks.sessions.hibernate(cur.tenantId, cur.id) : undefined))
          : this.c.hooks.endings.terminate(sb.id, 'killed', 'timeout', `timeout of ${sb.timeoutMs} ms reached`);
      void act.catch((err) => this.c.log.error({ err, sandboxId: sb.id }, 'timeout action failed'));
    }, Math.min(ms, 2 ** 31 - 1));
    e.timer.unref();
  }

  schedulePolicy(sb: Sandbox): void {
    this.scheduleIdle(sb);
    const e = this.c.live.entry(sb.id);
    clearTimeout(e.policyTimer);
    if (!sb.snapshotPolicy || this.c.stopping()) return;
    e.policyTimer = setTimeout(() => void this.scheduledSnapshot(sb.id).catch((err) => this.c.log.error({ err, sandboxId: sb.id }, 'scheduled snapshot failed')), sb.snapshotPolicy.intervalMs);
    e.policyTimer.unref();
  }

  /** Hibernates a sandbox once no API call has touched it for `idleTimeoutMs`. */
  private scheduleIdle(sb: Sandbox): void {
    const e = this.c.live.entry(sb.id);
    clearTimeout(e.idleTimer);
    if (!sb.idleTimeoutMs || this.c.stopping()) return;
    e.lastActive ??= Date.now();
    const due = e.lastActive + sb.idleTimeoutMs - Date.now();
    e.idleTimer = setTimeout(() => void this.idleTick(sb).catch((err) => this.c.log.error({ err, sandboxId: sb.id }, 'idle check failed')), Math.max(0, due));
    e.idleTimer.unref();
  }

  /**
   * The idle timer fired: hibernate, or look again later — after the idle time from the last
   * call, from now when a call is still open, and from now after a refusal (say a socket this
   * runsc cannot checkpoint), which is recorded.
   */
  private async idleTick(sb: Sandbox): Promise<void> {
    const e = this.c.live.entry(sb.id);
    try {
      const r = await this.c.hooks.sessions.hibernateIfIdle(sb.id, sb.idleTimeoutMs!);
      if (r !== 'active') return;
      if ((e.channel?.openCalls ?? 0) > 0) e.lastActive = Date.now();
    } catch (err) {
      e.lastActive = Date.now();
      const code = err instanceof SpaceError ? err.code : 'ERROR';
      this.c.log.warn({ err, sandboxId: sb.id }, 'idle hibernation refused');
      await this.c.event(sb.id, 'idle-hibernate-refused', `idle, but not hibernated: ${code}: ${err instanceof Error ? err.message : String(err)}; trying again after ${sb.idleTimeoutMs} ms`).catch(() => {});
    }
    // Re-armed from the record; with the store away, from what this tick knew (checked again then).
    const cur = await this.c.store.getSandbox(sb.id).catch(() => ({ ...sb, state: 'running' as const }));
    if (cur?.state === 'running') this.scheduleIdle(cur);
  }

  /** One tick of the rolling policy: snapshot, expire the oldest scheduled ones, re-arm. A refusal is recorded and retried next tick. */
  private async scheduledSnapshot(id: string): Promise<void> {
    let known: Sandbox | undefined;
    await this.c.withLock(id, async () => {
      const sb = await this.c.store.getSandbox(id);
      known = sb;
      if (!sb?.snapshotPolicy || sb.state !== 'running' || this.c.stopping()) return;
      // A checkpoint disconnects the agent, which would cut a client's open command stream.
      const open = this.c.live.get(id)?.channel?.openCalls ?? 0;
      if (open > 0) {
        await this.c.event(id, 'snapshot-deferred', `scheduled snapshot deferred: ${open} call(s) open; retrying in ${sb.snapshotPolicy.intervalMs} ms`);
        return;
      }
      const release = this.c.live.entry(id).closeGate();
      try {
        const { imageDir } = await this.c.hooks.checkpoints.takeSnapshot(sb, 'schedule', undefined, true);
        await fs.rm(imageDir, { recursive: true, force: true });
      } catch (err) {
        const e = err instanceof SpaceError ? err : undefined;
        await this.c.event(id, 'snapshot-refused', `scheduled snapshot not taken: ${e?.code ?? 'ERROR'}: ${err instanceof Error ? err.message : String(err)}; retrying in ${sb.snapshotPolicy.intervalMs} ms`);
      } finally {
        release();
      }
      const scheduled = (await this.c.store.listSnapshots(id)).filter((s) => s.trigger === 'schedule');
      for (const old of scheduled.slice(0, Math.max(0, scheduled.length - sb.snapshotPolicy.keep))) await this.c.hooks.checkpoints.deleteSnapshot(old);
    }).catch((err) => this.c.log.error({ err, sandboxId: id }, 'scheduled snapshot failed'));
    // Re-armed from the record; with the store away, from what this tick read (checked again
    // then), or — it read nothing — for another try in 5 s.
    const cur = await this.c.store.getSandbox(id).catch(() => known ?? null);
    if (cur === null) {
      const e = this.c.live.entry(id);
      e.policyTimer = setTimeout(() => void this.scheduledSnapshot(id).catch((err) => this.c.log.error({ err, sandboxId: id }, 'scheduled snapshot failed')), 5000);
      e.policyTimer.unref();
    } else if (cur && (cur.state === 'running' || cur.state === 'paused')) this.schedulePolicy(cur);
  }
}
