/**
 * A fake in-sandbox agent: speaks the real wire protocol (@space/protocol) over an in-memory
 * stream, keeps its "machine" — files, environment, hostname, a counter standing for memory —
 * in a plain object that a checkpoint writes out whole, and runs a handful of commands:
 *
 *   true | false | exit N | echo WORDS… | hostname | printenv NAME | cat PATH
 *   write PATH WORDS…   a file holding WORDS (and a newline)
 *   tick                adds one to the in-memory counter and prints it (state a restore must keep)
 *   sleep SECONDS       runs until then or a signal (background-able)
 *   die oom|crash       the "sandbox" stops as the runtime would report it
 *
 * Enough for the lifecycle — the state machine, admission, snapshots, pools, timers and
 * recovery — to be tested in seconds without a runtime; not a shell.
 */
import type { Duplex } from 'node:stream';
import path from 'node:path';
import { Channel, FrameKind, FrameReader, INITIAL_WINDOW, PROTOCOL_VERSION, creditPayload, encodeData, encodeFrame, encodeJson, parseJson, type Frame } from '@space/protocol';

/** One file or directory of the fake machine. */
export interface FakeEntry {
  type: 'file' | 'dir';
  /** Base64 of the content (files). */
  data?: string;
  mode: number;
  mtimeMs: number;
}

/** Everything a checkpoint of the fake machine holds. */
export interface FakeMachine {
  /** The id the agent says in its hello: the sandbox it booted as, until an `identity` request. */
  sandboxId: string;
  hostname: string;
  env: Record<string, string>;
  files: Record<string, FakeEntry>;
  /** Stands for process memory: what `tick` counts, restored with the snapshot. */
  counter: number;
  /** The disk size the last identity gave (a real agent grows its file system to it). */
  diskBytes?: number;
}

/** What the agent tells its driver. */
export interface FakeAgentHooks {
  /** A command said `die`: the runtime stops with this reason. */
  die(reason: 'oom' | 'crashed'): void;
  /** The agent quiesced: it stays away until the driver reconnects it. */
  quiesced(): void;
  /**
   * What the agent does with an identity request: a string refuses it with that message (as a
   * real agent whose disk does not grow), `'drop'` closes the connection without an answer (it
   * then reconnects, as a real one does), undefined takes it.
   */
  refuseIdentity?(req: Record<string, unknown>): string | undefined;
}

/** A fresh machine for sandbox `id`. */
export function newMachine(id: string, env: Record<string, string>): FakeMachine {
  const now = Date.now();
  const dir = (): FakeEntry => ({ type: 'dir', mode: 0o755, mtimeMs: now });
  return { sandboxId: id, hostname: id, env: { ...env }, files: { '/': dir(), '/home': dir(), '/home/user': dir(), '/tmp': dir() }, counter: 0 };
}

class AgentError extends Error {
  constructor(readonly code: string, message: string) {
    super(message);
  }
}

interface Proc {
  pid: number;
  argv: string[];
  running: boolean;
  background: boolean;
  startedAt: number;
  exitCode: number | null;
  signal: string | null;
  kill?: (signal: string) => void;
}

/** One connection of the agent to the daemon. */
export class FakeAgent {
  private readonly reader = new FrameReader((f) => this.onFrame(f));
  private nextPid = 100;
  private readonly procs = new Map<number, Proc>();
  /** Uploads in progress, by stream: what arrived so far and what to do at its End. */
  private readonly uploads = new Map<number, { chunks: Buffer[]; done: () => void }>();
  private alive = true;

  constructor(
    private readonly m: FakeMachine,
    private readonly link: Duplex,
    private readonly hooks: FakeAgentHooks,
  ) {
    link.on('data', (d: Buffer) => {
      try {
        this.reader.push(d);
      } catch {
        link.destroy();
      }
    });
    link.on('close', () => (this.alive = false));
    link.on('error', () => {});
    this.event({ event: 'hello', version: PROTOCOL_VERSION, sandboxId: m.sandboxId, startedAt: Date.now() });
  }

  /** Drops the connection (the sandbox stopped, or the driver closed). */
  close(): void {
    this.link.destroy();
  }

  private write(buf: Buffer): void {
    if (this.alive) this.link.write(buf);
  }

  private event(v: object): void {
    this.write(encodeJson(FrameKind.Event, 0, v));
  }

  private onFrame(f: Frame): void {
    const up = this.uploads.get(f.stream);
    if (up && f.kind === FrameKind.Data) {
      up.chunks.push(f.payload.subarray(1));
      this.write(encodeFrame(FrameKind.Credit, f.stream, creditPayload(f.payload.length - 1)));
      return;
    }
    if (up && f.kind === FrameKind.End) return up.done();
    if (up && f.kind === FrameKind.Cancel) return void this.uploads.delete(f.stream);
    if (f.kind !== FrameKind.Request) return;
    const stream = f.stream;
    const req = parseJson(f.payload);
    const reply = (v: object) => this.write(encodeJson(FrameKind.Reply, stream, v));
    const end = (v: object) => this.write(encodeJson(FrameKind.End, stream, v));
    const data = (ch: Channel, s: string) => s && this.write(encodeData(stream, ch, Buffer.from(s)));
    Promise.resolve()
      .then(() => this.handle(req, reply, end, data, stream))
      .catch((err: unknown) => end({ error: err instanceof AgentError ? { code: err.code, message: err.message } : { code: 'INTERNAL', message: String(err) } }));
  }

  private resolve(p: unknown): string {
    if (typeof p !== 'string' || !p) throw new AgentError('INVALID_PATH', 'path must be a non-empty string');
    return path.posix.resolve('/home/user', p);
  }

  private entry(p: string): FakeEntry {
    const e = this.m.files[p];
    if (!e) throw new AgentError('FILE_NOT_FOUND', `ENOENT: ${p}`);
    return e;
  }

  private info(p: string) {
    const e = this.entry(p);
    return { name: path.posix.basename(p), path: p, type: e.type, size: e.data ? Buffer.from(e.data, 'base64').length : 0, mode: e.mode, mtimeMs: e.mtimeMs, owner: 'user', group: 'user' };
  }

  private checkParent(p: string): void {
    const parent = this.m.files[path.posix.dirname(p)];
    if (!parent || parent.type !== 'dir') throw new AgentError('FILE_NOT_FOUND', `ENOENT: ${path.posix.dirname(p)}`);
  }

  private writeFile(p: string, content: Buffer): void {
    this.checkParent(p);
    this.m.files[p] = { type: 'file', data: content.toString('base64'), mode: 0o644, mtimeMs: Date.now() };
  }

  private async handle(req: Record<string, unknown>, reply: (v: object) => void, end: (v: object) => void, data: (ch: Channel, s: string) => void, stream: number): Promise<void> {
    switch (req.op) {
      case 'ping':
        return end({ pong: Date.now() });
      case 'health':
        return end({ uptimeMs: 1, processes: [...this.procs.values()].filter((p) => p.running).length, rssBytes: 1 << 20 });
      case 'identity': {
        const refused = this.hooks.refuseIdentity?.(req);
        if (refused === 'drop') return this.close();
        if (refused !== undefined) throw new AgentError('DRIVER_FAILED', refused);
        this.m.sandboxId = String(req.sandboxId);
        if (typeof req.hostname === 'string') this.m.hostname = req.hostname;
        if (req.env && typeof req.env === 'object') this.m.env = { ...(req.env as Record<string, string>) };
        if (typeof req.diskBytes === 'number') this.m.diskBytes = req.diskBytes;
        return end({});
      }
      case 'quiesce':
        end({});
        this.hooks.quiesced();
        setImmediate(() => this.link.destroy());
        return;
      case 'snapshot-check':
        return end({ blockers: [] });
      case 'ps':
        return end({ processes: [...this.procs.values()].map((p) => ({ pid: p.pid, argv: p.argv, cwd: '/home/user', user: 'user', pty: false, background: p.background, startedAt: p.startedAt, running: p.running })) });
      case 'stat':
        return end({ entry: this.info(this.resolve(req.path)) });
      case 'list': {
        const dir = this.resolve(req.path);
        if (this.entry(dir).type !== 'dir') throw new AgentError('NOT_A_DIRECTORY', `${dir} is not a directory`);
        const prefix = dir === '/' ? '/' : `${dir}/`;
        return end({ entries: Object.keys(this.m.files).filter((k) => k !== dir && k.startsWith(prefix) && !k.slice(prefix.length).includes('/')).sort().map((k) => this.info(k)) });
      }
      case 'mkdir': {
        const p = this.resolve(req.path);
        const parts = p.split('/').filter(Boolean);
        for (let i = 1; i <= parts.length; i++) {
          const d = `/${parts.slice(0, i).join('/')}`;
          if (!this.m.files[d]) this.m.files[d] = { type: 'dir', mode: 0o755, mtimeMs: Date.now() };
        }
        return end({});
      }
      case 'remove': {
        const p = this.resolve(req.path);
        this.entry(p);
        for (const k of Object.keys(this.m.files)) if (k === p || k.startsWith(`${p}/`)) delete this.m.files[k];
        return end({});
      }
      case 'rename': {
        const from = this.resolve(req.from);
        const to = this.resolve(req.to);
        this.entry(from);
        for (const k of Object.keys(this.m.files)) {
          if (k === from || k.startsWith(`${from}/`)) {
            this.m.files[to + k.slice(from.length)] = this.m.files[k]!;
            delete this.m.files[k];
          }
        }
        return end({});
      }
      case 'read': {
        const e = this.entry(this.resolve(req.path));
        if (e.type === 'dir') throw new AgentError('IS_A_DIRECTORY', 'is a directory');
        const buf = Buffer.from(e.data ?? '', 'base64');
        reply({ size: buf.length });
        if (buf.length) this.write(encodeData(stream, Channel.File, buf));
        return end({});
      }
      case 'write': {
        const p = this.resolve(req.path);
        this.checkParent(p);
        const chunks: Buffer[] = [];
        this.uploads.set(stream, {
          chunks,
          done: () => {
            this.uploads.delete(stream);
            const all = Buffer.concat(chunks);
            this.writeFile(p, all);
            end({ size: all.length });
          },
        });
        return reply({ window: INITIAL_WINDOW });
      }
      case 'exec':
        return this.exec(req, reply, end, data);
      case 'attach': {
        const p = this.procs.get(Number(req.pid));
        if (!p) throw new AgentError('PROCESS_NOT_FOUND', `No process ${String(req.pid)}`);
        reply({ pid: p.pid, running: p.running });
        if (!p.running) return end({ exitCode: p.exitCode, signal: p.signal });
        await new Promise<void>((r) => {
          const k = p.kill;
          p.kill = (s) => (k?.(s), r());
        });
        return end({ exitCode: p.exitCode, signal: p.signal });
      }
      case 'signal': {
        const p = this.procs.get(Number(req.pid));
        if (!p) throw new AgentError('PROCESS_NOT_FOUND', `No process ${String(req.pid)}`);
        p.kill?.(String(req.signal));
        return end({});
      }
      default:
        throw new AgentError('BAD_REQUEST', `the fake agent does not do ${JSON.stringify(req.op)}`);
    }
  }

  private async exec(req: Record<string, unknown>, reply: (v: object) => void, end: (v: object) => void, data: (ch: Channel, s: string) => void): Promise<void> {
    const argv = Array.isArray(req.argv) ? req.argv.map(String) : typeof req.shell === 'string' ? req.shell.trim().split(/\s+/) : [];
    // Through `sh -c LINE`, as the SDK sends a command line.
    const words = argv[0] === '/bin/sh' && argv[1] === '-c' ? (argv[2] ?? '').trim().split(/\s+/) : argv;
    const [cmd, ...args] = words;
    const p: Proc = { pid: this.nextPid++, argv: words, running: true, background: req.background === true, startedAt: Date.now(), exitCode: null, signal: null };
    this.procs.set(p.pid, p);
    reply({ pid: p.pid });
    let out = '';
    let err = '';
    let code = 0;
    const env = { ...this.m.env, ...((req.env as Record<string, string>) ?? {}) };
    switch (cmd) {
      case 'true':
        break;
      case 'false':
        code = 1;
        break;
      case 'exit':
        code = Number(args[0] ?? 0);
        break;
      case 'echo':
        out = `${args.join(' ')}\n`;
        break;
      case 'hostname':
        out = `${this.m.hostname}\n`;
        break;
      case 'printenv':
        if (env[args[0] ?? ''] === undefined) code = 1;
        else out = `${env[args[0]!]}\n`;
        break;
      case 'cat': {
        const e = this.m.files[this.resolve(args[0])];
        if (e?.type === 'file') out = Buffer.from(e.data ?? '', 'base64').toString();
        else {
          err = `cat: ${args[0]}: No such file or directory\n`;
          code = 1;
        }
        break;
      }
      case 'write':
        this.writeFile(this.resolve(args[0]), Buffer.from(`${args.slice(1).join(' ')}\n`));
        break;
      case 'tick':
        out = `${++this.m.counter}\n`;
        break;
      case 'sleep': {
        if (p.background) end({});
        const sig = await new Promise<string | null>((r) => {
          const t = setTimeout(() => r(null), Number(args[0] ?? 0) * 1000);
          t.unref();
          p.kill = (s) => (clearTimeout(t), r(s));
        });
        p.running = false;
        p.exitCode = sig ? null : 0;
        p.signal = sig;
        this.event({ event: 'process-exit', pid: p.pid, exitCode: p.exitCode, signal: p.signal });
        if (!p.background) end({ exitCode: p.exitCode, signal: p.signal });
        return;
      }
      case 'die':
        this.hooks.die(args[0] === 'oom' ? 'oom' : 'crashed');
        return;
      default:
        err = `fake: ${String(cmd)}: command not found\n`;
        code = 127;
    }
    data(Channel.Stdout, out);
    data(Channel.Stderr, err);
    p.running = false;
    p.exitCode = code;
    end({ exitCode: code, signal: null });
  }
}
