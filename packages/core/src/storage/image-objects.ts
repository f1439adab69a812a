/**
 * A checkpoint image in the blob store: the snapshot object (snapshot-format.ts) under its key,
 * and beside it, under `<key>.<suffix>`, the bytes its files stand for that are stored apart
 * ({@link ImageAttachment}: a disk's stream). Written attachments first, object last, so a
 * crash leaves at most objects nothing names, which the collector removes (an attachment lives as
 * long as the object whose key it extends: dedup-blobs.ts).
 */
import path from 'node:path';
import { SpaceError } from '../errors.js';
import type { BlobStore } from '../ports/blob-store.js';
import type { ImageForms, ImageReaders } from '../ports/driver.js';
import { imageEntries, packSnapshot, readSnapshot, type SnapshotMeta } from './snapshot-format.js';

/**
 * Stores image directory `imageDir` as object `key` and its attachments. Returns the image's
 * metadata, the bytes stored (object and attachments, before deduplication) and the suffixes of
 * the attachments `copied`: one that stands for what it stood for in image `opts.earlier` is a
 * copy of that one's object.
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
  } = {},
): Promise<{ meta: SnapshotMeta; sizeBytes: number; copied: string[] }> {
  const { earlier } = opts;
  const attachments: NonNullable<SnapshotMeta['attachments']> = [];
  const copied: string[] = [];
  try {
    if (forms.attachments.length) {
      for (const name of await imageEntries(imageDir)) {
        for (const a of forms.attachments) {
          const file = path.join(imageDir, name);
          // Recorded before the write, so that a failure deletes whatever of it was stored.
          const entry = { file: name, name: a.name, key: a.suffix, size: 0 };
          // What an earlier snapshot of the sandbox stored already (a disk nothing wrote to
          // since): its object is copied, which costs a manifest, not a pass over the bytes.
          if (earlier && blobs.copy && (await a.unchangedSince?.(file, earlier.id))) {
            // The earlier snapshot went meanwhile (retention), or its object cannot be read:
            // the bytes are stored anew (a store that cannot write them fails that put). A
            // failed copy wrote nothing (its one write is the store's atomic put).
            const size = await blobs.copy(`${earlier.key}.${a.suffix}`, `${key}.${a.suffix}`).catch(() => undefined);
            if (size !== undefined) {
              attachments.push({ ...entry, size });
              copied.push(a.suffix);
              break;
            }
          }
          const bytes = await a.open(file);
          if (!bytes) continue;
          attachments.push(entry);
          // A store that fails (a revoked key) may leave the stream unread: its producer stops with it.
          entry.size = await blobs.put(`${key}.${a.suffix}`, bytes).finally(() => bytes.destroy());
          break;
        }
      }
    }
    const { stream, meta: full } = await packSnapshot(imageDir, { ...meta, ...(attachments.length ? { attachments } : {}) }, forms.codecs);
    const size = opts.whole && blobs.putWhole ? await blobs.putWhole(key, stream) : await blobs.put(key, stream);
    return { meta: full, sizeBytes: size + attachments.reduce((n, a) => n + a.size, 0), copied };
  } catch (err) {
    // Nothing names what was stored; it goes now (or with the next collection).
    for (const a of attachments) await blobs.delete(`${key}.${a.key}`).catch(() => {});
    throw err;
  }
}

/**
 * Reads object `key` into `imageDir` (verified: SNAPSHOT_CORRUPT) and makes what its
 * attachments stand for where this node lacks it, from their stored bytes.
 *
 * @example
 * await getImage(blobs, snap.blobKey, snap.id, dir, 2 ** 35, driverRouter);
 */
export async function getImage(blobs: BlobStore, key: string, id: string, imageDir: string, maxPayload: number, forms: ImageReaders): Promise<SnapshotMeta> {
  const meta = await readSnapshot(id, await blobs.get(key), imageDir, maxPayload, (name) => forms.codecNamed(name));
  for (const a of meta.attachments ?? []) {
    const attachment = forms.attachmentNamed(a.name);
    if (!attachment) throw new SpaceError('DRIVER_UNAVAILABLE', `Snapshot ${id} stores the bytes of ${a.file} as ${a.name}, which no driver of this daemon reads; start spaced with the driver that took it (${meta.driver}, with the same options)`, { details: { snapshotId: id } });
    const file = path.join(imageDir, a.file);
    if (!(await attachment.needed(file))) continue;
    const bytes = await blobs.get(`${key}.${a.key}`).catch((err: unknown) => {
      throw err instanceof SpaceError && err.code !== 'SNAPSHOT_NOT_FOUND' ? err : new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: the stored bytes of ${a.file} are missing; it was not restored`, { cause: err, details: { snapshotId: id } });
    });
    await attachment.apply(file, bytes).catch((err: unknown) => {
      throw err instanceof SpaceError && err.code !== 'SNAPSHOT_CORRUPT' ? err : new SpaceError('SNAPSHOT_CORRUPT', `Snapshot ${id} is corrupt: ${a.file} could not be made from its stored bytes (${err instanceof Error ? err.message : String(err)}); it was not restored`, { cause: err, details: { snapshotId: id } });
    });
  }
  return meta;
}

/**
 * Deletes object `key` and whatever attachments it may have (`suffixes`: every enabled driver's;
 * deleting one that is not there does nothing).
 *
 * @example
 * await deleteImage(blobs, snap.blobKey, drivers.attachmentSuffixes());
 */
export async function deleteImage(blobs: BlobStore, key: string, suffixes: readonly string[]): Promise<void> {
  await blobs.delete(key);
  for (const s of suffixes) await blobs.delete(`${key}.${s}`);
}
