/**
 * Recovery: at start-up, the operations a crash interrupted finished or undone from the journal,
 * running sandboxes re-adopted, lost ones restored from their newest snapshot; and any sandbox
 * that dies brought back from its last good one.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { CHECKPOINT_COMPLETE } from '../ports/driver.js';
import { SpaceError } from '../errors.js';
import type { Intent } from '../ports/intent-journal.js';
import { TERMINAL_STATES, type Sandbox } from '../model.js';
import type { RecoveryHooks, SandboxContext } from './context.js';

/** How long a restarted daemon waits for a checkpoint or restore its predecessor left running. */
const SETTLE_TIMEOUT_MS = 300_000;

/** Recovery. Built by the facade (SandboxService), which wires it into the hooks. */
export class Recovery implements RecoveryHooks {
  constructor(private readonly c: SandboxContext) {}

  /**
   * Finishes or undoes the operations a crash interrupted (the journal), re-adopts sandboxes
   * that still run, restores the others from their newest snapshot (dead only without one),
   * finishes interrupted creates, and removes what no sandbox owns.
   */
  async startUp(): Promise<void> {
    // Operations a crash interrupted: each is finished or undone first, from what the journal
    // and the runtime say (checkpoint images in the work directory included).
    // With a shared store (a cluster), only this node's sandboxes: another node's intents are
    // its operations under way, and its sandboxes run there.
    const intents = await this.c.journal.list();
    const settled = new Set<string>();
    for (const intent of intents) {
      const sb = await this.c.store.getSandbox(intent.sandboxId);
      if (sb && !this.c.owns(sb)) continue;
      if (sb && !TERMINAL_STATES.includes(sb.state) && !settled.has(sb.id) && (await this.reconcile(sb, intent))) settled.add(sb.id);
      await this.c.journal.done(intent);
      if (intent.imageDir) await fs.rm(intent.imageDir, { recursive: true, force: true });
    }
    // Whatever else is in the work directory (unpacked snapshots) belonged to finished or undone operations.
    await fs.rm(this.c.workDir, { recursive: true, force: true });
    await fs.mkdir(this.c.workDir, { recursive: true, mode: 0o700 });
    const hibernated = await this.mine(['hibernated']);
    for (const sb of hibernated) if (!settled.has(sb.id)) this.c.hooks.timers.schedule(sb);
    const active = await this.mine(['starting', 'running', 'paused']);
    const known = new Set([...active, ...hibernated].map((s) => s.id));
    for (const sb of active) {
      if (settled.has(sb.id)) continue;
      if (sb.state === 'starting') {
        await this.finishCreate(sb);
        continue;
      }
      let alive = false;
      try {
        // A sandbox of a driver this daemon no longer runs cannot be adopted (nor recovered: it ends dead, saying why).
        this.c.driver.assign(sb.id, sb.driver);
        alive = await this.adoptRunning(sb);
      } catch (err) {
        this.c.log.warn({ err, sandboxId: sb.id }, 'adopt failed');
      }
      if (alive) {
        this.c.log.info({ sandboxId: sb.id }, 're-adopted running sandbox');
      } else if (sb.lastSnapshotId) {
        // Restores it from its last snapshot, or marks it dead if that fails.
        await this.recover(sb, 'the sandbox was gone when the daemon started');
      } else {
        const st = await this.c.driver.status(sb.id).catch(() => ({ running: false, reason: undefined, detail: undefined }));
        await this.c.driver.destroy(sb.id).catch((err) => this.c.log.error({ err, sandboxId: sb.id }, 'cleanup of dead sandbox failed'));
        await this.c.hooks.endings.end(sb.id, 'dead', st.reason ?? 'lost', st.detail ?? 'the sandbox was gone when the daemon started');
      }
    }
    // States as recovery left them (one read).
    const stateNow = new Map((await this.mine(['running', 'paused', 'hibernated'])).map((s) => [s.id, s.state]));
    for (const id of await this.c.driver.list()) {
      if (!known.has(id)) {
        this.c.log.warn({ sandboxId: id }, 'removing orphaned runtime sandbox');
        await this.c.driver.destroy(id).catch((err) => this.c.log.error({ err, sandboxId: id }, 'orphan removal failed'));
      } else if (stateNow.get(id) === 'hibernated') {
        // A hibernated sandbox holds nothing on the host; a crash may have cut its release short.
        await this.c.driver.destroy(id).catch((err) => this.c.log.error({ err, sandboxId: id }, 'releasing a hibernated sandbox failed'));
      } else if (stateNow.has(id)) {
        await this.c.driver.releaseStale(id).catch((err) => this.c.log.warn({ err, sandboxId: id }, 'releasing stale incarnations failed'));
      }
    }
  }

  /**
   * This node's sandboxes in these states. The store's only daemon owns them all: one recorded
   * under another node name (the host was renamed, or `--node-name` changed) is taken over.
   */
  private async mine(states: Sandbox['state'][]): Promise<Sandbox[]> {
    const out: Sandbox[] = [];
    for (const sb of await this.c.store.sandboxesInStates(states)) {
      if (!this.c.owns(sb)) continue;
      if (this.c.nodeName && sb.node !== this.c.nodeName) out.push(await this.c.store.updateSandbox(sb.id, { node: this.c.nodeName }));
      else out.push(sb);
    }
    return out;
  }

  /**
   * Brings a sandbox that died (failed checkpoint, lost while the daemon was down) back from
   * its last good snapshot and records what was lost. Returns false when that is impossible.
   */
  async recover(sb: Sandbox, why: string): Promise<boolean> {
    const snap = sb.lastSnapshotId ? await this.c.store.getSnapshot(sb.lastSnapshotId) : undefined;
    if (!snap) {
      await this.c.hooks.endings.terminate(sb.id, 'dead', 'crashed', why);
      return false;
    }
    try {
      await this.c.hooks.checkpoints.restoreFrom(snap, sb);
    } catch (err) {
      await this.c.event(sb.id, 'recovery-failed', `could not restore snapshot ${snap.id}: ${err instanceof Error ? err.message : String(err)}`);
      await this.c.hooks.endings.terminate(sb.id, 'dead', 'crashed', `${why}; recovery from ${snap.id} failed`);
      return false;
    }
    const lostS = Math.round((Date.now() - Date.parse(snap.createdAt)) / 1000);
    await this.c.event(sb.id, 'recovered', `${why}; rolled back to snapshot ${snap.id}, its newest complete state, losing the last ${lostS} s`);
    const r = await this.c.store.updateSandbox(sb.id, { state: 'running', fromSnapshotId: snap.id });
    this.c.hooks.timers.arm(r);
    return true;
  }

  /**
   * Node `lost` stopped heartbeating (a cluster): each of its sandboxes that was running,
   * paused or being created is taken over by this node — conditionally, so of several nodes
   * doing this each sandbox goes to one — and restored here from its newest snapshot (event
   * `recovered`, saying how much time was lost), or ends `dead` (`node-lost`) without one. A
   * sandbox that cannot run here (its volumes are on the lost node, or its template's files) is
   * left to wait for that node; a disk is restored with the rest from the snapshot. Returns how
   * many were restored and how many ended.
   */
  async adoptLost(lost: string): Promise<{ restored: number; ended: number }> {
    const me = this.c.nodeName;
    const done = { restored: 0, ended: 0 };
    if (!me || lost === me) return done;
    for (const found of await this.c.store.sandboxesInStates(['starting', 'running', 'paused'], { node: lost })) {
      await this.c.withLock(found.id, async () => {
        const sb = await this.c.store.getSandbox(found.id);
        if (!sb || sb.node !== lost || !['starting', 'running', 'paused'].includes(sb.state)) return;
        try {
          await this.c.hooks.sessions.assertMovable(sb, me);
        } catch (err) {
          if (!this.waiting.has(sb.id)) this.c.log.warn({ err, sandboxId: sb.id, node: lost }, 'a lost node\'s sandbox cannot run here; it waits for its node');
          this.waiting.add(sb.id);
          return;
        }
        let claimed: Sandbox;
        try {
          claimed = await this.c.store.updateSandbox(sb.id, { node: me, generation: (sb.generation ?? 0) + 1 }, { node: lost, state: sb.state });
        } catch {
          return; // another node took it first, or its state changed: not this node's to recover
        }
        const why = `its node ${lost} was lost (no heartbeat)`;
        await this.c.event(sb.id, 'moved', `taken over from node ${lost} by node ${me} (ownership generation ${claimed.generation}): ${why}`);
        if (claimed.state !== 'starting' && claimed.lastSnapshotId) {
          if (await this.recover(claimed, why)) done.restored++;
          else done.ended++;
        } else {
          await this.c.hooks.endings.end(sb.id, 'dead', 'node-lost', `${why}${claimed.state === 'starting' ? ' while it was being created' : ', and it had no snapshot to come back from'}`);
          done.ended++;
        }
      });
    }
    return done;
  }

  /** Lost nodes' sandboxes already found unable to run here (logged once). */
  private readonly waiting = new Set<string>();

  /** Whether the runtime still runs (or holds paused) the sandbox; an unanswered question counts as no. */
  async runtimeRuns(id: string): Promise<boolean> {
    return (await this.c.driver.status(id).catch(() => ({ running: false }))).running;
  }

  /**
   * Re-attaches to a sandbox whose runtime still runs, and makes the runtime's state match the
   * session's: a crash mid-checkpoint can leave a running session's runtime paused. False when
   * the runtime is gone.
   */
  async adoptRunning(sb: Sandbox): Promise<boolean> {
    if (sb.state === 'starting' || !(await this.c.driver.adopt(sb.id))) return false;
    if (sb.state === 'paused') await this.c.driver.pause(sb.id).catch(() => {});
    else await this.c.driver.resume(sb.id).catch(() => {});
    this.c.hooks.timers.arm(sb);
    return true;
  }

  /**
   * Finishes or undoes one operation a crash interrupted, from its intent and what the runtime
   * holds: rolls forward when the runtime's output is complete, back otherwise, and never to
   * an older snapshot while newer complete state exists. Records what it did as a `recovered`
   * event. Returns false when the sandbox is left to the ordinary start-up path (adopt, or
   * restore from its newest snapshot). Never throws.
   */
  private async reconcile(sb: Sandbox, intent: Intent): Promise<boolean> {
    const what = `the daemon stopped during ${intent.op === 'snapshot' ? `a ${intent.trigger ?? 'manual'} snapshot` : `a ${intent.op}`} (step ${intent.step}, begun ${intent.startedAt})`;
    try {
      this.c.driver.assign(sb.id, sb.driver);
      // A checkpoint or restore the dead daemon started may still be running: let it end (bounded).
      await this.c.driver.settle(sb.id, SETTLE_TIMEOUT_MS);
      switch (intent.op) {
        case 'snapshot':
        case 'hibernate':
          return await this.reconcileSnapshot(sb, intent, what);
        case 'wake':
          return await this.reconcileWake(sb, intent, what);
        case 'rollback':
          return await this.reconcileRollback(sb, intent, what);
        default:
          return false;
      }
    } catch (err) {
      this.c.log.error({ err, sandboxId: sb.id, intent }, 'reconciling an interrupted operation failed');
      await this.c.event(sb.id, 'recovery-failed', `${what}; finishing it failed: ${err instanceof Error ? err.message : String(err)}`);
      return false;
    }
  }

  private async reconcileSnapshot(sb: Sandbox, intent: Intent, what: string): Promise<boolean> {
    const stored = intent.snapshotId ? await this.c.store.getSnapshot(intent.snapshotId) : undefined;
    const complete = !!stored || (!!intent.imageDir && existsSync(path.join(intent.imageDir, CHECKPOINT_COMPLETE)));
    const running = await this.runtimeRuns(sb.id);
    if (intent.op === 'hibernate' && sb.state === 'hibernated') {
      // Only the journal's last word was missing.
      await this.c.driver.destroy(sb.id);
      this.c.hooks.timers.schedule(sb);
      return true;
    }
    if (!complete) {
      if (running && (await this.adoptRunning(sb))) {
        await this.c.event(sb.id, 'recovered', `${what}: the checkpoint was not complete, so it was rolled back; the sandbox ran on untouched, nothing lost`);
        return true;
      }
      // Stopped without a complete image: the newest complete state is its last snapshot (none: it is lost).
      return false;
    }
    // The checkpoint is complete: it becomes the snapshot it was meant to be.
    const snap = await this.c.hooks.checkpoints.storeImage(sb, intent, intent.imageDir!, Date.now() - Date.parse(intent.startedAt));
    if (intent.op === 'hibernate') {
      if (running && (await this.adoptRunning(sb))) {
        await this.c.event(sb.id, 'recovered', `${what}: rolled forward, snapshot ${snap.id} is stored; the sandbox still ran, so it runs on; nothing lost`);
        return true;
      }
      await this.c.driver.destroy(sb.id);
      const r = await this.c.store.updateSandbox(sb.id, { state: 'hibernated' });
      if (sb.volumes?.length) await this.c.volumes?.suspend(sb.id);
      this.c.hooks.timers.schedule(r);
      await this.c.event(sb.id, 'recovered', `${what}: rolled forward, hibernated in snapshot ${snap.id} (its checkpoint was complete); nothing lost`);
      return true;
    }
    if (running && (await this.adoptRunning(sb))) {
      await this.c.event(sb.id, 'recovered', `${what}: rolled forward, the complete checkpoint is stored as snapshot ${snap.id} and the sandbox ran on; nothing lost`);
      return true;
    }
    await this.c.hooks.checkpoints.restoreFrom(snap, sb, intent.imageDir);
    const r = await this.c.store.getSandbox(sb.id);
    if (r?.state === 'paused') await this.c.driver.pause(sb.id).catch(() => {});
    this.c.hooks.timers.arm(r ?? sb);
    await this.c.event(sb.id, 'recovered', `${what}: rolled forward, the complete checkpoint is stored as snapshot ${snap.id} and the sandbox restored from it; nothing lost`);
    return true;
  }

  private async reconcileWake(sb: Sandbox, intent: Intent, what: string): Promise<boolean> {
    if (sb.state !== 'hibernated') return false;
    const running = await this.runtimeRuns(sb.id);
    if (running && (await this.c.driver.adopt(sb.id).catch(() => false))) {
      await this.c.hooks.sessions.markWoken(sb);
      await this.c.event(sb.id, 'recovered', `${what}: rolled forward, the restore from snapshot ${intent.snapshotId} had completed; woken, nothing lost`);
      return true;
    }
    await this.c.driver.destroy(sb.id);
    this.c.hooks.timers.schedule(sb);
    await this.c.event(sb.id, 'recovered', `${what}: rolled back, still hibernated in snapshot ${intent.snapshotId}; nothing lost (wake it again)`);
    return true;
  }

  private async reconcileRollback(sb: Sandbox, intent: Intent, what: string): Promise<boolean> {
    const snap = intent.snapshotId ? await this.c.store.getSnapshot(intent.snapshotId) : undefined;
    if (intent.step === 'verify' || !snap) {
      // Nothing had changed yet: the sandbox is as it was before the request.
      await this.c.event(sb.id, 'recovered', `${what}: the rollback to ${intent.snapshotId} had not begun, so it was dropped; the sandbox is as before`);
      return false;
    }
    // The old incarnation may be gone already: finish what was asked, from the snapshot asked for.
    await this.c.hooks.checkpoints.restoreFrom(snap, sb);
    const r = await this.c.store.updateSandbox(sb.id, { state: 'running', fromSnapshotId: snap.id });
    this.c.hooks.timers.arm(r);
    await this.c.event(sb.id, 'recovered', `${what}: rolled forward, rolled back to snapshot ${snap.id} as asked`);
    return true;
  }

  /**
   * A sandbox still `starting` after a crash: its create (or fork copy) never returned. It is
   * finished afresh: from its template, or from the snapshot a fork copy comes from.
   */
  private async finishCreate(sb: Sandbox): Promise<void> {
    try {
      this.c.driver.assign(sb.id, sb.driver);
      await this.c.driver.settle(sb.id, SETTLE_TIMEOUT_MS);
      await this.c.driver.destroy(sb.id);
      let from: string;
      if (sb.parentId && sb.fromSnapshotId) {
        const snap = await this.c.store.getSnapshot(sb.fromSnapshotId);
        if (!snap) throw new SpaceError('SNAPSHOT_NOT_FOUND', `snapshot ${sb.fromSnapshotId} it is copied from is gone`);
        await this.c.hooks.checkpoints.restoreFrom(snap, sb);
        from = `snapshot ${snap.id} of ${sb.parentId}`;
      } else {
        const t = await this.c.templates.resolve(sb.tenantId, sb.template);
        const trust = this.c.egress ? await this.c.egress.trust(sb.tenantId) : undefined;
        const release = await this.c.admission.slot();
        try {
          await this.c.hooks.starts.startSandbox(t, sb, this.c.hooks.egress.envOf(t.env, sb.env, sb.secrets), trust);
        } finally {
          release();
        }
        from = `template ${t.name}`;
      }
      const r = await this.c.store.updateSandbox(sb.id, { state: 'running', startedAt: new Date().toISOString() });
      this.c.hooks.timers.arm(r);
      await this.c.event(sb.id, 'recovered', `the daemon stopped while creating it: rolled forward, started afresh from ${from}`);
    } catch (err) {
      this.c.log.error({ err, sandboxId: sb.id }, 'finishing an interrupted create failed');
      await this.c.driver.destroy(sb.id).catch(() => {});
      await this.c.hooks.endings.end(sb.id, 'dead', 'start-failed', `the daemon stopped while creating it, and starting it again failed: ${err instanceof Error ? err.message : String(err)}`);
      this.c.live.delete(sb.id);
    }
  }
}
