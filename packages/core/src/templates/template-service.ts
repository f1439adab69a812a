/**
 * Templates as first-class objects: the built-ins every tenant sees and each tenant's own,
 * built from Debian packages or an uploaded image, with an optional start command and
 * environment. A build makes the root file system (cached by content), then has the sandbox
 * service boot it once and keep a snapshot of it (the template image) that creates restore.
 * A failed build leaves no template, root file system or image behind.
 */
import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream, existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SpaceError } from '../errors.js';
import { LIMITS, TEMPLATE_NAME_RE, type Template, type TemplateImage, type TemplateStart } from '../model.js';
import type { Progress, RootfsBuilder, RootfsSource } from '../ports/rootfs-builder.js';
import type { MetadataStore } from '../ports/metadata-store.js';
import { checkMap } from '../validate.js';

/** What a client asks for when building a template. */
export interface TemplateBuildRequest {
  /** Lowercase letters, digits, `.`, `_`, `-`; unique per tenant, not a built-in's name. */
  name: string;
  /** Debian bookworm packages to install (with mmdebstrap). */
  packages?: string[];
  /** An upload from {@link TemplateService.saveUpload}: OCI layout, docker save, or rootfs tarball. */
  uploadId?: string;
  /** Command started before the template snapshot is taken. */
  start?: { cmd: string; readyCmd?: string; readyTimeoutMs?: number };
  /** Environment of every sandbox made from it (over the image's own `Env`). */
  env?: Record<string, string>;
  /** Warm pool size. @default 0 */
  poolSize?: number;
}

/** A stored upload. */
export interface TemplateUpload {
  uploadId: string;
  sizeBytes: number;
  sha256: string;
  createdAt: string;
}

/**
 * Where template images are kept at rest. The image directory the runtime restores from is a
 * working copy (in RAM, see the daemon); this store holds the durable, encrypted copy and
 * writes it back when the working copy is missing (after a reboot).
 *
 * @example
 * await images.save(t, image, dir);              // after a capture
 * if (await images.load(t, image, tmp)) use(tmp); // no working copy: from the stored one
 */
export interface TemplateImageStore {
  /** Stores the image directory `dir` of template `t`. */
  save(t: Template, image: TemplateImage, dir: string): Promise<void>;
  /**
   * Writes the stored image of `t` into `dir`; false when none is stored (or it is unusable:
   * it will be captured again). Rejects with `KEY_REVOKED` / `KEY_DESTROYED` when the tenant's key forbids it.
   */
  load(t: Template, image: TemplateImage, dir: string): Promise<boolean>;
  /** Forgets the stored image. */
  drop(t: Template, image: TemplateImage): Promise<void>;
}

/**
 * The blob key of a template's stored image: under its tenant (built-ins under `_builtin`,
 * which no tenant id can be), so it is encrypted with that tenant's key.
 *
 * @example
 * templateImageBlobKey('acme', 't-3f…-9a…') // 'templates/acme/t-3f…-9a…'
 */
export function templateImageBlobKey(tenantId: string, imageKey: string): string {
  return `templates/${tenantId || '_builtin'}/${imageKey}`;
}

/** Options of {@link TemplateService}. */
export interface TemplateServiceOptions {
  store: MetadataStore;
  rootfs: RootfsBuilder;
  /** Where template images (checkpoints) live. */
  imagesDir: string;
  /** Where uploads wait for their build. */
  uploadsDir: string;
  /** The durable copy of images (none: the working copies in `imagesDir` are all there is). */
  images?: TemplateImageStore;
  /** Boots the template once and checkpoints it into `imagesDir/<key>`. */
  capture(t: Template, rootfs: string, imageKey: string, progress: Progress, signal?: AbortSignal): Promise<TemplateImage>;
  /** How many non-ended sandboxes use the template. */
  inUse(tenantId: string, name: string): Promise<number>;
  /** The driver's version (part of every image key). */
  driverVersion(): Promise<string>;
  /** Pool sizes of the built-ins. */
  builtinPools?: Record<string, number>;
  /** This node's name, recorded on the templates it builds. */
  nodeName?: string;
  /** The store is shared with other nodes: only this node's interrupted builds are its to clear. */
  shared?: boolean;
  /** Largest pool a template may ask for. @default 16 */
  maxPoolSize?: number;
  /** Largest upload, bytes. @default 8 GiB */
  maxUploadBytes?: number;
}

const UPLOAD_TTL_MS = 3600_000;
const UPLOAD_ID_RE = /^up[a-f0-9]{24}$/;

/** In the working copy of an image a node keeps beside the record's ({@link TemplateService.captureImage}): its {@link TemplateImage}. */
const NODE_IMAGE_META = 'space-node-image.json';

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

/**
 * Template registry and builds.
 *
 * @example
 * const t = await templates.build('tenant1', { name: 'py', packages: ['python3-numpy'] }, (p, s) => console.log(p, s));
 * const rootfs = await templates.rootfsOf(t);
 */
export class TemplateService {
  private readonly building = new Set<string>();
  private readonly captures = new Map<string, Promise<Template>>();
  private readonly loads = new Map<string, Promise<boolean>>();
  /** Called when a template's pool size or image changes. */
  onChange: (t: Template) => void = () => {};

  constructor(private readonly opts: TemplateServiceOptions) {}

  /** Registers the built-ins, forgets builds a crash interrupted, drops stale uploads. */
  async start(): Promise<void> {
    await fs.mkdir(this.opts.imagesDir, { recursive: true, mode: 0o700 });
    await fs.mkdir(this.opts.uploadsDir, { recursive: true, mode: 0o700 });
    for (const name of this.opts.rootfs.builtins) {
      const cur = await this.opts.store.getTemplate('', name);
      const poolSize = this.opts.builtinPools?.[name] ?? cur?.poolSize ?? 0;
      const key = this.opts.rootfs.builtinKey(name);
      // Its size (disks must hold it) once its files are there: built now, or by another daemon sharing the directory.
      const rootfsBytes = cur?.key === key && cur.rootfsBytes !== undefined ? cur.rootfsBytes : this.opts.rootfs.has(key) ? (await this.opts.rootfs.build(key, { type: 'builtin', name })).sizeBytes || undefined : undefined;
      if (!cur || cur.poolSize !== poolSize || cur.key !== key || cur.rootfsBytes !== rootfsBytes) {
        // A new release's built-in (another key) is built on first use; the old one's files go —
        // unless sandboxes made from it still run on them: then they stay in the template cache
        // (not removed later; `space template` does not list them).
        if (cur && cur.key !== key && !(await this.opts.inUse('', name))) await this.opts.rootfs.remove(cur.key);
        const { rootfsBytes: _, ...rest } = cur ?? { name, tenantId: '', state: 'ready' as const, source: { type: 'builtin' as const }, env: {}, createdAt: new Date().toISOString() };
        await this.opts.store.putTemplate({ ...rest, key, poolSize, ...(rootfsBytes !== undefined ? { rootfsBytes } : {}) });
      }
    }
    for (const t of await this.opts.store.listTemplates()) {
      // Another node's build under way is not an interrupted one.
      if (t.state === 'building' && (!this.opts.shared || t.node === this.opts.nodeName)) {
        await this.opts.store.deleteTemplate(t.tenantId, t.name);
        await this.dropFiles(t);
      }
    }
    await this.sweepUploads(0);
    for (const e of await fs.readdir(this.opts.imagesDir)) if (e.includes('.tmp-')) await fs.rm(path.join(this.opts.imagesDir, e), { recursive: true, force: true });
  }

  /** The template `name` as `tenantId` sees it: its own, else a built-in. */
  async resolve(tenantId: string, name: string): Promise<Template> {
    if (typeof name !== 'string' || !TEMPLATE_NAME_RE.test(name)) throw await this.notFound(tenantId, name);
    const t = (await this.opts.store.getTemplate(tenantId, name)) ?? (await this.opts.store.getTemplate('', name));
    if (!t) throw await this.notFound(tenantId, name);
    if (t.state !== 'ready') throw new SpaceError('TEMPLATE_NOT_READY', `Template ${name} is still being built`);
    return t;
  }

  private async notFound(tenantId: string, name: string): Promise<SpaceError> {
    const available = (await this.list(tenantId)).map((t) => t.name);
    return new SpaceError('TEMPLATE_NOT_FOUND', `No template ${JSON.stringify(name)}; available: ${available.join(', ')}`, { details: { template: name, available } });
  }

  /** Built-ins and the tenant's own templates. */
  async list(tenantId: string): Promise<Template[]> {
    return (await this.opts.store.listTemplates()).filter((t) => t.tenantId === '' || t.tenantId === tenantId);
  }

  /** Every template of every tenant (for pools). */
  all(): Promise<Template[]> {
    return this.opts.store.listTemplates();
  }

  /** The template's root file system, building a built-in first if needed (`base` downloads). */
  async rootfsOf(t: Template, progress?: Progress): Promise<string> {
    if (this.opts.rootfs.has(t.key)) return this.opts.rootfs.path(t.key);
    if (t.source.type !== 'builtin') {
      if (this.opts.shared && t.node && t.node !== this.opts.nodeName) throw new SpaceError('TEMPLATE_NOT_ON_NODE', `Template ${t.name} was built on node ${t.node}, which holds its root file system; this node (${this.opts.nodeName}) does not`, { details: { template: t.name, node: t.node } });
      throw new SpaceError('TEMPLATE_BUILD_FAILED', `The root file system of template ${t.name} is missing from the template directory; remove the template and build it again`);
    }
    const built = await this.opts.rootfs.build(t.key, { type: 'builtin', name: t.name }, progress);
    const cur = await this.opts.store.getTemplate(t.tenantId, t.name);
    if (built.sizeBytes && cur?.key === t.key && cur.rootfsBytes === undefined) await this.opts.store.putTemplate({ ...cur, rootfsBytes: built.sizeBytes });
    return this.opts.rootfs.path(t.key);
  }

  /**
   * The node a sandbox of this template must start on, when not this one: a tenant's template
   * built on another node of the cluster (its root file system is in that node's cache) and
   * not in this one's. Undefined: here (or the template does not resolve: the create says why).
   *
   * @example
   * const node = await templates.placement('tenant1', 'tools'); // 'n2'
   */
  async placement(tenantId: string, name: string): Promise<string | undefined> {
    if (!this.opts.shared) return undefined;
    const t = await this.resolve(tenantId, name).catch(() => undefined);
    if (!t || t.source.type === 'builtin' || !t.node || t.node === this.opts.nodeName || this.opts.rootfs.has(t.key)) return undefined;
    return t.node;
  }

  /** Whether the template's root file system is on disk. */
  rootfsReady(t: Template): boolean {
    return this.opts.rootfs.has(t.key);
  }

  /** The image key the template's snapshot must have with the current driver. */
  async imageKey(t: Template): Promise<string> {
    return `${t.key}-${sha256(JSON.stringify([await this.opts.driverVersion(), t.start ?? null, t.env])).slice(0, 16)}`;
  }

  /**
   * The key a capture on this node stores its image under: the content key, and with a shared
   * store the node's name too. Nodes capturing one template at once (each at its first use)
   * then never write over each other's copy: the record names one of them, whose stored copy
   * every node loads; a working copy under another key is not taken for it.
   */
  private captureKey(contentKey: string): string {
    return this.opts.shared && this.opts.nodeName ? `${contentKey}.${this.opts.nodeName.toLowerCase()}` : contentKey;
  }

  /** Whether `image` was taken for the content key (on any node). */
  private static isCurrent(image: TemplateImage, contentKey: string): boolean {
    return image.key === contentKey || image.key.startsWith(`${contentKey}.`);
  }

  /** Directory of an image. */
  imageDir(image: TemplateImage): string {
    return path.join(this.opts.imagesDir, image.key);
  }

  /**
   * The template's image if it is current and its working copy is there (written back from the
   * stored copy if needed) — or, where this node could not load that one, its own
   * ({@link captureImage}).
   */
  async usableImage(t: Template): Promise<TemplateImage | undefined> {
    const contentKey = await this.imageKey(t);
    if (!t.image || !TemplateService.isCurrent(t.image, contentKey)) return undefined;
    if (existsSync(path.join(this.imageDir(t.image), '.space-complete'))) return t.image;
    const own = await this.nodeImage(contentKey);
    if (own) return own;
    return (await this.loadImage(t, t.image)) ? t.image : undefined;
  }

  /** This node's own image for `contentKey`, kept beside the record's (see {@link captureImage}), if its working copy is there. */
  private async nodeImage(contentKey: string): Promise<TemplateImage | undefined> {
    const key = this.captureKey(contentKey);
    if (!this.opts.shared || key === contentKey) return undefined;
    const dir = path.join(this.opts.imagesDir, key);
    if (!existsSync(path.join(dir, '.space-complete'))) return undefined;
    const meta = await fs.readFile(path.join(dir, NODE_IMAGE_META), 'utf8').catch(() => undefined);
    return meta ? (JSON.parse(meta) as TemplateImage) : undefined;
  }

  /** Writes the working copy of `image` from its stored copy, once at a time per image. */
  private loadImage(t: Template, image: TemplateImage): Promise<boolean> {
    const images = this.opts.images;
    if (!images) return Promise.resolve(false);
    const dir = this.imageDir(image);
    let p = this.loads.get(dir);
    if (!p) {
      p = (async () => {
        const tmp = `${dir}.tmp-load-${randomBytes(4).toString('hex')}`;
        try {
          if (!(await images.load(t, image, tmp))) return false;
          await fs.writeFile(path.join(tmp, '.space-complete'), new Date().toISOString());
          await fs.rm(dir, { recursive: true, force: true });
          await fs.rename(tmp, dir);
          return true;
        } finally {
          // A load that failed midway may still be closing its files: a leftover is swept at the next start.
          await fs.rm(tmp, { recursive: true, force: true, maxRetries: 3 }).catch(() => {});
        }
      })().finally(() => this.loads.delete(dir));
      this.loads.set(dir, p);
    }
    return p;
  }

  /** Stores a newly captured image durably; on failure it is removed and the capture fails. */
  private async keep(t: Template, image: TemplateImage): Promise<TemplateImage> {
    try {
      await this.opts.images?.save(t, image, this.imageDir(image));
      return image;
    } catch (err) {
      await fs.rm(this.imageDir(image), { recursive: true, force: true });
      throw err;
    }
  }

  /** Removes an image: its working copy and its stored copy. */
  private async removeImage(t: Template, image: TemplateImage): Promise<void> {
    await fs.rm(this.imageDir(image), { recursive: true, force: true });
    await this.opts.images?.drop(t, image).catch(() => {}); // unreferenced: collected with the other unreferenced objects
  }

  /**
   * Takes the template's image (again), e.g. for a built-in on first use or after a runtime
   * upgrade. One capture per template at a time.
   */
  captureImage(t: Template, progress: Progress = () => {}): Promise<Template> {
    const ref = `${t.tenantId}/${t.name}`;
    let p = this.captures.get(ref);
    if (!p) {
      p = (async () => {
        // It may have been removed since the caller looked it up.
        if (!(await this.opts.store.getTemplate(t.tenantId, t.name))) throw new SpaceError('TEMPLATE_NOT_FOUND', `Template ${t.name} was removed`);
        const rootfs = await this.rootfsOf(t, progress);
        const contentKey = await this.imageKey(t);
        const key = this.captureKey(contentKey);
        const recorded = (await this.opts.store.getTemplate(t.tenantId, t.name))?.image;
        // The record names another node's current image, which this node could not load (with
        // disks, one stored before 2026-12-07 without the template files its disk grew from,
        // which this node's pool does not hold). This node takes its own and keeps it beside,
        // in its working copies only: the record, and the other node's image that every other
        // node may be using, stay as they are. (Replacing the record made the nodes take it in
        // turns, each removing the other's image.)
        if (this.opts.shared && recorded && recorded.key !== key && TemplateService.isCurrent(recorded, contentKey)) {
          const own = await this.opts.capture(t, rootfs, key, progress);
          await fs.writeFile(path.join(this.imageDir(own), NODE_IMAGE_META), JSON.stringify(own));
          const cur = await this.opts.store.getTemplate(t.tenantId, t.name);
          return { ...(cur ?? t), image: own };
        }
        const old = t.image;
        const image = await this.keep(t, await this.opts.capture(t, rootfs, key, progress));
        const cur = await this.opts.store.getTemplate(t.tenantId, t.name);
        if (!cur) {
          await this.removeImage(t, image);
          throw new SpaceError('TEMPLATE_NOT_FOUND', `Template ${t.name} was removed while its snapshot was taken`);
        }
        const next = { ...cur, image };
        await this.opts.store.putTemplate(next);
        if (old && old.key !== image.key) await this.removeImage(t, old);
        this.onChange(next);
        return next;
      })().finally(() => this.captures.delete(ref));
      this.captures.set(ref, p);
    }
    return p;
  }

  /**
   * Makes an existing template ready to create from: its root file system (built-ins are built
   * on first use) and a current image.
   */
  async prepare(tenantId: string, name: string, progress: Progress = () => {}): Promise<Template> {
    const t = await this.resolve(tenantId, name);
    if (!this.rootfsReady(t)) await this.rootfsOf(t, (p, s) => progress(Math.round(p * 0.8), s));
    if (await this.usableImage(t)) {
      progress(100, 'ready');
      return t;
    }
    const next = await this.captureImage(t, (p, s) => progress(80 + Math.round(p * 0.2), s));
    progress(100, 'ready');
    return next;
  }

  /** Builds a template: root file system, then its image. The upload it names is used up, whatever the outcome. */
  async build(tenantId: string, req: TemplateBuildRequest, progress: Progress = () => {}, signal?: AbortSignal): Promise<Template> {
    try {
      return await this.buildNow(tenantId, req, progress, signal);
    } finally {
      if (typeof req.uploadId === 'string' && UPLOAD_ID_RE.test(req.uploadId)) {
        const file = this.uploadFile(tenantId, req.uploadId);
        await fs.rm(file, { force: true }).catch(() => {});
        await fs.rm(`${file}.json`, { force: true }).catch(() => {});
      }
    }
  }

  private async buildNow(tenantId: string, req: TemplateBuildRequest, progress: Progress, signal?: AbortSignal): Promise<Template> {
    const name = req.name;
    if (typeof name !== 'string' || !TEMPLATE_NAME_RE.test(name)) throw new SpaceError('BAD_REQUEST', `Template names are 1–63 lowercase letters, digits, ".", "_" or "-", starting with a letter or digit; got ${JSON.stringify(name)}`);
    if ((this.opts.rootfs.builtins as readonly string[]).includes(name)) throw new SpaceError('TEMPLATE_EXISTS', `${name} is a built-in template; pick another name`);
    if ((req.packages === undefined) === (req.uploadId === undefined)) throw new SpaceError('BAD_REQUEST', 'Give exactly one of packages (Debian packages) or uploadId (an uploaded image)');
    const start = this.checkStart(req.start);
    const env = checkMap('env', req.env, LIMITS.envEntries);
    const poolSize = this.checkPool(req.poolSize ?? 0);
    const ref = `${tenantId}/${name}`;
    if (this.building.has(ref) || (await this.opts.store.getTemplate(tenantId, name))) throw new SpaceError('TEMPLATE_EXISTS', `Template ${name} exists; remove it first with \`space template rm ${name}\``);
    this.building.add(ref);
    let source: RootfsSource;
    let key: string;
    let upload: TemplateUpload | undefined;
    let t: Template | undefined;
    try {
      if (req.packages) {
        if (!Array.isArray(req.packages) || req.packages.length === 0 || req.packages.length > 500) throw new SpaceError('BAD_REQUEST', 'packages must be a list of 1 to 500 Debian package names');
        const packages = [...new Set(req.packages)].sort();
        source = { type: 'debian', packages };
        key = `t-${sha256(`debian\0${packages.join(',')}`).slice(0, 32)}`;
      } else {
        upload = await this.getUpload(tenantId, req.uploadId!);
        source = { type: 'upload', file: this.uploadFile(tenantId, upload.uploadId) };
        // Keyed by tenant too: another tenant's identical upload is never a visible cache hit.
        key = `t-${sha256(`upload\0${tenantId}\0${upload.sha256}`).slice(0, 32)}`;
      }
      const cached = this.opts.rootfs.has(key);
      t = {
        name,
        tenantId,
        state: 'building',
        source: source.type === 'debian' ? source : { type: 'upload', format: 'rootfs', sha256: upload!.sha256, sizeBytes: upload!.sizeBytes },
        key,
        ...(start ? { start } : {}),
        env,
        poolSize,
        createdAt: new Date().toISOString(),
        ...(this.opts.nodeName ? { node: this.opts.nodeName } : {}),
      };
      await this.opts.store.putTemplate(t);
      try {
        const built = await this.opts.rootfs.build(key, source, (p, s) => progress(Math.round(p * 0.7), s), signal);
        if (t.source.type === 'upload' && built.format) t.source = { ...t.source, format: built.format };
        t.env = { ...built.env, ...env };
        t.rootfsBytes = built.sizeBytes;
        signal?.throwIfAborted();
        const imageKey = this.captureKey(await this.imageKey(t));
        t.image = await this.keep(t, await this.opts.capture(t, this.opts.rootfs.path(key), imageKey, (p, s) => progress(70 + Math.round(p * 0.3), s), signal));
        t = { ...t, state: 'ready', readyAt: new Date().toISOString() };
        await this.opts.store.putTemplate(t);
        progress(100, 'ready');
        this.onChange(t);
        return t;
      } catch (err) {
        await this.opts.store.deleteTemplate(tenantId, name);
        if (!cached) await this.dropFiles(t);
        else if (t.image) await this.removeImage(t, t.image);
        throw err;
      }
    } finally {
      this.building.delete(ref);
    }
  }

  private checkStart(s: TemplateBuildRequest['start']): TemplateStart | undefined {
    if (s === undefined) return undefined;
    if (typeof s.cmd !== 'string' || !s.cmd.trim() || s.cmd.length > 8192) throw new SpaceError('BAD_REQUEST', 'start.cmd must be a non-empty shell command of at most 8 KiB');
    if (s.readyCmd !== undefined && (typeof s.readyCmd !== 'string' || !s.readyCmd.trim() || s.readyCmd.length > 8192)) throw new SpaceError('BAD_REQUEST', 'start.readyCmd must be a non-empty shell command of at most 8 KiB');
    const readyTimeoutMs = s.readyTimeoutMs ?? 60_000;
    if (!Number.isInteger(readyTimeoutMs) || readyTimeoutMs < 100 || readyTimeoutMs > 600_000) throw new SpaceError('BAD_REQUEST', 'start.readyTimeoutMs must be from 100 to 600000');
    return { cmd: s.cmd, ...(s.readyCmd ? { readyCmd: s.readyCmd } : {}), readyTimeoutMs };
  }

  private checkPool(size: unknown): number {
    const max = this.opts.maxPoolSize ?? 16;
    if (typeof size !== 'number' || !Number.isInteger(size) || size < 0 || size > max) throw new SpaceError('BAD_REQUEST', `poolSize must be an integer from 0 to ${max} (the node's limit)`);
    return size;
  }

  /** Sets a template's warm pool size. Built-ins need an admin key. */
  async setPool(tenantId: string, name: string, size: number, admin: boolean): Promise<Template> {
    const n = this.checkPool(size);
    const t = await this.resolve(tenantId, name);
    if (t.tenantId === '' && !admin) throw new SpaceError('FORBIDDEN', `The pool of built-in template ${name} is the node's: set it with an admin key`);
    const next = { ...t, poolSize: n };
    await this.opts.store.putTemplate(next);
    this.onChange(next);
    return next;
  }

  /** Removes a tenant's template, its image and (when no other template shares it) its root file system. */
  async remove(tenantId: string, name: string): Promise<void> {
    const t = await this.opts.store.getTemplate(tenantId, name);
    if (!t) {
      if (await this.opts.store.getTemplate('', name)) throw new SpaceError('FORBIDDEN', `${name} is a built-in template and cannot be removed`);
      throw await this.notFound(tenantId, name);
    }
    if (t.state === 'building') throw new SpaceError('TEMPLATE_NOT_READY', `Template ${name} is still being built`);
    const n = await this.opts.inUse(tenantId, name);
    if (n > 0) throw new SpaceError('TEMPLATE_IN_USE', `${n} sandbox${n === 1 ? '' : 'es'} still use${n === 1 ? 's' : ''} template ${name}; kill ${n === 1 ? 'it' : 'them'} first`, { details: { sandboxes: n } });
    await this.opts.store.deleteTemplate(tenantId, name);
    this.onChange({ ...t, poolSize: 0 });
    await this.dropFiles(t);
  }

  private async dropFiles(t: Template): Promise<void> {
    if (t.image) await this.removeImage(t, t.image);
    if (t.source.type === 'builtin') return;
    const shared = (await this.opts.store.listTemplates()).some((o) => o.key === t.key && (o.tenantId !== t.tenantId || o.name !== t.name));
    if (!shared) await this.opts.rootfs.remove(t.key);
  }

  private uploadFile(tenantId: string, uploadId: string): string {
    return path.join(this.opts.uploadsDir, sha256(tenantId).slice(0, 16), `${uploadId}.tar`);
  }

  /** Stores an upload (an image tarball) for a later build; kept for an hour. */
  async saveUpload(tenantId: string, body: Readable): Promise<TemplateUpload> {
    await this.sweepUploads(UPLOAD_TTL_MS);
    const uploadId = `up${randomBytes(12).toString('hex')}`;
    const file = this.uploadFile(tenantId, uploadId);
    await fs.mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    const max = this.opts.maxUploadBytes ?? 8 * 1024 ** 3;
    const h = createHash('sha256');
    let size = 0;
    const count = new Transform({
      transform(chunk: Buffer, _enc, cb) {
        size += chunk.length;
        if (size > max) return cb(new SpaceError('PAYLOAD_TOO_LARGE', `Uploads are limited to ${max} bytes`));
        h.update(chunk);
        cb(null, chunk);
      },
    });
    try {
      await pipeline(body, count, createWriteStream(`${file}.part`, { mode: 0o600 }));
      if (size === 0) throw new SpaceError('TEMPLATE_IMAGE_INVALID', 'The upload is empty');
      const up: TemplateUpload = { uploadId, sizeBytes: size, sha256: h.digest('hex'), createdAt: new Date().toISOString() };
      await fs.writeFile(`${file}.json`, JSON.stringify(up));
      await fs.rename(`${file}.part`, file);
      return up;
    } catch (err) {
      await fs.rm(`${file}.part`, { force: true });
      throw err;
    }
  }

  private async getUpload(tenantId: string, uploadId: string): Promise<TemplateUpload> {
    if (typeof uploadId !== 'string' || !UPLOAD_ID_RE.test(uploadId)) throw new SpaceError('UPLOAD_NOT_FOUND', `No upload ${JSON.stringify(uploadId)}`);
    try {
      const up = JSON.parse(await fs.readFile(`${this.uploadFile(tenantId, uploadId)}.json`, 'utf8')) as TemplateUpload;
      if (!existsSync(this.uploadFile(tenantId, uploadId))) throw new Error('gone');
      return up;
    } catch {
      throw new SpaceError('UPLOAD_NOT_FOUND', `No upload ${uploadId} for this API key (uploads are kept for an hour and used once)`);
    }
  }

  private async sweepUploads(olderThanMs: number): Promise<void> {
    const now = Date.now();
    for (const d of await fs.readdir(this.opts.uploadsDir).catch(() => [] as string[])) {
      const dir = path.join(this.opts.uploadsDir, d);
      for (const f of await fs.readdir(dir).catch(() => [] as string[])) {
        const st = await fs.stat(path.join(dir, f)).catch(() => undefined);
        if (st && (olderThanMs === 0 ? f.endsWith('.part') : now - st.mtimeMs > olderThanMs)) await fs.rm(path.join(dir, f), { force: true });
      }
    }
  }
}
