/**
 * The blob-store interface: where snapshot bytes live (a local directory by default; an
 * object store or an encrypting codec in front of one later). Writes are atomic: a blob is
 * visible only once complete.
 */
import type { Readable } from 'node:stream';
import { SpaceError } from '../errors.js';

/** The tenant a blob key `<kind>/<tenant>/<id>` belongs to. */
export function tenantOfKey(key: string): string {
  const parts = key.split('/');
  if (parts.length < 3 || !parts[1]) throw new SpaceError('INTERNAL', `Blob key ${key} names no tenant`);
  return parts[1];
}

/** Size and time of a stored blob. */
export interface BlobInfo {
  key: string;
  size: number;
  createdAt: string;
}

/**
 * Stores opaque byte streams under keys like `snapshots/<tenant>/<id>`.
 *
 * @example
 * await blobs.put('snapshots/t1/sn1', fs.createReadStream(file));
 * const stream = await blobs.get('snapshots/t1/sn1');
 */
export interface BlobStore {
  /** Stores `data` under `key`, atomically (a crash leaves no partial blob). Returns its size. */
  put(key: string, data: Readable): Promise<number>;
  /** Reads a blob; rejects with `SNAPSHOT_NOT_FOUND` when missing. */
  get(key: string): Promise<Readable>;
  stat(key: string): Promise<BlobInfo | undefined>;
  /**
   * Throws if `key` could not be stored now (e.g. its tenant's encryption key is revoked), so
   * that callers can refuse before doing expensive work.
   */
  assertWritable?(key: string): Promise<void>;
  delete(key: string): Promise<void>;
  /** Keys directly under `prefix` (a "directory" such as `chunks/<tenant>`). */
  list?(prefix: string): Promise<string[]>;
}
