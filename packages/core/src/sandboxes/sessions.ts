/**
 * Stateful sessions: pause and resume, snapshots on request, hibernate and wake, rollback, the
 * rolling snapshot policy, and moving a session to another node of a cluster.
 */
import { promises as fs } from 'node:fs';
import { SpaceError } from '../errors.js';
import { Laps } from '../laps.js';
import { assertAllowed, type Sandbox, type Snapshot, type SnapshotPolicy } from '../model.js';
import type { SandboxContext, SessionHooks } from './context.js';

/** Stateful sessions. Built by the facade (SandboxService), which wires it into the hooks. */
export class Sessions implements SessionHooks {
  constructor(private readonly c: SandboxContext) {}

  /** Freezes a running sandbox in memory (no disk). */
  pause(tenantId: string, id: string): Promise<Sandbox> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'pause');
      await this.c.driver.pause(id);
      await this.c.event(id, 'paused', 'paused in memory');
      return this.c.store.updateSandbox(id, { state: 'paused' });
    });
  }

  /** Unfreezes a paused sandbox. */
  resume(tenantId: string, id: string): Promise<Sandbox> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'resume');
      return this.resumeLocked(sb);
    });
  }

  private async resumeLocked(sb: Sandbox): Promise<Sandbox> {
    await this.c.driver.resume(sb.id);
    await this.c.event(sb.id, 'resumed', 'resumed');
    return this.c.store.updateSandbox(sb.id, { state: 'running' });
  }

  /**
   * Brings a sandbox to `running` for whoever needs it now: wakes a hibernated one, resumes a
   * paused one when `resumePaused`, and returns any other as it is. Concurrent callers wake it
   * once (the second finds it running).
   */
  awaken(tenantId: string, id: string, resumePaused = false): Promise<Sandbox> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      if (sb.state === 'hibernated') return this.wakeLocked(sb);
      if (sb.state === 'paused' && resumePaused) return this.resumeLocked(sb);
      return sb;
    });
  }

  /** Takes a snapshot now; the sandbox keeps running (it is stopped for the checkpoint's duration). */
  snapshot(tenantId: string, id: string, opts: { name?: string } = {}): Promise<Snapshot> {
    if (opts.name !== undefined && (typeof opts.name !== 'string' || opts.name.length > 128)) throw new SpaceError('BAD_REQUEST', 'Snapshot name must be a string of at most 128 characters');
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'snapshot');
      const { snapshot, imageDir } = await this.c.hooks.checkpoints.takeSnapshot(sb, 'manual', opts.name, true);
      await fs.rm(imageDir, { recursive: true, force: true });
      return snapshot;
    });
  }

  /** A sandbox's snapshots, oldest first. */
  async snapshots(tenantId: string, id: string): Promise<Snapshot[]> {
    await this.c.hooks.get(tenantId, id);
    return this.c.store.listSnapshots(id);
  }

  /** A tenant's snapshot by id; another tenant's is as unknown as a missing one. */
  async getSnapshot(tenantId: string, snapshotId: string): Promise<Snapshot> {
    const snap = typeof snapshotId === 'string' && snapshotId.length < 64 ? await this.c.store.getSnapshot(snapshotId) : undefined;
    if (!snap || snap.tenantId !== tenantId) throw new SpaceError('SNAPSHOT_NOT_FOUND', `No snapshot ${JSON.stringify(snapshotId)} for this API key`, { details: { snapshotId } });
    return snap;
  }

  /**
   * Deletes one snapshot. The snapshot a hibernated sandbox sleeps in holds its state and is
   * refused (`SANDBOX_INVALID_STATE`); deleting a running sandbox's newest snapshot makes the
   * one before it the point a crash recovers to.
   *
   * @example
   * await svc.removeSnapshot('tenant1', 'sn0123456789abcdefgh');
   */
  async removeSnapshot(tenantId: string, snapshotId: string): Promise<void> {
    const snap = await this.getSnapshot(tenantId, snapshotId);
    await this.c.withLock(snap.sandboxId, async () => {
      const sb = await this.c.hooks.get(tenantId, snap.sandboxId);
      if (sb.lastSnapshotId === snap.id && sb.state === 'hibernated') throw new SpaceError('SANDBOX_INVALID_STATE', `Snapshot ${snap.id} holds hibernated sandbox ${sb.id}: wake or kill the sandbox first`);
      if (sb.lastSnapshotId === snap.id) {
        const rest = (await this.c.store.listSnapshots(sb.id)).filter((x) => x.id !== snap.id);
        await this.c.store.updateSandbox(sb.id, { lastSnapshotId: rest.at(-1)?.id });
      }
      await this.c.hooks.checkpoints.deleteSnapshot(snap);
      await this.c.event(sb.id, 'snapshot-deleted', `snapshot ${snap.id} deleted`);
    });
  }

  /** Saves the whole sandbox to a snapshot and releases every host resource. */
  hibernate(tenantId: string, id: string): Promise<Sandbox> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'hibernate');
      return this.hibernateLocked(sb);
    });
  }

  /**
   * The idle timer's hibernation, decided under the sandbox's lock: only a sandbox still running,
   * untouched by API calls for `idleMs`, with no agent call open (a command streaming its output
   * is activity, and a checkpoint would cut it), and with the gate closed from that check on, so
   * that no call slips in before the checkpoint. `active` says to look again later.
   */
  hibernateIfIdle(id: string, idleMs: number): Promise<'hibernated' | 'active' | 'gone'> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.store.getSandbox(id);
      if (!sb || sb.state !== 'running' || this.c.stopping()) return 'gone';
      const e = this.c.live.entry(id);
      if (Date.now() - (e.lastActive ?? 0) < idleMs || (e.channel?.openCalls ?? 0) > 0) return 'active';
      const release = e.closeGate();
      try {
        await this.c.event(id, 'idle', `no API call for ${idleMs} ms: hibernating`);
        await this.hibernateLocked(sb);
        return 'hibernated';
      } finally {
        release();
      }
    });
  }

  /** Hibernates `sb` (its lock held). */
  private async hibernateLocked(sb: Sandbox): Promise<Sandbox> {
    const id = sb.id;
    const t0 = Date.now();
    const { snapshot, imageDir, intent } = await this.c.hooks.checkpoints.takeSnapshot(sb, 'hibernate', undefined, false);
    await fs.rm(imageDir, { recursive: true, force: true });
    await this.c.faults.fault('hibernate:after-snapshot');
    const e = this.c.live.entry(id);
    clearTimeout(e.policyTimer);
    clearTimeout(e.idleTimer);
    await this.c.driver.retire(id);
    e.quiescing = false;
    await this.c.event(id, 'hibernated', `hibernated to snapshot ${snapshot.id} in ${Date.now() - t0} ms`);
    const r = await this.c.store.updateSandbox(id, { state: 'hibernated' });
    await this.c.journal.done(intent);
    // Its volumes close (ciphertext at rest while it sleeps) once its runtime has let go of them:
    // in the background, as the runtime is released in the background; the wake opens them again.
    if (sb.volumes?.length) void this.c.volumes?.suspend(id);
    return r;
  }

  /**
   * Hands the sandbox to node `to` of the cluster: hibernated here first when it runs, then its
   * record moves (conditionally: still this node's and hibernated) with its generation bumped.
   * The new node wakes it from the snapshot in the shared blob store.
   */
  move(tenantId: string, id: string, to: string, opts: { wakeThere?: boolean } = {}): Promise<{ sandbox: Sandbox; wasRunning: boolean }> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'move');
      if (to === this.c.nodeName) throw new SpaceError('BAD_REQUEST', `Sandbox ${id} is on node ${to} already`);
      await this.assertMovable(sb, to);
      const wasRunning = sb.state !== 'hibernated';
      const asleep = wasRunning ? await this.hibernateLocked(sb) : sb;
      // Hibernated here, not yet handed over: a node lost now leaves it hibernated and its own,
      // for the next request on any node to take over.
      await this.c.faults.fault('move:after-hibernate');
      this.c.live.get(id)?.clearTimers();
      const moved = await this.c.store.updateSandbox(id, { node: to, generation: (asleep.generation ?? 0) + 1, ...(wasRunning && opts.wakeThere ? { wakeOnArrival: true } : {}) }, { node: this.c.nodeName ?? null, state: 'hibernated' });
      await this.c.event(id, 'moved', `moved from node ${this.c.nodeName} to node ${to} (ownership generation ${moved.generation}); it wakes there`);
      return { sandbox: moved, wasRunning };
    });
  }

  /**
   * Takes a hibernated sandbox of another node (down: `why`) for this one, conditionally (still
   * that node's and hibernated: of two nodes trying, one wins and the other gets the error).
   */
  async takeOver(sb: Sandbox, why: string): Promise<Sandbox> {
    const me = this.c.nodeName;
    if (!me) throw new SpaceError('SANDBOX_ON_OTHER_NODE', `Sandbox ${sb.id} runs on node ${sb.node}`);
    await this.assertMovable(sb, me);
    const taken = await this.c.store.updateSandbox(sb.id, { node: me, generation: (sb.generation ?? 0) + 1 }, { node: sb.node ?? null, state: 'hibernated' });
    await this.c.event(sb.id, 'moved', `taken over from node ${sb.node} by node ${me} (ownership generation ${taken.generation}): ${why}`);
    this.c.hooks.timers.schedule(taken);
    return taken;
  }

  /**
   * Throws unless the sandbox can run on node `to`: no volume (kept on its node), its template's
   * files there. A gVisor disk moves: a cluster's snapshots hold what it grew from (`putImage`'s
   * `portable`); a microVM's does not yet.
   */
  async assertMovable(sb: Sandbox, to: string): Promise<void> {
    if (sb.volumes?.length) {
      throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${sb.id} mounts volumes, which are kept on node ${sb.node}: it cannot move to another node (yet)`, { details: { sandboxId: sb.id, node: sb.node } });
    }
    if (sb.diskMb !== undefined && !this.c.driver.disksOf(sb.driver)?.movable) {
      throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${sb.id} keeps its disk on node ${sb.node}: a disk of the ${sb.driver} driver cannot move to another node (yet)`, { details: { sandboxId: sb.id, node: sb.node } });
    }
    const t = await this.c.templates.resolve(sb.tenantId, sb.template).catch(() => undefined);
    const here = to === this.c.nodeName;
    if (t && t.source.type !== 'builtin' && t.node && t.node !== to && !(here && this.c.templates.rootfsReady(t))) {
      throw new SpaceError('TEMPLATE_NOT_ON_NODE', `Sandbox ${sb.id} runs template ${t.name}, whose root file system is on node ${t.node}, not on node ${to}`, { details: { template: t.name, node: t.node } });
    }
  }

  /** Restores a hibernated sandbox from its snapshot. */
  wake(tenantId: string, id: string): Promise<Sandbox> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'wake');
      return this.wakeLocked(sb);
    });
  }

  private async wakeLocked(sb: Sandbox): Promise<Sandbox> {
    const id = sb.id;
    const snap = sb.lastSnapshotId ? await this.c.store.getSnapshot(sb.lastSnapshotId) : undefined;
    if (!snap) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Sandbox ${id} has no snapshot to wake from`);
    const t0 = Date.now();
    const intent = await this.c.journal.begin(id, 'wake', { step: 'restore', snapshotId: snap.id });
    await this.c.faults.fault('wake:after-intent');
    const laps = new Laps();
    try {
      await this.c.faults.during('wake:during-restore', this.c.hooks.checkpoints.restoreFrom(snap, sb, undefined, laps));
    } catch (err) {
      // Still hibernated in its snapshot: whatever the restore left is removed.
      await this.c.driver.destroy(id).catch((e) => this.c.log.warn({ err: e, sandboxId: id }, 'cleanup after a failed wake failed'));
      await this.c.journal.done(intent);
      throw err;
    }
    await this.c.faults.fault('wake:after-restore');
    this.c.log.info({ sandboxId: id, snapshotId: snap.id, ms: laps.ms }, 'woken');
    await this.c.event(id, 'woken', `woken from snapshot ${snap.id} in ${Date.now() - t0} ms (ms: ${laps})`);
    let woke: Sandbox;
    try {
      woke = await this.markWoken(sb);
    } catch (err) {
      // Taken over by another node while this one restored it (fenced out): this copy goes.
      if (err instanceof SpaceError && err.code === 'SANDBOX_ON_OTHER_NODE') {
        const e = this.c.live.get(id);
        if (e) e.killing = true;
        e?.clearTimers();
        e?.channel?.destroy();
        this.c.live.delete(id);
        await this.c.driver.destroy(id).catch((e) => this.c.log.warn({ err: e, sandboxId: id }, 'removing a copy another node took over failed'));
        await this.c.journal.done(intent);
      }
      throw err;
    }
    await this.c.journal.done(intent);
    return woke;
  }

  /** Records a woken sandbox as running; the timeout starts afresh (like creating), or a timeout that hibernated it would fire at once. */
  async markWoken(sb: Sandbox): Promise<Sandbox> {
    // Its idle time starts now: a wake that took longer than the idle timeout must not hibernate it at once.
    this.c.live.entry(sb.id).lastActive = Date.now();
    const woke = await this.c.store.updateSandbox(sb.id, { state: 'running', ...(sb.timeoutMs ? { expiresAt: new Date(Date.now() + sb.timeoutMs).toISOString() } : {}) });
    this.c.hooks.timers.arm(woke);
    return woke;
  }

  /** Rolls a sandbox back to one of its snapshots, in place. The snapshot is verified before anything changes. */
  rollback(tenantId: string, id: string, snapshotId: string): Promise<Sandbox> {
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'rollback');
      const snap = await this.c.hooks.checkpoints.ownSnapshot(sb, snapshotId);
      const intent = await this.c.journal.begin(id, 'rollback', { step: 'verify', snapshotId: snap.id });
      // Verified (and decrypted) before anything changes: a corrupt snapshot or a revoked key is refused as is.
      const dir = await this.c.hooks.checkpoints.unpack(snap).catch(async (err) => {
        await this.c.journal.done(intent);
        throw err;
      });
      await this.c.faults.fault('rollback:after-verify');
      try {
        await this.c.journal.step(intent, 'restore');
        await this.c.faults.during('rollback:during-restore', this.c.hooks.checkpoints.restoreFrom(snap, sb, dir));
      } catch (err) {
        // A restore that fails now may have lost the old incarnation.
        const msg = err instanceof Error ? err.message : String(err);
        if (!(await this.c.hooks.recovery.runtimeRuns(id))) await this.c.hooks.recovery.recover(sb, `rollback to ${snap.id} failed: ${msg}`);
        await this.c.journal.done(intent);
        throw new SpaceError('SNAPSHOT_FAILED', `Rollback of ${id} to ${snap.id} failed: ${msg}`, { cause: err });
      } finally {
        await fs.rm(dir, { recursive: true, force: true });
      }
      await this.c.faults.fault('rollback:after-restore');
      await this.c.event(id, 'rolled-back', `rolled back to snapshot ${snap.id} (${snap.createdAt})`);
      const r = await this.c.store.updateSandbox(id, { state: 'running', fromSnapshotId: snap.id });
      this.c.hooks.timers.schedulePolicy(r);
      await this.c.journal.done(intent);
      return r;
    });
  }

  /** Sets (or with `null` removes) the rolling snapshot policy. */
  setSnapshotPolicy(tenantId: string, id: string, policy: SnapshotPolicy | null): Promise<Sandbox> {
    if (policy && (!Number.isInteger(policy.intervalMs) || policy.intervalMs < 1000 || policy.intervalMs > 7 * 86_400_000 || !Number.isInteger(policy.keep) || policy.keep < 1 || policy.keep > 1000)) {
      throw new SpaceError('BAD_REQUEST', 'Snapshot policy needs intervalMs from 1000 to 604800000 and keep from 1 to 1000');
    }
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'setPolicy');
      const updated = await this.c.store.updateSandbox(id, policy ? { snapshotPolicy: { intervalMs: policy.intervalMs, keep: policy.keep } } : { snapshotPolicy: undefined });
      this.c.hooks.timers.schedulePolicy(updated);
      return updated;
    });
  }
}
