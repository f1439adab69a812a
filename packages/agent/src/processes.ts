/**
 * Processes started by the agent: plain pipes or a PTY, foreground or background, with
 * output sent to every attached stream (as E2B's envd does: a second `connect` does not
 * steal the first one's output); the slowest attached reader paces the process. While no
 * stream is attached, a background process's output is kept in a bounded tail buffer.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { accessSync, constants as fsc, existsSync } from 'node:fs';
import path from 'node:path';
import { AGENT_RUNTIME_DIR } from '@space/protocol';
import { createRequire } from 'node:module';
import { Channel, type ExecRequest, type ProcessInfo } from '@space/protocol';
import type { Stream } from './streams.js';
import { resolveUser } from './users.js';

const TAIL_BYTES = 64 * 1024;
/** While set (around a checkpoint), losing a stream does not kill a foreground process. */
let keepForeground = false;
const KEEP_EXITED = 100;
const SIGNALS = new Set(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT', 'SIGWINCH']);

interface PtyLike {
  pid: number;
  onData(cb: (d: string | Buffer) => void): void;
  onExit(cb: (e: { exitCode: number; signal?: number }) => void): void;
  write(d: string | Buffer): void;
  resize(c: number, r: number): void;
  pause(): void;
  resume(): void;
  kill(sig?: string): void;
}

type PtyModule = { spawn(file: string, args: string[], opts: Record<string, unknown>): PtyLike };
let ptyModule: PtyModule | undefined;
function loadPty(): PtyModule {
  ptyModule ??= createRequire(process.argv[1] ?? '/')('node-pty') as PtyModule;
  return ptyModule;
}

/** Error with a SPACE error code, reported to the daemon. */
export class AgentError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

/** A process started by the agent. */
export class Proc {
  readonly info: ProcessInfo;
  private child?: ChildProcess;
  private pty?: PtyLike;
  private readonly streams = new Set<Stream>();
  private tail: { channel: Channel; data: Buffer }[] = [];
  private tailBytes = 0;
  dropped = 0;
  timedOut = false;
  signal: string | null = null;
  private openOutputs: number;
  private exited = false;
  private timer?: NodeJS.Timeout;
  /** Called once the process has exited and all output is read. */
  onDone: () => void = () => {};

  constructor(req: ExecRequest, baseEnv: Record<string, string>) {
    const user = resolveUser(req.user);
    if (!user) throw new AgentError('BAD_REQUEST', `Unknown user ${JSON.stringify(req.user)} in this sandbox`);
    const argv = req.argv?.length ? req.argv : ['/bin/sh', '-c', req.shell ?? ''];
    const cwd = req.cwd ?? user.home;
    const env = { ...baseEnv, HOME: user.home, USER: user.name, LOGNAME: user.name, ...(req.env ?? {}) };
    this.info = {
      pid: 0,
      argv,
      ...(req.tag ? { tag: req.tag } : {}),
      cwd,
      user: user.name,
      pty: !!req.pty,
      background: !!req.background,
      startedAt: Date.now(),
      running: true,
      exitCode: null,
    };
    // Root's commands run through the helper, which drops CAP_SYS_ADMIN (only the agent keeps it).
    const cmd = user.uid === 0 ? rootArgv(argv, (env as Record<string, string | undefined>).PATH) : argv;
    if (req.pty) {
      this.openOutputs = 0;
      const p = loadPty().spawn(cmd[0]!, cmd.slice(1), { name: 'xterm-256color', cols: req.pty.cols, rows: req.pty.rows, cwd, env: { TERM: 'xterm-256color', ...env }, uid: user.uid, gid: user.gid, encoding: null });
      this.pty = p;
      this.info.pid = p.pid;
      p.onData((d) => this.output(Channel.Pty, typeof d === 'string' ? Buffer.from(d) : d));
      p.onExit(({ exitCode, signal }) => this.exit(signal ? null : exitCode, signal ? `SIG${signal}` : null));
    } else {
      this.openOutputs = 2;
      const child = spawn(cmd[0]!, cmd.slice(1), {
        cwd,
        env,
        uid: user.uid,
        gid: user.gid,
        detached: true,
        stdio: [req.stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'],
      });
      this.child = child;
      child.stdout!.on('data', (d: Buffer) => this.output(Channel.Stdout, d));
      child.stderr!.on('data', (d: Buffer) => this.output(Channel.Stderr, d));
      child.stdout!.on('close', () => this.outputClosed());
      child.stderr!.on('close', () => this.outputClosed());
      child.stdin?.on('error', () => {});
      child.on('exit', (code, sig) => this.exit(code, sig));
    }
    if (req.timeoutMs && req.timeoutMs > 0) {
      this.timer = setTimeout(() => {
        this.timedOut = true;
        this.kill('SIGKILL');
      }, req.timeoutMs);
    }
  }

  /**
   * Resolves once the OS has started the process; rejects with COMMAND_FAILED_TO_START.
   * Node assigns `pid` synchronously when the spawn succeeded, so no event-loop turn is spent.
   */
  started(): Promise<void> {
    const child = this.child;
    if (!child) return Promise.resolve();
    if (child.pid !== undefined) {
      this.info.pid = child.pid;
      child.on('error', () => {});
      return Promise.resolve();
    }
    return new Promise((_, reject) => {
      child.once('error', (err: NodeJS.ErrnoException) => {
        clearTimeout(this.timer);
        reject(new AgentError('COMMAND_FAILED_TO_START', `Cannot start ${JSON.stringify(this.info.argv[0])}: ${err.code ?? err.message}${err.code === 'ENOENT' ? ' (no such program or cwd)' : ''}`));
      });
    });
  }

  /** Adds `stream` to the process's readers; the first one gets the tail kept so far. */
  attach(stream: Stream): void {
    this.streams.add(stream);
    const tail = this.tail;
    this.tail = [];
    this.tailBytes = 0;
    for (const t of tail) stream.send(t.channel, t.data);
    stream.on('drain', () => this.resumeIfUnblocked());
    stream.on('close', () => {
      if (!this.streams.delete(stream)) return;
      this.resumeIfUnblocked();
      if (this.streams.size === 0 && !this.info.background && this.info.running && !keepForeground) this.kill('SIGKILL');
    });
    if (!this.info.running && this.openOutputs === 0) this.finish();
  }

  /** Writes to stdin (or the PTY). */
  write(data: Buffer): void {
    if (this.pty) this.pty.write(data);
    else if (this.child?.stdin) this.child.stdin.write(data);
    else throw new AgentError('BAD_REQUEST', 'This process was started without stdin: pass stdin: true');
  }

  closeStdin(): void {
    if (this.pty) this.pty.write(Buffer.from([4]));
    else this.child?.stdin?.end();
  }

  resize(cols: number, rows: number): void {
    if (!this.pty) throw new AgentError('BAD_REQUEST', 'Only a PTY process can be resized');
    this.pty.resize(cols, rows);
  }

  kill(sig: string): void {
    if (!SIGNALS.has(sig)) throw new AgentError('BAD_REQUEST', `Unsupported signal ${JSON.stringify(sig)}; use one of ${[...SIGNALS].join(', ')}`);
    if (!this.info.running) return;
    try {
      process.kill(-this.info.pid, sig as NodeJS.Signals);
    } catch {
      try {
        process.kill(this.info.pid, sig as NodeJS.Signals);
      } catch {
        // already gone
      }
    }
  }

  private output(channel: Channel, data: Buffer): void {
    if (this.streams.size) {
      let blocked = false;
      for (const s of this.streams) if (!s.send(channel, data)) blocked = true;
      if (blocked) this.pauseOutput();
      return;
    }
    this.tail.push({ channel, data });
    this.tailBytes += data.length;
    while (this.tailBytes > TAIL_BYTES && this.tail.length > 1) {
      const d = this.tail.shift()!;
      this.tailBytes -= d.data.length;
      this.dropped += d.data.length;
    }
  }

  private pauseOutput(): void {
    if (this.pty) this.pty.pause();
    this.child?.stdout?.pause();
    this.child?.stderr?.pause();
  }

  /** Resumes the output once no attached reader is still waiting for credit. */
  private resumeIfUnblocked(): void {
    for (const s of this.streams) if (s.blocked) return;
    this.resumeOutput();
  }

  private resumeOutput(): void {
    if (this.pty) this.pty.resume();
    this.child?.stdout?.resume();
    this.child?.stderr?.resume();
  }

  private outputClosed(): void {
    this.openOutputs--;
    if (this.openOutputs === 0 && this.exited) this.finish();
  }

  private exit(code: number | null, sig: string | null): void {
    clearTimeout(this.timer);
    this.exited = true;
    this.info.running = false;
    this.info.exitCode = code;
    this.signal = sig;
    if (this.openOutputs === 0) this.finish();
  }

  private finish(): void {
    const end = { exitCode: this.info.exitCode, signal: this.signal, ...(this.timedOut ? { timedOut: true } : {}), ...(this.dropped ? { dropped: this.dropped } : {}) };
    const readers = [...this.streams];
    this.streams.clear();
    for (const s of readers) s.end(end);
    this.onDone();
  }
}

/** The agent's table of processes. */
export class ProcessTable {
  private readonly procs = new Map<number, Proc>();

  constructor(private readonly onExit: (p: Proc) => void) {}

  async start(req: ExecRequest, baseEnv: Record<string, string>): Promise<Proc> {
    const p = new Proc(req, baseEnv);
    await p.started();
    this.procs.set(p.info.pid, p);
    let reported = false;
    p.onDone = () => {
      if (reported) return;
      reported = true;
      this.onExit(p);
      this.prune();
    };
    return p;
  }

  get(pid: unknown): Proc {
    const p = typeof pid === 'number' ? this.procs.get(pid) : undefined;
    if (!p) throw new AgentError('PROCESS_NOT_FOUND', `No process ${String(pid)} started by this sandbox's agent`);
    return p;
  }

  list(): ProcessInfo[] {
    return [...this.procs.values()].map((p) => ({ ...p.info }));
  }

  /** Keeps foreground processes alive when their streams drop (checkpoint in progress). */
  setKeepForeground(v: boolean): void {
    keepForeground = v;
  }

  /** Kills every foreground process (the daemon that wanted their output is gone). */
  killForeground(): void {
    for (const p of this.procs.values()) if (!p.info.background && p.info.running) p.kill('SIGKILL');
  }

  private prune(): void {
    const exited = [...this.procs.values()].filter((p) => !p.info.running);
    for (const p of exited.slice(0, Math.max(0, exited.length - KEEP_EXITED))) this.procs.delete(p.info.pid);
  }
}

/** The static helper in the runtime (absent in runtimes older than it). */
const HELPER = `${AGENT_RUNTIME_DIR}/space-helper`;
const hasHelper = existsSync(HELPER);

function isExecutable(p: string): boolean {
  try {
    accessSync(p, fsc.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * `argv` prefixed with `space-helper exec`. The program is looked up first, so that a missing
 * one still fails to start (COMMAND_FAILED_TO_START) instead of exiting 127.
 */
function rootArgv(argv: string[], pathVar: string | undefined): string[] {
  if (!hasHelper) return argv;
  const prog = argv[0]!;
  const found = prog.includes('/') ? isExecutable(prog) : (pathVar ?? '').split(':').some((d) => d && isExecutable(path.join(d, prog)));
  if (!found) throw new AgentError('COMMAND_FAILED_TO_START', `Cannot start ${JSON.stringify(prog)}: ENOENT (no such program or cwd)`);
  return [HELPER, 'exec', ...argv];
}

/** Sets the sandbox's hostname (the agent holds the capability for it; its children do not). */
export function setHostname(name: string): Promise<void> {
  return new Promise((resolve, reject) => {
    if (!hasHelper) return reject(new AgentError('INTERNAL', 'this sandbox runtime has no space-helper to set the hostname'));
    execFile(HELPER, ['sethostname', name], { timeout: 5000 }, (err, _out, stderr) =>
      err ? reject(new AgentError('INTERNAL', `cannot set the hostname: ${stderr.trim() || err.message}`)) : resolve(),
    );
  });
}
