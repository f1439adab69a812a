/**
 * @space/blob-s3 — a {@link BlobStore} on S3-compatible object storage (`spaced --blob-store
 * s3://BUCKET?endpoint=…`): AWS's own SDK for the protocol (signatures, retries with
 * exponential backoff, multipart uploads through `@aws-sdk/lib-storage`), streaming both ways.
 * Objects are written whole or not at all (S3 shows an object only once its upload completes;
 * a failed multipart upload is aborted). What is stored is already encrypted and deduplicated
 * by the layers above; this store adds nothing to the bytes.
 */
import { Transform, type Readable } from 'node:stream';
import { DeleteObjectCommand, GetObjectCommand, HeadBucketCommand, HeadObjectCommand, ListObjectsV2Command, S3Client, S3ServiceException } from '@aws-sdk/client-s3';
import { Upload } from '@aws-sdk/lib-storage';
import { SpaceError, isUnreachableError, type BlobInfo, type BlobStore } from '@space/core';

const KEY = /^[a-z0-9][a-z0-9_\-/.]{0,255}$/;

/** Where the store is: parsed from `s3://BUCKET[/PREFIX]?endpoint=URL&region=R&pathStyle=true`. */
export interface S3Location {
  bucket: string;
  /** Keys are stored under this prefix (no leading slash, ends with `/` when not empty). */
  prefix: string;
  /** The server, e.g. `http://127.0.0.1:8080`; absent: AWS. */
  endpoint?: string;
  /** @default "us-east-1" */
  region: string;
  /** Path-style addressing (`endpoint/bucket/key`): the default with an endpoint, as most servers on an IP need. */
  pathStyle: boolean;
}

/**
 * Parses a `--blob-store` S3 URL. Credentials never come from it: AWS's chain reads them from
 * the environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`) or a file
 * (`AWS_SHARED_CREDENTIALS_FILE`, `~/.aws/credentials`).
 *
 * @example parseS3Url('s3://space-blobs/node1?endpoint=http://10.0.0.5:8080') // { bucket: 'space-blobs', prefix: 'node1/', … }
 */
export function parseS3Url(url: string): S3Location {
  let u: URL;
  try {
    u = new URL(url);
  } catch (err) {
    throw new SpaceError('CONFIG_INVALID', `--blob-store ${JSON.stringify(url)} is not a URL: use s3://BUCKET?endpoint=http://HOST:PORT`, { cause: err });
  }
  if (u.protocol !== 's3:') throw new SpaceError('CONFIG_INVALID', `Not an s3:// URL: ${u.protocol}`);
  if (u.username || u.password) throw new SpaceError('CONFIG_INVALID', '--blob-store must not carry credentials (ps shows them): set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_SHARED_CREDENTIALS_FILE');
  if (!/^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$/.test(u.hostname)) throw new SpaceError('CONFIG_INVALID', `Invalid bucket name ${JSON.stringify(u.hostname)} in --blob-store: 3-63 lower-case letters, digits, dots and hyphens`);
  const prefix = u.pathname.replace(/^\/+|\/+$/g, '');
  if (prefix && !KEY.test(prefix)) throw new SpaceError('CONFIG_INVALID', `Invalid key prefix ${JSON.stringify(prefix)} in --blob-store`);
  const endpoint = u.searchParams.get('endpoint') ?? undefined;
  if (endpoint !== undefined && !/^https?:\/\/[^/]+\/?$/.test(endpoint)) throw new SpaceError('CONFIG_INVALID', `--blob-store endpoint must be http(s)://HOST[:PORT], got ${JSON.stringify(endpoint)}`);
  const pathStyle = u.searchParams.get('pathStyle');
  return {
    bucket: u.hostname,
    prefix: prefix ? `${prefix}/` : '',
    ...(endpoint ? { endpoint } : {}),
    region: u.searchParams.get('region') ?? 'us-east-1',
    pathStyle: pathStyle === null ? endpoint !== undefined : pathStyle === 'true',
  };
}

/** Options of {@link S3BlobStore}. */
export interface S3BlobStoreOptions {
  /** Explicit credentials (tests); otherwise AWS's default chain (environment, then files). */
  credentials?: { accessKeyId: string; secretAccessKey: string };
  /** Multipart part size, bytes. @default 8 MiB */
  partSize?: number;
  /** Parts uploaded at once. @default 4 */
  queueSize?: number;
  /** Attempts per request, backoff between them (the SDK's standard retry mode). @default 5 */
  maxAttempts?: number;
  /** Longest a request may wait for a connection / for the server's answer, ms. @default 5000 / 60000 */
  connectTimeoutMs?: number;
  requestTimeoutMs?: number;
}

/** Whether `err` means the server could not be reached or could not answer (not "no such key"). */
function isUnavailable(err: unknown): boolean {
  const e = err as { code?: string; name?: string; $metadata?: { httpStatusCode?: number } };
  if (isUnreachableError(err)) return true;
  if (e.name === 'TimeoutError' || e.name === 'RequestTimeout') return true;
  return [500, 502, 503, 504].includes(e.$metadata?.httpStatusCode ?? 0);
}

/**
 * S3-compatible blob store.
 *
 * @example
 * const blobs = await S3BlobStore.open(parseS3Url('s3://space?endpoint=http://127.0.0.1:8080'));
 * await blobs.put('snapshots/t1/sn1', stream);
 */
export class S3BlobStore implements BlobStore {
  private constructor(
    private readonly s3: S3Client,
    readonly location: S3Location,
    private readonly opts: S3BlobStoreOptions,
  ) {}

  /**
   * Connects and checks the bucket. Refuses with `BLOB_STORE_UNAVAILABLE` saying which and why:
   * the server cannot be reached, refuses the credentials, or has no such bucket.
   */
  static async open(location: S3Location, opts: S3BlobStoreOptions = {}): Promise<S3BlobStore> {
    const s3 = new S3Client({
      region: location.region,
      ...(location.endpoint ? { endpoint: location.endpoint } : {}),
      forcePathStyle: location.pathStyle,
      maxAttempts: opts.maxAttempts ?? 5,
      ...(opts.credentials ? { credentials: opts.credentials } : {}),
      requestHandler: { connectionTimeout: opts.connectTimeoutMs ?? 5000, requestTimeout: opts.requestTimeoutMs ?? 60_000 },
      // Checksums on every request are for AWS; S3-compatible servers differ in what they accept.
      requestChecksumCalculation: 'WHEN_REQUIRED',
      responseChecksumValidation: 'WHEN_REQUIRED',
    });
    const store = new S3BlobStore(s3, location, opts);
    try {
      await s3.send(new HeadBucketCommand({ Bucket: location.bucket }));
    } catch (err) {
      s3.destroy();
      throw store.startError(err);
    }
    return store;
  }

  private where(): string {
    return `s3://${this.location.bucket}/${this.location.prefix} at ${this.location.endpoint ?? `AWS ${this.location.region}`}`;
  }

  private startError(err: unknown): SpaceError {
    const e = err as { name?: string; message?: string; $metadata?: { httpStatusCode?: number } };
    const status = e.$metadata?.httpStatusCode;
    if (status === 403 || status === 401 || e.name === 'CredentialsProviderError') return new SpaceError('BLOB_STORE_UNAVAILABLE', `The object store refused the credentials for ${this.where()} (${e.name ?? status}): check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the credentials file`, { cause: err });
    if (status === 404 || e.name === 'NotFound' || e.name === 'NoSuchBucket') return new SpaceError('BLOB_STORE_UNAVAILABLE', `No bucket ${this.location.bucket} at ${this.location.endpoint ?? 'AWS'}: create it first`, { cause: err });
    return new SpaceError('BLOB_STORE_UNAVAILABLE', `Cannot reach the object store for ${this.where()} (${(err as { code?: string }).code ?? e.name ?? e.message}): is it running and reachable from this node?`, { cause: err });
  }

  /** The error a caller sees for a failed request. */
  private failed(err: unknown, key: string): unknown {
    if (err instanceof SpaceError) return err;
    if (isUnavailable(err)) return new SpaceError('BLOB_STORE_UNAVAILABLE', `The object store could not be reached for ${key} (${(err as { code?: string; name?: string }).code ?? (err as Error).name}); nothing was changed`, { cause: err });
    return err;
  }

  private objectKey(key: string): string {
    if (!KEY.test(key) || key.includes('..')) throw new SpaceError('BAD_REQUEST', `Invalid blob key ${JSON.stringify(key)}`);
    return this.location.prefix + key;
  }

  async put(key: string, data: Readable): Promise<number> {
    const Key = this.objectKey(key);
    let size = 0;
    const counted = data.pipe(
      new Transform({
        transform(chunk: Buffer, _enc, cb) {
          size += chunk.length;
          cb(null, chunk);
        },
      }),
    );
    data.once('error', (err) => counted.destroy(err));
    const upload = new Upload({ client: this.s3, params: { Bucket: this.location.bucket, Key, Body: counted }, partSize: this.opts.partSize ?? 8 << 20, queueSize: this.opts.queueSize ?? 4, leavePartsOnError: false });
    try {
      await upload.done();
    } catch (err) {
      throw this.failed(err, key);
    }
    return size;
  }

  async get(key: string): Promise<Readable> {
    try {
      const r = await this.s3.send(new GetObjectCommand({ Bucket: this.location.bucket, Key: this.objectKey(key) }));
      return r.Body as Readable;
    } catch (err) {
      if (err instanceof S3ServiceException && (err.name === 'NoSuchKey' || err.$metadata.httpStatusCode === 404)) throw new SpaceError('SNAPSHOT_NOT_FOUND', `No stored data for ${key}`, { cause: err });
      throw this.failed(err, key);
    }
  }

  async stat(key: string): Promise<BlobInfo | undefined> {
    try {
      const r = await this.s3.send(new HeadObjectCommand({ Bucket: this.location.bucket, Key: this.objectKey(key) }));
      return { key, size: r.ContentLength ?? 0, createdAt: (r.LastModified ?? new Date(0)).toISOString() };
    } catch (err) {
      if (err instanceof S3ServiceException && err.$metadata.httpStatusCode === 404) return undefined;
      throw this.failed(err, key);
    }
  }

  async list(prefix: string): Promise<string[]> {
    const base = prefix.replace(/\/+$/, '');
    const out: string[] = [];
    let token: string | undefined;
    try {
      do {
        const r = await this.s3.send(new ListObjectsV2Command({ Bucket: this.location.bucket, Prefix: `${this.objectKey(base)}/`, Delimiter: '/', ...(token ? { ContinuationToken: token } : {}) }));
        const strip = (k: string) => k.slice(this.location.prefix.length).replace(/\/$/, '');
        for (const c of r.Contents ?? []) if (c.Key) out.push(strip(c.Key));
        for (const p of r.CommonPrefixes ?? []) if (p.Prefix) out.push(strip(p.Prefix));
        token = r.IsTruncated ? r.NextContinuationToken : undefined;
      } while (token);
    } catch (err) {
      throw this.failed(err, base);
    }
    return out.sort();
  }

  async delete(key: string): Promise<void> {
    try {
      await this.s3.send(new DeleteObjectCommand({ Bucket: this.location.bucket, Key: this.objectKey(key) }));
    } catch (err) {
      if (err instanceof S3ServiceException && err.$metadata.httpStatusCode === 404) return;
      throw this.failed(err, key);
    }
  }

  /** Closes the client's connections. */
  close(): void {
    this.s3.destroy();
  }
}
