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
  /**
   * Stores under `to` what `from` holds where the store can do so without moving the bytes (a
   * deduplicating store writes a second manifest); returns the size. Stores without it are
   * written with `put`. Rejects with `SNAPSHOT_NOT_FOUND` when `from` is not stored.
   */
  copy?(from: string, to: string): Promise<number>;
  /**
   * Stores `data` under `key` as `put` does, for an object known to share nothing with others
   * (a runtime's compressed image): a deduplicating store skips looking for what it could share.
   * Stores without it are written with `put`. Read back with `get`, like any object.
   */
  putWhole?(key: string, data: Readable): Promise<number>;
  /** Keys directly under `prefix` (a "directory" such as `chunks/<tenant>`). */
  list?(prefix: string): Promise<string[]>;
}

/**
 * Keeps blob writers and the collector apart across every daemon of a deployment (nodes sharing
 * one database and one blob store), as {@link DedupBlobStore} keeps them apart within one: a
 * collection deletes packs no recorded object references, so no node may be writing (and
 * referencing packs it knows of) while it runs. Before a collection's first deletion the
 * `generation` moves on; a writer seeing a new one forgets the pack locations it knew (some may
 * be gone) and reads them again from the manifests. (Moved before, not after: a collector
 * that dies half-way has still told every writer.)
 *
 * @example
 * await lock.writing(async (generation) => put(key, data));
 * const r = await lock.collecting(async (deleting) => gc({ mayDelete: async () => (await deleting(), true) }), { minIntervalMs: 9 * 60_000 });
 */
export interface BlobCollectionLock {
  /** Runs `fn` while no collection runs on any node (writers share the lock); `fn` gets the generation. */
  writing<T>(fn: (generation: string) => Promise<T>): Promise<T>;
  /**
   * Runs `fn` once no write runs on any node and none can start; `fn` calls `deleting()` before
   * it deletes anything (the first call moves the generation on). Undefined, without running
   * `fn`, when the lock could not be had in time or (`minIntervalMs`) another node collected
   * more recently than that. Returns the generation after it.
   */
  collecting<T>(fn: (deleting: () => Promise<void>) => Promise<T>, opts?: { minIntervalMs?: number }): Promise<{ value: T; generation: string } | undefined>;
}
