/**
 * Several drivers behind one: each sandbox runs on the driver it was created with
 * (`DriverCreateSpec.driver`, default: the first). Calls about a sandbox go to the driver that
 * holds it; which one that is comes from its create/restore, from core after a restart
 * ({@link DriverRouter.assign}), or from the drivers' own {@link SandboxDriver.list}.
 */
import type { DriverCreateSpec, DriverEvents, DriverReport, ImageAttachment, ImageFileCodec, ImageForms, RestoreTimings, RuntimeStatus, SandboxDriver, SandboxUsage } from './driver.js';
import { SpaceError } from '../errors.js';

/**
 * Routes sandbox calls to the driver each sandbox runs on.
 *
 * @example
 * const drivers = new DriverRouter(gvisor, [microvm]);
 * await drivers.create({ ...spec, driver: 'microvm' }); // later calls about spec.id go to microvm
 */
export class DriverRouter implements SandboxDriver {
  /** The default driver's name. */
  readonly name: string;
  private readonly byName = new Map<string, SandboxDriver>();
  private readonly owner = new Map<string, SandboxDriver>();

  constructor(
    private readonly def: SandboxDriver,
    others: SandboxDriver[] = [],
  ) {
    this.name = def.name;
    for (const d of [def, ...others]) this.byName.set(d.name, d);
  }

  /** Names of the enabled drivers, the default first. */
  names(): string[] {
    return [...this.byName.keys()];
  }

  /** The driver called `name`; `DRIVER_NOT_ENABLED` if this daemon does not run it. */
  get(name: string | undefined): SandboxDriver {
    if (name === undefined) return this.def;
    const d = this.byName.get(name);
    if (!d) throw new SpaceError('DRIVER_NOT_ENABLED', `Driver ${JSON.stringify(name)} is not enabled on this daemon (enabled: ${this.names().join(', ')}); start spaced with --drivers ${[...this.names(), name].join(',')}`, { details: { field: 'driver' } });
    return d;
  }

  /** Records which driver holds sandbox `id` (after a daemon restart, from its stored record). */
  assign(id: string, name: string): void {
    this.owner.set(id, this.get(name));
  }

  /** Whether the driver holding `id` checkpoints any state (see {@link SandboxDriver.checkpointsAnyState}). */
  checkpointsAnyStateOf(id: string): boolean {
    return this.of(id).checkpointsAnyState === true;
  }

  /** The image codecs of driver `name`, in the order they are tried. */
  codecOf(name: string): readonly ImageFileCodec[] {
    return this.get(name).imageCodecs ?? [];
  }

  /** The codec called `codec` of any enabled driver (to read what snapshots recorded). */
  codecNamed(codec: string): ImageFileCodec | undefined {
    for (const d of this.byName.values()) for (const c of d.imageCodecs ?? []) if (c.name === codec) return c;
    return undefined;
  }

  /** The image attachments of driver `name` (see {@link ImageAttachment}), in the order they are tried. */
  attachmentsOf(name: string): readonly ImageAttachment[] {
    return this.get(name).imageAttachments ?? [];
  }

  /** The attachment called `name` of any enabled driver (to restore what snapshots recorded). */
  attachmentNamed(name: string): ImageAttachment | undefined {
    for (const d of this.byName.values()) for (const a of d.imageAttachments ?? []) if (a.name === name) return a;
    return undefined;
  }

  /** How images of driver `name` are stored (see image-objects.ts; the router itself reads them). */
  imageForms(name: string): ImageForms {
    return { codecs: this.codecOf(name), attachments: this.attachmentsOf(name) };
  }

  /** Every enabled driver's attachment suffixes: the objects a stored image may have beside it. */
  attachmentSuffixes(): string[] {
    return [...new Set([...this.byName.values()].flatMap((d) => (d.imageAttachments ?? []).map((a) => a.suffix)))];
  }

  /** The disks of driver `name` (see {@link SandboxDriver.disks}); undefined when it keeps files in memory. */
  disksOf(name: string | undefined): SandboxDriver['disks'] {
    return this.get(name).disks;
  }

  /** The disks of the default driver. */
  get disks(): SandboxDriver['disks'] {
    return this.def.disks;
  }

  /** Tells every driver that image `imageId` is gone (see {@link SandboxDriver.forgetImage}). */
  async forgetImage(imageId: string): Promise<void> {
    for (const d of this.byName.values()) await d.forgetImage?.(imageId);
  }

  /** The version of driver `name` (recorded in its snapshots). */
  versionOf(name: string): Promise<string> {
    return this.get(name).version();
  }

  private of(id: string): SandboxDriver {
    return this.owner.get(id) ?? this.def;
  }

  bind(events: DriverEvents): void {
    for (const d of this.byName.values()) d.bind(events);
  }

  doctor(): Promise<DriverReport> {
    return this.def.doctor();
  }

  async init(): Promise<void> {
    for (const d of this.byName.values()) await d.init();
  }

  /** Readies what a create of `spec` needs (see {@link SandboxDriver.prepare}). */
  async prepare(spec: DriverCreateSpec, signal?: AbortSignal): Promise<void> {
    await this.get(spec.driver).prepare?.(spec, signal);
  }

  create(spec: DriverCreateSpec, signal?: AbortSignal): Promise<void> {
    const d = this.get(spec.driver);
    this.owner.set(spec.id, d);
    return d.create(spec, signal);
  }

  restore(spec: DriverCreateSpec, imageDir: string, signal?: AbortSignal): Promise<RestoreTimings | void> {
    const d = this.get(spec.driver);
    this.owner.set(spec.id, d);
    return d.restore(spec, imageDir, signal);
  }

  adopt(id: string): Promise<boolean> {
    return this.of(id).adopt(id);
  }

  status(id: string): Promise<RuntimeStatus> {
    return this.of(id).status(id);
  }

  usage(id: string): Promise<SandboxUsage> {
    return this.of(id).usage(id);
  }

  pause(id: string): Promise<void> {
    return this.of(id).pause(id);
  }

  resume(id: string): Promise<void> {
    return this.of(id).resume(id);
  }

  detachAgent(id: string): Promise<void> {
    return this.of(id).detachAgent(id);
  }

  async flush(id: string): Promise<boolean> {
    const d = this.of(id);
    return d.flush ? d.flush(id) : false;
  }

  checkpoint(id: string, imageDir: string): Promise<void> {
    return this.of(id).checkpoint(id, imageDir);
  }

  /** Waits for runtime operations a previous daemon left running on `id` (see {@link SandboxDriver.settle}). */
  async settle(id: string, timeoutMs: number): Promise<void> {
    await this.of(id).settle?.(id, timeoutMs);
  }

  /** Releases what earlier incarnations of `id` left (see {@link SandboxDriver.releaseStale}). */
  async releaseStale(id: string): Promise<void> {
    await this.of(id).releaseStale?.(id);
  }

  retire(id: string): Promise<void> {
    return this.of(id).retire(id);
  }

  /** The default driver's version (template snapshots are taken on the default driver). */
  version(): Promise<string> {
    return this.def.version();
  }

  async destroy(id: string): Promise<void> {
    await this.of(id).destroy(id);
    this.owner.delete(id);
  }

  /** Every driver's sandboxes; learns which driver holds each. */
  async list(): Promise<string[]> {
    const out: string[] = [];
    for (const d of this.byName.values()) {
      for (const id of await d.list()) {
        if (!this.owner.has(id)) this.owner.set(id, d);
        out.push(id);
      }
    }
    return out;
  }

  async close(): Promise<void> {
    for (const d of this.byName.values()) await d.close();
  }
}
