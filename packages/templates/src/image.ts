/**
 * Importing an uploaded image into a root file system, with no registry: an OCI image layout
 * (as `skopeo copy ... oci-archive:` or `docker buildx --output type=oci` write it), the output
 * of `docker save`, or a plain tarball of a root file system. Layers are applied in order
 * with OCI whiteouts; every blob of an OCI layout is checked against its digest. Extraction
 * never writes outside the root (node-tar refuses `..`, absolute paths and writes through
 * symbolic links).
 */
import { createHash } from 'node:crypto';
import { createReadStream, promises as fs } from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import * as tar from 'tar';
import { SpaceError, type Progress } from '@space/core';

/** What an image import found. */
export interface ImportedImage {
  format: 'oci' | 'docker' | 'rootfs';
  /** `Env` of the image config. */
  env: Record<string, string>;
}

interface Layer {
  file: string;
  mediaType?: string;
}

function invalid(message: string, cause?: unknown): SpaceError {
  return new SpaceError('TEMPLATE_IMAGE_INVALID', message, cause ? { cause } : {});
}

/** Entry names of a tar archive (normalised, without `./`); rejects when it is not one. */
async function listTar(file: string, what: string): Promise<string[]> {
  const names: string[] = [];
  try {
    await tar.t({ file, strict: true, onReadEntry: (e) => void names.push(path.posix.normalize(e.path).replace(/^(\.\/)+/, '').replace(/\/$/, '')) });
  } catch (err) {
    throw invalid(`${what} is not a readable tar archive: ${err instanceof Error ? err.message : String(err)}`, err);
  }
  if (!names.length) throw invalid(`${what} is empty`);
  return names;
}

async function extract(file: string, cwd: string, what: string, filter?: (p: string) => boolean): Promise<void> {
  try {
    await tar.x({ file, cwd, strict: true, unlink: true, preserveOwner: true, ...(filter ? { filter: (p: string) => filter(path.posix.normalize(p).replace(/^(\.\/)+/, '')) } : {}) });
  } catch (err) {
    throw invalid(`Cannot extract ${what}: ${err instanceof Error ? err.message : String(err)}`, err);
  }
}

async function readJson<T>(file: string, what: string): Promise<T> {
  try {
    return JSON.parse(await fs.readFile(file, 'utf8')) as T;
  } catch (err) {
    throw invalid(`${what} is missing or not JSON`, err);
  }
}

/** Path of an OCI blob, checked against its digest. */
async function ociBlob(layout: string, digest: unknown, what: string): Promise<string> {
  const m = typeof digest === 'string' ? /^sha256:([a-f0-9]{64})$/.exec(digest) : null;
  if (!m) throw invalid(`${what} has an unsupported digest ${JSON.stringify(digest)} (sha256 is required)`);
  const file = path.join(layout, 'blobs', 'sha256', m[1]!);
  const h = createHash('sha256');
  try {
    await pipeline(createReadStream(file), h);
  } catch (err) {
    throw invalid(`${what} (${digest}) is missing from the image`, err);
  }
  if (h.digest('hex') !== m[1]) throw invalid(`${what} (${digest}) does not match its digest: the image is corrupt`);
  return file;
}

interface OciDescriptor {
  mediaType?: string;
  digest?: string;
  platform?: { os?: string; architecture?: string };
}

async function ociLayers(layout: string): Promise<{ layers: Layer[]; config: string }> {
  const index = await readJson<{ manifests?: OciDescriptor[] }>(path.join(layout, 'index.json'), 'index.json');
  let desc = index.manifests?.[0];
  for (let depth = 0; desc && /image\.index|manifest\.list/.test(desc.mediaType ?? '') && depth < 2; depth++) {
    const nested = await readJson<{ manifests?: OciDescriptor[] }>(await ociBlob(layout, desc.digest, 'image index'), 'image index');
    desc = nested.manifests?.find((d) => (d.platform?.os ?? 'linux') === 'linux' && (d.platform?.architecture ?? 'amd64') === 'amd64');
  }
  if (!desc) throw invalid('index.json lists no image manifest (for linux/amd64)');
  const manifest = await readJson<{ config?: OciDescriptor; layers?: OciDescriptor[] }>(await ociBlob(layout, desc.digest, 'image manifest'), 'image manifest');
  if (!manifest.config || !Array.isArray(manifest.layers)) throw invalid('the image manifest has no config or layers');
  const config = await ociBlob(layout, manifest.config.digest, 'image config');
  const layers: Layer[] = [];
  for (const [i, l] of manifest.layers.entries()) layers.push({ file: await ociBlob(layout, l.digest, `layer ${i + 1}`), ...(l.mediaType ? { mediaType: l.mediaType } : {}) });
  return { layers, config };
}

async function dockerLayers(dir: string): Promise<{ layers: Layer[]; config: string }> {
  const manifest = await readJson<{ Config?: string; Layers?: string[] }[]>(path.join(dir, 'manifest.json'), 'manifest.json');
  const m = Array.isArray(manifest) ? manifest[0] : undefined;
  if (!m?.Config || !Array.isArray(m.Layers)) throw invalid('manifest.json of the docker save archive names no Config and Layers');
  const inside = (p: string) => {
    const r = path.resolve(dir, p);
    if (!r.startsWith(dir + path.sep)) throw invalid(`manifest.json names a path outside the archive: ${p}`);
    return r;
  };
  return { layers: m.Layers.map((l) => ({ file: inside(l) })), config: inside(m.Config) };
}

/** Applies one layer: whiteouts first (they hide lower layers), then its files. */
async function applyLayer(layer: Layer, root: string, n: number): Promise<void> {
  if (layer.mediaType && /zstd/.test(layer.mediaType)) throw invalid(`layer ${n} is zstd-compressed, which SPACE does not read; rebuild the image with gzip layers`);
  const names = await listTar(layer.file, `layer ${n}`);
  for (const name of names) {
    const base = path.posix.basename(name);
    if (!base.startsWith('.wh.')) continue;
    const dir = path.posix.dirname(name);
    const target = base === '.wh..wh..opq' ? dir : path.posix.join(dir, base.slice(4));
    const abs = path.resolve(root, target);
    if (abs !== root && !abs.startsWith(root + path.sep)) continue;
    // Never follow a symbolic link out of the root while deleting.
    const parent = await fs.realpath(path.dirname(abs)).catch(() => undefined);
    if (!parent || (parent !== root && !parent.startsWith(root + path.sep))) continue;
    if (base === '.wh..wh..opq') {
      for (const e of await fs.readdir(abs).catch(() => [] as string[])) await fs.rm(path.join(abs, e), { recursive: true, force: true });
    } else await fs.rm(abs, { recursive: true, force: true });
  }
  await extract(layer.file, root, `layer ${n}`, (p) => !path.posix.basename(p).startsWith('.wh.'));
}

/**
 * Imports `file` into the empty directory `root`, using `work` as scratch space.
 *
 * @example
 * const { format, env } = await importImage('/tmp/upload.tar', '/t/rootfs', '/t/work', (p, s) => {});
 */
export async function importImage(file: string, root: string, work: string, progress: Progress, signal?: AbortSignal): Promise<ImportedImage> {
  progress(2, 'reading the image');
  const names = new Set(await listTar(file, 'The upload'));
  const format: ImportedImage['format'] = names.has('oci-layout') && names.has('index.json') ? 'oci' : names.has('manifest.json') ? 'docker' : 'rootfs';
  if (format === 'rootfs') {
    progress(10, 'extracting the root file system');
    await extract(file, root, 'the root file system');
    return { format, env: {} };
  }
  await fs.mkdir(work, { recursive: true, mode: 0o700 });
  progress(5, `unpacking the ${format === 'oci' ? 'OCI layout' : 'docker save archive'}`);
  await extract(file, work, 'the image archive');
  const { layers, config } = format === 'oci' ? await ociLayers(work) : await dockerLayers(work);
  if (!layers.length) throw invalid('the image has no layers');
  for (const [i, layer] of layers.entries()) {
    signal?.throwIfAborted();
    progress(10 + Math.round((80 * i) / layers.length), `applying layer ${i + 1} of ${layers.length}`);
    await applyLayer(layer, root, i + 1);
  }
  const cfg = await readJson<{ config?: { Env?: string[] } }>(config, 'the image config');
  const env: Record<string, string> = {};
  for (const kv of cfg.config?.Env ?? []) {
    const i = kv.indexOf('=');
    if (i > 0) env[kv.slice(0, i)] = kv.slice(i + 1);
  }
  return { format, env };
}
