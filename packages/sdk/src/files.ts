/** `sandbox.files`: read, write (streaming, binary-safe), list and change files in a sandbox. */
import { Readable } from 'node:stream';
import { SpaceError } from '@space/api';
import type { ApiClient } from './client.js';

/** A file-system entry. */
export type { EntryInfo } from '@space/protocol';
import type { EntryInfo } from '@space/protocol';

/** What {@link Files.write} accepts. */
export type WriteData = string | Uint8Array | ArrayBuffer | Readable | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/**
 * Files of one sandbox. Relative paths are relative to the user's home.
 *
 * @example
 * await sandbox.files.write('/tmp/a.txt', 'hello');
 * const text = await sandbox.files.read('/tmp/a.txt');
 * for await (const chunk of await sandbox.files.read('/tmp/big', { format: 'stream' })) ...
 */
export class Files {
  constructor(
    private readonly api: ApiClient,
    private readonly sandboxId: string,
  ) {}

  private p(suffix = ''): string {
    return `/v1/sandboxes/${this.sandboxId}/files${suffix}`;
  }

  /** Reads a file as text (default), bytes, or a stream. */
  read(path: string, opts?: { format?: 'text'; signal?: AbortSignal }): Promise<string>;
  read(path: string, opts: { format: 'bytes'; signal?: AbortSignal }): Promise<Uint8Array>;
  read(path: string, opts: { format: 'stream'; signal?: AbortSignal }): Promise<Readable>;
  async read(path: string, opts: { format?: 'text' | 'bytes' | 'stream'; signal?: AbortSignal } = {}): Promise<string | Uint8Array | Readable> {
    const res = await this.api.request('GET', this.p('/content'), { query: { path }, timeoutMs: 0, ...(opts.signal ? { signal: opts.signal } : {}) });
    if (opts.format === 'stream') return res.body;
    const buf = new Uint8Array(await res.bytes());
    return opts.format === 'bytes' ? buf : new TextDecoder().decode(buf);
  }

  /**
   * Writes a file atomically (the old content stays if the upload fails). Returns its size.
   * `metadata` (keys: letters, digits and `!#$%&'*+-.^_\`|~`, lowercased; values: printable
   * ASCII) is stored with the file and follows it through renames, snapshots and forks;
   * keys an overwrite does not set stay.
   * @example await sb.files.write('/home/user/out.csv', csv, { metadata: { step: '3' } });
   */
  async write(path: string, data: WriteData, opts: { mode?: number; user?: string; metadata?: Record<string, string>; signal?: AbortSignal } = {}): Promise<{ path: string; size: number }> {
    return this.api.json('PUT', this.p('/content'), {
      query: { path, mode: opts.mode, user: opts.user },
      body: data,
      contentType: 'application/octet-stream',
      ...(opts.metadata ? { headers: Object.fromEntries(Object.entries(opts.metadata).map(([k, v]) => [`x-metadata-${k}`, v])) } : {}),
      timeoutMs: 0,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
  }

  /** Lists a directory; `depth` > 1 descends; `metadata` adds each entry's file metadata. */
  async list(path: string, opts: { depth?: number; metadata?: boolean } = {}): Promise<EntryInfo[]> {
    return (await this.api.json<{ entries: EntryInfo[] }>('GET', this.p(), { query: { path, depth: opts.depth, metadata: opts.metadata || undefined } })).entries;
  }

  /**
   * Stat of a path (symlinks not followed); `metadata` adds its file metadata.
   * @example (await sb.files.stat('out.csv', { metadata: true })).metadata // { step: '3' }
   */
  async stat(path: string, opts: { metadata?: boolean } = {}): Promise<EntryInfo> {
    return this.api.json('GET', this.p('/stat'), { query: { path, metadata: opts.metadata || undefined } });
  }

  /** Whether a path exists. */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (err instanceof SpaceError && err.code === 'FILE_NOT_FOUND') return false;
      throw err;
    }
  }

  /** mkdir -p. */
  async makeDir(path: string, opts: { user?: string } = {}): Promise<void> {
    await this.api.json('POST', this.p('/mkdir'), { json: { path, ...(opts.user ? { user: opts.user } : {}) } });
  }

  /** Removes a file, or a directory (with `recursive` when not empty). */
  async remove(path: string, opts: { recursive?: boolean } = {}): Promise<void> {
    await this.api.json('DELETE', this.p(), { query: { path, recursive: opts.recursive ? true : undefined } });
  }

  /** Renames (moves) a path. */
  async rename(from: string, to: string): Promise<void> {
    await this.api.json('POST', this.p('/rename'), { json: { from, to } });
  }
}
