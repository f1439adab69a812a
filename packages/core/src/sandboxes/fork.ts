/**
 * Fork: a sandbox copied into N new ones that diverge.
 */
import { promises as fs } from 'node:fs';
import os from 'node:os';
import { SpaceError } from '../errors.js';
import { assertAllowed, newSandboxId, type Sandbox } from '../model.js';
import type { ResolvedMount } from '../volumes/volumes.js';
import type { SandboxContext, SnapshotRef } from './context.js';
import { newSandboxRecord } from './record.js';

/**
 * How many copies of a fork restore at once: twice the cores, and one. Fork into 10 on 2 cores
 * (docs/benchmarks.md): one at a time 4.1–4.3 s, 3 at once 2.6 s, 5 at once 2.3–2.4 s, all 10
 * at once 2.2 s, for twice the memory of restores under way.
 */
export const FORK_PARALLEL = Math.min(16, 2 * os.availableParallelism() + 1);

/** Result of one copy of a fork. */
export type ForkResult = { sandbox: Sandbox } | { error: { code: string; message: string } };

/** Fork. Built by the facade (SandboxService), which wires it into the hooks. */
export class Forks {
  constructor(private readonly c: SandboxContext) {}

  /**
   * Copies a sandbox into `count` new ones: from a snapshot taken now (the parent keeps
   * running), or from one of its snapshots. Each copy has its own id, socket directory and
   * network namespace, and diverges from then on.
   */
  async fork(tenantId: string, id: string, opts: { count?: number; snapshotId?: string } = {}): Promise<ForkResult[]> {
    const count = opts.count ?? 1;
    if (!Number.isInteger(count) || count < 1 || count > 32) throw new SpaceError('BAD_REQUEST', 'count must be an integer from 1 to 32');
    const parent = await this.c.hooks.get(tenantId, id);
    assertAllowed(parent, 'fork');
    // Copies mount what the parent mounts: read-only volumes can be shared, a written one cannot.
    const rw = parent.volumes?.find((m) => !m.readOnly);
    if (rw) throw new SpaceError('VOLUME_IN_USE', `Sandbox ${id} mounts volume ${rw.volume} read-write, which one sandbox alone may: fork a sandbox that mounts it read-only (:ro)`, { details: { name: rw.volume } });
    const mounts = parent.volumes?.length && this.c.volumes ? await this.c.volumes.check(tenantId, parent.volumes, true) : [];
    await this.c.admission.admit(count, parent.memoryMb);
    const reservation = this.c.admission.reserve(count, parent.memoryMb);
    // Filled in as the copies come up, so that a failed fork knows what it made.
    const out: ForkResult[] = new Array(count);
    let imageDir: string | undefined;
    let copies: Promise<void> | undefined;
    const start = (dir: string, snap: SnapshotRef) => {
      imageDir = dir;
      copies = this.copies(parent, snap, dir, out, mounts, reservation);
      // Awaited below, once the snapshot is done: not an unhandled rejection meanwhile.
      copies.catch(() => {});
    };
    try {
      if (opts.snapshotId) {
        const snap = await this.c.hooks.checkpoints.ownSnapshot(parent, opts.snapshotId);
        start(await this.c.hooks.checkpoints.unpack(snap), snap);
      } else {
        if (parent.state === 'hibernated') throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${id} is hibernated: fork one of its snapshots (snapshotId) or wake it first`);
        try {
          // The copies start from the image as soon as it is complete, beside the parent's own
          // restore from it: a fork into 1 takes a checkpoint and a restore, not two restores.
          await this.c.withLock(id, async () => this.c.hooks.checkpoints.takeSnapshot(await this.c.hooks.get(tenantId, id), 'fork', undefined, true, start));
        } catch (err) {
          // The snapshot failed after its image was taken (the parent's restore from it, or its
          // store): a fork stores its snapshot or leaves nothing, so the copies made go too.
          if (copies) await this.discard(copies, out, err);
          throw err;
        }
      }
      await copies;
      const made = out.filter((r): r is { sandbox: Sandbox } => 'sandbox' in r);
      await this.c.event(parent.id, 'fork', `forked into ${made.length} of ${count} copies${made[0]?.sandbox.fromSnapshotId ? ` from snapshot ${made[0].sandbox.fromSnapshotId}` : ''}`);
      return out;
    } finally {
      reservation.release();
      if (imageDir) await fs.rm(imageDir, { recursive: true, force: true });
    }
  }

  /**
   * Restores copies of `parent` into `out` (one per slot) from the image in `imageDir`, a few at
   * once. Resolves when every copy has ended its restore, well or not; rejects with the first
   * failure to record or start one.
   */
  private async copies(parent: Sandbox, snap: SnapshotRef, imageDir: string, out: ForkResult[], mounts: ResolvedMount[], reservation: { track(id: string): void }): Promise<void> {
    const tenantId = parent.tenantId;
    const copy = async (): Promise<ForkResult> => {
      const childId = newSandboxId();
      // Placeholders stay valid for the copy (its processes hold the parent's); header rules become its own.
      const childSecrets = parent.secrets && this.c.egress ? await this.c.egress.secrets.copyRules(tenantId, parent.secrets, childId) : parent.secrets;
      const child = newSandboxRecord({
        id: childId,
        tenantId,
        template: parent.template,
        driver: parent.driver,
        cpu: parent.cpu,
        memoryMb: parent.memoryMb,
        ...(parent.diskMb !== undefined ? { diskMb: parent.diskMb } : {}),
        timeoutMs: parent.timeoutMs,
        env: parent.env,
        metadata: parent.metadata,
        ...(parent.onTimeout ? { onTimeout: parent.onTimeout } : {}),
        ...(parent.egress ? { egress: parent.egress } : {}),
        ...(childSecrets ? { secrets: childSecrets } : {}),
        ...(parent.volumes ? { volumes: parent.volumes } : {}),
        parentId: parent.id,
        fromSnapshotId: snap.id,
        node: this.c.nodeName,
      });
      reservation.track(child.id);
      if (mounts.length) this.c.volumes!.claim(child.id, mounts);
      await this.c.store.insertSandbox(child).catch(async (err: unknown) => {
        await this.c.volumes?.release(child.id);
        throw err;
      });
      await this.c.faults.fault('fork:after-record');
      try {
        await this.c.faults.during('fork:during-restore', this.c.hooks.checkpoints.restoreFrom(snap, child, imageDir));
        const running = await this.c.store.updateSandbox(child.id, { state: 'running', startedAt: new Date().toISOString() });
        this.c.hooks.timers.arm(running);
        await this.c.event(child.id, 'forked', `forked from ${parent.id} at snapshot ${snap.id}`);
        return { sandbox: running };
      } catch (err) {
        await this.c.driver.destroy(child.id).catch(() => {});
        await this.c.hooks.endings.end(child.id, 'dead', 'start-failed', err instanceof Error ? err.message : String(err));
        const e = err instanceof SpaceError ? err : new SpaceError('DRIVER_FAILED', String(err), { cause: err });
        return { error: { code: e.code, message: e.message } };
      }
    };
    // A few copies restore at once from the one image (read-only to each): a restore waits on
    // its processes starting as much as it computes, so the cores overlap them.
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < out.length; i = next++) out[i] = await copy();
    };
    // Every worker ends before the image goes (the caller's finally); the first failure then stands.
    const ended = await Promise.allSettled(Array.from({ length: Math.min(out.length, FORK_PARALLEL) }, worker));
    const failed = ended.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
  }

  /** Ends the copies a fork made before it failed with `cause`, once all have ended their restores. */
  private async discard(copies: Promise<void>, out: ForkResult[], cause: unknown): Promise<void> {
    await copies.catch(() => {});
    const why = `the fork's snapshot failed after the copies started: ${cause instanceof Error ? cause.message : String(cause)}`;
    for (const r of out) {
      if (r && 'sandbox' in r) await this.c.hooks.endings.terminate(r.sandbox.id, 'dead', 'start-failed', why).catch((err) => this.c.log.warn({ err, sandboxId: r.sandbox.id }, 'ending a copy of a failed fork failed'));
    }
  }
}
