/**
 * Where the daemon stores blobs (snapshots' chunks and manifests, template images), from
 * `--blob-store`: a local directory (the default, `<data>/blobs`, or `file:///PATH`, e.g. a
 * shared mount) or S3-compatible object storage (`s3://BUCKET[/PREFIX]?endpoint=…`). The
 * encryption and deduplication layers sit above whichever it is.
 */
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { Readable } from 'node:stream';
import { SpaceError, type BlobStore, type MetadataStore } from '@space/core';
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

/** The blob naming the deployment (metadata database) a blob store belongs to. */
const OWNER_KEY = 'meta/deployment.json';

async function ownerOf(blobs: BlobStore): Promise<string | undefined> {
  let text: string;
  try {
    const chunks: Buffer[] = [];
    for await (const c of await blobs.get(OWNER_KEY)) chunks.push(Buffer.from(c as Buffer));
    text = Buffer.concat(chunks).toString('utf8');
  } catch (err) {
    if ((err as { code?: string }).code === 'SNAPSHOT_NOT_FOUND') return undefined;
    throw err;
  }
  try {
    const id = (JSON.parse(text) as { id?: unknown }).id;
    if (typeof id === 'string') return id;
  } catch {
    // not ours to read
  }
  return `an unreadable ${OWNER_KEY}`;
}

/**
 * Makes sure the blob store belongs to this deployment (the metadata database, by its
 * `deployment-id`), marking it on first use. A blob store shared by two deployments would lose
 * data: each one's collection deletes the chunks the other's database references. Refuses with
 * `BLOB_STORE_IN_USE`. Called at start and before every collection.
 *
 * @example await claimBlobStore(blobs.store, store, 's3://space/node1/')
 */
export async function claimBlobStore(blobs: BlobStore, store: MetadataStore, where: string): Promise<void> {
  const id = await store.putMetaIfAbsent('deployment-id', randomUUID());
  let owner = await ownerOf(blobs);
  if (owner === undefined) {
    await blobs.put(OWNER_KEY, Readable.from([Buffer.from(JSON.stringify({ id, createdAt: new Date().toISOString() }))]));
    owner = await ownerOf(blobs);
  }
  if (owner !== id) {
    throw new SpaceError('BLOB_STORE_IN_USE', `The blob store ${where} belongs to another SPACE deployment (${owner}), not to this one's database (${id}): give each deployment its own bucket, prefix (s3://BUCKET/PREFIX) or directory`, { details: { owner, deployment: id } });
  }
}
