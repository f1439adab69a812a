/**
 * A volume's files seen from the host, for transfers without a sandbox. Paths are inside the
 * volume (`/data/x.csv`); no symbolic link is followed anywhere (a sandbox could have planted
 * one pointing at the host's files), and nothing leaves the volume's directory.
 */
import { constants, promises as fs, type Stats } from 'node:fs';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { VolumeEntry } from '@space/api';
import { SpaceError } from '../errors.js';
import { randomString } from '../ids.js';

/** Owner and permissions to give a file or directory. */
export interface VolumeFileMeta {
  uid?: number;
  gid?: number;
  /** Permission bits, e.g. 0o644. */
  mode?: number;
}

function entryType(s: Stats): VolumeEntry['type'] {
  return s.isFile() ? 'file' : s.isDirectory() ? 'directory' : s.isSymbolicLink() ? 'symlink' : 'other';
}

function fsError(err: unknown, p: string): never {
  const code = (err as NodeJS.ErrnoException).code;
  if (code === 'ENOENT') throw new SpaceError('FILE_NOT_FOUND', `No such file or directory in the volume: ${p}`, { cause: err, details: { path: p } });
  if (code === 'EEXIST') throw new SpaceError('FILE_EXISTS', `${p} exists in the volume`, { cause: err, details: { path: p } });
  if (code === 'ENOTDIR') throw new SpaceError('NOT_A_DIRECTORY', `A component of ${p} is not a directory`, { cause: err, details: { path: p } });
  if (code === 'EISDIR') throw new SpaceError('IS_A_DIRECTORY', `${p} is a directory`, { cause: err, details: { path: p } });
  if (code === 'ENOTEMPTY') throw new SpaceError('DIRECTORY_NOT_EMPTY', `${p} is not empty`, { cause: err, details: { path: p } });
  if (code === 'ENOSPC') throw new SpaceError('PAYLOAD_TOO_LARGE', `The volume is full: ${p} does not fit`, { cause: err, details: { path: p } });
  if (code === 'ELOOP') throw new SpaceError('INVALID_PATH', `${p} is a symbolic link: volume transfers do not follow links`, { cause: err, details: { path: p } });
  throw err;
}

/**
 * Files of one open volume; {@link close} lets go of it.
 *
 * @example
 * const f = await volumes.files('tenant-a', 'datasets', true);
 * try { await f.write('/in/data.csv', Readable.from(['a,b\n'])); } finally { await f.close(); }
 */
export class VolumeFiles {
  private released = false;
  private closed = false;

  constructor(
    private readonly root: string,
    private readonly readOnly: boolean,
    private readonly onRelease: () => void,
    private readonly onClose: () => Promise<void>,
  ) {}

  /**
   * Stops holding the volume at once (others may take it), before the files are closed: e.g.
   * when a download's last byte was read. {@link close} follows. Idempotent.
   */
  release(): void {
    if (this.released) return;
    this.released = true;
    this.onRelease();
  }

  /** Lets go of the volume; it is closed if nothing else holds it. Idempotent. */
  async close(): Promise<void> {
    this.release();
    if (this.closed) return;
    this.closed = true;
    await this.onClose();
  }

  /** The path's components inside the volume; `INVALID_PATH` for `..`, NUL or overlong paths. */
  private parts(p: unknown): string[] {
    if (typeof p !== 'string' || p.length > 4096 || p.includes('\0')) throw new SpaceError('INVALID_PATH', `Invalid path in the volume: ${JSON.stringify(p)}`, { details: { path: p } });
    const parts = p.split('/').filter((s) => s !== '' && s !== '.');
    if (parts.includes('..')) throw new SpaceError('INVALID_PATH', `A path in a volume may not contain '..': ${p}`, { details: { path: p } });
    return parts;
  }

  /**
   * The host path of `p`, every existing component checked not to be a symbolic link (a
   * missing last component is allowed when `mayBeMissing`).
   */
  private async resolve(p: unknown, mayBeMissing = false): Promise<string> {
    const parts = this.parts(p);
    let cur = this.root;
    for (let i = 0; i < parts.length; i++) {
      cur = path.join(cur, parts[i]!);
      const s = await fs.lstat(cur).catch((err: NodeJS.ErrnoException) => {
        if (err.code === 'ENOENT' && mayBeMissing && i === parts.length - 1) return undefined;
        return fsError(err, String(p));
      });
      if (s?.isSymbolicLink()) throw new SpaceError('INVALID_PATH', `${parts.slice(0, i + 1).join('/')} is a symbolic link: volume transfers do not follow links`, { details: { path: p } });
    }
    return cur;
  }

  private writable(): void {
    if (this.readOnly) throw new SpaceError('INTERNAL', 'This volume was opened for reading');
  }

  private async entry(hostPath: string, s: Stats): Promise<VolumeEntry> {
    const rel = '/' + path.relative(this.root, hostPath);
    const target = s.isSymbolicLink() ? await fs.readlink(hostPath).catch(() => undefined) : undefined;
    return { name: path.basename(rel) || '/', path: rel, type: entryType(s), size: s.size, mode: s.mode & 0o7777, uid: s.uid, gid: s.gid, mtime: s.mtime.toISOString(), atime: s.atime.toISOString(), ctime: s.ctime.toISOString(), ...(target !== undefined ? { target } : {}) };
  }

  /** Information about a file or directory. */
  async stat(p: string): Promise<VolumeEntry> {
    const hp = await this.resolve(p);
    return this.entry(hp, await fs.lstat(hp));
  }

  /** A directory's entries, `depth` levels deep (1: its own), by path. */
  async list(p: string, depth = 1): Promise<VolumeEntry[]> {
    const hp = await this.resolve(p);
    const out: VolumeEntry[] = [];
    const walk = async (dir: string, level: number): Promise<void> => {
      const names = await fs.readdir(dir).catch((err) => fsError(err, p));
      for (const n of names.sort()) {
        const child = path.join(dir, n);
        const s = await fs.lstat(child);
        out.push(await this.entry(child, s));
        if (s.isDirectory() && level < depth) await walk(child, level + 1);
      }
    };
    await walk(hp, 1);
    return out;
  }

  /** Makes a directory (and its parents when `parents`). */
  async mkdir(p: string, meta: VolumeFileMeta & { parents?: boolean } = {}): Promise<VolumeEntry> {
    this.writable();
    const parts = this.parts(p);
    if (!parts.length) throw new SpaceError('FILE_EXISTS', 'The volume\'s root exists');
    for (let i = meta.parents ? 1 : parts.length; i <= parts.length; i++) {
      const sub = '/' + parts.slice(0, i).join('/');
      const hp = await this.resolve(sub, true);
      try {
        await fs.mkdir(hp, { mode: meta.mode ?? 0o755 });
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'EEXIST' && (i < parts.length || meta.parents)) continue;
        fsError(err, sub);
      }
      await this.own(hp, meta);
    }
    return this.stat(p);
  }

  /** Gives `hp` its owner — by default the volume's (the sandboxes' default user), not the daemon's root — and mode. */
  private async own(hp: string, meta: VolumeFileMeta): Promise<void> {
    const root = await fs.stat(this.root);
    await fs.lchown(hp, meta.uid ?? root.uid, meta.gid ?? root.gid);
    if (meta.mode !== undefined) await fs.chmod(hp, meta.mode & 0o7777);
  }

  /** A file's contents as a stream, and its size. */
  async read(p: string): Promise<{ stream: Readable; size: number }> {
    const hp = await this.resolve(p);
    const h = await fs.open(hp, constants.O_RDONLY | constants.O_NOFOLLOW).catch((err) => fsError(err, p));
    const s = await h.stat();
    if (s.isDirectory()) {
      await h.close();
      fsError(Object.assign(new Error('EISDIR'), { code: 'EISDIR' }), p);
    }
    // The stream owns the handle and closes it (a handle left to the garbage collector would close it twice).
    return { stream: h.createReadStream(), size: s.size };
  }

  /**
   * A download that ends the transfer: the file's stream, and its size. The volume is let go
   * before the last byte is handed on (a client that has the whole file may take the volume
   * with its next call) and closed with the stream; on an error, at once.
   */
  async download(p: string): Promise<{ stream: Readable; size: number }> {
    let r: { stream: Readable; size: number };
    try {
      r = await this.read(p);
    } catch (err) {
      await this.close();
      throw err;
    }
    let sent = 0;
    if (r.size === 0) this.release();
    const counted = new Transform({
      transform: (chunk: Buffer, _enc, done) => {
        sent += chunk.length;
        if (sent >= r.size) this.release();
        done(null, chunk);
      },
    });
    // A client gone mid-way leaves the file open: closed here (unmounting waits for it).
    counted.once('close', () => {
      r.stream.destroy();
      void this.close();
    });
    r.stream.once('error', (err) => counted.destroy(err));
    return { stream: r.stream.pipe(counted), size: r.size };
  }

  /** Writes a file from `src` (replacing it whole, atomically); parent directories are made. */
  async write(p: string, src: Readable, meta: VolumeFileMeta = {}): Promise<VolumeEntry> {
    this.writable();
    const parts = this.parts(p);
    if (!parts.length) throw new SpaceError('IS_A_DIRECTORY', 'The volume\'s root is a directory');
    if (parts.length > 1) await this.mkdir('/' + parts.slice(0, -1).join('/'), { parents: true });
    const hp = await this.resolve(p, true);
    const tmp = path.join(path.dirname(hp), `.space-upload-${randomString(8)}`);
    try {
      const h = await fs.open(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, meta.mode ?? 0o644);
      await pipeline(src, h.createWriteStream());
      await this.own(tmp, meta);
      await fs.rename(tmp, hp);
    } catch (err) {
      await fs.rm(tmp, { force: true });
      fsError(err, p);
    }
    return this.stat(p);
  }

  /** Removes a file or a directory with its contents (links themselves, never what they point at). */
  async remove(p: string): Promise<void> {
    this.writable();
    if (!this.parts(p).length) throw new SpaceError('INVALID_PATH', 'The volume\'s root cannot be removed: remove the volume');
    await fs.rm(await this.resolve(p), { recursive: true });
  }

  /** Changes owner and permissions. */
  async setMeta(p: string, meta: VolumeFileMeta): Promise<VolumeEntry> {
    this.writable();
    const hp = await this.resolve(p);
    if (meta.uid !== undefined || meta.gid !== undefined) await fs.lchown(hp, meta.uid ?? -1, meta.gid ?? -1);
    if (meta.mode !== undefined) await fs.chmod(hp, meta.mode & 0o7777);
    return this.stat(p);
  }
}
