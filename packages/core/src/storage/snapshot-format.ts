/**
 * SPACE's own snapshot container around a runtime's checkpoint image.
 *
 * ```
 * "SPACESNP"             8 bytes magic
 * u16 format version     independent of the release (this is 2; 1 is read too)
 * u32 metadata length    at most 64 KiB, checked before anything is parsed
 * sha256(metadata)       32 bytes
 * metadata               JSON: SnapshotMeta
 * payload                the image files, concatenated in metadata.files order
 * ```
 *
 * Version 2 added `files[].codec`: the file is stored in the form the driver's
 * {@link ImageFileCodec} of that name wrote, and decoded (verified bit for bit) on unpacking.
 * Version 3 added `attachments`: bytes an image file stands for, stored as objects of their own
 * beside the snapshot's (see ImageAttachment and image-objects.ts); written only by a
 * snapshot that has some (others stay version 2, readable by daemons from before).
 * Version 4 lets a file's bytes be stored in several parts, applied in the order listed (a
 * whole, then the changes since: ImageAttachment.openSince); written only by a snapshot with a
 * file stored so, which daemons from before refuse instead of applying its first part alone.
 *
 * `metadata.payloadSha256` covers the payload; {@link readSnapshot} verifies both hashes and all
 * sizes while unpacking, and refuses with `SNAPSHOT_CORRUPT` before anything is restored.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, promises as fs } from 'node:fs';
import path from 'node:path';
import { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SpaceError } from '../errors.js';
import { CHECKPOINT_COMPLETE, type ImageFileCodec } from '../ports/driver.js';

export const SNAPSHOT_MAGIC = Buffer.from('SPACESNP');
/** The newest format written (a snapshot without attachments is written as version 2). */
export const SNAPSHOT_FORMAT_VERSION = 4;
/** An ImageAttachment's key suffix. */
const SUFFIX = /^[a-z0-9-]{1,32}$/;
const MAX_META = 64 * 1024;
const FIXED = 8 + 2 + 4 + 32;
/** Bytes read from an image file at once (a read of 64 KiB, the default, costs as much as one of 1 MiB here). */
const READ_CHUNK = 1 << 20;

/** What a snapshot says about itself. */
export interface SnapshotMeta {
  id: string;
  sandboxId: string;
  tenantId: string;
  template: string;
  driver: string;
  driverVersion: string;
  parentSnapshotId?: string;
  createdAt: string;
  /** Files of the runtime's image directory, in payload order; `size` is the stored size, `codec` the stored form's (none: as written). */
  files: { name: string; size: number; codec?: string }[];
  /**
   * Image files whose bytes are stored apart, as `<this object's key>.<key>` (version 3): the
   * attachment's name, its key suffix, and the stored size. A file listed more than once
   * (version 4) is stored in parts, applied in this order.
   */
  attachments?: { file: string; name: string; key: string; size: number }[];
  payloadSize: number;
  payloadSha256: string;
}

/** Whether some file's bytes are stored in more than one part (format version 4). */
function inParts(attachments: NonNullable<SnapshotMeta['attachments']>): boolean {
  return new Set(attachments.map((a) => a.file)).size < attachments.length;
}

/** The names of a runtime image directory's entries that are part of the image, in payload order. */
export async function imageEntries(imageDir: string): Promise<string[]> {
  // The runtime's completion mark (see SandboxDriver.checkpoint) says something about the directory, not the image.
  return (await fs.readdir(imageDir)).filter((n) => n !== CHECKPOINT_COMPLETE).sort();
}

/**
 * Packs a runtime image directory into a snapshot stream (hashing it first). Each file goes
 * through the first of `codecs` that takes it and is stored in its encoded form (written beside
 * `imageDir`, which stays as it is, and removed once the stream has been read); a file named in
 * `meta.attachments` is stored as it is.
 *
 * @example
 * const { stream, meta } = await packSnapshot(imageDir, { id, sandboxId, ... }, driver.imageCodecs);
 * await blobs.put(key, stream);
 */
export async function packSnapshot(imageDir: string, meta: Omit<SnapshotMeta, 'files' | 'payloadSize' | 'payloadSha256'>, codecs: readonly ImageFileCodec[] = []): Promise<{ stream: Readable; meta: SnapshotMeta }> {
  const names = await imageEntries(imageDir);
  const files: SnapshotMeta['files'] = [];
  const sources: string[] = [];
  const encodedDir = `${imageDir}.stored`;
  const hash = createHash('sha256');
  try {
    for (const name of names) {
      let p = path.join(imageDir, name);
      if (!(await fs.stat(p)).isFile()) continue;
      let used: string | undefined;
      for (const codec of meta.attachments?.some((a) => a.file === name) ? [] : codecs) {
        await fs.mkdir(encodedDir, { recursive: true });
        const enc = path.join(encodedDir, name);
        if (await codec.encode(p, enc)) {
          p = enc;
          used = codec.name;
          break;
        }
      }
      files.push({ name, size: (await fs.stat(p)).size, ...(used ? { codec: used } : {}) });
      sources.push(p);
      for await (const chunk of createReadStream(p, { highWaterMark: READ_CHUNK })) hash.update(chunk as Buffer);
    }
  } catch (err) {
    await fs.rm(encodedDir, { recursive: true, force: true });
    throw err;
  }
  const full: SnapshotMeta = { ...meta, files, payloadSize: files.reduce((a, f) => a + f.size, 0), payloadSha256: hash.digest('hex') };
  const metaBuf = Buffer.from(JSON.stringify(full));
  const head = Buffer.alloc(FIXED);
  SNAPSHOT_MAGIC.copy(head, 0);
  head.writeUInt16BE(!full.attachments?.length ? 2 : inParts(full.attachments) ? 4 : 3, 8);
  head.writeUInt32BE(metaBuf.length, 10);
  createHash('sha256').update(metaBuf).digest().copy(head, 14);
  async function* body(): AsyncGenerator<Buffer> {
    try {
      yield head;
      yield metaBuf;
      for (const p of sources) for await (const chunk of createReadStream(p, { highWaterMark: READ_CHUNK })) yield chunk as Buffer;
    } finally {
      await fs.rm(encodedDir, { recursive: true, force: true });
    }
  }
  return { stream: Readable.from(body()), meta: full };
}

function corrupt(id: string, why: string): SpaceError {
  return new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: ${why}; it was not restored`, { details: { snapshotId: id } });
}

/**
 * Unpacks a snapshot stream into `imageDir`, verifying magic, version, sizes and both hashes,
 * and decoding files stored through a codec (`codecs` finds one by name). Rejects with
 * `SNAPSHOT_CORRUPT` (nothing is restored from a corrupt snapshot), or `DRIVER_UNAVAILABLE`
 * when the snapshot needs a codec this daemon does not have.
 *
 * @example
 * await readSnapshot(snap.id, await blobs.get(snap.blobKey), dir, 2 ** 34, (name) => router.codecNamed(name));
 */
export async function readSnapshot(id: string, src: Readable, imageDir: string, maxPayload: number, codecs: (name: string) => ImageFileCodec | undefined = () => undefined): Promise<SnapshotMeta> {
  const it = src[Symbol.asyncIterator]() as AsyncIterator<Buffer>;
  let buf: Buffer = Buffer.alloc(0);
  const need = async (n: number): Promise<boolean> => {
    while (buf.length < n) {
      const r = await it.next();
      if (r.done) return false;
      buf = Buffer.concat([buf, r.value]);
    }
    return true;
  };
  if (!(await need(FIXED))) throw corrupt(id, 'truncated header');
  if (!buf.subarray(0, 8).equals(SNAPSHOT_MAGIC)) throw corrupt(id, 'bad magic');
  const version = buf.readUInt16BE(8);
  if (version < 1 || version > SNAPSHOT_FORMAT_VERSION) throw corrupt(id, `unsupported format version ${version}${version > SNAPSHOT_FORMAT_VERSION ? ' (written by a newer daemon)' : ''}`);
  const metaLen = buf.readUInt32BE(10);
  if (metaLen > MAX_META) throw corrupt(id, `metadata of ${metaLen} bytes exceeds ${MAX_META}`);
  const metaHash = Buffer.from(buf.subarray(14, FIXED));
  if (!(await need(FIXED + metaLen))) throw corrupt(id, 'truncated metadata');
  const metaBuf = buf.subarray(FIXED, FIXED + metaLen);
  if (!createHash('sha256').update(metaBuf).digest().equals(metaHash)) throw corrupt(id, 'metadata checksum mismatch');
  let meta: SnapshotMeta;
  try {
    meta = JSON.parse(metaBuf.toString('utf8')) as SnapshotMeta;
  } catch {
    throw corrupt(id, 'metadata is not JSON');
  }
  if (meta.id !== id) throw corrupt(id, `it holds snapshot ${String(meta.id)}`);
  if (!Array.isArray(meta.files) || meta.payloadSize > maxPayload || meta.files.reduce((a, f) => a + f.size, 0) !== meta.payloadSize) throw corrupt(id, 'inconsistent sizes');
  for (const f of meta.files) if (typeof f.name !== 'string' || !/^[A-Za-z0-9._-]{1,128}$/.test(f.name)) throw corrupt(id, 'bad file name');
  if (meta.attachments !== undefined) {
    const ok = version >= 3 && Array.isArray(meta.attachments) && meta.attachments.every((a) => meta.files.some((f) => f.name === a.file && f.codec === undefined) && typeof a.name === 'string' && typeof a.key === 'string' && SUFFIX.test(a.key) && Number.isSafeInteger(a.size) && a.size >= 0);
    if (!ok || (version < 4 && inParts(meta.attachments))) throw corrupt(id, 'bad attachments');
  }
  const decoders = new Map<string, ImageFileCodec>();
  for (const f of meta.files) {
    if (f.codec === undefined) continue;
    if (version < 2 || typeof f.codec !== 'string') throw corrupt(id, 'bad file codec');
    const c = codecs(f.codec);
    if (!c) throw new SpaceError('DRIVER_UNAVAILABLE', `Snapshot ${id} stores ${f.name} as ${f.codec}, which no driver of this daemon decodes; start spaced with the driver that took it (${String(meta.driver)})`, { details: { snapshotId: id } });
    decoders.set(f.name, c);
  }
  buf = buf.subarray(FIXED + metaLen);

  await fs.mkdir(imageDir, { recursive: true });
  const hash = createHash('sha256');
  for (const f of meta.files) {
    let left = f.size;
    const self: { buf: Buffer; it: AsyncIterator<Buffer> } = { buf, it };
    async function* part(): AsyncGenerator<Buffer> {
      while (left > 0) {
        if (self.buf.length === 0) {
          const r = await self.it.next();
          if (r.done) throw corrupt(id, 'truncated payload');
          self.buf = r.value;
        }
        const take = self.buf.subarray(0, Math.min(left, self.buf.length));
        self.buf = self.buf.subarray(take.length);
        left -= take.length;
        hash.update(take);
        yield take;
      }
    }
    await pipeline(Readable.from(part()), createWriteStream(path.join(imageDir, decoders.has(f.name) ? `${f.name}.stored` : f.name), { mode: 0o600 }));
    buf = self.buf;
  }
  if (buf.length > 0 || !(await it.next()).done) throw corrupt(id, 'trailing bytes after the payload');
  if (hash.digest('hex') !== meta.payloadSha256) throw corrupt(id, 'payload checksum mismatch');
  for (const [name, c] of decoders) {
    const stored = path.join(imageDir, `${name}.stored`);
    await c.decode(stored, path.join(imageDir, name)).catch((err: unknown) => {
      throw err instanceof SpaceError && err.code !== 'SNAPSHOT_CORRUPT' ? err : corrupt(id, `${name} does not decode (${err instanceof Error ? err.message : String(err)})`);
    });
    await fs.rm(stored, { force: true });
  }
  return meta;
}
