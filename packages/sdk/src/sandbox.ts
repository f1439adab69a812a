/** The `Sandbox` facade: create, connect, list, kill; sub-objects for commands, files, PTYs. */
import type { CreateSandboxOpts, Sandbox as CoreSandbox, SandboxState as CoreSandboxState } from '@space/core';
import { ApiClient, type ConnectionOpts } from './client.js';
import { Commands } from './commands.js';
import { Files } from './files.js';
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

/** One page of sandboxes. */
export interface SandboxPage {
  items: SandboxInfo[];
  nextCursor?: string;
}

/** Host resources a sandbox costs. */
export interface SandboxUsage {
  rssBytes: number;
  cgroupBytes?: number;
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

  private constructor(
    private readonly api: ApiClient,
    /** The sandbox as last fetched. */
    public info: SandboxInfo,
  ) {
    this.commands = new Commands(api, info.id);
    this.files = new Files(api, info.id);
    this.pty = new Pty(api, info.id);
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

  /** Host memory the sandbox costs. */
  async usage(): Promise<SandboxUsage> {
    return this.api.json<SandboxUsage>('GET', `/v1/sandboxes/${this.id}/usage`);
  }
}
