/**
 * Content-defined chunking and deduplication in front of the (encrypting) blob store. An
 * object is cut into chunks where the content says so (FastCDC: 1 KiB minimum, 4 KiB average,
 * 16 KiB maximum — small, because the memory of an idle sandbox changes in scattered pages; an
 * image's attachment, a disk's stream of whole files, in 64 KiB ones: {@link COARSE_CHUNKS}), so
 * an edit moves only the chunks around it. Each chunk is stored once per tenant, found by a
 * keyed hash of its content (HMAC-SHA-256 with a per-tenant secret: equal content across
 * tenants never shows as an equal id; 128 bits, and the whole object is checked by SHA-256 anyway).
 *
 * New chunks are not stored one object each (thousands of tiny encrypted objects, each with
 * its own wrapped data key, would cost more than they save) but gathered into **packs** of up
 * to 4 MiB: a pack is compressed as a whole (brotli) and stored as one object of the inner store
 * under `chunks/<tenant>/p<random>` — encrypted there with its own data key, its associated data
 * naming it, so a pack cannot be altered or swapped for another. The object itself becomes a
 * manifest listing its chunks (id, size, pack, offset), compressed. Reads check the whole against the
 * manifest's SHA-256, so the bytes come back exactly as written.
 *
 * A segment (8 MiB) of an object reads at most 4 stored packs: chunks it shares with any
 * further pack are stored again, so reads stay fast however long the history (at the price of
 * storing a few shared chunks twice).
 *
 * Garbage collection deletes packs no manifest references (a pack lives as long as any of its
 * chunks does), and objects no record names; an object `<key>.<suffix>` (an image's
 * attachment) lives as long as object `<key>`. Writers and the collector exclude each other (a
 * pack is never deleted while a write that may reference it runs); a write a crash interrupted leaves only unreferenced
 * packs, which the next collection removes. Objects written by the first version of this store
 * (one object per chunk, manifest `v: 1`) are still read and collected.
 */
import { createHash, createHmac, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import { SpaceError } from '../errors.js';
import { tenantOfKey, type BlobCollectionLock, type BlobInfo, type BlobStore } from '../ports/blob-store.js';
import type { KeyService } from '../security/keys.js';

const compress = promisify(zlib.brotliCompress);
const decompress = promisify(zlib.brotliDecompress);
/** Brotli at quality 1: ~360 MB/s on checkpoint images here and ~780 MB/s on random bytes (deflate's fastest level: 200 and 60). */
const PACK_COMPRESSION = { chunkSize: 1 << 20, params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 1 } };

/**
 * Chunk sizes of FastCDC's normalised chunking with a 32-bit gear hash: before the average size
 * a cut needs two zero bits more than the average's (less likely), after it two fewer (more
 * likely), which narrows the size spread.
 */
export interface ChunkShape {
  min: number;
  avg: number;
  max: number;
  /** The bits that must be zero for a cut before `avg`, and after it. */
  maskS: number;
  maskL: number;
}

/**
 * Images (a sandbox's memory): 1 KiB minimum, 4 KiB average, 16 KiB maximum, because the
 * memory of an idle sandbox changes in scattered pages.
 */
export const FINE_CHUNKS: ChunkShape = { min: 1024, avg: 4096, max: 16 * 1024, maskS: 0xfffc0000, maskL: 0xffc00000 };

/**
 * An image's attachments (a disk's `btrfs send` stream: whole files, changed a file at a time):
 * 16 KiB minimum, 64 KiB average, 256 KiB maximum. A GiB on a disk is 16,000 chunks, not
 * 262,000: a sixteenth of the keyed hashes, of the manifest (~1 MiB of JSON instead of ~16) and
 * of the entries the tenant's chunk index holds in the daemon's memory.
 */
export const COARSE_CHUNKS: ChunkShape = { min: 16 * 1024, avg: 64 * 1024, max: 256 * 1024, maskS: 0xffffc000, maskL: 0xfffc0000 };
/** Manifests since v2: this prefix, then the JSON brotli-compressed (first-version ones are plain JSON). */
const MANIFEST_V2 = Buffer.from('SPACEMF2');
const MANIFEST_COMPRESSION = { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 5 } };
/** Where the objects (manifests) of a tenant are, `<kind>/<tenant>/<id>`: read to index its chunks. */
const MANIFEST_KINDS = ['snapshots', 'templates'];
/** Raw chunk bytes gathered into one pack before it is compressed and stored. */
export const PACK_TARGET = 4 << 20;
/** How long a newly written object counts as live without being named to {@link DedupBlobStore.gc}. */
const RECENT_MS = 60_000;
/** Bytes of an object whose chunks are placed together (see put). */
const SEGMENT = 8 << 20;
/** Stored packs one segment may read; chunks from any more are stored again. */
const SEGMENT_PACKS = 4;
/** Decompressed pack bytes a read keeps at once at most (see chunksV2). */
const PACKS_HELD = 256 << 20;

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

/**
 * Length of the next chunk at the start of `buf` (FastCDC); 0 when more data is needed first.
 *
 * @example
 * for (let n = cutPoint(buf, true); buf.length; buf = buf.subarray(n), n = cutPoint(buf, true)) store(buf.subarray(0, n));
 */
export function cutPoint(buf: Buffer, final: boolean, shape: ChunkShape = FINE_CHUNKS): number {
  const { min, avg, max, maskS, maskL } = shape;
  const n = buf.length;
  if (n <= min) return final ? n : 0;
  const end = Math.min(n, max);
  const normal = Math.min(avg, end);
  let fp = 0;
  let i = min;
  for (; i < normal; i++) {
    fp = ((fp << 1) + GEAR[buf[i]!]!) >>> 0;
    if ((fp & maskS) === 0) return i + 1;
  }
  for (; i < end; i++) {
    fp = ((fp << 1) + GEAR[buf[i]!]!) >>> 0;
    if ((fp & maskL) === 0) return i + 1;
  }
  return end === max || final ? end : 0;
}

/** First version: every chunk its own object `chunks/<tenant>/<id>`. Read and collected only. */
interface ManifestV1 {
  v: 1;
  size: number;
  sha256: string;
  chunks: [id: string, size: number][];
}

/** Chunks in packs: `pack` indexes `packs`, `offset` is into the decompressed pack. */
interface ManifestV2 {
  v: 2;
  size: number;
  sha256: string;
  packs: string[];
  chunks: [id: string, size: number, pack: number, offset: number][];
}

type Manifest = ManifestV1 | ManifestV2;

/** Where a stored chunk is. */
interface Located {
  pack: string;
  offset: number;
  size: number;
}

function corrupt(key: string, why: string): SpaceError {
  return new SpaceError('SNAPSHOT_CORRUPT', `Stored object ${key} is corrupt (${why}); it was not restored`);
}

async function readAll(r: Readable): Promise<Buffer> {
  const parts: Buffer[] = [];
  for await (const c of r) parts.push(c as Buffer);
  return Buffer.concat(parts);
}

/** The first bytes of a stored manifest's JSON (of a v2 one, the first piece decompressed; empty when it is not one). */
async function manifestHead(raw: Buffer): Promise<Buffer> {
  if (!raw.subarray(0, MANIFEST_V2.length).equals(MANIFEST_V2)) return raw.subarray(0, 64);
  const d = zlib.createBrotliDecompress();
  d.end(raw.subarray(MANIFEST_V2.length));
  try {
    for await (const piece of d) return (piece as Buffer).subarray(0, 64);
  } catch {
    // not brotli: the full parse says what is wrong
  } finally {
    d.destroy();
  }
  return Buffer.alloc(0);
}

/** The object whose attachment `key` is (`<object key>.<suffix>`: a dot in its last part), if it is one. */
function attachmentOwner(key: string): string | undefined {
  const dot = key.lastIndexOf('.');
  return dot > key.lastIndexOf('/') + 1 ? key.slice(0, dot) : undefined;
}

/** The names under `chunks/<tenant>/` a manifest keeps alive. */
function referencedNames(m: Manifest): string[] {
  return m.v === 1 ? m.chunks.map(([id]) => id) : m.packs;
}

/**
 * A deduplicating {@link BlobStore} over another (normally an EncryptedBlobStore).
 *
 * @example
 * const blobs = new DedupBlobStore(new EncryptedBlobStore(local, keys, store), keys);
 * await blobs.put('snapshots/acme/sn1', stream); // new chunks in packs chunks/acme/p… + a manifest
 * await blobs.gc(['snapshots/acme/sn1']);        // drops packs nothing references
 */
export class DedupBlobStore implements BlobStore {
  /** Writes in flight; the collector waits for none, and writers wait for the collector. */
  private writers = 0;
  private collecting: Promise<unknown> | undefined;
  private idle: (() => void)[] = [];
  private readonly secrets = new Map<string, Promise<Buffer>>();
  /** Per tenant: every chunk some stored pack holds (built from the manifests, kept by puts). */
  private readonly indexes = new Map<string, Promise<Map<string, Located>>>();
  /**
   * Objects written in the last {@link RECENT_MS}: the caller records a new object (e.g. the
   * snapshot's row) just after `put` returns, so a collection starting in between must still
   * count it as live.
   */
  private readonly recent = new Map<string, number>();

  /** The collection generation this store's indexes were built in (with a shared lock). */
  private generation: string | undefined;

  constructor(
    private readonly inner: BlobStore,
    private readonly keys: KeyService,
    /** Crash tests: SIGKILL after deleting this many packs in a collection. Never set in production. */
    private readonly faultAfterGcDeletes?: number,
    /**
     * With other daemons writing to the same blob store (a cluster): the lock that keeps every
     * node's writes and collections apart (see {@link BlobCollectionLock}).
     */
    private readonly shared?: BlobCollectionLock,
  ) {}

  /** The chunk's id: 128 bits of its keyed hash (first-format ids have 160). */
  private async chunkId(tenant: string, data: Buffer, hexChars = 32): Promise<string> {
    let s = this.secrets.get(tenant);
    if (!s) {
      s = this.keys.daemonSecret(`chunk-id/${tenant}`);
      this.secrets.set(tenant, s);
      s.catch(() => this.secrets.delete(tenant));
    }
    return createHmac('sha256', await s).update(data).digest('hex').slice(0, hexChars);
  }

  /** Adds what a manifest says about pack locations to an index (pieces of a whole object have no id: see putWhole). */
  private static learn(index: Map<string, Located>, m: Manifest): void {
    if (m.v !== 2) return;
    for (const [id, size, p, offset] of m.chunks) if (id) index.set(id, { pack: m.packs[p]!, offset, size });
  }

  /** The tenant's chunk index, read from its manifests the first time (a collection rebuilds it). */
  private index(tenant: string): Promise<Map<string, Located>> {
    let ix = this.indexes.get(tenant);
    if (!ix) {
      ix = (async () => {
        const index = new Map<string, Located>();
        const keys = (await Promise.all(MANIFEST_KINDS.map(async (kind) => (await this.inner.list?.(`${kind}/${tenant}`)) ?? []))).flat();
        for (const k of keys) {
          // A manifest that cannot be read only means its chunks are not reused.
          const m = await this.manifest(k).catch(() => undefined);
          if (m) DedupBlobStore.learn(index, m);
        }
        return index;
      })();
      this.indexes.set(tenant, ix);
      ix.catch(() => this.indexes.delete(tenant));
    }
    return ix;
  }

  async put(key: string, data: Readable): Promise<number> {
    return this.writing(() => this.putHere(key, data));
  }

  /**
   * Stores `data` under `key` without looking for chunks to share: cut into pieces of
   * {@link PACK_TARGET} bytes, each compressed into a pack of its own, under a manifest like any
   * other (so `get`, `copy` and collection treat it as usual). For objects that share nothing
   * with what is stored (a runtime's compressed image: a change early in it shifts all that
   * follows), where content-defined chunking and a keyed hash per chunk cost time and find
   * nothing: for a 2.2 MB image ~10 ms instead of ~30 (docs/architecture.md, "Snapshots").
   *
   * @example
   * await blobs.putWhole('snapshots/acme/sn3', fs.createReadStream(image)); // 2255662
   */
  async putWhole(key: string, data: Readable): Promise<number> {
    return this.writing(async () => {
      const tenant = tenantOfKey(key);
      const whole = createHash('sha256');
      const packs: string[] = [];
      const chunks: ManifestV2['chunks'] = [];
      let size = 0;
      // At most two pieces compressed and stored at once, as put does.
      const storing = new Set<Promise<void>>();
      const store = async (piece: Buffer): Promise<void> => {
        const name = `p${randomBytes(16).toString('hex')}`;
        chunks.push(['', piece.length, packs.push(name) - 1, 0]);
        const done = (async () => {
          await this.inner.put(`chunks/${tenant}/${name}`, Readable.from([await compress(piece, PACK_COMPRESSION)]));
        })();
        storing.add(done);
        done.then(() => storing.delete(done), () => {});
        if (storing.size >= 2) await Promise.race(storing);
      };
      let parts: Buffer[] = [];
      let held = 0;
      for await (const b of data) {
        const piece = b as Buffer;
        whole.update(piece);
        size += piece.length;
        parts.push(piece);
        held += piece.length;
        while (held >= PACK_TARGET) {
          const all = Buffer.concat(parts);
          await store(all.subarray(0, PACK_TARGET));
          parts = [all.subarray(PACK_TARGET)];
          held -= PACK_TARGET;
        }
      }
      if (held > 0) await store(Buffer.concat(parts));
      await Promise.all(storing);
      const manifest: ManifestV2 = { v: 2, size, sha256: whole.digest('hex'), packs, chunks };
      const packed = await compress(Buffer.from(JSON.stringify(manifest)), MANIFEST_COMPRESSION);
      await this.inner.put(key, Readable.from([Buffer.concat([MANIFEST_V2, packed])]));
      this.recent.set(key, Date.now());
      return size;
    });
  }

  /**
   * Stores under `to` what object `from` of the same tenant holds, without reading its bytes: a
   * new manifest naming the same chunks (a few milliseconds where a put of the bytes would chunk,
   * hash and compress them all). Each key then lives on its own: deleting one leaves the other
   * whole. Rejects with `SNAPSHOT_NOT_FOUND` when `from` is not stored.
   *
   * @example
   * await blobs.copy('snapshots/acme/sn1.disk', 'snapshots/acme/sn2.disk'); // 1073741824
   */
  async copy(from: string, to: string): Promise<number> {
    const tenant = tenantOfKey(to);
    if (tenantOfKey(from) !== tenant) throw new SpaceError('INTERNAL', `Objects are copied within a tenant only (${from} to ${to})`);
    return this.writing(async () => {
      // (The encrypting store would answer for a deleted object that its data key is missing.)
      if (!(await this.inner.stat(from))) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Object ${from} is not stored`);
      const raw = await readAll(await this.inner.get(from));
      // The size leads the manifest's JSON (as put writes it): a GiB's manifest is ~16 MiB of
      // JSON, which need not be parsed to be copied (the inner store authenticated its bytes).
      const lead = /^\{"v":[12],"size":(\d+),/.exec((await manifestHead(raw)).toString('latin1'));
      const size = lead ? Number(lead[1]) : (await DedupBlobStore.parseManifest(from, raw)).size;
      await this.inner.put(to, Readable.from([raw]));
      this.recent.set(to, Date.now());
      // (The chunks are in the tenant's index already: the manifest copied names no new pack.)
      return size;
    });
  }

  /**
   * Runs a write (a put or a copy) apart from collections: this store's own, and with a shared
   * lock every node's — whose collection since this store's indexes were read may have deleted
   * packs they name, so they are read again.
   */
  private writing<T>(fn: () => Promise<T>): Promise<T> {
    const here = async (): Promise<T> => {
      while (this.collecting) await this.collecting.catch(() => {});
      this.writers++;
      try {
        return await fn();
      } finally {
        this.writers--;
        if (this.writers === 0) for (const w of this.idle.splice(0)) w();
      }
    };
    if (!this.shared) return here();
    return this.shared.writing(async (generation) => {
      if (generation !== this.generation) {
        this.indexes.clear();
        this.generation = generation;
      }
      return here();
    });
  }

  /** A put, within {@link writing}. */
  private async putHere(key: string, data: Readable): Promise<number> {
    const tenant = tenantOfKey(key);
    const shape = attachmentOwner(key) ? COARSE_CHUNKS : FINE_CHUNKS;
    const index = await this.index(tenant);
    const whole = createHash('sha256');
    const packs: string[] = [];
    const packNo = new Map<string, number>();
    const chunks: ManifestV2['chunks'] = [];
    let open: { name: string; parts: Buffer[]; size: number; holds: Map<string, Located> } | undefined;
    let size = 0;
    const packIndex = (name: string): number => {
      let i = packNo.get(name);
      if (i === undefined) {
        i = packs.push(name) - 1;
        packNo.set(name, i);
      }
      return i;
    };
    // Packs are compressed and stored while chunking goes on, at most two at a time.
    const storing = new Set<Promise<void>>();
    const flush = async (): Promise<void> => {
      if (!open) return;
      const p = open;
      open = undefined;
      const done: Promise<void> = (async () => {
        const body = await compress(Buffer.concat(p.parts), PACK_COMPRESSION);
        await this.inner.put(`chunks/${tenant}/${p.name}`, Readable.from([body]));
        // Only a stored pack may be found by later writes.
        for (const [id, at] of p.holds) index.set(id, at);
      })();
      storing.add(done);
      done.then(() => storing.delete(done), () => {});
      if (storing.size >= 2) await Promise.race(storing);
    };
    const place = async (id: string, chunk: Buffer, known: Located | undefined): Promise<void> => {
      if (known) {
        chunks.push([id, chunk.length, packIndex(known.pack), known.offset]);
        return;
      }
      const inOpen = open?.holds.get(id);
      if (open && inOpen) {
        chunks.push([id, chunk.length, packIndex(open.name), inOpen.offset]);
        return;
      }
      if (!open) open = { name: `p${randomBytes(16).toString('hex')}`, parts: [], size: 0, holds: new Map() };
      open.holds.set(id, { pack: open.name, offset: open.size, size: chunk.length });
      chunks.push([id, chunk.length, packIndex(open.name), open.size]);
      open.parts.push(chunk);
      open.size += chunk.length;
      if (open.size >= PACK_TARGET) await flush();
    };
    // Chunks are placed a segment at a time. A segment that would read more than
    // SEGMENT_PACKS stored packs stores the chunks of the packs it needs least again, in the
    // new pack: otherwise every snapshot would read a pack of each earlier snapshot for the
    // few chunks it still shares with it, and reads would slow down as a session goes on.
    let segment: { id: string; chunk: Buffer; known: Located | undefined }[] = [];
    let segmentBytes = 0;
    const placeSegment = async (): Promise<void> => {
      const need = new Map<string, number>();
      for (const e of segment) if (e.known) need.set(e.known.pack, (need.get(e.known.pack) ?? 0) + e.chunk.length);
      const keep = new Set([...need].sort((a, b) => b[1] - a[1]).slice(0, SEGMENT_PACKS).map(([name]) => name));
      for (const e of segment) await place(e.id, e.chunk, e.known && keep.has(e.known.pack) ? e.known : undefined);
      segment = [];
      segmentBytes = 0;
    };
    const store = async (chunk: Buffer): Promise<void> => {
      const id = await this.chunkId(tenant, chunk);
      segment.push({ id, chunk, known: index.get(id) });
      segmentBytes += chunk.length;
      if (segmentBytes >= SEGMENT) await placeSegment();
    };
    // Pieces are gathered until a whole chunk of the largest size is there: a cut depends only
    // on the bytes from the chunk's start, so waiting for them changes no boundary, and a large
    // chunk is then neither scanned again nor copied again with every piece that adds to it.
    let parts: Buffer[] = [];
    let held = 0;
    for await (const piece of data) {
      const b = piece as Buffer;
      whole.update(b);
      size += b.length;
      parts.push(b);
      held += b.length;
      if (held < shape.max) continue;
      let buf = parts.length === 1 ? parts[0]! : Buffer.concat(parts, held);
      while (buf.length >= shape.max) {
        const cut = cutPoint(buf, false, shape);
        await store(buf.subarray(0, cut));
        buf = buf.subarray(cut);
      }
      parts = buf.length ? [buf] : [];
      held = buf.length;
    }
    let buf = Buffer.concat(parts, held);
    while (buf.length) {
      const cut = cutPoint(buf, true, shape);
      await store(buf.subarray(0, cut));
      buf = buf.subarray(cut);
    }
    await placeSegment();
    await flush();
    await Promise.all(storing);
    const manifest: ManifestV2 = { v: 2, size, sha256: whole.digest('hex'), packs, chunks };
    const packed = await compress(Buffer.from(JSON.stringify(manifest)), MANIFEST_COMPRESSION);
    await this.inner.put(key, Readable.from([Buffer.concat([MANIFEST_V2, packed])]));
    this.recent.set(key, Date.now());
    return size;
  }

  /** The manifest stored at `key` (decrypted and authenticated by the inner store). */
  private async manifest(key: string): Promise<Manifest> {
    return DedupBlobStore.parseManifest(key, await readAll(await this.inner.get(key)));
  }

  /** Object `key`'s manifest from its stored bytes `raw`; SNAPSHOT_CORRUPT when it is not one. */
  private static async parseManifest(key: string, raw: Buffer): Promise<Manifest> {
    let m: Manifest;
    try {
      const json = raw.subarray(0, MANIFEST_V2.length).equals(MANIFEST_V2) ? await decompress(raw.subarray(MANIFEST_V2.length)) : raw;
      m = JSON.parse(json.toString()) as Manifest;
    } catch {
      throw corrupt(key, 'its manifest is not readable');
    }
    if ((m.v !== 1 && m.v !== 2) || !Array.isArray(m.chunks) || (m.v === 2 && !Array.isArray(m.packs))) throw corrupt(key, 'unknown manifest');
    return m;
  }

  async get(key: string): Promise<Readable> {
    const manifest = await this.manifest(key);
    const tenant = tenantOfKey(key);
    const pieces = manifest.v === 1 ? this.chunksV1(key, tenant, manifest) : this.chunksV2(key, tenant, manifest);
    async function* body(): AsyncGenerator<Buffer> {
      const whole = createHash('sha256');
      let size = 0;
      for await (const data of pieces) {
        whole.update(data);
        size += data.length;
        yield data;
      }
      if (size !== manifest.size || whole.digest('hex') !== manifest.sha256) throw corrupt(key, 'the whole does not match its checksum');
    }
    return Readable.from(body(), { objectMode: false });
  }

  /** The object's bytes from its packs, runs of adjacent chunks of one pack in one piece. */
  private async *chunksV2(key: string, tenant: string, m: ManifestV2): AsyncGenerator<Buffer> {
    // A later snapshot's chunks interleave its own pack with those of every earlier snapshot it
    // shares chunks with: each pack is kept from its first use to its last, so it is read once
    // (unless the packs in use at once would pass PACKS_HELD bytes: then the least recently used goes).
    const lastUse = new Map<number, number>();
    const span = new Map<number, number>();
    const order: number[] = []; // packs in the order the object first needs them
    m.chunks.forEach(([, size, p, offset], i) => {
      if (!lastUse.has(p)) order.push(p);
      lastUse.set(p, i);
      span.set(p, Math.max(span.get(p) ?? 0, offset + size));
    });
    const cache = new Map<number, Promise<Buffer>>();
    let held = 0;
    const forget = (p: number): void => {
      if (cache.delete(p)) held -= span.get(p) ?? 0;
    };
    let next = 0; // the next pack in `order` to load ahead, while the one before it is used
    const load = (p: number): Promise<Buffer> => {
      let b = cache.get(p);
      if (b) {
        cache.delete(p); // re-insert: most recently used last
        cache.set(p, b);
        return b;
      }
      const name = m.packs[p];
      if (typeof name !== 'string' || !/^p[0-9a-f]{32}$/.test(name)) return Promise.reject(corrupt(key, `pack ${String(p)} is not named`));
      b = (async () => {
        let stored: Buffer;
        try {
          stored = await readAll(await this.inner.get(`chunks/${tenant}/${name}`));
        } catch (err) {
          if (err instanceof SpaceError && err.code === 'SNAPSHOT_CORRUPT') throw corrupt(key, `pack ${name}: ${err.message}`);
          throw err instanceof SpaceError && err.code !== 'SNAPSHOT_NOT_FOUND' ? err : corrupt(key, `pack ${name} is missing`);
        }
        return decompress(stored, { chunkSize: 1 << 20 }).catch(() => {
          throw corrupt(key, `pack ${name} does not decompress`);
        });
      })();
      b.catch(() => {}); // awaited where used
      while (cache.size > 0 && held + (span.get(p) ?? 0) > PACKS_HELD) forget(cache.keys().next().value as number);
      cache.set(p, b);
      held += span.get(p) ?? 0;
      return b;
    };
    let run: { pack: Buffer; from: number; to: number } | undefined;
    for (const [i, [id, size, p, offset]] of m.chunks.entries()) {
      if (p === order[next]) {
        next++;
        if (next < order.length && !cache.has(order[next]!)) void load(order[next]!);
      }
      const pack = await load(p);
      if (!Number.isSafeInteger(offset) || !Number.isSafeInteger(size) || offset < 0 || size < 0 || offset + size > pack.length) throw corrupt(key, `chunk ${String(id)} lies outside its pack`);
      if (lastUse.get(p) === i) forget(p);
      if (run && run.pack === pack && run.to === offset) {
        run.to += size;
        continue;
      }
      if (run) yield run.pack.subarray(run.from, run.to);
      run = { pack, from: offset, to: offset + size };
    }
    if (run) yield run.pack.subarray(run.from, run.to);
  }

  /** First-version objects: one stored object per chunk, each checked against its id. */
  private async *chunksV1(key: string, tenant: string, m: ManifestV1): AsyncGenerator<Buffer> {
    for (const [id, len] of m.chunks) {
      const data = await (async () => readAll(await this.inner.get(`chunks/${tenant}/${id}`)))().catch((err: unknown) => {
        if (err instanceof SpaceError && err.code === 'SNAPSHOT_CORRUPT') throw corrupt(key, `chunk ${id}: ${err.message}`);
        throw err instanceof SpaceError && err.code !== 'SNAPSHOT_NOT_FOUND' ? err : corrupt(key, `chunk ${id} is missing`);
      });
      if (data.length !== len || (await this.chunkId(tenant, data, 40)) !== id) throw corrupt(key, `chunk ${id} does not match its id`);
      yield data;
    }
  }

  stat(key: string): Promise<BlobInfo | undefined> {
    return this.inner.stat(key);
  }

  async assertWritable(key: string): Promise<void> {
    await this.inner.assertWritable?.(key);
  }

  /** Deletes the object's manifest; its packs go at the next {@link gc}. */
  async delete(key: string): Promise<void> {
    this.recent.delete(key);
    await this.inner.delete(key);
  }

  /**
   * Deletes every pack (and first-version chunk) that no live object references, and rebuilds
   * each tenant's chunk index from their manifests. `liveKeys` lists every stored object's key;
   * as a function it is asked once no write runs (and none can start), so an object whose write
   * was under way when the collection was asked for is never missed. Objects written in the
   * last minute count as live too (their caller — this node or, on a shared store, another —
   * may not have recorded them yet). Tenants with a manifest that cannot be read (revoked key,
   * corrupt) are skipped. `mayDelete` is asked before each deletion (at most once a second):
   * when it says no, the collection stops there. On a shared store (a cluster) the collection
   * runs under the deployment's lock, with every node's writes held off; `minIntervalMs` skips
   * it when any node collected more recently. Returns the number of stored objects deleted.
   */
  async gc(liveKeys: string[] | (() => Promise<string[]>), opts: { mayDelete?: () => Promise<boolean>; minIntervalMs?: number } = {}): Promise<number> {
    if (!this.shared) return this.gcHere(liveKeys, opts.mayDelete);
    const r = await this.shared.collecting(
      (deleting) =>
        this.gcHere(liveKeys, async () => {
          await deleting();
          return opts.mayDelete ? opts.mayDelete() : true;
        }),
      opts.minIntervalMs !== undefined ? { minIntervalMs: opts.minIntervalMs } : {},
    );
    // This store's indexes were rebuilt by the collection: they are of its generation.
    if (r) this.generation = r.generation;
    return r?.value ?? 0;
  }

  /** A collection, kept apart from this store's own writes. */
  private async gcHere(liveKeys: string[] | (() => Promise<string[]>), mayDeleteNow?: () => Promise<boolean>): Promise<number> {
    let askedAt = 0;
    let allowed = true;
    const mayDelete = async () => {
      if (!mayDeleteNow) return true;
      if (Date.now() - askedAt >= 1000) {
        allowed = await mayDeleteNow();
        askedAt = Date.now();
      }
      return allowed;
    };
    while (this.collecting) await this.collecting.catch(() => {});
    const run = (async () => {
      while (this.writers > 0) await new Promise<void>((r) => this.idle.push(r));
      const live = new Set(typeof liveKeys === 'function' ? await liveKeys() : liveKeys);
      for (const [k, at] of this.recent) {
        if (Date.now() - at > RECENT_MS) this.recent.delete(k);
        else if (await this.inner.stat(k)) live.add(k);
      }
      let deleted = 0;
      // Manifests no record names: just written, their record not yet in (by another node of a
      // cluster: this node's own are in `recent`) — live; or a snapshot whose record was deleted
      // but whose bytes were not (a crash in between) — deleted.
      for (const kind of MANIFEST_KINDS) {
        for (const dir of (await this.inner.list?.(kind)) ?? []) {
          for (const k of (await this.inner.list?.(dir)) ?? []) {
            if (live.has(k)) continue;
            // An attachment (`<key>.<suffix>`, image-objects.ts) lives as long as its object.
            const owner = attachmentOwner(k);
            if (owner && live.has(owner)) {
              live.add(k);
              continue;
            }
            const info = await this.inner.stat(k);
            if (!info) continue;
            if (Date.now() - Date.parse(info.createdAt) < RECENT_MS) {
              live.add(k);
              continue;
            }
            if (kind !== 'snapshots') continue;
            if (!(await mayDelete())) return deleted;
            await this.inner.delete(k);
            deleted++;
          }
        }
      }
      const byTenant = new Map<string, string[]>();
      for (const k of live) byTenant.set(tenantOfKey(k), [...(byTenant.get(tenantOfKey(k)) ?? []), k]);
      const tenants = new Set([...byTenant.keys(), ...((await this.inner.list?.('chunks')) ?? []).map((p) => p.split('/')[1]!)]);
      for (const tenant of tenants) {
        const referenced = new Set<string>();
        const index = new Map<string, Located>();
        try {
          for (const k of byTenant.get(tenant) ?? []) {
            const m = await this.manifest(k);
            for (const name of referencedNames(m)) referenced.add(name);
            DedupBlobStore.learn(index, m);
          }
        } catch {
          continue; // a manifest we cannot read (revoked key, corrupt): keep all of this tenant's packs
        }
        for (const ck of (await this.inner.list?.(`chunks/${tenant}`)) ?? []) {
          if (referenced.has(ck.split('/')[2]!)) continue;
          if (!(await mayDelete())) {
            // What this tenant's index knew of the packs deleted so far goes with them.
            this.indexes.set(tenant, Promise.resolve(index));
            return deleted;
          }
          await this.inner.delete(ck);
          deleted++;
          if (this.faultAfterGcDeletes !== undefined && deleted >= this.faultAfterGcDeletes) process.kill(process.pid, 'SIGKILL');
        }
        this.indexes.set(tenant, Promise.resolve(index));
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
