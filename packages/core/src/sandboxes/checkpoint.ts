/**
 * Checkpoints and restores: a snapshot taken (journalled, the agent quiesced, the image packed
 * into the blob store), and a sandbox booted from one.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { AgentChannel } from '../agent/channel.js';
import type { DriverCreateSpec } from '../ports/driver.js';
import { SpaceError } from '../errors.js';
import { Laps } from '../laps.js';
import type { Intent } from '../ports/intent-journal.js';
import { newSnapshotId, type Sandbox, type Snapshot, type SnapshotTrigger } from '../model.js';
import { deleteImage, getImage, putImage } from '../storage/image-objects.js';
import type { CheckpointHooks, OnCheckpointed, SandboxContext, SnapshotRef } from './context.js';

/** Where a snapshot's image is stored in the blob store. */
const snapshotBlobKey = (tenantId: string, snapshotId: string) => `snapshots/${tenantId}/${snapshotId}`;

/** Room a checkpoint needs beyond the sandbox's memory limit: the runtime's own state files. */
const IMAGE_MARGIN_MB = 64;

/** Checkpoints and restores. Built by the facade (SandboxService), which wires it into the hooks. */
export class Checkpoints implements CheckpointHooks {
  constructor(private readonly c: SandboxContext) {}

  async spec(sb: Sandbox): Promise<DriverCreateSpec> {
    const t = await this.c.templates.resolve(sb.tenantId, sb.template);
    // The same mounts as when it was checkpointed (a restore needs them), the volumes opened.
    const mounts = sb.volumes?.length ? await this.volumes().mountsOf(sb) : [];
    return { id: sb.id, template: sb.template, rootfs: await this.c.templates.rootfsOf(t), cpu: sb.cpu, memoryMb: sb.memoryMb, ...(sb.diskMb !== undefined ? { diskMb: sb.diskMb } : {}), env: { ...t.env, ...sb.env }, driver: sb.driver, ...(mounts.length ? { mounts } : {}) };
  }

  private volumes(): NonNullable<SandboxContext['volumes']> {
    if (!this.c.volumes) throw new SpaceError('VOLUMES_UNAVAILABLE', 'This sandbox mounts volumes, and this daemon has none now: start it with volumes on');
    return this.c.volumes;
  }

  /** Refuses (SNAPSHOT_UNSUPPORTED_STATE, naming the process) what this runtime cannot checkpoint; changes nothing. */
  async assertSnapshottable(ch: AgentChannel, id: string, what: string): Promise<void> {
    if (this.c.driver.checkpointsAnyStateOf(id)) return;
    const check = await ch.unary({ op: 'snapshot-check' }, 30_000);
    const blockers = (Array.isArray(check.blockers) ? check.blockers : []).slice(0, 20) as { pid?: unknown; command?: unknown; socket?: unknown; reason?: unknown }[];
    if (!blockers.length) return;
    const b = blockers[0]!;
    throw new SpaceError('SNAPSHOT_UNSUPPORTED_STATE', `Cannot snapshot ${what}: process ${String(b.pid)} (${String(b.command).slice(0, 100)}) holds a ${String(b.socket).slice(0, 100)}: ${String(b.reason).slice(0, 200)}. The sandbox keeps running.`, {
      details: { blockers: blockers.map((x) => ({ pid: Number(x.pid), command: String(x.command).slice(0, 200), socket: String(x.socket).slice(0, 200), reason: String(x.reason).slice(0, 200) })) },
    });
  }

  /**
   * Refuses (`CAPACITY_EXHAUSTED`) a checkpoint the work directory has no room for, before the
   * sandbox is touched: the image can be as large as the sandbox's memory, and a runtime that
   * runs out of room mid-checkpoint takes the sandbox down with it (runsc does).
   */
  private async assertRoomForImage(sb: Sandbox): Promise<void> {
    await fs.mkdir(this.c.workDir, { recursive: true, mode: 0o700 });
    const st = await fs.statfs(this.c.workDir);
    const freeMb = Math.floor((st.bavail * st.bsize) / 2 ** 20);
    const needMb = sb.memoryMb + IMAGE_MARGIN_MB;
    if (freeMb < needMb) {
      throw new SpaceError('CAPACITY_EXHAUSTED', `No room to checkpoint ${sb.id}: its image can take up to ${needMb} MiB and the work directory ${this.c.workDir} has ${freeMb} MiB free; the sandbox is untouched. Retry later, or give the daemon a larger --work-dir`, { details: { retryAfterS: 30, needMb, freeMb } });
    }
  }

  /**
   * Disconnects the agent for good (a unix socket to the host cannot be checkpointed) and
   * checkpoints the sandbox into `imageDir`. Leaves `quiescing` set: the caller restores or retires.
   */
  async quiesceAndCheckpoint(id: string, ch: AgentChannel, imageDir: string, injectFaults = true, laps?: Laps): Promise<void> {
    const e = this.c.live.entry(id);
    e.quiescing = true;
    await this.c.driver.detachAgent(id);
    const closed = new Promise<void>((r) => (ch.closed ? r() : ch.once('close', () => r())));
    await ch.unary({ op: 'quiesce' }, 10_000);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([closed, new Promise((r) => (timer = setTimeout(r, 5_000)))]);
    clearTimeout(timer);
    ch.destroy();
    e.channel = undefined;
    if (injectFaults) await this.c.faults.fault('snapshot:after-quiesce');
    if (injectFaults && this.c.faults.has('snapshot:checkpoint-fails')) {
      // What a failed checkpoint does in this runsc: the container is gone.
      await this.c.driver.destroy(id);
      throw new Error('injected checkpoint failure');
    }
    laps?.lap('quiesce');
    await this.c.faults.during(injectFaults ? 'snapshot:during-checkpoint' : '', this.c.driver.checkpoint(id, imageDir));
    laps?.lap('checkpoint');
  }

  /**
   * Checks the sandbox can be checkpointed, quiesces its agent, checkpoints it, and (when
   * `keepRunning`) restores it at once. The snapshot is stored and listed only when complete.
   * If the checkpoint fails and kills the sandbox, it is restored from its last good snapshot.
   *
   * The operation is journalled: with `keepRunning` its intent is done when this returns;
   * without (hibernate), the caller finishes the returned intent once the sandbox is retired.
   * `onCheckpointed` gets the image as soon as it is complete (see {@link OnCheckpointed}).
   */
  async takeSnapshot(sb: Sandbox, trigger: SnapshotTrigger, name: string | undefined, keepRunning: boolean, onCheckpointed?: OnCheckpointed): Promise<{ snapshot: Snapshot; imageDir: string; intent: Intent }> {
    const laps = new Laps();
    // Refuse before touching anything when the image may not fit.
    await this.assertRoomForImage(sb);
    // The sandbox's pending writes go out while it runs, not in its downtime.
    if (await this.c.driver.flush(sb.id)) laps.lap('flush');
    const wasPaused = sb.state === 'paused';
    if (wasPaused) await this.c.driver.resume(sb.id);
    // Refuse before stopping anything if the snapshot could not be stored (e.g. a revoked key).
    await this.c.blobs.assertWritable?.(`snapshots/${sb.tenantId}/check`).catch(async (err) => {
      if (wasPaused) await this.c.driver.pause(sb.id);
      throw err;
    });
    const ch = await this.c.hooks.agents.channel(sb.id);
    const release = this.c.live.entry(sb.id).closeGate();
    try {
      return await this.takeSnapshotGated(sb, ch, trigger, name, keepRunning, wasPaused, release, laps, onCheckpointed);
    } finally {
      release();
    }
  }

  /**
   * The snapshot, with agent calls held at the gate: until the sandbox runs again (`openGate`,
   * when it keeps running: calls then wait out the downtime only, not the store, which takes
   * seconds for a disk holding a GiB), or until the end (hibernate: no agent comes back).
   */
  private async takeSnapshotGated(sb: Sandbox, ch: AgentChannel, trigger: SnapshotTrigger, name: string | undefined, keepRunning: boolean, wasPaused: boolean, openGate: () => void, laps: Laps, onCheckpointed?: OnCheckpointed): Promise<{ snapshot: Snapshot; imageDir: string; intent: Intent }> {
    try {
      await this.assertSnapshottable(ch, sb.id, `sandbox ${sb.id}`);
    } catch (err) {
      if (wasPaused) await this.c.driver.pause(sb.id);
      throw err;
    }
    const id = newSnapshotId();
    const imageDir = path.join(this.c.workDir, id);
    const e = this.c.live.entry(sb.id);
    const intent = await this.c.journal.begin(sb.id, keepRunning ? 'snapshot' : 'hibernate', { step: 'checkpoint', snapshotId: id, imageDir, trigger, ...(name ? { name } : {}), keepRunning, wasPaused });
    await this.c.faults.fault('snapshot:after-intent');
    // What came before the sandbox stops: room and key checks, the agent's look at its processes, the journal.
    laps.lap('checks');
    const t0 = performance.now();
    try {
      await this.quiesceAndCheckpoint(sb.id, ch, imageDir, true, laps);
      this.c.log.debug({ sandboxId: sb.id, ms: Math.round(performance.now() - t0) }, 'checkpointed');
      await this.c.faults.fault('snapshot:after-checkpoint');
    } catch (err) {
      await fs.rm(imageDir, { recursive: true, force: true });
      if (await this.c.hooks.recovery.runtimeRuns(sb.id)) {
        // The checkpoint did not happen and the sandbox still runs: let the agent back in.
        await this.c.driver.adopt(sb.id).catch(() => {});
        e.quiescing = false;
      } else {
        e.quiescing = false;
        await this.c.hooks.recovery.recover(sb, `checkpoint failed: ${err instanceof Error ? err.message : String(err)}`);
      }
      await this.c.journal.done(intent);
      throw new SpaceError('SNAPSHOT_FAILED', `Snapshot of ${sb.id} failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
    await this.c.journal.step(intent, 'checkpointed');
    onCheckpointed?.(imageDir, { id, sandboxId: sb.id, blobKey: snapshotBlobKey(sb.tenantId, id) });
    let downtimeMs = Math.round(performance.now() - t0);
    if (keepRunning) {
      try {
        await this.c.faults.during('snapshot:during-restore', this.bootFromImage(sb, imageDir, laps));
        this.c.log.debug({ sandboxId: sb.id, ms: Math.round(performance.now() - t0) }, 'restored');
        if (wasPaused) {
          await this.c.driver.pause(sb.id);
          laps.lap('pause');
        }
      } finally {
        e.quiescing = false;
      }
      downtimeMs = Math.round(performance.now() - t0);
      openGate();
      await this.c.faults.fault('snapshot:after-restore');
    }
    let snapshot: Snapshot;
    try {
      snapshot = await this.storeImage(sb, intent, imageDir, downtimeMs, laps);
    } catch (err) {
      // The failure changes nothing of the sandbox: it runs on, or (hibernating) goes on from its image.
      if (!keepRunning) await this.continueFromImage(sb, imageDir, err);
      await fs.rm(imageDir, { recursive: true, force: true });
      await this.c.journal.done(intent);
      throw err;
    }
    if (keepRunning) await this.c.journal.done(intent);
    else await this.c.journal.step(intent, 'stored');
    return { snapshot, imageDir, intent };
  }

  /** A hibernate whose snapshot could not be stored: the sandbox goes on from its checkpoint image. */
  private async continueFromImage(sb: Sandbox, imageDir: string, cause: unknown): Promise<void> {
    this.c.log.warn({ err: cause, sandboxId: sb.id }, 'the hibernate snapshot could not be stored; the sandbox goes on from its checkpoint');
    const e = this.c.live.entry(sb.id);
    try {
      await this.bootFromImage(sb, imageDir);
    } catch (err) {
      e.quiescing = false;
      await this.c.hooks.recovery.recover(sb, `storing the hibernate snapshot failed (${cause instanceof Error ? cause.message : String(cause)}) and so did going on from its checkpoint (${err instanceof Error ? err.message : String(err)})`);
      return;
    }
    e.quiescing = false;
  }

  /**
   * Packs a complete checkpoint image into the blob store as the snapshot `intent` names,
   * records it and makes it the sandbox's newest. Idempotent: a snapshot already recorded is
   * returned as it is (recovery may call it twice).
   */
  async storeImage(sb: Sandbox, intent: Intent, imageDir: string, downtimeMs: number, laps?: Laps): Promise<Snapshot> {
    const id = intent.snapshotId!;
    const existing = await this.c.store.getSnapshot(id);
    if (existing) {
      if (sb.lastSnapshotId !== id) await this.c.store.updateSandbox(sb.id, { lastSnapshotId: id });
      return existing;
    }
    const createdAt = new Date().toISOString();
    const blobKey = snapshotBlobKey(sb.tenantId, id);
    // A hibernate's or a fork's image is stored as the runtime wrote it, not through the
    // driver's codecs: the call waits for the store (and a wake for the fetch), and runsc's
    // compressed state file is a ninth of the inflated form, which is only there so that
    // consecutive snapshots deduplicate (an idle sandbox: 1.1 MiB to chunk, encrypt and store
    // instead of 9.6, no inflate after the checkpoint and no deflate before the restore). The
    // price: it shares no chunks with the session's other snapshots (docs/architecture.md).
    const asWritten = intent.op === 'hibernate' || intent.trigger === 'fork';
    const forms = this.c.driver.imageForms(sb.driver);
    // What a codec would have inflated is compressed as written: it shares no chunk with any
    // stored object, so it is stored whole, without chunking it by content and hashing each
    // chunk (~20 ms of a hibernate's store). A driver without codecs (microVM: raw RAM, which
    // deduplicates well) is stored as always.
    const whole = asWritten && forms.codecs.length > 0;
    // What the sandbox's disk grew from (see diskGrewFrom): what that snapshot stored beside its
    // image (a disk's stream) serves this one too, followed by the change since (the driver makes it).
    const before = forms.attachments.length ? await this.diskGrewFrom(sb, id) : undefined;
    const earlier = before?.blobKey ? { id: before.id, key: before.blobKey } : undefined;
    const { meta, sizeBytes, since } = await this.c.faults.during('snapshot:during-store', putImage(this.c.blobs, blobKey, imageDir, {
      id,
      sandboxId: sb.id,
      tenantId: sb.tenantId,
      template: sb.template,
      driver: sb.driver,
      driverVersion: await this.c.driver.versionOf(sb.driver),
      ...(sb.fromSnapshotId ? { parentSnapshotId: sb.fromSnapshotId } : {}),
      createdAt,
    }, asWritten ? { ...forms, codecs: [] } : forms, { ...(earlier ? { earlier } : {}), whole, portable: this.c.shared }));
    await this.c.faults.fault('snapshot:after-blob');
    const trigger = intent.trigger ?? 'manual';
    const snapshot: Snapshot = {
      id,
      sandboxId: sb.id,
      tenantId: sb.tenantId,
      ...(intent.name ? { name: intent.name } : {}),
      trigger,
      createdAt,
      sizeBytes,
      ...(meta.parentSnapshotId ? { parentSnapshotId: meta.parentSnapshotId } : {}),
      downtimeMs,
      template: sb.template,
      driver: sb.driver,
      blobKey,
    };
    await this.c.store.insertSnapshot(snapshot);
    await this.c.faults.fault('snapshot:after-record');
    await this.c.store.updateSandbox(sb.id, { lastSnapshotId: id });
    laps?.lap('store');
    if (laps) this.c.log.info({ sandboxId: sb.id, snapshotId: id, trigger, downtimeMs, ms: laps.ms }, 'snapshot stored');
    const changes = since.length && earlier ? `; ${since.map((c) => `${c.suffix} stored as its changes since ${earlier.id} (${c.size} bytes)`).join(', ')}` : '';
    await this.c.event(sb.id, 'snapshot', `snapshot ${id} (${trigger}${intent.name ? `, "${intent.name}"` : ''}): ${sizeBytes} bytes, ${downtimeMs} ms downtime${laps ? ` (ms: ${laps})` : ''}${changes}`);
    return snapshot;
  }

  /**
   * The snapshot the sandbox's disk last grew from, other than snapshot `id`: its newest own
   * snapshot, unless it was restored from another since — the one it was rolled back to, or the
   * parent's snapshot a fork was copied from (that sandbox's, the same tenant's), until it takes
   * its own. A snapshot taken after that restore names it as its parent (`parentSnapshotId`).
   * Any stored snapshot of the tenant would give a correct change (btrfs sends the difference
   * of any two trees); the one the disk grew from gives the smallest, and lets a fork's first
   * snapshot store its change since the fork instead of the whole disk.
   */
  private async diskGrewFrom(sb: Sandbox, id: string): Promise<Snapshot | undefined> {
    const get = async (sid: string | undefined) => {
      const s = sid && sid !== id ? await this.c.store.getSnapshot(sid) : undefined;
      return s?.tenantId === sb.tenantId ? s : undefined;
    };
    const last = await get(sb.lastSnapshotId);
    const own = last?.sandboxId === sb.id ? last : undefined;
    if (own && (!sb.fromSnapshotId || own.id === sb.fromSnapshotId || own.parentSnapshotId === sb.fromSnapshotId)) return own;
    return (await get(sb.fromSnapshotId)) ?? own;
  }

  /**
   * Restores `target` from an image directory and waits for its agent; `laps` gets the steps
   * (the driver's: disk, network, runtime; then the agent's reconnect).
   */
  async bootFromImage(target: Sandbox, imageDir: string, laps?: Laps): Promise<void> {
    const connected = this.c.live.entry(target.id).waitAgent(this.c.bootTimeout(target.driver));
    const spec = await this.spec(target);
    laps?.lap('spec');
    const parts = await this.c.driver.restore(spec, imageDir);
    laps?.split('restore', { disk: parts?.diskMs, network: parts?.prepareMs, runtime: parts?.runtimeMs });
    if (!(await connected)) throw new SpaceError('TIMEOUT', `The agent of ${target.id} did not reconnect within ${this.c.bootTimeout(target.driver)} ms after the restore`);
    laps?.lap('agent');
  }

  /** Fetches a snapshot and unpacks it into a scratch directory, verifying it (SNAPSHOT_CORRUPT). */
  async unpack(snap: SnapshotRef): Promise<string> {
    const dir = path.join(this.c.workDir, `r-${snap.id}-${Math.random().toString(36).slice(2, 8)}`);
    try {
      await getImage(this.c.blobs, snap.blobKey, snap.id, dir, this.c.maxSnapshotBytes, this.c.driver);
      return dir;
    } catch (err) {
      await fs.rm(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** Verifies `snap`, then replaces whatever runs as `target` with it. */
  async restoreFrom(snap: SnapshotRef, target: Sandbox, imageDir?: string, laps?: Laps): Promise<void> {
    const dir = imageDir ?? (await this.unpack(snap));
    laps?.lap('fetch');
    const e = this.c.live.entry(target.id);
    e.quiescing = true;
    if (snap.sandboxId !== target.id) {
      e.restoringFrom = snap.sandboxId;
      e.identity = { hostname: target.id };
    }
    try {
      e.channel?.destroy();
      e.channel = undefined;
      await this.bootFromImage(target, dir, laps);
    } finally {
      e.quiescing = false;
      e.restoringFrom = undefined;
      e.identity = undefined;
      if (!imageDir) await fs.rm(dir, { recursive: true, force: true });
    }
  }

  /** A snapshot of `sb`; another sandbox's (or tenant's) is as unknown as a missing one. */
  async ownSnapshot(sb: Sandbox, snapshotId: string): Promise<Snapshot> {
    const snap = await this.c.store.getSnapshot(String(snapshotId));
    if (!snap || snap.sandboxId !== sb.id) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Sandbox ${sb.id} has no snapshot ${JSON.stringify(snapshotId)}`, { details: { snapshotId } });
    return snap;
  }

  async deleteSnapshot(sn: Snapshot): Promise<void> {
    // Record first, bytes second: a crash in between leaves an unreferenced blob, never a listed snapshot without bytes.
    await this.c.store.deleteSnapshot(sn.id);
    await deleteImage(this.c.blobs, sn.blobKey, this.c.driver.attachmentSuffixes());
    await this.c.driver.forgetImage(sn.id);
  }
}
