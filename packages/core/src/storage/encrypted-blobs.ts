/**
 * Envelope encryption between the snapshot code and any {@link BlobStore}: every object gets a
 * fresh 256-bit data key, wrapped by its tenant's key (see keys.ts) and kept in the metadata
 * store, never beside the data. The object is cut into chunks, each sealed with AES-256-GCM
 * under a nonce that is the chunk's index (unique: the key is used for one object only) and
 * associated data that binds the tenant, the object key, the chunk index and whether it is
 * the last chunk — so chunks cannot be reordered, truncated, or moved between objects or
 * tenants without the read failing with `SNAPSHOT_CORRUPT`.
 *
 * Format: `SPACEENC` | u8 version 1 | u32 header length | header JSON `{alg, tenant, object,
 * chunkSize}` | chunks `u32 length | ciphertext+tag`.
 */
import { createCipheriv, createDecipheriv, createHash } from 'node:crypto';
import { Readable, Transform, type TransformCallback } from 'node:stream';
import { SpaceError } from '../errors.js';
import { tenantOfKey, type BlobInfo, type BlobStore } from '../ports/blob-store.js';
import type { KeyService } from '../security/keys.js';
import type { MetadataStore } from '../ports/metadata-store.js';

const MAGIC = Buffer.from('SPACEENC');
const VERSION = 1;
const TAG = 16;
/** Plaintext bytes per chunk. */
export const ENCRYPTION_CHUNK = 1 << 20;

interface Header {
  alg: 'AES-256-GCM';
  tenant: string;
  object: string;
  chunkSize: number;
}

function nonce(i: number): Buffer {
  const n = Buffer.alloc(12);
  n.writeBigUInt64BE(BigInt(i), 4);
  return n;
}

function aad(headerHash: Buffer, i: number, last: boolean): Buffer {
  const b = Buffer.alloc(9);
  b.writeBigUInt64BE(BigInt(i), 0);
  b[8] = last ? 1 : 0;
  return Buffer.concat([headerHash, b]);
}

function corrupt(object: string, why: string): SpaceError {
  return new SpaceError('SNAPSHOT_CORRUPT', `Stored object ${object} failed decryption (${why}); it was not restored`);
}

/** Bytes that arrive in pieces, taken from the front without re-copying what stays. */
class ByteQueue {
  private parts: Buffer[] = [];
  length = 0;

  push(b: Buffer): void {
    this.parts.push(b);
    this.length += b.length;
  }

  /** The first `n` bytes (n ≤ length), removed. */
  take(n: number): Buffer {
    this.length -= n;
    if (this.parts[0]!.length >= n) {
      const first = this.parts[0]!;
      if (first.length === n) this.parts.shift();
      else this.parts[0] = first.subarray(n);
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let off = 0;
    while (off < n) {
      const p = this.parts[0]!;
      const k = Math.min(p.length, n - off);
      p.copy(out, off, 0, k);
      off += k;
      if (k === p.length) this.parts.shift();
      else this.parts[0] = p.subarray(k);
    }
    return out;
  }

  /** The first `n` bytes (n ≤ length), left in place. */
  peek(n: number): Buffer {
    const b = this.take(n);
    this.parts.unshift(b);
    this.length += n;
    return b;
  }
}

/** Seals a plaintext stream into the format above. */
class Sealer extends Transform {
  private readonly q = new ByteQueue();
  private i = 0;
  private readonly hh: Buffer;

  constructor(private readonly key: Buffer, header: Header) {
    super();
    const h = Buffer.from(JSON.stringify(header));
    this.hh = createHash('sha256').update(h).digest();
    const lenBuf = Buffer.alloc(4);
    lenBuf.writeUInt32BE(h.length);
    this.push(Buffer.concat([MAGIC, Buffer.from([VERSION]), lenBuf, h]));
  }

  private emit1(plain: Buffer, last: boolean): void {
    const c = createCipheriv('aes-256-gcm', this.key, nonce(this.i));
    c.setAAD(aad(this.hh, this.i, last));
    const body = c.update(plain);
    c.final();
    const l = Buffer.alloc(4);
    l.writeUInt32BE(body.length + TAG);
    this.push(l);
    this.push(body);
    this.push(c.getAuthTag());
    this.i++;
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    this.q.push(chunk);
    // Keep at least one byte back: only at the end do we know which chunk is last.
    while (this.q.length > ENCRYPTION_CHUNK) this.emit1(this.q.take(ENCRYPTION_CHUNK), false);
    cb();
  }

  override _flush(cb: TransformCallback): void {
    this.emit1(this.q.take(this.q.length), true);
    cb();
  }
}

/** Opens the format above; errors are `SNAPSHOT_CORRUPT`. */
class Opener extends Transform {
  private readonly q = new ByteQueue();
  private hh: Buffer | undefined;
  private i = 0;
  /** The newest complete chunk, held back until we know whether it is the last. */
  private pending: Buffer | undefined;

  constructor(private readonly key: Buffer, private readonly expect: { tenant: string; object: string }) {
    super();
  }

  private open1(ct: Buffer, last: boolean): Buffer {
    if (ct.length < TAG) throw corrupt(this.expect.object, `chunk ${this.i} is too short`);
    const d = createDecipheriv('aes-256-gcm', this.key, nonce(this.i));
    d.setAAD(aad(this.hh!, this.i, last));
    d.setAuthTag(ct.subarray(ct.length - TAG));
    try {
      const out = d.update(ct.subarray(0, ct.length - TAG));
      d.final();
      this.i++;
      return out;
    } catch {
      throw corrupt(this.expect.object, `chunk ${this.i} does not authenticate: altered, moved from another object, or truncated`);
    }
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, cb: TransformCallback): void {
    try {
      this.q.push(chunk);
      if (!this.hh) {
        if (this.q.length < 13) return cb();
        const fixed = this.q.peek(13);
        if (!fixed.subarray(0, 8).equals(MAGIC) || fixed[8] !== VERSION) throw corrupt(this.expect.object, 'not an encrypted SPACE object');
        const hl = fixed.readUInt32BE(9);
        if (hl > 4096) throw corrupt(this.expect.object, 'header too large');
        if (this.q.length < 13 + hl) return cb();
        this.q.take(13);
        const hb = this.q.take(hl);
        let h: Header;
        try {
          h = JSON.parse(hb.toString()) as Header;
        } catch {
          throw corrupt(this.expect.object, 'header is not JSON');
        }
        if (h.tenant !== this.expect.tenant || h.object !== this.expect.object) throw corrupt(this.expect.object, `it belongs to ${h.tenant}/${h.object}`);
        this.hh = createHash('sha256').update(hb).digest();
      }
      while (this.q.length >= 4) {
        const l = this.q.peek(4).readUInt32BE(0);
        if (l > ENCRYPTION_CHUNK + TAG) throw corrupt(this.expect.object, `chunk ${this.i} claims ${l} bytes`);
        if (this.q.length < 4 + l) break;
        this.q.take(4);
        if (this.pending) this.push(this.open1(this.pending, false));
        this.pending = this.q.take(l);
      }
      cb();
    } catch (err) {
      cb(err as Error);
    }
  }

  override _flush(cb: TransformCallback): void {
    try {
      if (!this.hh || !this.pending || this.q.length) throw corrupt(this.expect.object, 'it ends in the middle');
      this.push(this.open1(this.pending, true));
      cb();
    } catch (err) {
      cb(err as Error);
    }
  }
}

/**
 * A {@link BlobStore} that encrypts everything it stores in `inner`.
 *
 * @example
 * const blobs = new EncryptedBlobStore(new LocalBlobStore(dir), keys, store);
 * await blobs.put('snapshots/acme/sn1', stream); // stored sealed; its data key wrapped by acme's key
 */
export class EncryptedBlobStore implements BlobStore {
  constructor(
    private readonly inner: BlobStore,
    private readonly keys: KeyService,
    private readonly store: MetadataStore,
  ) {}

  async put(key: string, data: Readable): Promise<number> {
    const tenant = tenantOfKey(key);
    const { dataKey, record } = await this.keys.newDataKey(tenant, key);
    // The wrapped key is recorded first: a blob never exists without the key to read it.
    await this.store.putDataKey(record);
    return this.inner.put(key, data.pipe(new Sealer(dataKey, { alg: 'AES-256-GCM', tenant, object: key, chunkSize: ENCRYPTION_CHUNK })));
  }

  async get(key: string): Promise<Readable> {
    const d = await this.store.getDataKey(key);
    if (!d) throw new SpaceError('SNAPSHOT_CORRUPT', `Stored object ${key} has no data key: it was not written by this daemon`);
    const dataKey = await this.keys.unwrapRecord(d);
    const raw = await this.inner.get(key);
    const out = new Opener(dataKey, { tenant: d.tenantId, object: key });
    raw.on('error', (err) => out.destroy(err));
    return raw.pipe(out);
  }

  async assertWritable(key: string): Promise<void> {
    await this.keys.assertUsable(tenantOfKey(key));
  }

  stat(key: string): Promise<BlobInfo | undefined> {
    return this.inner.stat(key);
  }

  async delete(key: string): Promise<void> {
    await this.inner.delete(key);
    await this.store.deleteDataKey(key);
  }

  async list(prefix: string): Promise<string[]> {
    return (await this.inner.list?.(prefix)) ?? [];
  }
}
