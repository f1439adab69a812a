/** `sandbox.commands`: run processes in a sandbox, stream their output, drive background ones. */
import { SpaceError, asErrorCode } from '@space/api';
import { ndjson, type ApiClient, type HttpResponse } from './client.js';

/** Options of {@link Commands.run}. */
export interface CommandRunOpts {
  /** Called with each chunk of stdout (UTF-8 decoded). */
  onStdout?: (data: string) => void;
  /** Called with each chunk of stderr (UTF-8 decoded). */
  onStderr?: (data: string) => void;
  /** Extra environment variables. */
  env?: Record<string, string>;
  /** Working directory. @default the user's home */
  cwd?: string;
  /** User name or uid. @default "user" (uid 1000) */
  user?: string;
  /** Kill the process after this many ms. */
  timeoutMs?: number;
  /** Keep stdin open (send with {@link CommandHandle.sendStdin}). @default false */
  stdin?: boolean;
  /** Aborting stops waiting and kills a foreground process. */
  signal?: AbortSignal;
  /** Free-form tag shown in listings. */
  tag?: string;
}

/** Result of a finished command. */
export interface CommandResult {
  exitCode: number | null;
  /** Signal that ended it, e.g. "SIGKILL". */
  signal: string | null;
  stdout: string;
  stderr: string;
  /** True when `timeoutMs` killed it. */
  timedOut: boolean;
}

/** A process the agent runs, as listed. */
export type { ProcessInfo } from '@space/protocol';
import type { ProcessInfo } from '@space/protocol';

/** Raw output events of a process stream. */
export type OutputEvent = { type: 'start'; pid: number } | { type: 'stdout' | 'stderr' | 'pty'; data: Uint8Array } | { type: 'exit'; exitCode: number | null; signal: string | null; timedOut?: boolean } | { type: 'error'; code: string; message: string };

/** Parses a command stream's NDJSON into {@link OutputEvent}s. */
export async function* outputEvents(res: HttpResponse): AsyncGenerator<OutputEvent> {
  for await (const ev of ndjson(res)) {
    if (ev.type === 'stdout' || ev.type === 'stderr' || ev.type === 'pty') yield { type: ev.type, data: Buffer.from(String(ev.data), 'base64') };
    else yield ev as OutputEvent;
  }
}

/** Collects a stream into a result, calling the callbacks on the way. */
async function collect(events: AsyncIterable<OutputEvent>, opts: Pick<CommandRunOpts, 'onStdout' | 'onStderr'> & { onPty?: (d: Uint8Array) => void }): Promise<CommandResult> {
  const out: string[] = [];
  const err: string[] = [];
  const dOut = new TextDecoder();
  const dErr = new TextDecoder();
  for await (const ev of events) {
    switch (ev.type) {
      case 'stdout': {
        const s = dOut.decode(ev.data, { stream: true });
        out.push(s);
        opts.onStdout?.(s);
        break;
      }
      case 'stderr': {
        const s = dErr.decode(ev.data, { stream: true });
        err.push(s);
        opts.onStderr?.(s);
        break;
      }
      case 'pty':
        opts.onPty?.(ev.data);
        break;
      case 'exit':
        return { exitCode: ev.exitCode, signal: ev.signal, stdout: out.join(''), stderr: err.join(''), timedOut: !!ev.timedOut };
      case 'error':
        throw new SpaceError(asErrorCode(ev.code), ev.message);
    }
  }
  throw new SpaceError('AGENT_DISCONNECTED', 'The command stream ended without an exit status');
}

/**
 * A running process: wait for it, feed its stdin, signal it.
 *
 * @example
 * const h = await sandbox.commands.run('sleep 100', { background: true });
 * await h.kill();
 */
export class CommandHandle {
  constructor(
    protected readonly api: ApiClient,
    protected readonly sandboxId: string,
    readonly pid: number,
    private readonly stream?: Promise<CommandResult>,
    private readonly callbacks: Pick<CommandRunOpts, 'onStdout' | 'onStderr'> = {},
  ) {}

  /** Waits for the process to exit (attaching to its output when it runs in the background). */
  async wait(opts: { signal?: AbortSignal } = {}): Promise<CommandResult> {
    if (this.stream) return this.stream;
    const res = await this.api.request('GET', `/v1/sandboxes/${this.sandboxId}/commands/${this.pid}/output`, { timeoutMs: 0, ...(opts.signal ? { signal: opts.signal } : {}) });
    return collect(outputEvents(res), this.callbacks);
  }

  /** Writes to the process's stdin (it must have been started with `stdin: true`, or be a PTY). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    await this.api.json('POST', `/v1/sandboxes/${this.sandboxId}/commands/${this.pid}/stdin`, { json: { data: Buffer.from(data).toString('base64') } });
  }

  /** Closes stdin (EOF). */
  async closeStdin(): Promise<void> {
    await this.api.json('POST', `/v1/sandboxes/${this.sandboxId}/commands/${this.pid}/stdin`, { json: { eof: true } });
  }

  /** Sends a signal. @default "SIGKILL" */
  async kill(signal = 'SIGKILL'): Promise<void> {
    await this.api.json('POST', `/v1/sandboxes/${this.sandboxId}/commands/${this.pid}/signal`, { json: { signal } });
  }
}

/**
 * Commands of one sandbox.
 *
 * @example
 * const r = await sandbox.commands.run('echo hi', { onStdout: (s) => process.stdout.write(s) });
 * r.exitCode; // 0
 */
export class Commands {
  constructor(
    private readonly api: ApiClient,
    private readonly sandboxId: string,
  ) {}

  /** Runs a command and waits for it; `cmd` is a shell line, or an argv array run without a shell. */
  run(cmd: string | string[], opts?: CommandRunOpts & { background?: false }): Promise<CommandResult>;
  /** Starts a command in the background and returns its handle at once. */
  run(cmd: string | string[], opts: CommandRunOpts & { background: true }): Promise<CommandHandle>;
  async run(cmd: string | string[], opts: CommandRunOpts & { background?: boolean } = {}): Promise<CommandResult | CommandHandle> {
    const body = {
      ...(Array.isArray(cmd) ? { argv: cmd } : { cmd }),
      ...(opts.env ? { env: opts.env } : {}),
      ...(opts.cwd ? { cwd: opts.cwd } : {}),
      ...(opts.user ? { user: opts.user } : {}),
      ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}),
      ...(opts.stdin ? { stdin: true } : {}),
      ...(opts.tag ? { tag: opts.tag } : {}),
      ...(opts.background ? { background: true } : {}),
    };
    const path = `/v1/sandboxes/${this.sandboxId}/commands`;
    if (opts.background) {
      const { pid } = await this.api.json<{ pid: number }>('POST', path, { json: body, ...(opts.signal ? { signal: opts.signal } : {}) });
      return new CommandHandle(this.api, this.sandboxId, pid, undefined, opts);
    }
    const res = await this.api.request('POST', path, { json: body, timeoutMs: 0, ...(opts.signal ? { signal: opts.signal } : {}) });
    return collect(outputEvents(res), opts);
  }

  /** Starts a foreground command and returns a handle at once (for stdin-driven programs). */
  async start(cmd: string | string[], opts: CommandRunOpts = {}): Promise<CommandHandle> {
    const res = await this.api.request('POST', `/v1/sandboxes/${this.sandboxId}/commands`, {
      json: { ...(Array.isArray(cmd) ? { argv: cmd } : { cmd }), ...(opts.env ? { env: opts.env } : {}), ...(opts.cwd ? { cwd: opts.cwd } : {}), ...(opts.user ? { user: opts.user } : {}), ...(opts.timeoutMs ? { timeoutMs: opts.timeoutMs } : {}), stdin: opts.stdin ?? true },
      timeoutMs: 0,
      ...(opts.signal ? { signal: opts.signal } : {}),
    });
    const events = outputEvents(res);
    const first = await events.next();
    if (first.done || first.value.type !== 'start') throw new SpaceError('AGENT_PROTOCOL_ERROR', 'The command stream did not start with a start event');
    const pid = first.value.pid;
    const done = collect(events, opts);
    done.catch(() => {}); // surfaced by wait()
    return new CommandHandle(this.api, this.sandboxId, pid, done, opts);
  }

  /** Re-attaches to a process by pid. */
  async connect(pid: number, opts: Pick<CommandRunOpts, 'onStdout' | 'onStderr'> = {}): Promise<CommandHandle> {
    return new CommandHandle(this.api, this.sandboxId, pid, undefined, opts);
  }

  /** Processes started in this sandbox (running and recently exited). */
  async list(): Promise<ProcessInfo[]> {
    return (await this.api.json<{ processes: ProcessInfo[] }>('GET', `/v1/sandboxes/${this.sandboxId}/commands`)).processes;
  }

  /** Sends a signal to a process. @default "SIGKILL" */
  async kill(pid: number, signal = 'SIGKILL'): Promise<void> {
    await new CommandHandle(this.api, this.sandboxId, pid).kill(signal);
  }

  /** Writes to a process's stdin. */
  async sendStdin(pid: number, data: string | Uint8Array): Promise<void> {
    await new CommandHandle(this.api, this.sandboxId, pid).sendStdin(data);
  }
}

