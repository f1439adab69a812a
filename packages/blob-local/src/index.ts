/**
 * @space/blob-local — a {@link BlobStore} on a local directory. A blob is written to a
 * temporary file, fsynced and renamed into place, so a crash at any moment leaves either no
 * blob or the complete one.
 */
import { randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream, promises as fs } from 'node:fs';
import path from 'node:path';
import type { Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { SpaceError, type BlobInfo, type BlobStore } from '@space/core';

const KEY = /^[a-z0-9][a-z0-9_\-/.]{0,255}$/;

/**
 * Local-directory blob store.
 *
 * @example
 * const blobs = new LocalBlobStore('/var/lib/space/blobs');
 * await blobs.put('snapshots/t1/sn1', stream);
 */
export class LocalBlobStore implements BlobStore {
  constructor(readonly dir: string) {}

  private file(key: string): string {
    if (!KEY.test(key) || key.includes('..')) throw new SpaceError('BAD_REQUEST', `Invalid blob key ${JSON.stringify(key)}`);
    return path.join(this.dir, key);
  }

  async put(key: string, data: Readable): Promise<number> {
    const final = this.file(key);
    await fs.mkdir(path.dirname(final), { recursive: true, mode: 0o700 });
    const tmp = `${final}.tmp-${randomBytes(6).toString('hex')}`;
    try {
      await pipeline(data, createWriteStream(tmp, { mode: 0o600 }));
      const fh = await fs.open(tmp, 'r');
      await fh.sync();
      await fh.close();
      await fs.rename(tmp, final);
    } catch (err) {
      await fs.rm(tmp, { force: true });
      throw err;
    }
    return (await fs.stat(final)).size;
  }

  async get(key: string): Promise<Readable> {
    const f = this.file(key);
    try {
      await fs.access(f);
    } catch {
      throw new SpaceError('SNAPSHOT_NOT_FOUND', `No stored data for ${key}`);
    }
    return createReadStream(f, { highWaterMark: 1 << 20 });
  }

  async stat(key: string): Promise<BlobInfo | undefined> {
    try {
      const st = await fs.stat(this.file(key));
      return { key, size: st.size, createdAt: st.mtime.toISOString() };
    } catch {
      return undefined;
    }
  }

  async list(prefix: string): Promise<string[]> {
    const dir = this.file(prefix.replace(/\/+$/, ''));
    const names = await fs.readdir(dir).catch(() => [] as string[]);
    return names.filter((n) => !n.includes('.tmp')).map((n) => `${prefix.replace(/\/+$/, '')}/${n}`);
  }

  async delete(key: string): Promise<void> {
    await fs.rm(this.file(key), { force: true });
  }

  /** Removes temporary files left by a crash mid-write. */
  async sweep(): Promise<number> {
    let n = 0;
    const walk = async (d: string): Promise<void> => {
      for (const e of await fs.readdir(d, { withFileTypes: true }).catch(() => [])) {
        const p = path.join(d, e.name);
        if (e.isDirectory()) await walk(p);
        else if (/\.tmp-[0-9a-f]{12}$/.test(e.name)) {
          await fs.rm(p, { force: true });
          n++;
        }
      }
    };
    await walk(this.dir);
    return n;
  }
}
