/**
 * Named volumes (issue 23): a tenant's persistent file systems that outlive sandboxes. Records
 * live in the metadata store, bytes on the node's {@link VolumeHost}, each volume's files
 * encrypted under its own data key (`volume/<id>`, wrapped by the tenant's key: rotation
 * rewraps it, revocation makes the volume unopenable).
 *
 * Who may use a volume is decided here, in memory and synchronously (so two concurrent
 * creates cannot both pass): one holder read-write, or any number read-only. Holders are the
 * sandboxes that mount it — from their create until they are killed or die, hibernated ones
 * included — and file transfers (`space volume cp`). A restart rebuilds the holders from the
 * sandbox records.
 */
import path from 'node:path';
import type { Volume, VolumeMount, VolumeSnapshot } from '@space/api';
import { SpaceError } from '../errors.js';
import { KeyedSerial } from '../async-queue.js';
import { randomString } from '../ids.js';
import type { Logger } from '../logger.js';
import type { Sandbox } from '../model.js';
import type { DriverMount } from '../ports/driver.js';
import type { MetadataStore } from '../ports/metadata-store.js';
import type { VolumeHost } from '../ports/volume-host.js';
import type { VolumeRecord, VolumeSnapshotRecord } from '../records.js';
import type { KeyService } from '../security/keys.js';
import { VolumeFiles } from './volume-files.js';

/** Volume names: what users type (`space volume create NAME`). */
export const VOLUME_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,62}$/;

/** Paths a volume may not be mounted on or under: the sandbox's own machinery. */
const RESERVED_MOUNTS = ['/proc', '/dev', '/sys', '/.space'];

/** Most volumes one sandbox mounts. */
export const MAX_VOLUME_MOUNTS = 8;

/** Smallest volume, MiB (ext4 needs room for its journal). */
export const MIN_VOLUME_MB = 64;

/** Options of {@link Volumes}. */
export interface VolumesOptions {
  store: MetadataStore;
  keys: KeyService;
  logger: Logger;
  /** Where volumes live; absent: volumes are refused with `VOLUMES_UNAVAILABLE` (saying {@link unavailable}). */
  host?: VolumeHost;
  /** Why there is no host, for the error. */
  unavailable?: string;
  /** Size when a create gives none, MiB. @default 1024 */
  defaultMb?: number;
  /** Largest volume, MiB. @default 65536 */
  maxMb?: number;
  /**
   * This node's name when nodes share the store: a volume is kept on the disk of the node that
   * made it (its record says which), and only that node acts on it — the others answer
   * `VOLUME_ON_OTHER_NODE`, and the API forwards such requests there. Absent: a node of its own.
   */
  node?: string;
}

/** A mount checked against the tenant's volumes. */
export interface ResolvedMount extends VolumeMount {
  volumeId: string;
  readOnly: boolean;
}

interface Holder {
  path: string;
  readOnly: boolean;
  /**
   * Whether it needs the volume open now. A hibernated sandbox holds its volumes (nobody else
   * may write them) without needing them open: they are closed, ciphertext only, until it wakes.
   */
  active: boolean;
}

/**
 * A checked mount path: absolute, normalized, not `/` and not over the sandbox's machinery.
 * @example checkMountPath('/data') // '/data'
 */
export function checkMountPath(p: unknown): string {
  if (typeof p !== 'string' || !p.startsWith('/') || p.length > 1024 || p.includes('\0')) {
    throw new SpaceError('INVALID_PATH', `A volume's mount path must be an absolute path, e.g. /data; got ${JSON.stringify(p)}`, { details: { field: 'volumes' } });
  }
  const norm = path.posix.normalize(p).replace(/\/+$/, '');
  if (p.split('/').some((s) => s === '..' || s === '.') || (norm !== p && norm + '/' !== p)) {
    throw new SpaceError('INVALID_PATH', `A volume's mount path must not contain '.', '..' or '//': ${JSON.stringify(p)}`, { details: { field: 'volumes' } });
  }
  if (norm === '') throw new SpaceError('INVALID_PATH', 'A volume cannot be mounted on / (it would hide the whole file system): use e.g. /data', { details: { field: 'volumes' } });
  const reserved = RESERVED_MOUNTS.find((r) => norm === r || norm.startsWith(r + '/'));
  if (reserved) throw new SpaceError('INVALID_PATH', `A volume cannot be mounted on ${norm}: ${reserved} belongs to the sandbox's system`, { details: { field: 'volumes' } });
  if (norm === '/tmp') throw new SpaceError('INVALID_PATH', 'A volume cannot be mounted on /tmp itself (the sandbox\'s scratch space): use a directory below it or e.g. /data', { details: { field: 'volumes' } });
  return norm;
}

function toSnapshot(v: VolumeRecord, s: VolumeSnapshotRecord): VolumeSnapshot {
  return { id: s.id, volume: v.name, createdAt: s.createdAt };
}

/**
 * The node's volumes.
 *
 * @example
 * const v = await volumes.create('tenant-a', { name: 'datasets', sizeMb: 1024 });
 * const mounts = await volumes.check('tenant-a', [{ volume: 'datasets', path: '/data' }], true);
 * volumes.claim('sb123', mounts); // VOLUME_IN_USE if another sandbox writes it
 */
export class Volumes {
  private readonly holders = new Map<string, Map<string, Holder>>();
  /** Opens and closes of each volume, in turn (a close re-checks its holders when its turn comes). */
  private readonly serial = new KeyedSerial();
  /** Volumes being removed: claimed by nothing from the moment the removal passed its check. */
  private readonly removing = new Set<string>();
  private fileHolders = 0;
  readonly defaultMb: number;
  readonly maxMb: number;

  constructor(private readonly opts: VolumesOptions) {
    this.defaultMb = opts.defaultMb ?? 1024;
    this.maxMb = opts.maxMb ?? 65536;
  }

  /** Whether this node has volumes. */
  get available(): boolean {
    return !!this.opts.host;
  }

  private host(): VolumeHost {
    if (!this.opts.host) throw new SpaceError('VOLUMES_UNAVAILABLE', `This daemon has no volumes${this.opts.unavailable ? `: ${this.opts.unavailable}` : ''}`);
    return this.opts.host;
  }

  private async record(tenantId: string, name: unknown): Promise<VolumeRecord> {
    const v = typeof name === 'string' ? await this.opts.store.getVolume(tenantId, name) : undefined;
    if (!v || v.state !== 'ready') throw new SpaceError('VOLUME_NOT_FOUND', `No volume ${JSON.stringify(name)} for this tenant`, { details: { name } });
    return v;
  }

  /** Whether this node keeps the volume (always, on a node of its own). */
  private mine(v: VolumeRecord): boolean {
    return !this.opts.node || !v.node || v.node === this.opts.node;
  }

  /** `v`, when this node keeps it; else `VOLUME_ON_OTHER_NODE` naming the node that does. */
  private local(v: VolumeRecord): VolumeRecord {
    if (!this.mine(v)) throw new SpaceError('VOLUME_ON_OTHER_NODE', `Volume ${v.name} is kept on node ${v.node}: its files, snapshots and sandboxes are there`, { details: { name: v.name, node: v.node } });
    return v;
  }

  private view(v: VolumeRecord, users = [...(this.holders.get(v.id) ?? new Map<string, Holder>()).entries()].filter(([h]) => h.startsWith('sb')).map(([sandboxId, h]) => ({ sandboxId, path: h.path, readOnly: h.readOnly }))): Volume {
    return { id: v.id, name: v.name, sizeMb: v.sizeMb, createdAt: v.createdAt, mountedBy: users, ...(v.node ? { node: v.node } : {}) };
  }

  /**
   * The node that keeps a volume (by name or id), when it is another node; undefined when it
   * is this one, or there is no such volume (this node then says so). What the API forwards by.
   *
   * @example await volumes.nodeOf('tenant-a', 'data') // 'node-b'
   */
  async nodeOf(tenantId: string, nameOrId: string): Promise<string | undefined> {
    if (!this.opts.node) return undefined;
    const v = await this.find(tenantId, nameOrId).catch(() => undefined);
    return v && !this.mine(v) ? v.node : undefined;
  }

  /**
   * The node that keeps the volumes a create mounts, when it is another node (the create goes
   * there); undefined when this one, or when the mounts are not well formed (the create then
   * says why). `VOLUMES_ON_DIFFERENT_NODES` when they are kept on different nodes.
   *
   * @example await volumes.nodeOfMounts('tenant-a', [{ volume: 'data', path: '/data' }]) // 'node-b'
   */
  async nodeOfMounts(tenantId: string, mounts: unknown): Promise<string | undefined> {
    if (!this.opts.node || !Array.isArray(mounts)) return undefined;
    const found = await Promise.all(mounts.map((m) => (typeof m === 'object' && m && typeof (m as { volume?: unknown }).volume === 'string' ? this.record(tenantId, (m as { volume: string }).volume).catch(() => undefined) : undefined)));
    return this.keptOn(found.filter((v): v is VolumeRecord => !!v));
  }

  /**
   * The node of E2B's volume `id` (any tenant's: its owner authenticates the request), when it
   * is another node; undefined when this one, or no such volume.
   */
  async nodeOfId(id: string): Promise<string | undefined> {
    const v = this.opts.node ? await this.opts.store.getVolumeById(id) : undefined;
    return v && !this.mine(v) ? v.node : undefined;
  }

  /** The other node that keeps all of `vols` (undefined: this one); `VOLUMES_ON_DIFFERENT_NODES` when they are on several. */
  private keptOn(vols: VolumeRecord[]): string | undefined {
    const nodes = new Set(vols.map((v) => (this.mine(v) ? undefined : v.node)));
    if (nodes.size > 1) throw new SpaceError('VOLUMES_ON_DIFFERENT_NODES', `A sandbox mounts volumes kept on one node; these are on different nodes: ${vols.map((v) => `${v.name} on ${v.node ?? this.opts.node}`).join(', ')}`, { details: { field: 'volumes' } });
    return [...nodes][0];
  }

  private async key(v: VolumeRecord): Promise<Buffer> {
    const d = await this.opts.store.getDataKey(`volume/${v.id}`);
    if (!d) throw new SpaceError('INTERNAL', `The data key of volume ${v.name} is missing`);
    return this.opts.keys.unwrapRecord(d);
  }

  /** Makes an empty volume. `VOLUME_EXISTS`, `INVALID_LIMITS`, `KEY_REVOKED` change nothing. */
  async create(tenantId: string, spec: { name?: unknown; sizeMb?: unknown }): Promise<Volume> {
    const host = this.host();
    const name = spec.name;
    if (typeof name !== 'string' || !VOLUME_NAME_RE.test(name)) throw new SpaceError('BAD_REQUEST', `Invalid volume name ${JSON.stringify(name)}: use 1 to 63 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit`, { details: { field: 'name' } });
    const sizeMb = spec.sizeMb ?? this.defaultMb;
    if (typeof sizeMb !== 'number' || !Number.isInteger(sizeMb) || sizeMb < MIN_VOLUME_MB || sizeMb > this.maxMb) {
      throw new SpaceError('INVALID_LIMITS', `sizeMb must be a whole number of MiB from ${MIN_VOLUME_MB} to ${this.maxMb} (this node's maximum); got ${JSON.stringify(sizeMb)}`, { details: { field: 'sizeMb' } });
    }
    const id = `vol-${randomString(16)}`;
    const { dataKey, record } = await this.opts.keys.newDataKey(tenantId, `volume/${id}`);
    const rec: VolumeRecord = { id, tenantId, name, sizeMb, createdAt: new Date().toISOString(), state: 'creating', ...(this.opts.node ? { node: this.opts.node } : {}) };
    // The record is the intent: a restart removes a volume still `creating`.
    await this.opts.store.insertVolume(rec);
    try {
      await this.opts.store.putDataKey(record);
      await host.create(id, sizeMb, dataKey);
    } catch (err) {
      await host.remove(id).catch(() => {});
      await this.opts.store.deleteDataKey(`volume/${id}`);
      await this.opts.store.deleteVolume(id);
      throw err;
    }
    const ready = await this.opts.store.updateVolume(id, { state: 'ready' });
    this.opts.logger.info({ tenantId, volumeId: id, name, sizeMb }, 'volume created');
    return this.view(ready);
  }

  /**
   * A tenant's volumes, by name. In a cluster, those of other nodes too: who mounts them is
   * read from the sandbox records (this node's own holders are in memory).
   */
  async list(tenantId: string): Promise<Volume[]> {
    const vols = (await this.opts.store.listVolumes(tenantId)).filter((v) => v.state === 'ready');
    const remote = vols.filter((v) => !this.mine(v));
    const users = new Map<string, Volume['mountedBy']>();
    // Their holders run on their nodes: one indexed query per such node.
    for (const node of new Set(remote.map((v) => v.node!))) {
      for (const sb of await this.opts.store.sandboxesInStates(['starting', 'running', 'paused', 'hibernated'], { node })) {
        if (sb.tenantId !== tenantId) continue;
        for (const m of sb.volumes ?? []) users.set(m.volume, [...(users.get(m.volume) ?? []), { sandboxId: sb.id, path: m.path, readOnly: !!m.readOnly }]);
      }
    }
    return vols.map((v) => (this.mine(v) ? this.view(v) : this.view(v, users.get(v.name) ?? [])));
  }

  /** One volume (by name, or by id as E2B's API names them), or `VOLUME_NOT_FOUND`. */
  async get(tenantId: string, nameOrId: string): Promise<Volume> {
    return this.view(this.local(await this.find(tenantId, nameOrId)));
  }

  private async find(tenantId: string, nameOrId: string): Promise<VolumeRecord> {
    if (nameOrId.startsWith('vol-')) {
      const v = await this.opts.store.getVolumeById(nameOrId);
      if (v && v.tenantId === tenantId && v.state === 'ready') return v;
    }
    return this.record(tenantId, nameOrId);
  }

  /** Deletes a volume, its snapshots and its key. `VOLUME_IN_USE` while anything holds it. */
  async remove(tenantId: string, nameOrId: string): Promise<void> {
    const v = this.local(await this.find(tenantId, nameOrId));
    if (this.holders.get(v.id)?.size) throw new SpaceError('VOLUME_IN_USE', `Volume ${v.name} is in use by ${this.describeHolders(v.id)}: remove it once ${this.holders.get(v.id)!.size === 1 ? 'that has' : 'those have'} ended (kill the sandboxes)`, { details: { name: v.name } });
    if (this.removing.has(v.id)) throw new SpaceError('VOLUME_NOT_FOUND', `Volume ${v.name} is being removed`, { details: { name: v.name } });
    // Set in the same step as the check: a create that resolved the name meanwhile cannot claim it.
    this.removing.add(v.id);
    try {
      await this.opts.store.updateVolume(v.id, { state: 'deleting' });
      await this.finishRemove(v);
    } finally {
      this.removing.delete(v.id);
    }
    this.opts.logger.info({ tenantId, volumeId: v.id, name: v.name }, 'volume removed');
  }

  private async finishRemove(v: VolumeRecord): Promise<void> {
    await this.serial.run(v.id, () => this.host().remove(v.id));
    for (const s of await this.opts.store.listVolumeSnapshots(v.id)) await this.opts.store.deleteVolumeSnapshot(s.id);
    await this.opts.store.deleteDataKey(`volume/${v.id}`);
    await this.opts.store.deleteVolume(v.id);
  }

  private describeHolders(id: string): string {
    const hs = [...(this.holders.get(id)?.entries() ?? [])];
    const names = hs.map(([h, x]) => (h.startsWith('files:') ? 'a file transfer' : h === 'restore' ? 'a restore' : `sandbox ${h}${x.readOnly ? ' (read-only)' : ''}`));
    return names.slice(0, 5).join(', ') + (names.length > 5 ? ` and ${names.length - 5} more` : '');
  }

  /**
   * Checks a create's `volumes` (paths, names, count) against the tenant's volumes and the
   * driver; changes nothing. `driverMounts`: whether the sandbox's driver can mount them.
   */
  async check(tenantId: string, mounts: unknown, driverMounts: boolean): Promise<ResolvedMount[]> {
    if (mounts === undefined) return [];
    if (!Array.isArray(mounts)) throw new SpaceError('BAD_REQUEST', 'volumes must be a list of { volume, path, readOnly? }', { details: { field: 'volumes' } });
    if (!mounts.length) return [];
    this.host();
    if (!driverMounts) throw new SpaceError('VOLUMES_UNAVAILABLE', 'This sandbox\'s driver cannot mount volumes: they mount into gVisor sandboxes with disks (the default driver, spaced --disks on)', { details: { field: 'volumes' } });
    if (mounts.length > MAX_VOLUME_MOUNTS) throw new SpaceError('BAD_REQUEST', `A sandbox mounts at most ${MAX_VOLUME_MOUNTS} volumes; got ${mounts.length}`, { details: { field: 'volumes' } });
    const out: ResolvedMount[] = [];
    const vols: VolumeRecord[] = [];
    for (const m of mounts as Record<string, unknown>[]) {
      if (typeof m !== 'object' || m === null) throw new SpaceError('BAD_REQUEST', 'Each volume mount is { volume, path, readOnly? }', { details: { field: 'volumes' } });
      const p = checkMountPath(m.path);
      if (m.readOnly !== undefined && typeof m.readOnly !== 'boolean') throw new SpaceError('BAD_REQUEST', 'readOnly must be true or false', { details: { field: 'volumes' } });
      if (out.some((o) => o.path === p)) throw new SpaceError('INVALID_PATH', `Two volumes are mounted on ${p}`, { details: { field: 'volumes' } });
      const v = await this.record(tenantId, m.volume);
      if (out.some((o) => o.volumeId === v.id)) throw new SpaceError('BAD_REQUEST', `Volume ${v.name} is listed twice: mount it once`, { details: { field: 'volumes' } });
      vols.push(v);
      out.push({ volume: v.name, path: p, ...(m.readOnly === true ? { readOnly: true } : { readOnly: false }), volumeId: v.id });
    }
    // In a cluster: all kept here (a create of another node's volumes was forwarded there).
    const elsewhere = this.keptOn(vols);
    if (elsewhere) this.local(vols.find((v) => v.node === elsewhere)!);
    return out;
  }

  /** Why `holder` may not take volume `id` now (undefined: it may). */
  private conflict(id: string, holder: string, readOnly: boolean): string | undefined {
    if (this.removing.has(id)) return 'its removal';
    const hs = [...(this.holders.get(id)?.entries() ?? [])].filter(([h]) => h !== holder);
    if (!hs.length) return undefined;
    if (readOnly && hs.every(([, h]) => h.readOnly)) return undefined;
    return this.describeHolders(id);
  }

  /**
   * Makes sandbox `sandboxId` a holder of every mount, or of none: `VOLUME_IN_USE` when one is
   * written by another sandbox, or it asks to write one another sandbox has. Synchronous.
   */
  claim(sandboxId: string, mounts: ResolvedMount[]): void {
    for (const m of mounts) {
      const why = this.conflict(m.volumeId, sandboxId, m.readOnly);
      if (why) throw new SpaceError('VOLUME_IN_USE', `Volume ${m.volume} is in use by ${why}: a volume is mounted read-write by one sandbox, or read-only (:ro) by many`, { details: { name: m.volume } });
    }
    for (const m of mounts) this.hold(m.volumeId, sandboxId, { path: m.path, readOnly: m.readOnly, active: true });
  }

  private hold(id: string, holder: string, h: Holder): void {
    let hs = this.holders.get(id);
    if (!hs) this.holders.set(id, (hs = new Map()));
    hs.set(holder, h);
  }

  /** The host directories of a sandbox's volumes, opened (for the driver's spec). */
  async mountsOf(sb: Sandbox): Promise<DriverMount[]> {
    if (!sb.volumes?.length) return [];
    const host = this.host();
    const out: DriverMount[] = [];
    for (const m of sb.volumes) {
      const v = await this.record(sb.tenantId, m.volume);
      // Held from now on as one that needs it open (a wake, a restore; or a restart's recovery
      // that came here before anything else claimed it).
      this.hold(v.id, sb.id, { path: m.path, readOnly: !!m.readOnly, active: true });
      const key = await this.key(v);
      const source = await this.serial.run(v.id, () => host.open(v.id, key));
      out.push({ source, target: m.path, readOnly: !!m.readOnly });
    }
    return out;
  }

  /** Sandbox `sandboxId` lets go of its volumes (it ended); a volume nobody needs open is closed. */
  async release(sandboxId: string): Promise<void> {
    for (const [id, hs] of this.holders) {
      if (!hs.delete(sandboxId)) continue;
      await this.closeIfIdle(id);
    }
  }

  /**
   * Sandbox `sandboxId` keeps its volumes but needs none open (it hibernated): each is closed
   * once no one else needs it open, so a hibernated session's volumes are ciphertext at rest.
   * Its next restore ({@link mountsOf}) opens them again.
   */
  async suspend(sandboxId: string): Promise<void> {
    for (const [id, hs] of this.holders) {
      const h = hs.get(sandboxId);
      if (!h) continue;
      h.active = false;
      await this.closeIfIdle(id);
    }
  }

  /** Whether nobody needs volume `id` open (hibernated holders and none are alike). */
  private idle(id: string): boolean {
    return ![...(this.holders.get(id)?.values() ?? [])].some((h) => h.active);
  }

  private async closeIfIdle(id: string): Promise<void> {
    if (!this.idle(id)) return;
    if (!this.holders.get(id)?.size) this.holders.delete(id);
    await this.serial.run(id, async () => {
      // Checked again in turn: a claim or a wake made meanwhile keeps it open.
      if (!this.idle(id)) return;
      await this.host().close(id);
    }).catch((err) => this.opts.logger.warn({ err, volumeId: id }, 'closing a volume failed; it stays open'));
  }

  /**
   * A volume's files, for transfers without a sandbox (`space volume cp`, E2B's volume API).
   * Writing needs the volume free; reading, no sandbox writing it. `close()` when done.
   */
  async files(tenantId: string, nameOrId: string, write: boolean): Promise<VolumeFiles> {
    const host = this.host();
    const v = this.local(await this.find(tenantId, nameOrId));
    const holder = `files:${++this.fileHolders}`;
    const why = this.conflict(v.id, holder, !write);
    if (why) throw new SpaceError('VOLUME_IN_USE', `Volume ${v.name} is in use by ${why}: ${write ? 'files can be written into a volume no sandbox has mounted' : 'files can be read from a volume no sandbox writes'}`, { details: { name: v.name } });
    this.hold(v.id, holder, { path: '', readOnly: !write, active: true });
    try {
      const key = await this.key(v);
      const root = await this.serial.run(v.id, () => host.open(v.id, key));
      return new VolumeFiles(
        root,
        !write,
        () => this.holders.get(v.id)?.delete(holder),
        () => this.closeIfIdle(v.id),
      );
    } catch (err) {
      this.holders.get(v.id)?.delete(holder);
      await this.closeIfIdle(v.id);
      throw err;
    }
  }

  /**
   * Runs `fn` on a volume's files (see {@link files}) and lets go of them after, however it ends.
   * @example const entries = await volumes.withFiles('tenant-a', 'data', false, (f) => f.list('/'));
   */
  async withFiles<T>(tenantId: string, nameOrId: string, write: boolean, fn: (f: VolumeFiles) => Promise<T>): Promise<T> {
    const f = await this.files(tenantId, nameOrId, write);
    try {
      return await fn(f);
    } finally {
      await f.close();
    }
  }

  /** What an open volume holds, bytes (undefined when closed). */
  async usedBytes(tenantId: string, name: string): Promise<number | undefined> {
    const v = this.local(await this.find(tenantId, name));
    return this.host().usedBytes(v.id);
  }

  /** Copies a volume as it is now (writers pause for the copy). */
  async snapshot(tenantId: string, name: string): Promise<VolumeSnapshot> {
    const host = this.host();
    const v = this.local(await this.find(tenantId, name));
    const s: VolumeSnapshotRecord = { id: `vs-${randomString(16)}`, volumeId: v.id, createdAt: new Date().toISOString(), state: 'creating' };
    await this.opts.store.insertVolumeSnapshot(s);
    try {
      await this.serial.run(v.id, () => host.snapshot(v.id, s.id));
    } catch (err) {
      await host.removeSnapshot(v.id, s.id).catch(() => {});
      await this.opts.store.deleteVolumeSnapshot(s.id);
      throw new SpaceError('SNAPSHOT_FAILED', `Snapshot of volume ${v.name} failed: ${(err as Error).message}`, { cause: err });
    }
    return toSnapshot(v, await this.opts.store.updateVolumeSnapshot(s.id, { state: 'ready' }));
  }

  /** A volume's snapshots, oldest first. */
  async snapshots(tenantId: string, name: string): Promise<VolumeSnapshot[]> {
    const v = this.local(await this.find(tenantId, name));
    return (await this.opts.store.listVolumeSnapshots(v.id)).filter((s) => s.state === 'ready').map((s) => toSnapshot(v, s));
  }

  private async ownSnapshot(v: VolumeRecord, snapshotId: string): Promise<VolumeSnapshotRecord> {
    const s = await this.opts.store.getVolumeSnapshot(snapshotId);
    if (!s || s.volumeId !== v.id || s.state !== 'ready') throw new SpaceError('SNAPSHOT_NOT_FOUND', `Volume ${v.name} has no snapshot ${snapshotId}: \`space volume snapshots ${v.name}\` lists them`, { details: { snapshotId } });
    return s;
  }

  /** Puts a snapshot's contents back. `VOLUME_IN_USE` while anything holds the volume. */
  async restore(tenantId: string, name: string, snapshotId: string): Promise<Volume> {
    const host = this.host();
    const v = this.local(await this.find(tenantId, name));
    const s = await this.ownSnapshot(v, snapshotId);
    const why = this.conflict(v.id, 'restore', false);
    if (why) throw new SpaceError('VOLUME_IN_USE', `Volume ${v.name} is in use by ${why}: restore it once nothing holds it (kill the sandboxes)`, { details: { name: v.name } });
    // Held by the restore itself meanwhile: a create that claimed it now would see either contents.
    this.hold(v.id, 'restore', { path: '', readOnly: false, active: false });
    try {
      await this.serial.run(v.id, async () => {
        await host.close(v.id);
        await host.restore(v.id, s.id);
      });
    } finally {
      this.holders.get(v.id)?.delete('restore');
    }
    this.opts.logger.info({ tenantId, volumeId: v.id, snapshotId }, 'volume restored');
    return this.view(v);
  }

  /** Deletes one snapshot of a volume. */
  async removeSnapshot(tenantId: string, name: string, snapshotId: string): Promise<void> {
    const v = this.local(await this.find(tenantId, name));
    const s = await this.ownSnapshot(v, snapshotId);
    await this.serial.run(v.id, () => this.host().removeSnapshot(v.id, s.id));
    await this.opts.store.deleteVolumeSnapshot(s.id);
  }

  /**
   * After a restart: holders again from the sandbox records, unfinished creates and removals
   * undone or finished, half-made snapshots dropped, and volumes nobody needs open (held by
   * nobody, or by hibernated sandboxes only) closed.
   */
  async recover(): Promise<void> {
    const host = this.opts.host;
    if (!host) return;
    await host.recover();
    // In a cluster: this node's sandboxes and volumes only (the others' are theirs to recover).
    const live = await this.opts.store.sandboxesInStates(['starting', 'running', 'paused', 'hibernated'], this.opts.node ? { node: this.opts.node } : undefined);
    for (const sb of live) {
      for (const m of sb.volumes ?? []) {
        const v = await this.opts.store.getVolume(sb.tenantId, m.volume);
        if (v) this.hold(v.id, sb.id, { path: m.path, readOnly: !!m.readOnly, active: sb.state !== 'hibernated' });
      }
    }
    const own = (await this.opts.store.listVolumes()).filter((v) => this.mine(v));
    for (const v of own) {
      if (v.state === 'creating') {
        await host.remove(v.id);
        await this.opts.store.deleteDataKey(`volume/${v.id}`);
        await this.opts.store.deleteVolume(v.id);
        this.opts.logger.warn({ volumeId: v.id, name: v.name }, 'a volume whose create was interrupted was removed');
      } else if (v.state === 'deleting') await this.finishRemove(v);
    }
    const mineIds = new Set(own.map((v) => v.id));
    for (const s of await this.opts.store.listVolumeSnapshots()) {
      if (s.state !== 'creating' || !mineIds.has(s.volumeId)) continue;
      await host.removeSnapshot(s.volumeId, s.id);
      await this.opts.store.deleteVolumeSnapshot(s.id);
    }
    for (const id of await host.openIds()) await this.closeIfIdle(id);
  }
}

