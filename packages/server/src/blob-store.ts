/**
 * Where the daemon stores blobs (snapshots' chunks and manifests, template images), from
 * `--blob-store`: a local directory (the default, `<data>/blobs`, or `file:///PATH`, e.g. a
 * shared mount) or S3-compatible object storage (`s3://BUCKET[/PREFIX]?endpoint=…`). The
 * encryption and deduplication layers sit above whichever it is.
 */
import path from 'node:path';
import { SpaceError, type BlobStore } from '@space/core';
import { LocalBlobStore } from '@space/blob-local';
import { S3BlobStore, parseS3Url } from '@space/blob-s3';

/** An open blob store, what to call it in logs, and how to let it go. */
export interface OpenedBlobStore {
  store: BlobStore;
  /** e.g. `file:///var/lib/space/blobs`, `s3://bucket/prefix/ at http://…` (no credentials). */
  where: string;
  close(): void;
}

/**
 * Opens the blob store a `--blob-store` URL names (undefined: `<dataDir>/blobs`). Local stores
 * are swept of a crash's partial files; an S3 store's bucket must exist and answer
 * (`BLOB_STORE_UNAVAILABLE` otherwise, saying which and why).
 *
 * @example const { store } = await openBlobStore('s3://space?endpoint=http://10.0.0.5:8080', '/var/lib/space');
 */
export async function openBlobStore(url: string | undefined, dataDir: string): Promise<OpenedBlobStore> {
  if (url === undefined || url.startsWith('file:')) {
    let dir = path.join(dataDir, 'blobs');
    if (url !== undefined) {
      const u = new URL(url);
      if (u.host || !path.isAbsolute(decodeURIComponent(u.pathname)) || u.pathname === '/') throw new SpaceError('CONFIG_INVALID', `--blob-store ${JSON.stringify(url)}: use file:///ABSOLUTE/PATH (three slashes, not the root)`);
      dir = decodeURIComponent(u.pathname).replace(/\/+$/, '');
    }
    const store = new LocalBlobStore(dir);
    await store.sweep();
    return { store, where: `file://${dir}`, close: () => {} };
  }
  if (url.startsWith('s3:')) {
    const location = parseS3Url(url);
    const store = await S3BlobStore.open(location);
    return { store, where: `s3://${location.bucket}/${location.prefix} at ${location.endpoint ?? `AWS ${location.region}`}`, close: () => store.close() };
  }
  throw new SpaceError('CONFIG_INVALID', `--blob-store ${JSON.stringify(url)}: use file:///PATH or s3://BUCKET?endpoint=http://HOST:PORT (default: DATA_DIR/blobs)`);
}
