/**
 * A checkpoint image in the blob store: the snapshot object (snapshot-format.ts) under its key,
 * and beside it, under `<key>.<suffix>`, the bytes its files stand for that are stored apart
 * ({@link ImageAttachment}: a disk's stream). Written attachments first, object last, so a
 * crash leaves at most objects nothing names, which the collector removes (an attachment lives as
 * long as the object whose key it extends: dedup-blobs.ts).
 */
import path from 'node:path';
import { Readable } from 'node:stream';
import { SpaceError } from '../errors.js';
import type { BlobStore } from '../ports/blob-store.js';
import type { ImageForms, ImageReaders } from '../ports/driver.js';
import { imageEntries, packSnapshot, readSnapshot, type SnapshotMeta } from './snapshot-format.js';

/**
 * At most this many parts per file: the whole, then the changes since earlier snapshots, each
 * after the last ({@link ImageAttachment.openSince}). A restore on a node without what they make
 * applies them all; so the next snapshot after the longest chain, or after changes that add up
 * to more than the whole, stores the whole again.
 */
export const MAX_ATTACHMENT_PARTS = 32;

/** The key suffix of part `i` (from 0) of the bytes an attachment with suffix `suffix` stores. */
function partKey(suffix: string, i: number): string {
  return i === 0 ? suffix : `${suffix}-p${i + 1}`;
}

/** The key suffixes of the parts object `key` has for attachment `suffix`, in order (none: not stored). */
async function storedParts(blobs: BlobStore, key: string, suffix: string): Promise<string[]> {
  const parts: string[] = [];
  while (parts.length < MAX_ATTACHMENT_PARTS && (await blobs.stat(`${key}.${partKey(suffix, parts.length)}`))) parts.push(partKey(suffix, parts.length));
  return parts;
}

/**
 * Copies parts `parts` of object `from` to object `to` (manifests, not bytes); their sizes, or
 * undefined, with none of them left under `to`, when one cannot be copied (`from` deleted
 * meanwhile) or `worth` says no to the sizes.
 */
async function copyParts(blobs: BlobStore, from: string, to: string, parts: string[], worth: (sizes: number[]) => boolean): Promise<number[] | undefined> {
  const sizes: number[] = [];
  try {
    for (const p of parts) sizes.push(await blobs.copy!(`${from}.${p}`, `${to}.${p}`));
    if (worth(sizes)) return sizes;
  } catch {
    // (undefined: the whole is stored instead)
  }
  for (const p of parts.slice(0, sizes.length)) await blobs.delete(`${to}.${p}`).catch(() => {});
  return undefined;
}

/**
 * Stores image directory `imageDir` as object `key` and its attachments. Returns the image's
 * metadata, the bytes stored (object and attachments, before deduplication) and, per attachment
 * stored as its change since image `opts.earlier` (a copy of that one's parts, which costs
 * manifests, not a pass over the bytes, then the change as one more part), its suffix and the
 * change's size.
 *
 * @example
 * const { sizeBytes } = await putImage(blobs, `snapshots/acme/${id}`, imageDir, { id, sandboxId, ... }, driverRouter.imageForms('gvisor'));
 */
export async function putImage(
  blobs: BlobStore,
  key: string,
  imageDir: string,
  meta: Omit<SnapshotMeta, 'files' | 'payloadSize' | 'payloadSha256' | 'attachments'>,
  forms: ImageForms,
  opts: {
    /** An earlier image of the same sandbox on this node (its id and key), whose attachments may serve this one. */
    earlier?: { id: string; key: string };
    /** The object shares nothing with stored ones (a runtime's compressed image): stored without looking for chunks to share ({@link BlobStore.putWhole}). */
    whole?: boolean;
    /**
     * The image must restore on other nodes too (a cluster): what its attachments' bytes are
     * made against ({@link ImageAttachment.base}: a disk's template files) is stored beside them.
     */
    portable?: boolean;
  } = {},
): Promise<{ meta: SnapshotMeta; sizeBytes: number; since: { suffix: string; size: number }[] }> {
  const { earlier } = opts;
  const attachments: NonNullable<SnapshotMeta['attachments']> = [];
  const since: { suffix: string; size: number }[] = [];
  const bases: string[] = [];
  try {
    if (forms.attachments.length) {
      for (const name of await imageEntries(imageDir)) {
        for (const a of forms.attachments) {
          const file = path.join(imageDir, name);
          if (opts.portable && a.base) {
            const b = await a.base(file);
            if (b) {
              bases.push(`${key}.${baseKey(a.suffix)}`);
              // The earlier image's disk grew from the same template: its copy serves first.
              await putBase(blobs, key, a.suffix, b, earlier?.key);
            }
          }
          if (earlier && blobs.copy && a.openSince) {
            // What the sandbox's previous snapshot stored, then the change since: a snapshot
            // after a small change (or none) does not store everything again. Where that one
            // went meanwhile (retention), its copy left the node, or its parts are many or add
            // up to more than their whole, the whole is stored.
            const parts = await storedParts(blobs, earlier.key, a.suffix);
            const change = parts.length > 0 && parts.length < MAX_ATTACHMENT_PARTS ? await a.openSince(file, earlier.id) : undefined;
            const sizes = change && (await copyParts(blobs, earlier.key, key, parts, (s) => s.slice(1).reduce((n, x) => n + x, 0) <= s[0]!));
            if (change && sizes) {
              const last = partKey(a.suffix, parts.length);
              const size = await blobs.put(`${key}.${last}`, change).finally(() => change.destroy()).catch(() => undefined);
              if (size !== undefined) {
                parts.forEach((p, i) => attachments.push({ file: name, name: a.name, key: p, size: sizes[i]! }));
                attachments.push({ file: name, name: a.name, key: last, size });
                since.push({ suffix: a.suffix, size });
                break;
              }
              // The change could not be made (btrfs failing) or stored: the whole, as if there were no earlier one.
              for (const p of [...parts, last]) await blobs.delete(`${key}.${p}`).catch(() => {});
            }
            change?.destroy();
          }
          const bytes = await a.open(file);
          if (!bytes) continue;
          // Recorded before the write, so that a failure deletes whatever of it was stored.
          const entry = { file: name, name: a.name, key: a.suffix, size: 0 };
          attachments.push(entry);
          // A store that fails (a revoked key) may leave the stream unread: its producer stops with it.
          entry.size = await blobs.put(`${key}.${a.suffix}`, bytes).finally(() => bytes.destroy());
          break;
        }
      }
    }
    const { stream, meta: full } = await packSnapshot(imageDir, { ...meta, ...(attachments.length ? { attachments } : {}) }, forms.codecs);
    const size = opts.whole && blobs.putWhole ? await blobs.putWhole(key, stream) : await blobs.put(key, stream);
    return { meta: full, sizeBytes: size + attachments.reduce((n, a) => n + a.size, 0), since };
  } catch (err) {
    // Nothing names what was stored; it goes now (or with the next collection).
    for (const k of [...attachments.map((a) => `${key}.${a.key}`), ...bases]) await blobs.delete(k).catch(() => {});
    throw err;
  }
}

/**
 * Reads object `key` into `imageDir` (verified: SNAPSHOT_CORRUPT) and makes what its
 * attachments stand for where this node lacks it, from their stored bytes (a file's parts one
 * after another).
 *
 * @example
 * await getImage(blobs, snap.blobKey, snap.id, dir, 2 ** 35, driverRouter);
 */
export async function getImage(blobs: BlobStore, key: string, id: string, imageDir: string, maxPayload: number, forms: ImageReaders): Promise<SnapshotMeta> {
  const meta = await readSnapshot(id, await blobs.get(key), imageDir, maxPayload, (name) => forms.codecNamed(name));
  const byFile = new Map<string, NonNullable<SnapshotMeta['attachments']>>();
  for (const a of meta.attachments ?? []) byFile.set(a.file, [...(byFile.get(a.file) ?? []), a]);
  for (const [name, parts] of byFile) {
    const a = parts[0]!;
    const attachment = forms.attachmentNamed(a.name);
    if (!attachment) throw new SpaceError('DRIVER_UNAVAILABLE', `Snapshot ${id} stores the bytes of ${a.file} as ${a.name}, which no driver of this daemon reads; start spaced with the driver that took it (${meta.driver}, with the same options)`, { details: { snapshotId: id } });
    if (parts.some((p) => p.name !== a.name)) throw new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: the parts of ${a.file} are of different kinds; it was not restored`, { details: { snapshotId: id } });
    const file = path.join(imageDir, name);
    if (!(await attachment.needed(file))) continue;
    if (attachment.needsBase && attachment.applyBase && (await attachment.needsBase(file))) {
      // Taken on another node: what its bytes are made against (a disk's template files) first.
      const k = `${key}.${baseKey(attachment.suffix)}`;
      if (!(await blobs.stat(k))) throw new SpaceError('TEMPLATE_NOT_ON_NODE', `Snapshot ${id} was taken on another node, and ${a.file} grew from that node's template files, which this node lacks and the snapshot does not hold (it was taken outside a cluster, or before 2026-12-07); restore it on the node that took it`, { details: { snapshotId: id } });
      await attachment.applyBase(file, await blobs.get(k)).catch((err: unknown) => {
        throw err instanceof SpaceError && err.code !== 'SNAPSHOT_CORRUPT' ? err : new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: the template files ${a.file} grew from could not be made from its stored bytes (${err instanceof Error ? err.message : String(err)}); it was not restored`, { cause: err, details: { snapshotId: id } });
      });
    }
    const part = (p: (typeof parts)[number]): Promise<Readable> =>
      blobs.get(`${key}.${p.key}`).catch((err: unknown) => {
        throw err instanceof SpaceError && err.code !== 'SNAPSHOT_NOT_FOUND' ? err : new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: the stored bytes of ${a.file} are missing; it was not restored`, { cause: err, details: { snapshotId: id } });
      });
    const first = await part(a);
    async function* all(): AsyncGenerator<Buffer> {
      yield* first;
      for (const p of parts.slice(1)) yield* await part(p);
    }
    const bytes = parts.length === 1 ? first : Readable.from(all(), { objectMode: false });
    await attachment.apply(file, bytes).catch((err: unknown) => {
      throw err instanceof SpaceError && err.code !== 'SNAPSHOT_CORRUPT' ? err : new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: ${a.file} could not be made from its stored bytes (${err instanceof Error ? err.message : String(err)}); it was not restored`, { cause: err, details: { snapshotId: id } });
    });
  }
  return meta;
}

/**
 * Deletes object `key` and whatever attachments it may have, every part (`suffixes`: every
 * enabled driver's; deleting one that is not there does nothing).
 *
 * @example
 * await deleteImage(blobs, snap.blobKey, drivers.attachmentSuffixes());
 */
export async function deleteImage(blobs: BlobStore, key: string, suffixes: readonly string[]): Promise<void> {
  await blobs.delete(key);
  // Every part, in order (any left by a crash half-way are collected: an attachment lives as
  // long as its object).
  for (const s of suffixes) {
    for (const p of await storedParts(blobs, key, s)) await blobs.delete(`${key}.${p}`);
    await blobs.delete(`${key}.${baseKey(s)}`);
  }
}

/** The key suffix of what an attachment's bytes are made against ({@link ImageAttachment.base}). */
function baseKey(suffix: string): string {
  return `${suffix}-base`;
}

/**
 * Per blob store, tenant and base: the last object that stored it. A snapshot's base is a copy of
 * the earlier image's or that one (a manifest: milliseconds, where storing a template's files
 * again reads and hashes them all: ~30 s for `base` here); stored anew when there is neither,
 * or they have gone since.
 */
const baseHolders = new WeakMap<BlobStore, Map<string, string>>();

/** Stores base `b` of attachment `suffix` as `<key>.<suffix>-base`: a copy of `<earlier>.<suffix>-base` or of the last one stored, else its bytes. */
async function putBase(blobs: BlobStore, key: string, suffix: string, b: { id: string; open(): Readable }, earlier?: string): Promise<void> {
  const to = `${key}.${baseKey(suffix)}`;
  let holders = baseHolders.get(blobs);
  if (!holders) baseHolders.set(blobs, (holders = new Map()));
  const ref = `${key.split('/')[1]}|${suffix}|${b.id}`;
  let copied = false;
  for (const from of [earlier && `${earlier}.${baseKey(suffix)}`, holders.get(ref)]) {
    if (copied || !from || !blobs.copy) continue;
    copied = await blobs.copy(from, to).then(() => true, () => false);
  }
  if (!copied) {
    const bytes = b.open();
    await blobs.put(to, bytes).finally(() => bytes.destroy());
  }
  holders.set(ref, to);
}
