/** The `Sandbox` facade: create, connect, list, kill; sub-objects for commands, files, PTYs. */
import type { CreateSandboxOpts, EgressLogPage, EgressPolicy, Sandbox as CoreSandbox, SandboxEvent, SandboxState as CoreSandboxState, Snapshot, SnapshotPolicy } from '@space/api';
import { ApiClient, SpaceError, type ConnectionOpts } from './client.js';
import { asErrorCode } from '@space/api';
import { Commands } from './commands.js';
import { Files } from './files.js';
import { Ports } from './ports.js';
import { Pty } from './pty.js';

/** Lifecycle states of a sandbox. */
export type SandboxState = CoreSandboxState;

/** A sandbox as the API returns it. */
export type SandboxInfo = CoreSandbox;

/** Options of {@link Sandbox.create}: what to create, and how to reach the daemon. */
export interface SandboxCreateOpts extends CreateSandboxOpts, ConnectionOpts {}

/** Options of {@link Sandbox.list}. */
export interface SandboxListOpts extends ConnectionOpts {
  state?: SandboxState[];
  /** Every pair must match. */
  metadata?: Record<string, string>;
  /** Page size. @default 50 */
  limit?: number;
  /** `nextCursor` of the previous page. */
  cursor?: string;
}

/** A stored snapshot of a sandbox (memory, processes, filesystem). */
export type SnapshotInfo = Snapshot;
export type { EgressLogPage, EgressPolicy, SandboxEvent, SnapshotPolicy };

/** One page of sandboxes. */
export interface SandboxPage {
  items: SandboxInfo[];
  nextCursor?: string;
}

/** Host resources a sandbox costs. */
export interface SandboxUsage {
  /** Resident memory of its host processes, bytes. */
  rssBytes: number;
  /** Memory charged to it (its working set: file pages it has not used lately are left out), bytes. */
  cgroupBytes?: number;
  /** CPU time used since it started, ns. */
  cpuNs?: number;
  /** What its disk holds (template files included), bytes, when it has one. */
  diskUsedBytes?: number;
  /** Its disk's size, bytes. */
  diskLimitBytes?: number;
}

/**
 * A SPACE sandbox.
 *
 * @example
 * import { Sandbox } from '@space/sdk';
 * const sb = await Sandbox.create({ template: 'minimal', memoryMb: 256 });
 * try {
 *   const r = await sb.commands.run('uname -a');
 *   console.log(r.stdout);
 * } finally {
 *   await sb.kill();
 * }
 */
export class Sandbox {
  /** Run processes. */
  readonly commands: Commands;
  /** Read and write files. */
  readonly files: Files;
  /** Interactive terminals. */
  readonly pty: Pty;
  /** Ports exposed through the daemon's ingress (preview URLs). */
  readonly ports: Ports;

  private constructor(
    private readonly api: ApiClient,
    /** The sandbox as last fetched. */
    public info: SandboxInfo,
  ) {
    this.commands = new Commands(api, info.id);
    this.files = new Files(api, info.id);
    this.pty = new Pty(api, info.id);
    this.ports = new Ports(api, info.id);
  }

  /** The sandbox id. */
  get id(): string {
    return this.info.id;
  }

  /** Creates a sandbox and waits until it accepts commands. */
  static async create(opts: SandboxCreateOpts = {}): Promise<Sandbox> {
    const api = new ApiClient(opts);
    const { apiUrl: _u, apiKey: _k, requestTimeoutMs: _t, signal, ...body } = opts;
    const info = await api.json<SandboxInfo>('POST', '/v1/sandboxes', { json: body, ...(signal ? { signal } : {}) });
    return new Sandbox(api, info);
  }

  /** Connects to an existing sandbox of your tenant. */
  static async connect(id: string, opts: ConnectionOpts = {}): Promise<Sandbox> {
    const api = new ApiClient(opts);
    return new Sandbox(api, await api.json<SandboxInfo>('GET', `/v1/sandboxes/${encodeURIComponent(id)}`, opts.signal ? { signal: opts.signal } : {}));
  }

  /** Lists your sandboxes, newest first. */
  static async list(opts: SandboxListOpts = {}): Promise<SandboxPage> {
    const api = new ApiClient(opts);
    return api.json<SandboxPage>('GET', '/v1/sandboxes', {
      query: {
        state: opts.state?.join(','),
        label: opts.metadata ? Object.entries(opts.metadata).map(([k, v]) => `${k}=${v}`) : undefined,
        limit: opts.limit,
        cursor: opts.cursor,
      },
    });
  }

  /** Kills a sandbox by id. */
  static async kill(id: string, opts: ConnectionOpts = {}): Promise<SandboxInfo> {
    return new ApiClient(opts).json<SandboxInfo>('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`);
  }

  /** Kills this sandbox and frees its resources. */
  async kill(): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('DELETE', `/v1/sandboxes/${this.id}`);
  }

  /** Re-reads the sandbox's state. */
  async refresh(): Promise<SandboxInfo> {
    this.info = await this.api.json<SandboxInfo>('GET', `/v1/sandboxes/${this.id}`);
    return this.info;
  }

  /** True while the sandbox runs. */
  async isRunning(): Promise<boolean> {
    return (await this.refresh()).state === 'running';
  }

  /** Freezes the sandbox in memory (no CPU, no disk); commands fail until {@link resume}. */
  async pause(): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/pause`);
  }

  /** Unfreezes a paused sandbox. */
  async resume(): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/resume`);
  }

  /** Saves the whole sandbox to a snapshot and frees its host resources; any command or file call wakes it. */
  async hibernate(): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/hibernate`, { timeoutMs: 600_000 });
  }

  /**
   * Moves it to another node of the cluster (`Nodes.list`): hibernated on its node, woken on
   * `node` when it was running, its disk with it. Sandboxes with volumes do not move.
   *
   * @example
   * await sb.move('node-b'); // sb.info.node === 'node-b'
   */
  async move(node: string): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/move`, { json: { node }, timeoutMs: 1_200_000 });
  }

  /** Restores a hibernated sandbox now (calls on it also wake it on demand). */
  async wake(): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/wake`, { timeoutMs: 600_000 });
  }

  /**
   * Takes a snapshot now; the sandbox keeps running (stopped for the checkpoint's duration,
   * reported as `downtimeMs`). Fails with `SNAPSHOT_UNSUPPORTED_STATE` when a process holds
   * sockets this runtime cannot save; the sandbox keeps running then too.
   */
  async snapshot(opts: { name?: string } = {}): Promise<SnapshotInfo> {
    return this.api.json<SnapshotInfo>('POST', `/v1/sandboxes/${this.id}/snapshots`, { json: opts, timeoutMs: 600_000 });
  }

  /** The sandbox's snapshots, oldest first. */
  async snapshots(): Promise<SnapshotInfo[]> {
    return (await this.api.json<{ snapshots: SnapshotInfo[] }>('GET', `/v1/sandboxes/${this.id}/snapshots`)).snapshots;
  }

  /**
   * Deletes one of the sandbox's snapshots: its stored image and disk, and the node's copy.
   * The others stay restorable. Fails with `SANDBOX_INVALID_STATE` (409) for the snapshot a
   * hibernated sandbox sleeps in, and `SNAPSHOT_NOT_FOUND` (404) for one the sandbox does not have.
   *
   * @example
   * for (const s of (await sb.snapshots()).slice(0, -3)) await sb.deleteSnapshot(s.id); // keep the newest three
   */
  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.api.request('DELETE', `/v1/sandboxes/${this.id}/snapshots/${encodeURIComponent(snapshotId)}`);
  }

  /** Rolls the sandbox back to one of its snapshots, in place (verified before anything changes). */
  async rollback(snapshotId: string): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/rollback`, { json: { snapshotId }, timeoutMs: 600_000 });
  }

  /**
   * Copies this sandbox into `count` independent sandboxes: from a snapshot taken now (this
   * one keeps running) or from `fromSnapshot`.
   *
   * @example
   * const copies = await sb.fork({ count: 3 });
   * for (const c of copies) await c.commands.run('echo $SPACE_SANDBOX_ID');
   */
  async fork(opts: { count?: number; fromSnapshot?: string } = {}): Promise<Sandbox[]> {
    const r = await this.api.json<{ results: ({ sandbox: SandboxInfo } | { error: { code: string; message: string } })[] }>('POST', `/v1/sandboxes/${this.id}/fork`, {
      json: { count: opts.count ?? 1, ...(opts.fromSnapshot ? { snapshotId: opts.fromSnapshot } : {}) },
      timeoutMs: 600_000,
    });
    const ok = r.results.filter((x): x is { sandbox: SandboxInfo } => 'sandbox' in x).map((x) => new Sandbox(this.api, x.sandbox));
    const failed = r.results.find((x): x is { error: { code: string; message: string } } => 'error' in x);
    if (failed && ok.length === 0) throw new SpaceError(asErrorCode(failed.error.code), failed.error.message);
    return ok;
  }

  /** Sets rolling snapshots (`null` turns them off): one every `intervalMs`, the newest `keep` kept. */
  async setSnapshotPolicy(policy: SnapshotPolicy | null): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('PUT', `/v1/sandboxes/${this.id}/snapshot-policy`, { json: policy });
  }

  /** What happened to the sandbox (snapshots, refusals, recoveries, ...), oldest first. */
  async events(): Promise<SandboxEvent[]> {
    return (await this.api.json<{ events: SandboxEvent[] }>('GET', `/v1/sandboxes/${this.id}/events`)).events;
  }

  /** The sandbox's egress policy. */
  async egress(): Promise<EgressPolicy> {
    return this.api.json<EgressPolicy>('GET', `/v1/sandboxes/${this.id}/egress`);
  }

  /** Replaces the egress policy (missing fields take their defaults); applies from the next request on. */
  async setEgress(policy: Partial<EgressPolicy>): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('PUT', `/v1/sandboxes/${this.id}/egress`, { json: policy });
  }

  /** Attaches secrets by name: processes started from now on see placeholders in env vars of those names. */
  async attachSecrets(names: string[]): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('POST', `/v1/sandboxes/${this.id}/secrets`, { json: { names } });
  }

  /** Detaches a secret: the proxy stops replacing its placeholder at the next request. */
  async detachSecret(name: string): Promise<void> {
    this.info = await this.api.json<SandboxInfo>('DELETE', `/v1/sandboxes/${this.id}/secrets/${encodeURIComponent(name)}`);
  }

  /** The audit log of the sandbox's egress, newest first. */
  async egressLog(opts: { limit?: number; cursor?: string } = {}): Promise<EgressLogPage> {
    return this.api.json<EgressLogPage>('GET', `/v1/sandboxes/${this.id}/egress/log`, { query: { limit: opts.limit, cursor: opts.cursor } });
  }

  /** Host memory the sandbox costs. */
  async usage(): Promise<SandboxUsage> {
    return this.api.json<SandboxUsage>('GET', `/v1/sandboxes/${this.id}/usage`);
  }
}
