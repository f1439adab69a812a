/** `sandbox.pty`: interactive terminals. */
import { SpaceError, asErrorCode } from '@space/api';
import type { ApiClient } from './client.js';
import { CommandHandle, outputEvents, type CommandResult } from './commands.js';

/** Options of {@link Pty.create}. */
export interface PtyCreateOpts {
  cols: number;
  rows: number;
  /** Terminal output (raw bytes). */
  onData: (data: Uint8Array) => void;
  /** Program and arguments to run. @default the user's login shell from /etc/passwd, as a login shell (`-l`) */
  cmd?: string[];
  env?: Record<string, string>;
  cwd?: string;
  user?: string;
  timeoutMs?: number;
}

/**
 * A terminal session.
 *
 * @example
 * const t = await sandbox.pty.create({ cols: 80, rows: 24, onData: (d) => process.stdout.write(d) });
 * await t.sendInput('ls\n');
 * await t.resize(120, 40);
 * await t.kill();
 */
export class PtyHandle extends CommandHandle {
  constructor(api: ApiClient, sandboxId: string, pid: number, done: Promise<CommandResult>) {
    super(api, sandboxId, pid, done);
  }

  /** Types into the terminal. */
  sendInput(data: string | Uint8Array): Promise<void> {
    return this.sendStdin(data);
  }

  /** Changes the terminal size. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.api.json('POST', `/v1/sandboxes/${this.sandboxId}/commands/${this.pid}/resize`, { json: { cols, rows } });
  }
}

/** Terminals of one sandbox. */
export class Pty {
  constructor(
    private readonly api: ApiClient,
    private readonly sandboxId: string,
  ) {}

  /** Starts a program on a new PTY; output goes to `onData`. */
  async create(opts: PtyCreateOpts): Promise<PtyHandle> {
    const res = await this.api.request('POST', `/v1/sandboxes/${this.sandboxId}/commands`, {
      json: { ...(opts.cmd ? { argv: opts.cmd } : {}), pty: { cols: opts.cols, rows: opts.rows }, ...(opts.env ? { env: opts.env } : {}), ...(opts.cwd ? { cwd: opts.cwd } : {}), ...(opts.user ? { user: opts.user } : {}), ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}) },
      timeoutMs: 0,
    });
    const events = outputEvents(res);
    const first = await events.next();
    if (first.done || first.value.type !== 'start') throw new SpaceError('AGENT_PROTOCOL_ERROR', 'The terminal stream did not start with a start event');
    const done = (async (): Promise<CommandResult> => {
      for await (const ev of events) {
        if (ev.type === 'pty' || ev.type === 'stdout' || ev.type === 'stderr') opts.onData(ev.data);
        else if (ev.type === 'exit') return { exitCode: ev.exitCode, signal: ev.signal, stdout: '', stderr: '', timedOut: !!ev.timedOut };
        else if (ev.type === 'error') throw new SpaceError(asErrorCode(ev.code), ev.message);
      }
      throw new SpaceError('AGENT_DISCONNECTED', 'The terminal stream ended without an exit status');
    })();
    done.catch(() => {});
    return new PtyHandle(this.api, this.sandboxId, first.value.pid, done);
  }
}
