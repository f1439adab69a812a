/**
 * Content-defined chunking and deduplication in front of the (encrypting) blob store. An
 * object is cut into chunks where the content says so (FastCDC: 16 KiB minimum, 64 KiB
 * average, 256 KiB maximum), so an edit moves only the chunks around it. Each chunk is stored
 * once per tenant under an id that is a keyed hash of its content (HMAC-SHA-256 with a
 * per-tenant secret: equal content across tenants never shows as an equal id), as its own
 * encrypted object; the object itself becomes a manifest listing its chunks. Reads check every
 * chunk against its id and the whole against the manifest's SHA-256, so the bytes come back
 * exactly as written.
 *
 * Garbage collection deletes chunks no manifest references. Writers and the collector
 * exclude each other (a chunk is never deleted while a write that may reference it runs); a
 * write a crash interrupted leaves only unreferenced chunks, which the next collection removes.
 */
import { createHash, createHmac } from 'node:crypto';
import { Readable } from 'node:stream';
import { SpaceError } from './errors.js';
import { tenantOfKey, type BlobInfo, type BlobStore } from './blobs.js';
import type { KeyService } from './keys.js';

const MIN = 16 * 1024;
const AVG = 64 * 1024;
const MAX = 256 * 1024;
/**
 * FastCDC's normalised chunking with a 32-bit gear hash: before the average size a cut needs
 * 18 zero bits (less likely), after it 14 (more likely), which narrows the size spread.
 */
const MASK_S = 0xffffc000;
const MASK_L = 0xfffc0000;

/** A fixed gear table (deterministic, so chunk boundaries are stable across restarts). */
const GEAR: Uint32Array = (() => {
  const out = new Uint32Array(256);
  let h = createHash('sha256').update('space-fastcdc-gear').digest();
  for (let i = 0; i < 256; i++) {
    if (i % 8 === 0) h = createHash('sha256').update(h).digest();
    out[i] = h.readUInt32BE((i % 8) * 4);
  }
  return out;
})();

/** Length of the next chunk at the start of `buf` (FastCDC); 0 when more data is needed first. */
export function cutPoint(buf: Buffer, final: boolean): number {
  const n = buf.length;
  if (n <= MIN) return final ? n : 0;
  const end = Math.min(n, MAX);
  const normal = Math.min(AVG, end);
  let fp = 0;
  let i = MIN;
  for (; i < normal; i++) {
    fp = ((fp << 1) + GEAR[buf[i]!]!) >>> 0;
    if ((fp & MASK_S) === 0) return i + 1;
  }
  for (; i < end; i++) {
    fp = ((fp << 1) + GEAR[buf[i]!]!) >>> 0;
    if ((fp & MASK_L) === 0) return i + 1;
  }
  return end === MAX || final ? end : 0;
}

interface Manifest {
  v: 1;
  size: number;
  sha256: string;
  chunks: [id: string, size: number][];
}

function corrupt(key: string, why: string): SpaceError {
  return new SpaceError('SNAPSHOT_CORRUPT', `Stored object ${key} is corrupt (${why}); it was not restored`);
}

async function readAll(r: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of r) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

/**
 * A deduplicating {@link BlobStore} over another (normally an EncryptedBlobStore).
 *
 * @example
 * const blobs = new DedupBlobStore(new EncryptedBlobStore(local, keys, store), keys);
 * await blobs.put('snapshots/acme/sn1', stream); // chunks/acme/<id> ×N + a manifest
 * await blobs.gc(['snapshots/acme/sn1']);        // drops chunks nothing references
 */
export class DedupBlobStore implements BlobStore {
  /** Writes in flight; the collector waits for none, and writers wait for the collector. */
  private writers = 0;
  private collecting: Promise<unknown> | undefined;
  private idle: (() => void)[] = [];

  constructor(
    private readonly inner: BlobStore,
    private readonly keys: KeyService,
    /** Crash tests: SIGKILL after deleting this many chunks in a collection. Never set in production. */
    private readonly faultAfterGcDeletes?: number,
  ) {}

  private readonly secrets = new Map<string, Promise<Buffer>>();

  private async chunkId(tenant: string, data: Buffer): Promise<string> {
    let s = this.secrets.get(tenant);
    if (!s) {
      s = this.keys.daemonSecret(`chunk-id/${tenant}`);
      this.secrets.set(tenant, s);
      s.catch(() => this.secrets.delete(tenant));
    }
    return createHmac('sha256', await s).update(data).digest('hex').slice(0, 40);
  }

  async put(key: string, data: Readable): Promise<number> {
    while (this.collecting) await this.collecting.catch(() => {});
    this.writers++;
    try {
      const tenant = tenantOfKey(key);
      const whole = createHash('sha256');
      const chunks: Manifest['chunks'] = [];
      let size = 0;
      let buf: Buffer = Buffer.alloc(0);
      const store = async (chunk: Buffer) => {
        const id = await this.chunkId(tenant, chunk);
        const ck = `chunks/${tenant}/${id}`;
        if (!(await this.inner.stat(ck))) await this.inner.put(ck, Readable.from([chunk]));
        chunks.push([id, chunk.length]);
      };
      for await (const piece of data) {
        const b = piece as Buffer;
        whole.update(b);
        size += b.length;
        buf = buf.length ? Buffer.concat([buf, b]) : b;
        for (let cut = cutPoint(buf, false); cut > 0; cut = cutPoint(buf, false)) {
          await store(buf.subarray(0, cut));
          buf = buf.subarray(cut);
        }
      }
      while (buf.length) {
        const cut = cutPoint(buf, true);
        await store(buf.subarray(0, cut));
        buf = buf.subarray(cut);
      }
      const manifest: Manifest = { v: 1, size, sha256: whole.digest('hex'), chunks };
      await this.inner.put(key, Readable.from([Buffer.from(JSON.stringify(manifest))]));
      return size;
    } finally {
      this.writers--;
      if (this.writers === 0) for (const w of this.idle.splice(0)) w();
    }
  }

  /** The manifest stored at `key` (decrypted and authenticated by the inner store). */
  private async manifest(key: string): Promise<Manifest> {
    let m: Manifest;
    try {
      m = JSON.parse((await readAll(await this.inner.get(key))).toString()) as Manifest;
    } catch (err) {
      if (err instanceof SpaceError) throw err;
      throw corrupt(key, 'its manifest is not readable');
    }
    if (m.v !== 1 || !Array.isArray(m.chunks)) throw corrupt(key, 'unknown manifest');
    return m;
  }

  async get(key: string): Promise<Readable> {
    const manifest = await this.manifest(key);
    const tenant = tenantOfKey(key);
    const self = this;
    async function* body(): AsyncGenerator<Buffer> {
      const whole = createHash('sha256');
      let size = 0;
      for (const [id, len] of manifest.chunks) {
        const data = await (async () => readAll(await self.inner.get(`chunks/${tenant}/${id}`)))().catch((err: unknown) => {
          if (err instanceof SpaceError && err.code === 'SNAPSHOT_CORRUPT') throw corrupt(key, `chunk ${id}: ${err.message}`);
          throw err instanceof SpaceError && err.code !== 'SNAPSHOT_NOT_FOUND' ? err : corrupt(key, `chunk ${id} is missing`);
        });
        if (data.length !== len || (await self.chunkId(tenant, data)) !== id) throw corrupt(key, `chunk ${id} does not match its id`);
        whole.update(data);
        size += len;
        yield data;
      }
      if (size !== manifest.size || whole.digest('hex') !== manifest.sha256) throw corrupt(key, 'the whole does not match its checksum');
    }
    return Readable.from(body(), { objectMode: false });
  }

  stat(key: string): Promise<BlobInfo | undefined> {
    return this.inner.stat(key);
  }

  async assertWritable(key: string): Promise<void> {
    await this.inner.assertWritable?.(key);
  }

  /** Deletes the object's manifest; its chunks go at the next {@link gc}. */
  async delete(key: string): Promise<void> {
    await this.inner.delete(key);
  }

  /**
   * Deletes every chunk of these tenants that none of `liveKeys` (every stored object's key)
   * references. Tenants whose key is revoked are skipped (their manifests cannot be read).
   * Returns the number of chunks deleted.
   */
  async gc(liveKeys: string[]): Promise<number> {
    while (this.collecting) await this.collecting.catch(() => {});
    const run = (async () => {
      while (this.writers > 0) await new Promise<void>((r) => this.idle.push(r));
      const byTenant = new Map<string, string[]>();
      for (const k of liveKeys) byTenant.set(tenantOfKey(k), [...(byTenant.get(tenantOfKey(k)) ?? []), k]);
      const tenants = new Set([...byTenant.keys(), ...((await this.inner.list?.('chunks')) ?? []).map((p) => p.split('/')[1]!)]);
      let deleted = 0;
      for (const tenant of tenants) {
        const referenced = new Set<string>();
        try {
          for (const k of byTenant.get(tenant) ?? []) {
            for (const [id] of (await this.manifest(k)).chunks) referenced.add(id);
          }
        } catch {
          continue; // a manifest we cannot read (revoked key, corrupt): keep all of this tenant's chunks
        }
        for (const ck of (await this.inner.list?.(`chunks/${tenant}`)) ?? []) {
          if (referenced.has(ck.split('/')[2]!)) continue;
          await this.inner.delete(ck);
          deleted++;
          if (this.faultAfterGcDeletes !== undefined && deleted >= this.faultAfterGcDeletes) process.kill(process.pid, 'SIGKILL');
        }
      }
      return deleted;
    })();
    this.collecting = run;
    try {
      return await run;
    } finally {
      this.collecting = undefined;
    }
  }
}
