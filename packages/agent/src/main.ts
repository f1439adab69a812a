/**
 * The SPACE in-sandbox agent. It is the sandbox's first process, runs on the read-only
 * runtime mounted at /.space (node + this bundle), connects OUT to the daemon's socket in the
 * per-sandbox directory mounted at /run/space, and serves the daemon's requests. It keeps
 * reconnecting for as long as it lives, so a daemon restart does not disturb the sandbox.
 */
import net from 'node:net';
import path from 'node:path';
import {
  AGENT_RUNTIME_DIR,
  AGENT_SOCKET_DIR,
  AGENT_SOCKET_NAME,
  Channel,
  FrameKind,
  FrameReader,
  PROTOCOL_VERSION,
  encodeJson,
  parseJson,
  type ExecRequest,
  type Frame,
  type IdentityRequest,
  type SerialOpen,
  TRUST_FILES,
} from '@space/protocol';
import { appendFileSync, mkdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { execFileSync } from 'node:child_process';
import { SerialPort, type SerialConnection } from './serial.js';
import * as files from './files.js';
import { checkMetadata } from './metadata.js';
import { growDisk } from './disk.js';
import { snapshotBlockers } from './snapshot.js';
import { AgentError, ProcessTable, kernelFiles, setHostname, startSudoBroker, type Proc } from './processes.js';
import { Stream, type FrameSink } from './streams.js';

/** Which sandbox this agent serves; a fork learns its new id from the daemon. */
let sandboxId = process.env.SPACE_SANDBOX_ID ?? 'unknown';
const socketPath = process.env.SPACE_AGENT_SOCKET ?? path.join(AGENT_SOCKET_DIR, AGENT_SOCKET_NAME);
const startedAt = Date.now();

/** Environment every process inherits: ours minus the agent's own settings. */
const baseEnv: Record<string, string> = {};
for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('SPACE_AGENT') && v !== undefined) baseEnv[k] = v;
baseEnv.PATH ??= '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The variables of the image's own environment that a new identity keeps (the rest is replaced). */
const RUNTIME_ENV = ['PATH', 'LANG'];

/** Takes a new identity after a restore into another sandbox: id, hostname, environment. */
async function takeIdentity(req: IdentityRequest): Promise<void> {
  if (typeof req.sandboxId !== 'string' || !/^[a-z0-9]{1,64}$/.test(req.sandboxId)) throw new AgentError('BAD_REQUEST', 'sandboxId must be [a-z0-9]{1,64}');
  if (req.hostname !== undefined && (typeof req.hostname !== 'string' || !/^[a-z0-9][a-z0-9-]{0,62}$/.test(req.hostname))) throw new AgentError('BAD_REQUEST', 'hostname must be [a-z0-9-]{1,63}');
  // A new identity is a new boot: a new boot_id, set with the hostname in one helper call.
  const newBoot = req.sandboxId !== sandboxId;
  if (req.hostname) {
    await setHostname(req.hostname, newBoot);
    hostsEntry(req.hostname);
  } else if (newBoot) kernelFiles();
  sandboxId = req.sandboxId;
  if (req.env && typeof req.env === 'object') {
    for (const k of Object.keys(baseEnv)) if (!RUNTIME_ENV.includes(k)) delete baseEnv[k];
    for (const [k, v] of Object.entries(req.env)) if (typeof v === 'string') baseEnv[k] = v;
  }
  baseEnv.SPACE_SANDBOX_ID = sandboxId;
  if (req.trust !== undefined) trust(req.trust);
  if (req.diskBytes !== undefined) {
    if (!Number.isSafeInteger(req.diskBytes) || req.diskBytes <= 0) throw new AgentError('BAD_REQUEST', 'diskBytes must be a positive whole number of bytes');
    await growDisk(req.diskBytes);
  }
}

/**
 * Keeps the sandbox's hostname in /etc/hosts (`127.0.1.1 NAME`), as Docker does: sudo, Python's
 * getfqdn and many servers resolve their own host name, and a sandbox has no DNS.
 */
function hostsEntry(hostname: string): void {
  const MARK = '# space: hostname';
  try {
    const lines = readFileSync('/etc/hosts', 'utf8').split('\n').filter((l) => !l.endsWith(MARK) && l !== '');
    writeFileSync('/etc/hosts', [...lines, `127.0.1.1\t${hostname}\t${MARK}`, ''].join('\n'));
  } catch (err) {
    log('cannot add the hostname to /etc/hosts', err);
  }
}

/** The egress CA this agent has installed (a sandbox belongs to one tenant: at most one). */
let trusted: string | undefined;

/**
 * Installs the egress CA: its own file, appended to the system bundle when the image has one
 * (which the bundle path then links to), else the bundle path holds the CA alone. It runs on
 * every create, so it is cheap: a few small synchronous writes (the promise API would cost a
 * thread hop per call, which is slow under gVisor's ptrace platform).
 */
function trust(pem: string): void {
  if (typeof pem !== 'string' || !/^-----BEGIN CERTIFICATE-----\n[A-Za-z0-9+/=\n]+-----END CERTIFICATE-----\n?$/.test(pem)) throw new AgentError('BAD_REQUEST', 'trust must be one PEM certificate');
  const cert = pem.endsWith('\n') ? pem : `${pem}\n`;
  if (trusted === cert) return;
  mkdirSync(path.dirname(TRUST_FILES.ca), { recursive: true, mode: 0o755 });
  writeFileSync(TRUST_FILES.ca, cert, { mode: 0o644 });
  rmSync(TRUST_FILES.bundle, { force: true });
  if (statSync(TRUST_FILES.system, { throwIfNoEntry: false })?.isFile()) {
    appendFileSync(TRUST_FILES.system, `\n${cert}`);
    symlinkSync(TRUST_FILES.system, TRUST_FILES.bundle);
  } else writeFileSync(TRUST_FILES.bundle, cert, { mode: 0o644 });
  trusted = cert;
}

let conn: Connection | undefined;
/**
 * Set by a `quiesce` request before the daemon checkpoints the sandbox: the agent closes its
 * connection (a unix socket connected to the host cannot be checkpointed) and reconnects only
 * once the daemon's socket exists again, i.e. after the restore.
 */
let quiesced = false;
const procs = new ProcessTable((p) => conn?.event({ event: 'process-exit', pid: p.info.pid, exitCode: p.info.exitCode, signal: p.signal }));

/** The part of a connection the agent uses: a unix socket (gVisor) or a serial-port connection (microVM). */
type Link = net.Socket | SerialConnection;

class Connection implements FrameSink {
  private readonly streams = new Map<number, Stream>();
  alive = true;

  constructor(private readonly socket: Link) {
    const reader = new FrameReader((f) => this.onFrame(f));
    socket.on('data', (d) => {
      try {
        reader.push(d);
      } catch (err) {
        log('protocol error from daemon', err);
        socket.destroy();
      }
    });
    socket.on('close', () => this.closed());
    socket.on('error', () => {});
    this.event({ event: 'hello', version: PROTOCOL_VERSION, sandboxId, startedAt });
  }

  write(buf: Buffer): void {
    if (this.alive) this.socket.write(buf);
  }

  event(v: object): void {
    this.write(encodeJson(FrameKind.Event, 0, v));
  }

  /** Closes the connection on purpose (before a checkpoint): processes keep running. */
  drop(): void {
    // The host end of a serial port stays open: tell the daemon to close it.
    if (serialPath) this.event({ event: 'bye' });
    this.socket.destroy();
  }

  private closed(): void {
    this.alive = false;
    for (const s of this.streams.values()) {
      s.emit('cancel', 'disconnected');
      s.close();
    }
    this.streams.clear();
    if (!quiesced) procs.killForeground();
    if (conn === this) conn = undefined;
    // A serial port waits for the daemon's next open by itself.
    if (!serialPath) setTimeout(connect, 50);
  }

  private onFrame(f: Frame): void {
    if (f.kind === FrameKind.Request) {
      if (this.streams.has(f.stream) || f.stream % 2 !== 1) throw new Error(`bad stream id ${f.stream}`);
      const s = new Stream(this, f.stream);
      this.streams.set(f.stream, s);
      s.on('close', () => this.streams.delete(f.stream));
      const req = parseJson(f.payload);
      handle(req, s).catch((err: unknown) => {
        const e = err instanceof AgentError ? err : new AgentError('INTERNAL', err instanceof Error ? err.message : String(err));
        s.fail(e.code, e.message);
      });
      return;
    }
    const s = this.streams.get(f.stream);
    if (!s) return; // stream already finished on our side
    switch (f.kind) {
      case FrameKind.Data:
        s.emit('data', f.payload.readUInt8(0) as Channel, f.payload.subarray(1));
        return;
      case FrameKind.Credit:
        s.addCredit(f.payload.readUInt32BE(0));
        return;
      case FrameKind.End:
        s.emit('end', parseJson(f.payload));
        return;
      case FrameKind.Cancel:
        // A handler that cleans up on cancel (uploads) ends the stream itself once done.
        if (s.listenerCount('cancel') > 0) s.emit('cancel', 'cancelled');
        else s.close();
        return;
      default:
        throw new Error(`unexpected frame kind ${f.kind}`);
    }
  }
}

function num(v: unknown, name: string, min: number, max: number): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) throw new AgentError('BAD_REQUEST', `${name} must be an integer from ${min} to ${max}`);
  return v;
}

function attachStream(p: Proc, s: Stream): void {
  s.on('data', (_ch: Channel, d: Buffer) => {
    try {
      p.write(d);
    } catch {
      // stdin closed
    }
    s.grant(d.length);
  });
  s.on('end', () => p.closeStdin());
  p.attach(s);
}

async function handle(req: Record<string, unknown>, s: Stream): Promise<void> {
  switch (req.op) {
    case 'ping':
      s.end({ pong: Date.now() });
      return;
    case 'health':
      s.end({ uptimeMs: Date.now() - startedAt, processes: procs.list().filter((p) => p.running).length, rssBytes: process.memoryUsage().rss });
      return;
    case 'exec': {
      const r = req as unknown as ExecRequest;
      if (r.pty) {
        num(r.pty.cols, 'pty.cols', 1, 1000);
        num(r.pty.rows, 'pty.rows', 1, 1000);
      }
      const p = await procs.start(r, baseEnv);
      s.reply({ pid: p.info.pid });
      if (r.background) {
        // Nobody reads a background process's output yet: keep it in its tail buffer for the next attach.
        s.end({});
        return;
      }
      attachStream(p, s);
      return;
    }
    case 'attach': {
      const p = procs.get(req.pid);
      s.reply({ pid: p.info.pid, running: p.info.running });
      attachStream(p, s);
      return;
    }
    case 'stdin': {
      const p = procs.get(req.pid);
      if (typeof req.data === 'string' && req.data) p.write(Buffer.from(req.data, 'base64'));
      if (req.eof === true) p.closeStdin();
      s.end({});
      return;
    }
    case 'signal':
      procs.get(req.pid).kill(String(req.signal));
      s.end({});
      return;
    case 'resize':
      procs.get(req.pid).resize(num(req.cols, 'cols', 1, 1000), num(req.rows, 'rows', 1, 1000));
      s.end({});
      return;
    case 'quiesce':
      quiesced = true;
      procs.setKeepForeground(true);
      s.end({});
      setImmediate(() => conn?.drop());
      return;
    case 'identity':
      await takeIdentity(req as unknown as IdentityRequest);
      s.end({});
      return;
    case 'snapshot-check':
      s.end({ blockers: snapshotBlockers() });
      return;
    case 'ps':
      s.end({ processes: procs.list() });
      return;
    case 'stat':
      s.end({ entry: await files.stat(files.resolvePath(req.path), req.metadata === true) });
      return;
    case 'list':
      s.end({ entries: await files.list(files.resolvePath(req.path), req.depth === undefined ? 1 : num(req.depth, 'depth', 1, 32), req.metadata === true) });
      return;
    case 'mkdir':
      await files.mkdirp(files.resolvePath(req.path), req.user as string | undefined);
      s.end({});
      return;
    case 'remove':
      await files.remove(files.resolvePath(req.path), req.recursive === true);
      s.end({});
      return;
    case 'rename':
      await files.rename(files.resolvePath(req.from), files.resolvePath(req.to));
      s.end({});
      return;
    case 'read':
      await files.readTo(files.resolvePath(req.path), s);
      return;
    case 'watch':
      await files.watchTo(files.resolvePath(req.path), req.recursive === true, s);
      return;
    case 'write':
      await files.writeFrom(files.resolvePath(req.path), s, typeof req.mode === 'number' ? req.mode & 0o7777 : undefined, req.user as string | undefined, req.metadata === undefined ? undefined : checkMetadata(req.metadata));
      return;
    default:
      throw new AgentError('BAD_REQUEST', `Unknown op ${JSON.stringify(req.op)}`);
  }
}

function log(msg: string, err?: unknown): void {
  process.stderr.write(`[space-agent] ${new Date().toISOString()} ${msg}${err ? `: ${err instanceof Error ? err.message : String(err)}` : ''}\n`);
}

let backoff = 20;
function connect(): void {
  // While quiesced the daemon has removed its socket, so each attempt fails at once (ENOENT)
  // and no connected socket exists when the checkpoint happens; after the restore the first
  // attempt that finds the socket reconnects.
  const sock = net.connect(socketPath);
  const retry = () => {
    sock.destroy();
    if (!quiesced) backoff = Math.min(backoff * 2, 1000);
    setTimeout(connect, quiesced ? 10 : backoff);
  };
  sock.once('error', retry);
  sock.once('connect', () => {
    sock.off('error', retry);
    backoff = 20;
    if (quiesced) {
      quiesced = false;
      procs.setKeepForeground(false);
    }
    conn = new Connection(sock);
  });
}

/** In a microVM: the virtio-serial port to serve on (found by the guest's init). */
const serialPath = process.env.SPACE_AGENT_PORT;
/** The guest's busybox (on the microVM runtime disk), for what Node cannot do: addresses, clock. */
const BUSYBOX = '/.space/busybox';
let booted = false;

/** Applies what the daemon sends when it opens a serial connection (see {@link SerialOpen}). */
function applyOpen(open: SerialOpen): void {
  if (open.boot && !booted && typeof open.boot.sandboxId === 'string') {
    sandboxId = open.boot.sandboxId;
    for (const [k, v] of Object.entries(open.boot.env ?? {})) if (typeof v === 'string') baseEnv[k] = v;
    baseEnv.SPACE_SANDBOX_ID = sandboxId;
  }
  booted = true;
  try {
    // Mixed in and the CRNG reseeded at once: a plain write would wait for the next periodic reseed.
    if (typeof open.seed === 'string') execFileSync(`${AGENT_RUNTIME_DIR}/space-helper`, ['reseed'], { input: Buffer.from(open.seed, 'base64'), stdio: ['pipe', 'ignore', 'pipe'], timeout: 5000 });
    if (typeof open.now === 'number') execFileSync(BUSYBOX, ['date', '-u', '-s', `@${Math.round(open.now / 1000)}`], { stdio: 'ignore', timeout: 5000 });
    const n = open.net;
    if (n && /^[0-9.]+$/.test(n.address) && /^[0-9.]+$/.test(n.gateway) && Number.isInteger(n.prefixLength)) {
      const ip = (...args: string[]) => execFileSync(BUSYBOX, ['ip', ...args], { stdio: 'ignore', timeout: 5000 });
      ip('addr', 'flush', 'dev', 'eth0');
      ip('neigh', 'flush', 'dev', 'eth0');
      ip('link', 'set', 'eth0', 'up');
      ip('addr', 'add', `${n.address}/${n.prefixLength}`, 'dev', 'eth0');
      for (const r of n.routes) if (/^[0-9./]+$/.test(r)) ip('route', 'replace', r, 'via', n.gateway, 'dev', 'eth0');
    }
  } catch (err) {
    log('cannot apply the connection settings', err);
  }
}

process.on('uncaughtException', (err) => log('uncaught exception', err));
process.on('unhandledRejection', (err) => log('unhandled rejection', err));
process.on('SIGTERM', () => process.exit(0));
// A first boot (not a restore: the agent's memory is the image's then) on a runtime without
// /proc/sys/kernel/random gets one, with a boot_id (tools such as E2B's read it).
if (!serialPath) kernelFiles(true);
hostsEntry(hostname());
startSudoBroker();
if (serialPath) {
  new SerialPort(serialPath, (link, open) => {
    applyOpen(open);
    if (quiesced) {
      quiesced = false;
      procs.setKeepForeground(false);
    }
    conn = new Connection(link);
  }).start();
} else connect();
