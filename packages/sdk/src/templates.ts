/**
 * Templates: list, build (from Debian packages, an image tarball or a directory), remove, and
 * size their warm pools. Builds stream their progress.
 */
import { createReadStream, promises as fs } from 'node:fs';
import { Readable } from 'node:stream';
import { isErrorCode } from '@space/api';
import { ApiClient, SpaceError, ndjson, type ConnectionOpts, type HttpResponse } from './client.js';

/** A template as the API returns it. */
export interface TemplateInfo {
  name: string;
  /** Built-ins (`minimal`, `base`) are the node's and every tenant sees them. */
  builtin: boolean;
  /** `missing`: a built-in whose root file system is built on first use. */
  state: 'ready' | 'building' | 'missing';
  source: { type: 'builtin' } | { type: 'debian'; packages: string[] } | { type: 'upload'; format: 'oci' | 'docker' | 'rootfs'; sha256: string; sizeBytes: number };
  start?: { cmd: string; readyCmd?: string; readyTimeoutMs: number };
  env: Record<string, string>;
  pool: { size: number; ready: number };
  /** The template snapshot that creates restore. */
  image?: { sizeBytes: number; captureMs: number; createdAt: string };
  rootfsBytes?: number;
  createdAt: string;
  readyAt?: string;
}

/** Progress of a build. */
export type BuildProgress = (percent: number, step: string) => void;

/** What to build a template from (exactly one of `packages`, `image`, `dir`). */
export interface TemplateBuildOpts extends ConnectionOpts {
  name: string;
  /** Debian bookworm packages. */
  packages?: string[];
  /** An image tarball: a file path, bytes or a stream (OCI layout, `docker save`, or rootfs tar). */
  image?: string | Uint8Array | Readable;
  /** A local directory to use as the root file system (uploaded as a tarball). */
  dir?: string;
  /** Started before the template snapshot; `readyCmd` exits 0 once it is ready. */
  start?: { cmd: string; readyCmd?: string; readyTimeoutMs?: number };
  env?: Record<string, string>;
  /** Warm pool size. @default 0 */
  poolSize?: number;
  onProgress?: BuildProgress;
}

/** Reads a build's NDJSON stream: progress to `onProgress`, the template at the end. */
async function buildResult(res: HttpResponse, onProgress?: BuildProgress): Promise<TemplateInfo> {
  for await (const ev of ndjson(res)) {
    if (ev.type === 'progress') onProgress?.(Number(ev.percent), String(ev.step));
    else if (ev.type === 'done') return ev.result as TemplateInfo;
    else if (ev.type === 'error') {
      throw new SpaceError(isErrorCode(ev.code) ? ev.code : 'INTERNAL', `${String(ev.message)}${ev.step ? ` (step: ${String(ev.step)})` : ''}`, { details: { step: ev.step } });
    }
  }
  throw new SpaceError('INTERNAL', 'The build stream ended without a result');
}

/**
 * Templates of the caller's tenant, plus the built-ins.
 *
 * @example
 * import { Templates, Sandbox } from '@space/sdk';
 * await Templates.build({ name: 'tools', packages: ['jq', 'ripgrep'], poolSize: 2, onProgress: (p, s) => console.log(p, s) });
 * const sb = await Sandbox.create({ template: 'tools' });
 */
export class Templates {
  /** Every template the caller can create from. */
  static async list(opts: ConnectionOpts = {}): Promise<TemplateInfo[]> {
    return (await new ApiClient(opts).json<{ templates: TemplateInfo[] }>('GET', '/v1/templates')).templates;
  }

  /** One template. */
  static get(name: string, opts: ConnectionOpts = {}): Promise<TemplateInfo> {
    return new ApiClient(opts).json<TemplateInfo>('GET', `/v1/templates/${encodeURIComponent(name)}`);
  }

  /** Builds a template and resolves once its snapshot is taken. Rejects with the failing step. */
  static async build(opts: TemplateBuildOpts): Promise<TemplateInfo> {
    const api = new ApiClient(opts);
    const sources = [opts.packages, opts.image, opts.dir].filter((x) => x !== undefined).length;
    if (sources !== 1) throw new SpaceError('BAD_REQUEST', 'Give exactly one of packages, image or dir');
    let uploadId: string | undefined;
    if (opts.image !== undefined || opts.dir !== undefined) {
      opts.onProgress?.(0, 'uploading');
      uploadId = (await Templates.upload(opts.dir !== undefined ? { dir: opts.dir } : { image: opts.image! }, opts)).uploadId;
    }
    const res = await api.request('POST', '/v1/templates', {
      json: { name: opts.name, ...(opts.packages ? { packages: opts.packages } : {}), ...(uploadId ? { uploadId } : {}), ...(opts.start ? { start: opts.start } : {}), ...(opts.env ? { env: opts.env } : {}), ...(opts.poolSize !== undefined ? { poolSize: opts.poolSize } : {}) },
      timeoutMs: 0,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    return buildResult(res, opts.onProgress);
  }

  /** Makes a template ready to create from (a built-in is built on first use). */
  static async prepare(name: string, opts: ConnectionOpts & { onProgress?: BuildProgress } = {}): Promise<TemplateInfo> {
    const res = await new ApiClient(opts).request('POST', `/v1/templates/${encodeURIComponent(name)}/build`, { timeoutMs: 0, ...(opts.signal ? { signal: opts.signal } : {}) });
    return buildResult(res, opts.onProgress);
  }

  /** Uploads an image tarball (or a directory, tarred on the fly) for {@link Templates.build}. */
  static async upload(what: { image: string | Uint8Array | Readable } | { dir: string }, opts: ConnectionOpts = {}): Promise<{ uploadId: string; sizeBytes: number; sha256: string }> {
    let body: Readable | Uint8Array | AsyncIterable<Uint8Array>;
    if ('dir' in what) {
      const st = await fs.stat(what.dir).catch(() => undefined);
      if (!st?.isDirectory()) throw new SpaceError('BAD_REQUEST', `${what.dir} is not a directory`);
      // Loaded here: only this call needs it, and loading it costs every CLI command otherwise.
      const tar = await import('tar');
      body = tar.c({ cwd: what.dir, portable: false }, ['.']) as unknown as AsyncIterable<Uint8Array>;
    } else if (typeof what.image === 'string') {
      const st = await fs.stat(what.image).catch(() => undefined);
      if (!st?.isFile()) throw new SpaceError('BAD_REQUEST', `${what.image} is not a file`);
      body = createReadStream(what.image);
    } else body = what.image;
    return new ApiClient(opts).json('POST', '/v1/template-uploads', { body, contentType: 'application/octet-stream', timeoutMs: 0 });
  }

  /** Removes a template of the caller's tenant (refused while sandboxes use it). */
  static async remove(name: string, opts: ConnectionOpts = {}): Promise<void> {
    await new ApiClient(opts).request('DELETE', `/v1/templates/${encodeURIComponent(name)}`);
  }

  /** Sets the warm pool size of a template (built-ins need an admin key). */
  static setPool(name: string, size: number, opts: ConnectionOpts = {}): Promise<TemplateInfo> {
    return new ApiClient(opts).json<TemplateInfo>('PUT', `/v1/templates/${encodeURIComponent(name)}/pool`, { json: { size } });
  }
}
