/** Named volumes: a tenant's persistent file systems that outlive sandboxes. */
import type { Readable } from 'node:stream';
import type { Volume, VolumeEntry, VolumeSnapshot } from '@space/api';
import { ApiClient, type ConnectionOpts } from './client.js';
import type { WriteData } from './files.js';

export type { Volume, VolumeEntry, VolumeSnapshot };

/**
 * A tenant's volumes. Mount them at creation (`Sandbox.create({ volumes: [{ volume, path }] })`):
 * read-write by one sandbox at a time, read-only (`readOnly: true`) by many. A volume is not
 * rolled back with a sandbox's snapshots; it has snapshots of its own.
 *
 * @example
 * await Volumes.create('datasets', { sizeMb: 4096 });
 * await Volumes.write('datasets', '/in/data.csv', csv);       // no sandbox needed
 * const sb = await Sandbox.create({ template: 'base', volumes: [{ volume: 'datasets', path: '/data' }] });
 * await sb.commands.run('wc -l /data/in/data.csv');
 */
export class Volumes {
  private static p(name: string, suffix = ''): string {
    return `/v1/volumes/${encodeURIComponent(name)}${suffix}`;
  }

  /** Makes an empty volume (its files encrypted at rest under the tenant's key). @default sizeMb 1024 */
  static create(name: string, opts: ConnectionOpts & { sizeMb?: number } = {}): Promise<Volume> {
    return new ApiClient(opts).json<Volume>('POST', '/v1/volumes', { json: { name, ...(opts.sizeMb !== undefined ? { sizeMb: opts.sizeMb } : {}) } });
  }

  /** The tenant's volumes, with the sandboxes that hold them. */
  static async list(opts: ConnectionOpts = {}): Promise<Volume[]> {
    return (await new ApiClient(opts).json<{ volumes: Volume[] }>('GET', '/v1/volumes')).volumes;
  }

  /** One volume (`usedBytes` while it is mounted). */
  static get(name: string, opts: ConnectionOpts = {}): Promise<Volume & { usedBytes?: number }> {
    return new ApiClient(opts).json('GET', Volumes.p(name));
  }

  /** Deletes a volume with its snapshots; `VOLUME_IN_USE` while a sandbox holds it. */
  static async remove(name: string, opts: ConnectionOpts = {}): Promise<void> {
    await new ApiClient(opts).request('DELETE', Volumes.p(name));
  }

  /** Copies the volume as it is now. */
  static snapshot(name: string, opts: ConnectionOpts = {}): Promise<VolumeSnapshot> {
    return new ApiClient(opts).json('POST', Volumes.p(name, '/snapshots'));
  }

  /** A volume's snapshots, oldest first. */
  static async snapshots(name: string, opts: ConnectionOpts = {}): Promise<VolumeSnapshot[]> {
    return (await new ApiClient(opts).json<{ snapshots: VolumeSnapshot[] }>('GET', Volumes.p(name, '/snapshots'))).snapshots;
  }

  /** Puts a snapshot's contents back; `VOLUME_IN_USE` while a sandbox holds it. */
  static restore(name: string, snapshotId: string, opts: ConnectionOpts = {}): Promise<Volume> {
    return new ApiClient(opts).json('POST', Volumes.p(name, '/restore'), { json: { snapshotId } });
  }

  /** Writes a file into a volume no sandbox holds (parent directories are made). */
  static write(name: string, path: string, data: WriteData, opts: ConnectionOpts & { signal?: AbortSignal } = {}): Promise<VolumeEntry> {
    return new ApiClient(opts).json('PUT', Volumes.p(name, '/files/content'), { query: { path }, body: data, contentType: 'application/octet-stream', timeoutMs: 0, ...(opts.signal ? { signal: opts.signal } : {}) });
  }

  /** Reads a file of a volume no sandbox writes, as text (default), bytes, or a stream. */
  static read(name: string, path: string, opts?: ConnectionOpts & { format?: 'text' }): Promise<string>;
  static read(name: string, path: string, opts: ConnectionOpts & { format: 'bytes' }): Promise<Uint8Array>;
  static read(name: string, path: string, opts: ConnectionOpts & { format: 'stream' }): Promise<Readable>;
  static async read(name: string, path: string, opts: ConnectionOpts & { format?: 'text' | 'bytes' | 'stream' } = {}): Promise<string | Uint8Array | Readable> {
    const res = await new ApiClient(opts).request('GET', Volumes.p(name, '/files/content'), { query: { path }, timeoutMs: 0 });
    if (opts.format === 'stream') return res.body;
    const buf = new Uint8Array(await res.bytes());
    return opts.format === 'bytes' ? buf : new TextDecoder().decode(buf);
  }

  /** A directory's entries in a volume, `depth` levels deep. */
  static async entries(name: string, path = '/', opts: ConnectionOpts & { depth?: number } = {}): Promise<VolumeEntry[]> {
    return (await new ApiClient(opts).json<{ entries: VolumeEntry[] }>('GET', Volumes.p(name, '/files'), { query: { path, depth: opts.depth } })).entries;
  }
}
