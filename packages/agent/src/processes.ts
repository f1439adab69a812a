/**
 * Processes started by the agent: plain pipes or a PTY, foreground or background, with
 * output sent to every attached stream (as E2B's envd does: a second `connect` does not
 * steal the first one's output); the slowest attached reader paces the process. While no
 * stream is attached, a background process's output is kept in a bounded tail buffer.
 */
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { accessSync, chmodSync, constants as fsc, existsSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import path from 'node:path';
import { AGENT_RUNTIME_DIR } from '@space/protocol';
import type { ErrorCode } from '@space/api';
import { createRequire } from 'node:module';
import { Channel, type ExecRequest, type ProcessInfo } from '@space/protocol';
import type { Stream } from './streams.js';
import { resolveUser } from './users.js';

const TAIL_BYTES = 64 * 1024;
/** While set (around a checkpoint), losing a stream does not kill a foreground process. */
let keepForeground = false;
const KEEP_EXITED = 100;
const SIGNALS = new Set(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP', 'SIGQUIT', 'SIGUSR1', 'SIGUSR2', 'SIGSTOP', 'SIGCONT', 'SIGWINCH', 'SIGTSTP']);

/**
 * Whether the agent must turn ^C, ^\ and ^Z typed on a terminal into signals: the gVisor
 * driver says so (that runsc's line discipline never does); a real kernel does it itself.
 */
const PTY_SIGNALS = process.env.SPACE_PTY_SIGNALS === 'agent';
/** The default VINTR, VQUIT and VSUSP characters; the watcher checks them against the terminal's. */
const TTY_CONTROL = new Set([0x03, 0x1c, 0x1a]);

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
  /** `code` is a member of SPACE's one error registry (@space/api): the daemon passes it on as is. */
  constructor(readonly code: ErrorCode, message: string) {
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
    // A terminal asked for without a program gets the user's login shell, as ssh gives.
    const argv = req.argv?.length ? req.argv : req.shell !== undefined ? ['/bin/sh', '-c', req.shell] : [user.shell, '-l'];
    const cwd = req.cwd ?? user.home;
    const env = { ...baseEnv, HOME: user.home, USER: user.name, LOGNAME: user.name, SHELL: user.shell, ...(req.env ?? {}) };
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
      // Where the runtime's terminals do not signal, the program starts through `ptyexec`,
      // which leaves a watcher in its session to do it (see writeWithSignals).
      let ptyCmd = cmd;
      let ptyEnv: Record<string, string> = { TERM: 'xterm-256color', ...env };
      if (PTY_SIGNALS && hasHelper) {
        this.watchToken = addWatcher();
        ptyCmd = [HELPER, 'ptyexec', ...cmd];
        ptyEnv = { ...ptyEnv, SPACE_PTY_SOCK: WATCHER_SOCK, SPACE_PTY_TOKEN: this.watchToken };
      }
      const p = loadPty().spawn(ptyCmd[0]!, ptyCmd.slice(1), { name: 'xterm-256color', cols: req.pty.cols, rows: req.pty.rows, cwd, env: ptyEnv, uid: user.uid, gid: user.gid, encoding: null });
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

  /** Terminal input waiting behind a control character the watcher is looking at. */
  private ptyInput: Promise<void> | undefined;
  /** This terminal's watcher, where the agent does the terminal's signals. */
  private watchToken?: string;

  /** Writes to stdin (or the PTY). */
  write(data: Buffer): void {
    if (this.pty) {
      if (!this.watchToken || (!this.ptyInput && !data.some((b) => TTY_CONTROL.has(b)))) return this.pty.write(data);
      const prev = this.ptyInput ?? Promise.resolve();
      const next = prev.then(() => this.writeWithSignals(data)).catch(() => {});
      this.ptyInput = next;
      void next.finally(() => {
        if (this.ptyInput === next) this.ptyInput = undefined;
      });
      return;
    }
    if (this.child?.stdin) this.child.stdin.write(data);
    else throw new AgentError('BAD_REQUEST', 'This process was started without stdin: pass stdin: true');
  }

  /**
   * Terminal input on a runtime whose line discipline does not signal: plain bytes go in as
   * they are; each control character is shown to the terminal's watcher, which does what a
   * kernel's n_tty would (signal the foreground group; or nothing when ISIG is off or the
   * terminal maps that character to nothing, as an editor in raw mode does: then the byte
   * goes in as input).
   */
  private async writeWithSignals(data: Buffer): Promise<void> {
    let from = 0;
    for (let i = 0; i < data.length; i++) {
      const byte = data[i]!;
      if (!TTY_CONTROL.has(byte)) continue;
      if (i > from) this.pty?.write(data.subarray(from, i));
      from = i + 1;
      const answer = this.info.running && this.watchToken ? await askWatcher(this.watchToken, byte) : 0;
      if (answer === 0) this.pty?.write(data.subarray(i, i + 1));
      else if (answer === 2) this.output(Channel.Pty, Buffer.from(`^${String.fromCharCode(byte + 0x40)}`));
    }
    if (from < data.length) this.pty?.write(data.subarray(from));
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
    if (this.watchToken) dropWatcher(this.watchToken);
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

/** Terminals' watchers (see `ptyexec` in native/helper.c), by the token their program got. */
const watchers = new Map<string, { socket?: net.Socket; waiting: ((s: net.Socket | undefined) => void)[] }>();
let watcherServer: net.Server | undefined;
/** Where watchers connect: an in-sandbox unix socket (snapshots keep it; nothing host-side). */
const WATCHER_SOCK = '/run/space-pty.sock';

/** Listens for watchers once; later calls are free. */
function ensureWatcherServer(): void {
  if (watcherServer) return;
  rmSync(WATCHER_SOCK, { force: true });
  const server = net.createServer((s) => {
    let hello = '';
    const onData = (d: Buffer) => {
      hello += d.toString('latin1');
      const nl = hello.indexOf('\n');
      if (nl < 0) {
        if (hello.length > 80) s.destroy();
        return;
      }
      s.off('data', onData);
      const w = watchers.get(hello.slice(0, nl));
      if (!w || w.socket) return void s.destroy();
      w.socket = s;
      s.on('error', () => {});
      s.on('close', () => {
        if (w.socket === s) w.socket = undefined;
      });
      for (const f of w.waiting.splice(0)) f(s);
    };
    s.on('data', onData);
    s.on('error', () => {});
  });
  server.on('error', (err) => process.stderr.write(`space-agent: terminal signals unavailable: ${err.message}\n`));
  server.listen(WATCHER_SOCK, () => {
    try {
      chmodSync(WATCHER_SOCK, 0o666);
    } catch {
      // then only root's terminals get signals
    }
  });
  watcherServer = server;
}

/** Registers a terminal's program; returns the token its watcher will present. */
function addWatcher(): string {
  ensureWatcherServer();
  const token = randomBytes(16).toString('hex');
  watchers.set(token, { waiting: [] });
  return token;
}

/** Forgets a terminal's watcher (its program ended); the watcher exits when the socket closes. */
function dropWatcher(token: string): void {
  const w = watchers.get(token);
  watchers.delete(token);
  w?.socket?.destroy();
  for (const f of w?.waiting.splice(0) ?? []) f(undefined);
}

/**
 * Asks a terminal's watcher what a kernel would do with control character `byte`: 0 pass
 * it on, 1 it signalled the foreground group, 2 that and echo it. A watcher that has not
 * connected within a second, or does not answer, counts as 0.
 */
async function askWatcher(token: string, byte: number): Promise<number> {
  const w = watchers.get(token);
  if (!w) return 0;
  const s = w.socket ?? (await new Promise<net.Socket | undefined>((resolve) => {
    const t = setTimeout(() => resolve(undefined), 1000);
    w.waiting.push((sock) => {
      clearTimeout(t);
      resolve(sock);
    });
  }));
  if (!s || s.destroyed) return 0;
  return new Promise((resolve) => {
    const done = (v: number) => {
      clearTimeout(t);
      s.off('data', onData);
      s.off('close', onClose);
      resolve(v);
    };
    const onData = (d: Buffer) => done(Math.max(0, Math.min(2, d[0]! - 0x30)));
    const onClose = () => done(0);
    const t = setTimeout(() => done(0), 1000);
    s.on('data', onData);
    s.once('close', onClose);
    s.write(Buffer.from([byte]));
  });
}

/**
 * Where the runtime lacks /proc/sys/kernel/random (this runsc), has the helper make it with a
 * `boot_id`; on a new identity, gives it a new one. The helper draws it from the kernel: Node's
 * generators live in memory that every fork of one snapshot shares (two forks drew one id).
 * No-op on a kernel that has its own.
 */
export function kernelFiles(sync = false): void {
  if (!hasHelper) return;
  if (sync) {
    try {
      execFileSync(HELPER, ['kernelfiles', 'new'], { stdio: ['ignore', 'ignore', 'pipe'], timeout: 5000 });
    } catch (err) {
      process.stderr.write(`space-agent: ${(err as { stderr?: Buffer }).stderr?.toString().trim() || String(err)}\n`);
    }
    return;
  }
  execFile(HELPER, ['kernelfiles', 'new'], { timeout: 5000 }, (err, _o, stderr) => {
    if (err) process.stderr.write(`space-agent: ${stderr.trim() || err.message}\n`);
  });
}

/**
 * Starts the sudo broker (`space-helper sudod`: root commands for members of group sudo, on
 * a runtime that never honours set-id bits) when the driver asks for it.
 */
export function startSudoBroker(): void {
  if (!hasHelper || process.env.SPACE_SUDO !== 'broker') return;
  const child = spawn(HELPER, ['sudod'], { detached: true, stdio: ['ignore', 'ignore', 'inherit'] });
  child.on('error', (err) => process.stderr.write(`space-agent: cannot start the sudo broker: ${err.message}\n`));
  child.unref();
}

/**
 * Sets the sandbox's hostname (the agent holds the capability for it; its children do not),
 * and with `newBoot` gives it a new boot id in the same helper call (see kernelFiles).
 */
export function setHostname(name: string, newBoot = false): Promise<void> {
  return new Promise((resolve, reject) => {
    if (!hasHelper) return reject(new AgentError('INTERNAL', 'this sandbox runtime has no space-helper to set the hostname'));
    execFile(HELPER, ['sethostname', name, ...(newBoot ? ['new'] : [])], { timeout: 5000 }, (err, _out, stderr) =>
      err ? reject(new AgentError('INTERNAL', `cannot set the hostname: ${stderr.trim() || err.message}`)) : resolve(),
    );
  });
}
