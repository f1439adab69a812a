/**
 * Starting and stopping `spaced`: data directory, metadata store, driver, first API key,
 * HTTP listener, state file, graceful shutdown. Several daemons run side by side when each
 * has its own data directory and port.
 */
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, promises as fs } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { Ext4Volumes } from '@space/volume-ext4';
import { ApiKeys, Volumes, type Logger, DedupBlobStore, EncryptedBlobStore, KeyService, LocalKeyProvider, SandboxService, SpaceError, templateImageBlobKey, type MetadataStore, type SandboxDriver } from '@space/core';
import { parseSizeMb, type DrainEvent, type DrainResult } from '@space/api';
import { DiskPool, GvisorDriver, MIN_POOL_BYTES, MIN_WORK_ROOM_BYTES } from '@space/driver-gvisor';
import { MicrovmDriver } from '@space/driver-microvm';
import { SqliteStore } from '@space/store-sqlite';
import { PostgresStore } from '@space/store-postgres';
import { claimBlobStore, openBlobStore } from './blob-store.js';
import { LeaseKeeper } from './lease-keeper.js';
import { NodeHeartbeat, checkNodeName, clusterDuties, nodeStates, nodeViews, planDrain } from './node.js';
import { VERSION } from './version.js';
import { RootfsStore } from '@space/templates';
import { AccessTokens, buildE2bApp } from '@space/e2b';
import { startIngress, type IngressOptions } from './ingress.js';
import { Pkcs11KeyProvider, type Pkcs11Options } from '@space/key-pkcs11';
import { buildApp } from './app.js';
import { registerE2bForwarding } from './forward.js';
import type { FastifyInstance } from 'fastify';
import { parseEgressHosts, prepareEgress, type EgressOptions } from './networking.js';
import { defaultDataDir, readState, type DaemonState } from './state.js';

export { defaultDataDir, readState, type DaemonState };

/** Daemon settings (CLI flags and SPACE_* environment variables). */
export interface DaemonOptions {
  /** Data directory: database, sandboxes' state, first API key. @default /var/lib/space (root) or ~/.local/share/space */
  dataDir?: string;
  /** `HOST:PORT` to listen on. @default "127.0.0.1:7070" */
  listen?: string;
  /** Template cache directory. @default `${dataDir}/templates` */
  templatesDir?: string;
  /** How often running sandboxes' usage is sampled (metrics series), ms. @default 5000 */
  usageSampleMs?: number;
  /** Most sandboxes alive at once. @default 64 */
  maxSandboxes?: number;
  /** Most memory the limits of the node's sandboxes may add up to, MiB (`--max-memory`). @default twice the host's memory */
  maxMemoryMb?: number;
  /** Largest file upload, bytes. @default 4 GiB */
  maxUploadBytes?: number;
  /** pino log level. @default "info" */
  logLevel?: string;
  /** Debian mirror for the base template. */
  debianMirror?: string;
  /**
   * `HOST:PORT` of the E2B-compatible API, or "off". @default the main port + 1 on the same
   * host (port 0 when the main port is 0)
   */
  e2bListen?: string;
  /**
   * What E2B's `allowInternetAccess: true` gives E2B-created sandboxes: `allow` (any public
   * destination through the egress proxy, E2B's meaning) or `deny` (refused, saying so).
   * @default "allow" (or SPACE_E2B_INTERNET)
   */
  e2bInternet?: 'allow' | 'deny';
  /**
   * What E2B sandboxes' ports are: `allow` (E2B's meaning: every port reachable through the
   * ingress without a token unless the sandbox asks for `allowPublicTraffic: false`) or `deny`
   * (every port needs the sandbox's `trafficAccessToken`; `allowPublicTraffic: true` is refused).
   * @default "allow" (or SPACE_E2B_PUBLIC_TRAFFIC)
   */
  e2bPublicTraffic?: 'allow' | 'deny';
  /** The ingress: preview URLs of sandboxes' ports. @default listen on the API's host, port + 2 ("off" for none) */
  ingress?: IngressOptions;
  /** Directory of key files the operator provides (local key provider). @default `${dataDir}/keys` */
  keyDir?: string;
  /** The node's key (a file in keyDir), used for tenants without their own. @default "node.key" */
  nodeKey?: string;
  /** A PKCS#11 token tenants may keep their keys in (provider `pkcs11`). */
  pkcs11?: Pkcs11Options;
  /** Warm pool sizes of the built-in templates, e.g. `{ minimal: 2 }` (tenants size their own). */
  pools?: Record<string, number>;
  /** Sandbox networking and the egress proxy. @default on, range 10.231.0.0/16, port 3128 */
  egress?: EgressOptions;
  /** The default isolation driver of this daemon's sandboxes. @default "gvisor" */
  driver?: 'gvisor' | 'microvm';
  /** Every driver a sandbox may choose at creation (the default is always one). @default [driver] */
  drivers?: ('gvisor' | 'microvm')[];
  /** microVM driver settings (with `driver: "microvm"`). */
  microvm?: { accel?: 'auto' | 'kvm' | 'tcg'; kernelDeb?: string; cacheDir?: string };
  /** Sandbox disks (both drivers): files on a bounded disk instead of memory. @default auto (or SPACE_DISKS) */
  disks?: DiskOptions;
  /**
   * Named volumes: `auto` (on when the host can: fscrypt, ext4 encryption, loop devices), `on`
   * (the daemon refuses to start without them), `off`. @default "auto" (or SPACE_VOLUMES)
   */
  volumes?: 'auto' | 'on' | 'off';
  /**
   * Metadata database: a `postgres://USER@HOST:PORT/DB` URL keeps it in PostgreSQL (password from
   * PGPASSWORD or ~/.pgpass, see {@link checkDatabaseUrl}); absent, SQLite in the data directory.
   * @default SPACE_DATABASE, else `${dataDir}/space.db`
   */
  database?: string;
  /**
   * Blob store (snapshots, template images): `file:///PATH` or `s3://BUCKET[/PREFIX]?endpoint=URL`
   * (credentials from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_SHARED_CREDENTIALS_FILE).
   * @default SPACE_BLOB_STORE, else `${dataDir}/blobs`
   */
  blobStore?: string;
  /**
   * Where checkpoint images are written and snapshots unpacked (transient, up to a sandbox's
   * memory size each). @default SPACE_WORK_DIR, else RAM (`/dev/shm/spaced-<hash>/work`);
   * with disks on, `${dataDir}/work` (disk streams pass through it)
   */
  workDir?: string;
  /** This node's name in its deployment. @default SPACE_NODE_NAME, else the host name */
  nodeName?: string;
  /** A node silent this long is shown `lost`, seconds; it heartbeats every third of it. @default 30 (or SPACE_NODE_LOST_AFTER) */
  nodeLostAfterS?: number;
  /**
   * The URL other nodes reach this one's API at (they forward requests for its sandboxes
   * there), e.g. `http://10.0.0.5:7070`. @default SPACE_ADVERTISE_URL, else the listener's URL
   */
  advertiseUrl?: string;
}

/**
 * A listener's URL as other nodes reach it: with `--advertise-url`, its host in place of the
 * listener's (the port stays).
 *
 * @example advertised('http://0.0.0.0:7071', 'http://10.0.0.5:7070') // 'http://10.0.0.5:7071'
 */
export function advertised(listenerUrl: string, advertiseUrl: string | undefined): string {
  if (!advertiseUrl) return listenerUrl;
  const u = new URL(listenerUrl);
  u.hostname = new URL(advertiseUrl).hostname;
  return u.origin;
}

/** Checks `--advertise-url`: an http(s) URL with no path, query or credentials. */
export function checkAdvertiseUrl(s: string | undefined): string | undefined {
  if (s === undefined || s === '') return undefined;
  let u: URL | undefined;
  try {
    u = new URL(s);
  } catch {
    u = undefined;
  }
  if (!u || (u.protocol !== 'http:' && u.protocol !== 'https:') || u.username || u.password || u.search || (u.pathname !== '/' && u.pathname !== '')) {
    throw new SpaceError('CONFIG_INVALID', `--advertise-url ${JSON.stringify(s)} must be the http(s) URL other nodes reach this one's API at, e.g. http://10.0.0.5:7070`);
  }
  return u.origin;
}

/**
 * Checks a `--database` URL: PostgreSQL's scheme, and no password when it came from the command
 * line (`fromArgv`), where every user of the host can read it in `ps`: put the password in
 * PGPASSWORD or ~/.pgpass, or the whole URL in SPACE_DATABASE.
 *
 * @example checkDatabaseUrl('postgres://space@db:5432/space', true) // ok
 */
export function checkDatabaseUrl(url: string, fromArgv: boolean): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch (err) {
    throw new SpaceError('CONFIG_INVALID', `--database ${JSON.stringify(url)} is not a URL: use postgres://USER@HOST:PORT/DATABASE`, { cause: err });
  }
  if (u.protocol !== 'postgres:' && u.protocol !== 'postgresql:') throw new SpaceError('CONFIG_INVALID', `--database must be a postgres:// URL (SQLite, the default, needs no flag); got ${u.protocol}`);
  if (fromArgv && u.password) throw new SpaceError('CONFIG_INVALID', '--database carries a password, which every user of this host can read in `ps`: put it in PGPASSWORD or ~/.pgpass, or pass the whole URL in SPACE_DATABASE');
  return url;
}

/** Checks the volumes setting (flag `--volumes`, `SPACE_VOLUMES`). */
export function parseVolumesMode(s: string): 'auto' | 'on' | 'off' {
  if (s !== 'auto' && s !== 'on' && s !== 'off') throw new SpaceError('CONFIG_INVALID', `Unknown --volumes ${JSON.stringify(s)}: use auto (on when the host can), on or off`);
  return s;
}

/** The node's volumes as the settings and the host allow. */
async function openVolumes(mode: 'auto' | 'on' | 'off', dataDir: string, store: MetadataStore, keys: KeyService, logger: Logger, node?: string): Promise<Volumes | undefined> {
  if (mode === 'off') return undefined;
  const crashWhileFrozen = process.env.SPACE_FAULT_INJECT?.split(',').includes('volume-snapshot:frozen');
  const host = new Ext4Volumes({ dir: path.join(dataDir, 'volumes'), ...(crashWhileFrozen ? { whileFrozen: () => process.kill(process.pid, 'SIGKILL') } : {}) });
  const report = await host.doctor();
  if (!report.available && mode === 'on') throw new SpaceError('VOLUMES_UNAVAILABLE', `--volumes on, but this host cannot keep volumes: ${report.detail}`);
  if (!report.available) logger.warn({ detail: report.detail }, 'volumes are off: this host cannot keep them');
  return new Volumes({ store, keys, logger, ...(node ? { node } : {}), ...(report.available ? { host } : { unavailable: report.detail }) });
}

/** Sandbox disks of the daemon (flags `--disks`, `--disk-pool`, `--disk-default`, `--disk-max`, `--disk-pool-size`). */
export interface DiskOptions {
  /**
   * `on`: every sandbox gets a disk in a btrfs pool (a second driver's pool in `<dir>/<driver>`); `off`: files in memory; `auto`: on
   * for a node of its own when the host has btrfs and loop devices, decided once per data
   * directory (see {@link resolveDisksMode}): a sandbox that writes more than its memory then
   * fills its disk instead of dying (docs/disks.md). @default "auto" (or SPACE_DISKS)
   */
  mode?: 'auto' | 'on' | 'off';
  /** Directory of the pool. @default `${dataDir}/disks` (or SPACE_DISK_POOL) */
  dir?: string;
  /** Disk size when a create gives none, MiB. @default 5120 (or SPACE_DISK_DEFAULT, e.g. "5G") */
  defaultMb?: number;
  /** Largest disk a create may ask for, MiB. @default 65536 (or SPACE_DISK_MAX) */
  maxMb?: number;
  /**
   * Size of a new disk pool, MiB, taken on the host when the pool is made (a pool made already
   * keeps its size; docs/disks.md, "The pool's size"). @default 32 GiB, or half of the host's free space if less (or SPACE_DISK_POOL_SIZE)
   */
  poolMb?: number;
}

/**
 * Checks a flag that counts something (`--max-sandboxes`): a whole number from 1.
 *
 * @example parseCount('64', '--max-sandboxes') // 64
 */
export function parseCount(s: string, flag: string): number {
  const n = /^\d+$/.test(s.trim()) ? Number(s.trim()) : NaN;
  if (!Number.isSafeInteger(n) || n < 1) throw new SpaceError('CONFIG_INVALID', `${flag} must be a whole number from 1; got ${JSON.stringify(s)}`);
  return n;
}

/** Checks the disks setting (flag `--disks`, `SPACE_DISKS`). */
export function parseDisksMode(s: string): 'auto' | 'on' | 'off' {
  if (s !== 'auto' && s !== 'on' && s !== 'off') throw new SpaceError('CONFIG_INVALID', `Unknown --disks ${JSON.stringify(s)}: use auto (on when this host can and the node is on its own), on (sandbox files on bounded disks in a btrfs pool) or off (in memory)`);
  return s;
}

/** The store setting that remembers what `--disks auto` came to for this data directory. */
const DISKS_DECIDED = 'disks-auto';

/**
 * What `--disks auto` comes to, and why (said in the log at start):
 * - **off** for nodes sharing a database: a disk moves with its session (every snapshot holds the
 *   template files it grew from), but a tenant's first snapshot of a template's sandbox on a
 *   node stores them (~40 s for `base`), and restoring a lost node's running sandboxes on disks
 *   is not tested yet (docs/disks.md, "In a cluster");
 * - what it came to before, for a data directory that decided already (its sandboxes and
 *   template images were made with or without disks, and restore only so);
 * - **off** for a data directory made before disks were the default (it holds live sandboxes
 *   or template images, all without a disk);
 * - else **on** when the host has what a disk pool needs (btrfs-progs, loop devices, and room
 *   under `hostDir` for the smallest pool beside its work files and the 1 GiB kept free: the
 *   pool takes its size on the host when made), **off** (saying what is missing) when not.
 *
 * @example const { mode, why } = await resolveDisksMode('auto', { shared: false, store, imagesDir });
 */
export async function resolveDisksMode(mode: 'auto' | 'on' | 'off', ctx: { shared: boolean; store: MetadataStore; imagesDir: string; hostDir?: string }): Promise<{ mode: 'on' | 'off'; why: string }> {
  if (mode !== 'auto') return { mode, why: `--disks ${mode}` };
  if (ctx.shared) return { mode: 'off', why: 'nodes sharing a database: sandbox disks move with their sessions, but a tenant\'s first snapshot of a template\'s sandbox on a node stores the template\'s files (~40 s for base), and restoring a lost node\'s running sandboxes on disks is not tested yet: start with --disks on for them (docs/disks.md, "In a cluster")' };
  const decided = await ctx.store.getMeta(DISKS_DECIDED);
  if (decided === 'on' || decided === 'off') return { mode: decided, why: `this data directory was set up with disks ${decided}` };
  let decision: { mode: 'on' | 'off'; why: string };
  const live = await ctx.store.sandboxesInStates(['starting', 'running', 'paused', 'hibernated']);
  const images = existsSync(ctx.imagesDir) && (await fs.readdir(ctx.imagesDir)).length > 0;
  if (live.length || images) decision = { mode: 'off', why: `this data directory holds ${live.length ? `${live.length} sandbox(es)` : 'template images'} made without disks: start with --disks on to change that (they would not restore)` };
  else {
    // The smallest pool, its room for work files, and the 1 GiB kept free on the host.
    const needs = MIN_POOL_BYTES + MIN_WORK_ROOM_BYTES + 2 ** 30;
    const free = ctx.hostDir ? await fs.statfs(ctx.hostDir).then((s) => s.bavail * s.bsize, () => Infinity) : Infinity;
    const missing = [...(onPath('mkfs.btrfs') && onPath('btrfs') ? [] : ['btrfs-progs (apt-get install btrfs-progs)']), ...(existsSync('/dev/loop-control') ? [] : ['loop devices (/dev/loop-control)']), ...(free >= needs ? [] : [`room for a disk pool (${Math.round(free / 2 ** 20)} MiB free under ${ctx.hostDir}; a pool takes ${Math.round(needs / 2 ** 20)} MiB at least)`])];
    decision = missing.length ? { mode: 'off', why: `this host lacks ${missing.join(' and ')}` } : { mode: 'on', why: 'a new data directory on a host with btrfs and loop devices' };
  }
  const kept = await ctx.store.putMetaIfAbsent(DISKS_DECIDED, decision.mode);
  return kept === decision.mode ? decision : { mode: kept as 'on' | 'off', why: `this data directory was set up with disks ${kept}` };
}

/** Whether a program is on the PATH. */
function onPath(cmd: string): boolean {
  return (process.env.PATH ?? '/usr/sbin:/usr/bin:/sbin:/bin').split(':').some((d) => d && existsSync(path.join(d, cmd)));
}

/** The disks settings: options first, then SPACE_DISK* variables; `settings` undefined when off. */
async function diskSettings(opts: DiskOptions | undefined, ctx: { shared: boolean; store: MetadataStore; imagesDir: string; hostDir: string; logger: Logger }): Promise<{ mode: 'on' | 'off'; why: string; settings?: { dir?: string; defaultMb?: number; maxMb?: number; poolBytes?: number; key?: Buffer } }> {
  const env = process.env;
  const { mode, why } = await resolveDisksMode(opts?.mode ?? parseDisksMode(env.SPACE_DISKS ?? 'auto'), ctx);
  ctx.logger.info({ disks: mode }, `sandbox disks ${mode}: ${why}`);
  if (mode === 'off') return { mode, why };
  const dir = opts?.dir ?? env.SPACE_DISK_POOL;
  const defaultMb = opts?.defaultMb ?? (env.SPACE_DISK_DEFAULT ? parseSizeMb(env.SPACE_DISK_DEFAULT, 'SPACE_DISK_DEFAULT') : undefined);
  const maxMb = opts?.maxMb ?? (env.SPACE_DISK_MAX ? parseSizeMb(env.SPACE_DISK_MAX, 'SPACE_DISK_MAX') : undefined);
  const poolMb = opts?.poolMb ?? (env.SPACE_DISK_POOL_SIZE ? parseSizeMb(env.SPACE_DISK_POOL_SIZE, 'SPACE_DISK_POOL_SIZE') : undefined);
  return { mode, why, settings: { ...(dir ? { dir } : {}), ...(defaultMb !== undefined ? { defaultMb } : {}), ...(maxMb !== undefined ? { maxMb } : {}), ...(poolMb !== undefined ? { poolBytes: poolMb * 2 ** 20 } : {}) } };
}

/** Checks a driver name (flag `--driver`, `SPACE_DRIVER`). */
export function parseDriver(s: string): 'gvisor' | 'microvm' {
  if (s !== 'gvisor' && s !== 'microvm') throw new SpaceError('BAD_REQUEST', `Unknown driver ${JSON.stringify(s)}: use gvisor or microvm`);
  return s;
}

/** Parses a comma-separated driver list (flag `--drivers`, `SPACE_DRIVERS`). */
export function parseDrivers(s: string): ('gvisor' | 'microvm')[] {
  return [...new Set(s.split(',').map((x) => x.trim()).filter(Boolean).map(parseDriver))];
}

/** Checks an acceleration setting (flag `--microvm-accel`, `SPACE_MICROVM_ACCEL`). */
export function parseAccel(s: string): 'auto' | 'kvm' | 'tcg' {
  if (s !== 'auto' && s !== 'kvm' && s !== 'tcg') throw new SpaceError('BAD_REQUEST', `Unknown acceleration ${JSON.stringify(s)}: use auto, kvm or tcg`);
  return s;
}

/** Checks the E2B public traffic setting (flag `--e2b-public-traffic`, `SPACE_E2B_PUBLIC_TRAFFIC`). */
export function parseE2bPublicTraffic(s: string): 'allow' | 'deny' {
  if (s !== 'allow' && s !== 'deny') throw new SpaceError('CONFIG_INVALID', `Unknown --e2b-public-traffic ${JSON.stringify(s)}: use allow (E2B's default: every port of an E2B sandbox reachable through the ingress without a token) or deny (each needs the sandbox's traffic token)`);
  return s;
}

/** Checks the E2B internet setting (flag `--e2b-internet`, `SPACE_E2B_INTERNET`). */
export function parseE2bInternet(s: string): 'allow' | 'deny' {
  if (s !== 'allow' && s !== 'deny') throw new SpaceError('CONFIG_INVALID', `Unknown --e2b-internet ${JSON.stringify(s)}: use allow (E2B's allowInternetAccess opens public destinations through the egress proxy) or deny`);
  return s;
}

/** Egress settings from SPACE_* environment variables (flags override them). */
function egressFromEnv(): EgressOptions {
  const e = process.env;
  return {
    ...(e.SPACE_EGRESS === 'off' ? { mode: 'off' as const } : {}),
    ...(e.SPACE_SANDBOX_NET ? { range: e.SPACE_SANDBOX_NET } : {}),
    ...(e.SPACE_EGRESS_PORT ? { port: Number(e.SPACE_EGRESS_PORT) } : {}),
    ...(e.SPACE_EGRESS_CA_FILE ? { upstreamCaFile: e.SPACE_EGRESS_CA_FILE } : {}),
    ...(e.SPACE_EGRESS_HOSTS ? { hosts: parseEgressHosts(e.SPACE_EGRESS_HOSTS) } : {}),
  };
}

/** Parses `NAME=SIZE[,NAME=SIZE]` (the --pool flag and SPACE_POOLS). */
export function parsePools(s: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of s.split(',').map((x) => x.trim()).filter(Boolean)) {
    const m = /^([a-z0-9][a-z0-9._-]{0,62})=(\d{1,2})$/.exec(part);
    if (!m) throw new SpaceError('BAD_REQUEST', `Invalid pool ${JSON.stringify(part)}: use TEMPLATE=SIZE, e.g. minimal=2`);
    out[m[1]!] = Number(m[2]);
  }
  return out;
}

/** Days the egress and ingress audit logs are kept. */
const EGRESS_LOG_DAYS = 30;

/** The blob keys of every stored snapshot and template image (what garbage collection must keep). */
async function snapshotKeys(store: MetadataStore): Promise<string[]> {
  const out: string[] = [];
  // One read (it runs while a cluster's blob writes wait), every snapshot row kept.
  for (const sn of await store.listAllSnapshots()) out.push(sn.blobKey);
  for (const t of await store.listTemplates()) if (t.image) out.push(templateImageBlobKey(t.tenantId, t.image.key));
  return out;
}

/**
 * Where the runtime restores template images from: a working copy in RAM (tmpfs), never on
 * disk; the durable copy is encrypted in the blob store. One directory per data directory.
 *
 * @example
 * templateImagesDir('/var/lib/space') // '/dev/shm/spaced-<12 hex>/template-images'
 */
export function templateImagesDir(dataDir: string): string {
  return path.join(ramDir(dataDir), 'template-images');
}

/** The daemon's directory in RAM (tmpfs): template images' working copies, checkpoint images under way. */
function ramDir(dataDir: string): string {
  return path.join('/dev/shm', `spaced-${createHash('sha256').update(path.resolve(dataDir)).digest('hex').slice(0, 12)}`);
}

/**
 * Where checkpoint images are written and snapshots unpacked on their way to and from the
 * blob store: in RAM, so a session's memory never lands on the node's disk in plaintext (the
 * stored snapshot is encrypted); the data directory only on a host without /dev/shm.
 *
 * @example defaultWorkDir('/var/lib/space') // '/dev/shm/spaced-<12 hex>/work'
 */
export function defaultWorkDir(dataDir: string): string {
  return existsSync('/dev/shm') ? path.join(ramDir(dataDir), 'work') : path.join(dataDir, 'work');
}

/** Parses `HOST:PORT` (IPv6 as `[::1]:7070`). */
export function parseListen(s: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d{1,5})$/.exec(s);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) throw new SpaceError('BAD_REQUEST', `Invalid listen address ${JSON.stringify(s)}: use HOST:PORT, e.g. 127.0.0.1:7070`);
  return { host: (m[1] ?? m[2])!, port };
}

/** A running daemon. */
export interface Daemon {
  url: string;
  state: DaemonState;
  /** Graceful stop: no new requests, in-flight ones finish (10 s at most), sandboxes keep running. */
  close(): Promise<void>;
}

/**
 * Starts the daemon.
 *
 * @example
 * const d = await startDaemon({ dataDir: '/tmp/space', listen: '127.0.0.1:0' });
 * console.log(d.url, d.state.keyFile);
 * await d.close();
 */
export async function startDaemon(opts: DaemonOptions = {}): Promise<Daemon> {
  const dataDir = path.resolve(opts.dataDir ?? defaultDataDir());
  const { host, port } = parseListen(opts.listen ?? process.env.SPACE_LISTEN ?? '127.0.0.1:7070');
  await fs.mkdir(dataDir, { recursive: true, mode: 0o700 });
  const running = readState(dataDir);
  if (running && running.pid !== process.pid) throw new SpaceError('BAD_REQUEST', `A daemon (pid ${running.pid}) already serves ${dataDir} at ${running.url}; stop it with \`space down --data-dir ${dataDir}\``);

  const logger = pino({ level: opts.logLevel ?? process.env.SPACE_LOG_LEVEL ?? 'info', base: { svc: 'spaced' } });
  // Settings first: a bad one changes nothing.
  const nodeName = checkNodeName(opts.nodeName ?? process.env.SPACE_NODE_NAME ?? os.hostname());
  const lostAfterMs = 1000 * (opts.nodeLostAfterS ?? Number(process.env.SPACE_NODE_LOST_AFTER ?? 30));
  if (!(lostAfterMs >= 3000)) throw new SpaceError('CONFIG_INVALID', '--node-lost-after must be a number of seconds, at least 3');
  const advertiseUrl = checkAdvertiseUrl(opts.advertiseUrl ?? process.env.SPACE_ADVERTISE_URL);
  const blobStore = await openBlobStore(opts.blobStore ?? process.env.SPACE_BLOB_STORE, dataDir);
  const database = opts.database ?? process.env.SPACE_DATABASE;
  // A PostgreSQL database may be shared by several nodes (a cluster): each acts on its own sandboxes only.
  const shared = !!database;
  if (shared && !advertiseUrl && (host === '0.0.0.0' || host === '::')) {
    blobStore.close();
    throw new SpaceError('CONFIG_INVALID', `Listening on ${host} with a PostgreSQL database, which other nodes may share: they could not reach this node at ${host}; say where they can with --advertise-url (e.g. http://10.0.0.5:${port})`);
  }
  let store: MetadataStore & { close(): Promise<void> };
  try {
    store = database ? await PostgresStore.open(checkDatabaseUrl(database, false), { logger, node: nodeName }) : SqliteStore.open(path.join(dataDir, 'space.db'));
  } catch (err) {
    blobStore.close();
    throw err;
  }
  try {
    await claimBlobStore(blobStore.store, store, blobStore.where);
  } catch (err) {
    blobStore.close();
    await store.close();
    throw err;
  }
  logger.info({ database: database ? 'postgres' : 'sqlite', blobs: blobStore.where }, 'stores open');
  /** Lets both stores go (every way out of start, and close). */
  const closeStores = async () => {
    blobStore.close();
    await store.close();
  };
  const rootfs = new RootfsStore(opts.templatesDir ?? process.env.SPACE_TEMPLATES_DIR ?? path.join(dataDir, 'templates'), opts.debianMirror ? { mirror: opts.debianMirror } : {});
  const pools = opts.pools ?? (process.env.SPACE_POOLS ? parsePools(process.env.SPACE_POOLS) : undefined);
  const keyDir = opts.keyDir ?? process.env.SPACE_KEY_DIR ?? path.join(dataDir, 'keys');
  const pkcs11Opts = opts.pkcs11 ?? (process.env.SPACE_PKCS11_MODULE ? { module: process.env.SPACE_PKCS11_MODULE, tokenLabel: process.env.SPACE_PKCS11_TOKEN ?? '', pin: process.env.SPACE_PKCS11_PIN ?? '' } : undefined);
  let pkcs11: Pkcs11KeyProvider | undefined;
  try {
    // A wrong module, token or PIN stops the daemon here (KEY_INVALID), not at the first restore.
    pkcs11 = pkcs11Opts ? Pkcs11KeyProvider.open(pkcs11Opts) : undefined;
  } catch (err) {
    await closeStores();
    throw err;
  }
  const encryptionKeys = new KeyService({
    store,
    providers: [new LocalKeyProvider(keyDir), ...(pkcs11 ? [pkcs11] : [])],
    nodeKey: { provider: 'local', ref: opts.nodeKey ?? process.env.SPACE_NODE_KEY ?? 'node.key' },
    logger,
    ...(process.env.SPACE_FAULT_INJECT?.startsWith('rotation:after-') ? { faultAfterRewraps: Number(process.env.SPACE_FAULT_INJECT.slice('rotation:after-'.length)) } : {}),
  });
  let ingressSecret: Buffer;
  let sessionSecret: Buffer;
  try {
    // A missing or bad node key stops the daemon here, never at the first restore: a data key
    // the deployment already has (the ingress's) must unwrap with it.
    await encryptionKeys.start();
    ingressSecret = await encryptionKeys.daemonSecret('ingress-passes');
    sessionSecret = await encryptionKeys.daemonSecret('console-sessions');
  } catch (err) {
    pkcs11?.close();
    await closeStores();
    // A node joining a deployment with a key of its own: say what a cluster needs.
    if (shared && err instanceof SpaceError && err.code === 'KEY_INVALID' && /does not unwrap/.test(err.message)) {
      throw new SpaceError('KEY_INVALID', `${err.message}. Every node of a deployment needs the same node key: copy it from a node of this deployment to ${path.join(keyDir, 'node.key')} (or give every node the same PKCS#11 token), then start this one again`, { cause: err });
    }
    throw err;
  }
  let egress: Awaited<ReturnType<typeof prepareEgress>>;
  try {
    egress = await prepareEgress({ ...egressFromEnv(), ...(opts.egress ?? {}) }, { dataDir, store, keys: encryptionKeys, logger });
  } catch (err) {
    pkcs11?.close();
    await closeStores();
    throw err;
  }
  const driverName = opts.driver ?? parseDriver(process.env.SPACE_DRIVER ?? 'gvisor');
  const accel = opts.microvm?.accel ?? (process.env.SPACE_MICROVM_ACCEL ? parseAccel(process.env.SPACE_MICROVM_ACCEL) : undefined);
  const kernelDeb = opts.microvm?.kernelDeb ?? process.env.SPACE_MICROVM_KERNEL_DEB;
  const cacheDir = opts.microvm?.cacheDir ?? process.env.SPACE_MICROVM_CACHE_DIR;
  const network = egress ? { network: egress.network } : {};
  const disksMode = await diskSettings(opts.disks, { shared, store, imagesDir: templateImagesDir(dataDir), hostDir: opts.disks?.dir ?? process.env.SPACE_DISK_POOL ?? dataDir, logger });
  const disks = disksMode.settings;
  if (disks) {
    // The driver opens the pool there; the work directory is chosen from it below.
    disks.dir ??= path.join(dataDir, 'disks');
    // The pool is kept encrypted at rest under a secret of the deployment's, wrapped by the node key.
    disks.key = await encryptionKeys.daemonSecret('disk-pool');
  }
  // Each driver lists the sandboxes its pool holds, so each has a pool of its own: the default
  // driver's is the pool directory (its vault holds the work directory, below), another's
  // `<pool directory>/<driver>`.
  const disksOf = (name: 'gvisor' | 'microvm') => (disks ? { disks: { ...disks, dir: name === driverName ? disks.dir! : path.join(disks.dir!, name) } } : {});
  const make = (name: 'gvisor' | 'microvm'): SandboxDriver =>
    name === 'microvm'
      ? new MicrovmDriver({ dataDir, ...network, ...(accel ? { accel } : {}), ...(kernelDeb ? { kernelDeb } : {}), ...(cacheDir ? { cacheDir } : {}), ...disksOf(name) })
      : new GvisorDriver({ dataDir, ...network, ...disksOf(name) });
  const driver = make(driverName);
  const extra = (opts.drivers ?? (process.env.SPACE_DRIVERS ? parseDrivers(process.env.SPACE_DRIVERS) : [])).filter((n) => n !== driverName).map(make);
  const gcFault = process.env.SPACE_FAULT_INJECT?.startsWith('gc:after-') ? Number(process.env.SPACE_FAULT_INJECT.slice('gc:after-'.length)) : undefined;
  // Nodes sharing the database share the blob store: their writes and collections take turns.
  const blobs = new DedupBlobStore(new EncryptedBlobStore(blobStore.store, encryptionKeys, store), encryptionKeys, gcFault, store.blobCollectionLock?.());
  // Template images used to be kept in plaintext on disk: they are captured again (and stored encrypted).
  await fs.rm(path.join(dataDir, 'template-images'), { recursive: true, force: true });
  const imagesDir = templateImagesDir(dataDir);
  // With disks, a snapshot's disk stream (GiBs) passes through the work directory: on disk, in
  // the pool's vault (encrypted at rest with it); `<data>/work` beside a pool made before vaults.
  const workDir = opts.workDir ?? process.env.SPACE_WORK_DIR ?? (disks?.dir ? (DiskPool.scratchDir(disks.dir) ?? path.join(dataDir, 'work')) : defaultWorkDir(dataDir));
  // In a cluster a volume is kept on the node that made it, and its sandboxes run there (docs/cluster.md).
  const volumes = await openVolumes(opts.volumes ?? parseVolumesMode(process.env.SPACE_VOLUMES ?? 'auto'), dataDir, store, encryptionKeys, logger, shared ? nodeName : undefined);
  const service = new SandboxService({
    store,
    driver,
    drivers: extra,
    logger,
    blobs,
    rootfs,
    workDir,
    nodeName,
    shared,
    nodeUp: async (name) => (await nodeStates(store, lostAfterMs)).some((n) => n.name === name && n.state === 'up'),
    imagesDir,
    uploadsDir: path.join(dataDir, 'uploads'),
    maxSandboxes: opts.maxSandboxes ?? 64,
    ...(opts.maxMemoryMb ? { maxMemoryMb: opts.maxMemoryMb } : {}),
    ...(egress ? { egress: egress.sandbox } : {}),
    ...(volumes ? { volumes } : {}),
    ...(pools ? { builtinPools: pools } : {}),
    ...(process.env.SPACE_FAULT_INJECT ? { faults: process.env.SPACE_FAULT_INJECT.split(',') } : {}),
    ...(opts.usageSampleMs ? { usageSampleMs: opts.usageSampleMs } : {}),
  });
  const keys = new ApiKeys(store);
  /** The daemon's own ports, which the proxy never connects to. */
  const daemonPorts = new Set<number>();
  const isLoopback = (ip: string) => ip.startsWith('127.') || ip === '::1';
  const daemonEndpoint = (ip: string, p: number) => daemonPorts.has(p) && (isLoopback(ip) || ip === host || host === '0.0.0.0' || host === '::');
  const keyFile = path.join(dataDir, 'admin.key');
  // A cluster node's lease keeper (lease-keeper.ts): pauses the node's sandboxes (gVisor's and
  // microVMs) if this daemon dies or hangs, before other nodes may take them over.
  const gvisorRuns = [driver, ...extra].some((d) => d.name === 'gvisor');
  const vmDirs = [driver, ...extra].flatMap((d) => (d instanceof MicrovmDriver ? [d.vmsDir] : []));
  const pausedFile = path.join(dataDir, 'lease-paused.json');
  const keeper = shared && (gvisorRuns || vmDirs.length) ? new LeaseKeeper({ leaseFile: path.join(dataDir, 'lease.json'), pausedFile, lostAfterMs, runsc: 'runsc', roots: gvisorRuns ? [path.join(dataDir, 'runsc')] : [], vmDirs }) : undefined;
  try {
    if (keeper) {
      // The keeper of a daemon that died may be pausing right now and writes what it paused
      // only after: it is waited for (at most 30 s), so the record read below is whole.
      const retired = await LeaseKeeper.retirePrevious(path.join(dataDir, 'lease.json'));
      if (retired.killed) logger.warn(retired, 'a lease keeper of the previous daemon did not exit within 30 s and was killed; what it paused may stay paused');
      // What the keeper of a daemon that died paused: its own sessions run again (re-adopted
      // below); the others were taken over and go in recovery.
      const r = await LeaseKeeper.resumeOwn(pausedFile, 'runsc', async (id) => {
        const sb = await store.getSandbox(id);
        return !!sb && sb.node === nodeName && (sb.state === 'running' || sb.state === 'starting');
      });
      if (r.resumed.length || r.left.length) logger.warn(r, 'sandboxes the lease keeper paused: this node\'s own resumed, the rest (taken over) left for removal');
    }
    await service.start();
    // Checkpoint images used to pass through <data>/work, on disk: recovery has finished what a
    // crash left there (the journal names each image's path), so the directory goes.
    if (path.resolve(workDir) !== path.join(dataDir, 'work')) await fs.rm(path.join(dataDir, 'work'), { recursive: true, force: true });
    await egress?.start(service, daemonEndpoint);
    if (!(await keys.any())) {
      const { key } = await keys.create({ tenantId: 'default', name: 'first admin key', admin: true });
      await fs.writeFile(keyFile, key + '\n', { mode: 0o600 });
      logger.info({ keyFile }, 'wrote the first admin API key');
    }
  } catch (err) {
    await service.shutdown().catch(() => {});
    await egress?.close().catch(() => {});
    await closeStores();
    throw err;
  }

  // From here on a step that fails (a listener's port taken, …) stops what started before it,
  // newest first: a daemon that could not start leaves nothing running behind it (warm pools,
  // timers, the egress proxy), and an embedding process (a test) can exit.
  const started: (() => Promise<unknown>)[] = [];
  // The working copies of template images: RAM is given back; the next start reloads them.
  // The work directory stays if an operation left something in it for the next start.
  // A failure here must not skip the rest of a stop (stores, egress, the state file).
  const dropRamCopies = async () => {
    await fs.rm(imagesDir, { recursive: true, force: true, maxRetries: 3 }).catch((err) => logger.warn({ err, imagesDir }, 'removing the working copies of template images failed'));
    await fs.rmdir(workDir).catch(() => {});
    await fs.rmdir(ramDir(dataDir)).catch(() => {});
  };
  const abort = async (err: unknown): Promise<never> => {
    for (const stop of started.reverse()) await stop().catch(() => {});
    await service.shutdown().catch(() => {});
    await dropRamCopies();
    await egress?.close().catch(() => {});
    pkcs11?.close();
    await closeStores();
    throw err;
  };
  const maxUploadBytes = opts.maxUploadBytes ?? 4 * 1024 ** 3;
  const hostUrl = (h: string, p: number) => `http://${h.includes(':') ? `[${h}]` : h}:${p}`;
  // The ingress on a listener of its own (host names route to sandboxes' ports); before the E2B
  // API, whose sandboxes carry its domain.
  const ingressListen = opts.ingress?.listen ?? process.env.SPACE_INGRESS_LISTEN ?? (port === 0 ? `${host.includes(':') ? `[${host}]` : host}:0` : `${host.includes(':') ? `[${host}]` : host}:${port + 2}`);
  const ingress = await startIngress(
    { service, network: egress?.network, secret: ingressSecret, logger: logger.child({ api: 'ingress' }), ...(shared ? { nodes: () => nodeStates(store, lostAfterMs) } : {}) },
    { listen: ingressListen, ...(opts.ingress?.domain ?? process.env.SPACE_INGRESS_DOMAIN ? { domain: opts.ingress?.domain ?? process.env.SPACE_INGRESS_DOMAIN } : {}), ...(opts.ingress?.certFile ? { certFile: opts.ingress.certFile } : {}), ...(opts.ingress?.keyFile ? { keyFile: opts.ingress.keyFile } : {}), ...(opts.ingress?.maxConnectionsPerSandbox !== undefined ? { maxConnectionsPerSandbox: opts.ingress.maxConnectionsPerSandbox } : {}) },
  ).catch(abort);
  if (ingress) started.push(() => ingress.close());
  if (ingress) daemonPorts.add(Number(new URL(ingress.url).port));
  // The E2B-compatible API on its own listener (see @space/e2b for why).
  const e2bListen = opts.e2bListen ?? process.env.SPACE_E2B_LISTEN ?? (port === 0 ? `${host.includes(':') ? `[${host}]` : host}:0` : `${host.includes(':') ? `[${host}]` : host}:${port + 1}`);
  let e2b: Awaited<ReturnType<typeof buildE2bApp>> | undefined;
  let e2bUrl: string | undefined;
  if (e2bListen !== 'off') {
    const l = parseListen(e2bListen);
    const internet = opts.e2bInternet ?? (process.env.SPACE_E2B_INTERNET ? parseE2bInternet(process.env.SPACE_E2B_INTERNET) : 'allow');
    const publicTraffic = opts.e2bPublicTraffic ?? (process.env.SPACE_E2B_PUBLIC_TRAFFIC ? parseE2bPublicTraffic(process.env.SPACE_E2B_PUBLIC_TRAFFIC) : 'allow');
    // With a shared database, a request for another node's sandbox goes to that node's E2B listener.
    const beforeRoutes = (a: FastifyInstance) =>
      registerE2bForwarding(a, {
        self: nodeName,
        find: (id) => store.getSandbox(id),
        owns: (sb) => service.owns(sb),
        nodes: async () => (await nodeStates(store, lostAfterMs)).flatMap((n) => (n.e2bUrl ? [{ ...n, url: n.e2bUrl }] : [])),
        errorBody: (e) => ({ code: e.status, message: `${e.code}: ${e.message}` }),
        volumeNode: async (id) => service.volumes?.nodeOfId(id),
        placeVolumes: async (apiKey, mounts) => (service.volumes ? service.volumes.nodeOfMounts((await keys.verify(apiKey)).tenantId, mounts.map((m) => ({ volume: m?.name, path: m?.path }))) : undefined),
      });
    const tokens = new AccessTokens(await encryptionKeys.daemonSecret('e2b-access-tokens').catch(abort));
    const e2bApp = await buildE2bApp({ service, keys, tokens, maxUploadBytes, internet, publicTraffic, ...(ingress ? { ingressDomain: ingress.domain } : {}), logger: logger.child({ api: 'e2b' }), ...(shared ? { beforeRoutes } : {}) }).catch(abort);
    e2b = e2bApp;
    started.push(() => e2bApp.close());
    await e2bApp.listen({ host: l.host, port: l.port }).catch(abort);
    const a = e2b.server.address();
    e2bUrl = hostUrl(l.host, typeof a === 'object' && a ? a.port : l.port);
    daemonPorts.add(typeof a === 'object' && a ? a.port : l.port);
  }
  // Chunks no snapshot references any more go at start and every 10 minutes (and on demand). In
  // a cluster the collection takes the deployment's blob lock (every node's snapshots wait for
  // it), and a scheduled one is left out when another node collected in the last 9 minutes.
  const gcNow = async (opts: { scheduled?: boolean } = {}) => {
    // Only in a blob store that is still this deployment's (its collection deletes what this
    // database does not reference).
    await claimBlobStore(blobStore.store, store, blobStore.where);
    const deleted = await blobs.gc(() => snapshotKeys(store), opts.scheduled && shared ? { minIntervalMs: 9 * 60_000 } : {});
    if (deleted) logger.info({ deleted }, 'snapshot chunks collected');
    const pruned = await store.pruneEgressLog(new Date(Date.now() - EGRESS_LOG_DAYS * 86_400_000).toISOString());
    if (pruned) logger.info({ pruned }, 'old egress log entries deleted');
    const prunedIngress = await store.pruneIngressLog(new Date(Date.now() - EGRESS_LOG_DAYS * 86_400_000).toISOString());
    if (prunedIngress) logger.info({ pruned: prunedIngress }, 'old ingress log entries deleted');
    return deleted;
  };
  // In the background: reading every manifest must not delay the listener. Close waits for it.
  let gcRun: Promise<unknown> = Promise.resolve();
  const gcLater = () => {
    gcRun = gcNow({ scheduled: true }).catch((err) => logger.error({ err }, 'chunk collection failed'));
  };
  gcLater();
  const gcTimer = setInterval(gcLater, 10 * 60_000);
  gcTimer.unref();
  started.push(async () => {
    clearInterval(gcTimer);
    await gcRun;
  });
  const instance = randomUUID();
  // Draining: the flag in the node's record (kept across restarts), then every session moved
  // to the node with most room; those that ran are woken there (wakeOnArrival, after its heartbeat).
  const drain = async (on: boolean, progress: (ev: DrainEvent) => void = () => {}): Promise<DrainResult> => {
    if (!heartbeat) throw new SpaceError('DAEMON_SHUTTING_DOWN', 'The node is still starting; drain it in a moment');
    await heartbeat.setDraining(on);
    const result: DrainResult = { node: nodeName, draining: on, moved: [], stayed: [] };
    if (!on) return result;
    const mine = (await store.sandboxesInStates(['running', 'paused', 'hibernated'], { node: nodeName })).filter((sb) => service.owns(sb));
    const plan = planDrain(await nodeViews(store, lostAfterMs), nodeName, mine);
    const sessions = mine.length;
    progress({ type: 'plan', sessions });
    const stayed = (id: string, reason: string) => {
      result.stayed.push({ id, reason });
      progress({ type: 'stayed', id, reason, done: result.moved.length + result.stayed.length, sessions });
    };
    for (const sb of mine) {
      const target = plan.get(sb.id);
      if (!target) {
        stayed(sb.id, 'no other node is up with room for it');
        continue;
      }
      try {
        await service.move(sb.tenantId, sb.id, target, { wakeThere: true });
        result.moved.push({ id: sb.id, node: target });
        progress({ type: 'moved', id: sb.id, node: target, done: result.moved.length + result.stayed.length, sessions });
      } catch (err) {
        stayed(sb.id, err instanceof Error ? err.message : String(err));
      }
    }
    logger.warn({ moved: result.moved.length, stayed: result.stayed.length }, 'node drained');
    return result;
  };
  // The node's heartbeat (made once the listener's URL is known; drains go through it).
  let heartbeat: NodeHeartbeat | undefined;
  const app = await buildApp({ service, keys, encryptionKeys, sessionSecret, gc: gcNow, ...(shared ? { cluster: { self: nodeName, nodes: () => nodeStates(store, lostAfterMs), draining: () => !!heartbeat?.draining, drain: (on: boolean, progress?: (ev: DrainEvent) => void) => drain(on, progress) } } : {}), drivers: [driver, ...extra], maxUploadBytes, logger, instance, ...(e2bUrl ? { e2bUrl } : {}), ...(ingress ? { ingress } : {}), ...(egress ? { secrets: egress.secrets } : {}), nodes: () => nodeViews(store, lostAfterMs) }).catch(abort);
  started.push(() => app.close());
  await app.listen({ host, port }).catch(abort);
  const addr = app.server.address();
  const actualPort = typeof addr === 'object' && addr ? addr.port : port;
  daemonPorts.add(actualPort);
  const url = hostUrl(host, actualPort);
  const state: DaemonState = { pid: process.pid, url, dataDir, keyFile, startedAt: new Date().toISOString(), instance, ...(e2bUrl ? { e2bUrl } : {}), ...(ingress ? { ingressUrl: ingress.url, ingressDomain: ingress.domain } : {}), disks: { mode: disksMode.mode, why: disksMode.why, ...(driver.disks?.poolBytes ? { poolBytes: driver.disks.poolBytes } : {}) } };
  const stateFile = path.join(dataDir, 'spaced.json');
  await fs.writeFile(`${stateFile}.tmp`, JSON.stringify(state, null, 2), { mode: 0o600 }).catch(abort);
  await fs.rename(`${stateFile}.tmp`, stateFile).catch(abort);
  const duties = { ...clusterDuties({ service, store, nodeName, lostAfterMs, logger, ...(keeper ? { keeper } : {}) }), report: () => ({ warm: service.pool.readyCounts() }) };
  // A drained node stays drained across restarts (the flag is in its record).
  const wasDraining = shared && (await store.listNodes().catch(abort)).some((n) => n.name === nodeName && n.draining);
  heartbeat = new NodeHeartbeat(store, { name: nodeName, url: advertiseUrl ?? url, ...(wasDraining ? { draining: true } : {}), ...(e2bUrl ? { e2bUrl: advertised(e2bUrl, advertiseUrl) } : {}), ...(ingress ? { ingressUrl: advertised(ingress.url, advertiseUrl) } : {}), version: VERSION, drivers: [driver, ...extra].map((d) => d.name), cpus: os.cpus().length, memoryMb: Math.round(os.totalmem() / 2 ** 20), ...service.capacity, startedAt: state.startedAt, heartbeatAt: state.startedAt }, logger, Math.max(1000, Math.floor(lostAfterMs / 3)), shared ? duties : {});
  started.push(() => heartbeat!.stop());
  await heartbeat.start().catch(abort);
  await keeper?.start().catch(abort);
  logger.info({ url, dataDir, node: nodeName, e2bUrl, ingressUrl: ingress?.url }, 'spaced listening');

  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      logger.info('shutting down');
      const force = setTimeout(() => {
        app.server.closeAllConnections();
        e2b?.server.closeAllConnections();
      }, 10_000);
      force.unref();
      await Promise.all([app.close(), e2b?.close(), ingress?.close()]);
      clearTimeout(force);
      clearInterval(gcTimer);
      await gcRun;
      // Its duties (a cluster's) end before the service does; the record says it stopped.
      await keeper?.stop();
      await heartbeat.stop();
      await service.shutdown();
      await dropRamCopies();
      await egress?.close();
      pkcs11?.close();
      await closeStores();
      if (existsSync(stateFile) && readState(dataDir)?.pid === process.pid) await fs.rm(stateFile, { force: true });
      logger.info('stopped');
    })());
  return { url, state, close };
}
