/**
 * Starting sandboxes from templates: a template's image captured (booted once, its start command
 * run, checkpointed), restored for each create, and kept warm in pools.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import type { AgentChannel } from '../agent/channel.js';
import type { DriverCreateSpec } from '../ports/driver.js';
import { SpaceError } from '../errors.js';
import { LIMITS, newSandboxId, type CreateTimings, type Sandbox, type Template, type TemplateImage, type TemplateStart } from '../model.js';
import { POOL_MEMORY_MB, poolDiskMb } from '../templates/warm-pool.js';
import type { Progress } from '../ports/rootfs-builder.js';
import { deleteImage, getImage, putImage } from '../storage/image-objects.js';
import { templateImageBlobKey, type TemplateImageStore } from '../templates/template-service.js';
import type { SandboxContext, StartHooks } from './context.js';
import { sendIdentity } from './identity.js';

/** Starting sandboxes from templates. Built by the facade (SandboxService), which wires it into the hooks. */
export class TemplateStarts implements StartHooks {
  constructor(private readonly c: SandboxContext) {}

  /**
   * Sizes the template's pool (a refill takes the image first if it has none) and, for a
   * template without a pool, has its image taken in the background for the next create.
   */
  preparePool(t: Template): void {
    if (this.c.stopping() || t.state !== 'ready') return;
    this.c.pool.configure(t);
    if (t.poolSize > 0 || !this.c.templates.rootfsReady(t)) return;
    // Shutdown waits for it: reloading or taking the image writes into the RAM directory that
    // the daemon removes once the service has stopped.
    void this.c
      .transient(
        (async () => {
          if (!(await this.c.templates.usableImage(t)) && !this.c.stopping()) await this.c.templates.captureImage(t);
        })(),
      )
      .catch((err) => {
        if (!this.c.stopping()) this.c.log.warn({ err, template: t.name }, 'taking the template snapshot failed');
      });
  }

  /**
   * Starts `sb` from its template: restores the template's image when it has a current one
   * (falling back to a boot if the restore fails), boots otherwise and has the image taken in
   * the background for the next create.
   */
  async startSandbox(t: Template, sb: Sandbox, env: Record<string, string>, trust: string | undefined, signal?: AbortSignal): Promise<Omit<CreateTimings, 'queueMs' | 'totalMs'>> {
    // Template snapshots are taken on the default driver; another driver boots from the root file system.
    const onDefault = sb.driver === this.c.driver.name;
    if (!onDefault && t.start) throw new SpaceError('TEMPLATE_NOT_ON_DRIVER', `Template ${t.name} has a start command, whose snapshot exists for the default driver (${this.c.driver.name}) only; create it without driver`, { details: { field: 'driver' } });
    // A template image has no volumes mounted, and a restore gets the mounts its checkpoint had: boot.
    let image = onDefault && !sb.volumes?.length ? await this.c.templates.usableImage(t) : undefined;
    // A start command must have run: without a current image, take one first.
    if (!image && t.start) image = (await this.c.templates.captureImage(t)).image;
    const rootfs = await this.c.templates.rootfsOf(t);
    const mounts = sb.volumes?.length ? await this.c.volumes!.mountsOf(sb) : [];
    const spec = { id: sb.id, template: t.name, rootfs, cpu: sb.cpu, memoryMb: sb.memoryMb, ...(sb.diskMb !== undefined ? { diskMb: sb.diskMb } : {}), env, driver: sb.driver, ...(mounts.length ? { mounts } : {}) };
    if (image) {
      try {
        return await this.restoreTemplate(image, spec, trust, signal);
      } catch (err) {
        if (t.start) throw err;
        // INVALID_LIMITS: the image cannot take this sandbox's shape (a microVM's disk size), an expected case.
        const expected = (err as { code?: string }).code === 'INVALID_LIMITS';
        this.c.log[expected ? 'info' : 'warn']({ err, sandboxId: sb.id, template: t.name }, 'restoring the template image failed; booting instead');
        await this.c.driver.destroy(sb.id).catch(() => {});
      }
    } else if (!this.c.stopping() && onDefault) this.preparePool(t);
    await this.c.driver.prepare(spec, signal);
    const connected = this.c.live.entry(sb.id).waitAgent(this.c.bootTimeout(sb.driver));
    const tA = performance.now();
    await this.c.driver.create(spec, signal);
    const tB = performance.now();
    const ch = await connected;
    if (!ch) throw new SpaceError('TIMEOUT', `The sandbox agent did not connect within ${this.c.bootTimeout(sb.driver)} ms`);
    const agentMs = Math.round(performance.now() - tB);
    if (!trust) return { source: 'boot', bootMs: Math.round(tB - tA), agentMs, identityMs: 0 };
    const tI = performance.now();
    await sendIdentity(ch, sb.id, { trust });
    return { source: 'boot', bootMs: Math.round(tB - tA), agentMs, identityMs: Math.round(performance.now() - tI) };
  }

  /** Restores a new sandbox from a template image and gives its agent the sandbox's identity. */
  private async restoreTemplate(image: TemplateImage, spec: DriverCreateSpec, trust: string | undefined, signal?: AbortSignal): Promise<Omit<CreateTimings, 'queueMs' | 'totalMs'>> {
    const e = this.c.live.entry(spec.id);
    e.restoringFrom = image.sourceId;
    // The disk's size too: a driver whose image carries a smaller disk grows the device, and the
    // agent the file system on it (a microVM's), before the create returns.
    const grow = spec.diskMb !== undefined && this.c.driver.disksOf(spec.driver)?.grownByAgent;
    e.identity = { hostname: spec.id, env: spec.env, ...(trust ? { trust } : {}), ...(grow ? { diskBytes: spec.diskMb! * 1048576 } : {}) };
    e.identityMs = 0;
    try {
      const connected = this.c.live.entry(spec.id).waitAgent(this.c.bootTimeout(spec.driver));
      const tA = performance.now();
      await this.c.driver.restore(spec, this.c.templates.imageDir(image), signal);
      const tB = performance.now();
      if (!(await connected)) throw new SpaceError('TIMEOUT', `The agent of ${spec.id} did not connect within ${this.c.bootTimeout(spec.driver)} ms after restoring the template image`);
      const identityMs = e.identityMs ?? 0;
      // The agent may connect (and take its identity) before runsc's restore command returns.
      return { source: 'snapshot', restoreMs: Math.round(tB - tA), agentMs: Math.max(0, Math.round(performance.now() - tB - identityMs)), identityMs };
    } finally {
      e.restoringFrom = undefined;
      e.identity = undefined;
    }
  }

  /** Restores one unassigned sandbox for a template's warm pool. */
  fillPool(t: Template): Promise<string> {
    return this.c.transient(this.fillPoolNow(t));
  }

  private async fillPoolNow(t: Template): Promise<string> {
    if (this.c.stopping()) throw new SpaceError('DAEMON_SHUTTING_DOWN');
    const cur = (await this.c.templates.usableImage(t)) ? t : await this.c.templates.captureImage(t);
    const id = newSandboxId();
    const release = await this.c.admission.slot();
    try {
      await this.restoreTemplate(cur.image!, { id, template: t.name, rootfs: await this.c.templates.rootfsOf(t), cpu: LIMITS.cpu.default, memoryMb: POOL_MEMORY_MB, ...this.poolDisk(t), env: t.env }, undefined, this.c.stopSignal);
      this.c.stopSignal.throwIfAborted();
      return id;
    } catch (err) {
      await this.discardPooled(id);
      throw err;
    } finally {
      release();
    }
  }

  /** The disk of pooled sandboxes and template images of `t` (none on a driver without disks). */
  private poolDisk(t: Template): { diskMb?: number } {
    const diskMb = poolDiskMb(this.c.driver.disks, t.rootfsBytes);
    return diskMb !== undefined ? { diskMb } : {};
  }

  async discardPooled(id: string): Promise<void> {
    const e = this.c.live.get(id);
    if (e) e.killing = true;
    e?.channel?.destroy();
    this.c.live.delete(id);
    await this.c.driver.destroy(id);
  }

  /**
   * Template images at rest: packed like snapshots (the default driver's image codec included)
   * into the blob store under the template's tenant, so they are encrypted with its key and
   * deduplicated with its snapshots.
   */
  templateImages(): TemplateImageStore {
    return {
      save: async (t, image, dir) => {
        await putImage(
          this.c.blobs,
          templateImageBlobKey(t.tenantId, image.key),
          dir,
          { id: image.key, sandboxId: image.sourceId, tenantId: t.tenantId || '_builtin', template: t.name, driver: this.c.driver.name, driverVersion: await this.c.driver.version(), createdAt: image.createdAt },
          this.c.driver.imageForms(this.c.driver.name),
          { portable: this.c.shared },
        );
      },
      load: async (t, image, dir) => {
        const key = templateImageBlobKey(t.tenantId, image.key);
        if (!(await this.c.blobs.stat(key))) return false;
        try {
          await getImage(this.c.blobs, key, image.key, dir, this.c.maxSnapshotBytes, this.c.driver);
          return true;
        } catch (err) {
          if (err instanceof SpaceError && (err.code === 'KEY_REVOKED' || err.code === 'KEY_DESTROYED')) throw err;
          this.c.log.warn({ err, template: t.name, tenantId: t.tenantId }, 'the stored template image is unusable; it will be taken again');
          return false;
        }
      },
      drop: async (t, image) => {
        await deleteImage(this.c.blobs, templateImageBlobKey(t.tenantId, image.key), this.c.driver.attachmentSuffixes());
        await this.c.driver.forgetImage(image.key);
      },
    };
  }

  /**
   * Boots a template once, runs its start command until ready, and checkpoints it into the
   * image `key`. The sandbox is removed afterwards; a failure leaves no image.
   */
  captureTemplate(t: Template, rootfs: string, key: string, progress: Progress, signal?: AbortSignal): Promise<TemplateImage> {
    if (this.c.stopping()) return Promise.reject(new SpaceError('DAEMON_SHUTTING_DOWN'));
    return this.c.transient(this.captureTemplateNow(t, rootfs, key, progress, signal ? AbortSignal.any([signal, this.c.stopSignal]) : this.c.stopSignal));
  }

  private async captureTemplateNow(t: Template, rootfs: string, key: string, progress: Progress, signal: AbortSignal): Promise<TemplateImage> {
    const id = newSandboxId();
    const dir = this.c.templates.imageDir({ key } as TemplateImage);
    // Checkpointed into a directory named like the image, as the driver names what it keeps beside an image by it.
    const scratch = `${dir}.tmp-${id}`;
    const tmp = path.join(scratch, path.basename(dir));
    const t0 = performance.now();
    const release = await this.c.admission.slot();
    try {
      const spec = { id, template: t.name, rootfs, cpu: LIMITS.cpu.default, memoryMb: POOL_MEMORY_MB, ...this.poolDisk(t), env: t.env };
      progress(0, 'preparing the template');
      await this.c.driver.prepare(spec, signal);
      progress(0, 'booting the template');
      const connected = this.c.live.entry(id).waitAgent(this.c.bootTimeout(undefined));
      await this.c.driver.create(spec, signal);
      const ch = await connected;
      if (!ch) throw new SpaceError('TIMEOUT', `The template's agent did not connect within ${this.c.bootTimeout(undefined)} ms`);
      if (t.start) await this.startAndWait(ch, t.start, progress, signal);
      signal.throwIfAborted();
      progress(80, 'taking the template snapshot');
      await this.c.hooks.checkpoints.assertSnapshottable(ch, id, `template ${t.name}`);
      await this.c.hooks.checkpoints.quiesceAndCheckpoint(id, ch, tmp, false);
      await fs.writeFile(path.join(tmp, '.space-complete'), new Date().toISOString());
      await fs.rm(dir, { recursive: true, force: true });
      await fs.rename(tmp, dir);
      progress(100, 'template snapshot taken');
      let sizeBytes = 0;
      for (const f of await fs.readdir(dir)) sizeBytes += (await fs.stat(path.join(dir, f))).size;
      return { key, sourceId: id, sizeBytes, captureMs: Math.round(performance.now() - t0), createdAt: new Date().toISOString() };
    } finally {
      release();
      await fs.rm(scratch, { recursive: true, force: true });
      this.c.live.get(id)?.channel?.destroy();
      this.c.live.delete(id);
      // runsc takes a second or two to let go of a checkpointed container.
      this.c.background(this.c.driver.destroy(id));
    }
  }

  /** Runs a template's start command in the background and waits for its ready command to succeed. */
  private async startAndWait(ch: AgentChannel, start: TemplateStart, progress: Progress, signal?: AbortSignal): Promise<void> {
    progress(30, `starting: ${start.cmd.slice(0, 60)}`);
    const call = ch.call({ op: 'exec', shell: start.cmd, background: true });
    const { pid } = (await call.reply) as { pid: number };
    call.cancel('background');
    if (!start.readyCmd) return;
    progress(40, `waiting for: ${start.readyCmd.slice(0, 60)}`);
    const deadline = Date.now() + start.readyTimeoutMs;
    for (;;) {
      signal?.throwIfAborted();
      const ready = await this.runToExit(ch, start.readyCmd, Math.min(10_000, start.readyTimeoutMs));
      if (ready.exitCode === 0) return;
      const procs = ((await ch.unary({ op: 'ps' })).processes ?? []) as { pid: number; running: boolean; exitCode: number | null }[];
      const p = procs.find((x) => x.pid === pid);
      if (!p || !p.running) {
        const out = await this.outputOf(ch, pid);
        throw new SpaceError('TEMPLATE_START_FAILED', `The start command exited (code ${p?.exitCode ?? '?'}) before "${start.readyCmd}" succeeded${out ? `; its last output: ${out}` : ''}`, { details: { step: 'start' } });
      }
      if (Date.now() >= deadline) throw new SpaceError('TEMPLATE_START_TIMEOUT', `"${start.readyCmd}" did not succeed within ${start.readyTimeoutMs} ms of starting "${start.cmd}" (last exit code ${ready.exitCode}${ready.output ? `, output: ${ready.output}` : ''})`, { details: { step: 'ready' } });
      await new Promise((r) => setTimeout(r, 200));
    }
  }

  /** Runs a shell command to completion; its exit code and the end of its output. */
  private async runToExit(ch: AgentChannel, shell: string, timeoutMs: number): Promise<{ exitCode: number | null; output: string }> {
    const call = ch.call({ op: 'exec', shell, timeoutMs });
    await call.reply;
    let output = '';
    for await (const c of call.output()) output = (output + c.data.toString()).slice(-500);
    const done = await call.done;
    return { exitCode: typeof done.exitCode === 'number' ? done.exitCode : null, output: output.trim() };
  }

  /** The kept output of a finished background process. */
  private async outputOf(ch: AgentChannel, pid: number): Promise<string> {
    try {
      const call = ch.call({ op: 'attach', pid });
      await call.reply;
      let out = '';
      for await (const c of call.output()) out = (out + c.data.toString()).slice(-500);
      return out.trim();
    } catch {
      return '';
    }
  }
}
