/**
 * The in-sandbox API of E2B ("envd", what `E2B_SANDBOX_URL` points at), served by the daemon
 * for every sandbox: requests name their sandbox in `E2b-Sandbox-Id` and prove access with
 * `X-Access-Token`. Connect RPC services `process.Process` and `filesystem.Filesystem`
 * (@connectrpc/connect on Fastify), and plain HTTP `/health` and `/files`. Every call goes
 * through SPACE's agent protocol, so it works the same on every driver.
 */
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { Readable } from 'node:stream';
import { Code, ConnectError, type ConnectRouter, type HandlerContext } from '@connectrpc/connect';
import { timestampFromMs } from '@bufbuild/protobuf/wkt';
import type { MessageInitShape } from '@bufbuild/protobuf';
import { AsyncQueue, SpaceError, toSpaceError, type AgentCall, type SandboxService } from '@space/core';
import { Channel, type EntryInfo as AgentEntry, type ExecRequest } from '@space/protocol';
import type { AccessTokens } from './access.js';
import { Process, Signal, type ProcessSelector, type StartResponseSchema } from './gen/process/process_pb.js';
import { EventType, Filesystem, FileType, type EntryInfoSchema, type FilesystemEventSchema, type WatchDirResponseSchema } from './gen/filesystem/filesystem_pb.js';

/** Deps of the envd API. */
export interface EnvdDeps {
  service: SandboxService;
  tokens: AccessTokens;
}

/** The sandbox and tenant a request is for, and the user it acts as. */
export interface EnvdCaller {
  tenantId: string;
  sandboxId: string;
  /** From `Authorization: Basic base64("<user>:")`; undefined = the sandbox's default user. */
  user: string | undefined;
}

type Headers = { get(name: string): string | null };

/** Authenticates an envd request from its headers. */
export function envdCaller(tokens: AccessTokens, h: Headers): EnvdCaller {
  const sandboxId = h.get('e2b-sandbox-id') ?? undefined;
  const tenantId = tokens.verify(sandboxId, h.get('x-access-token') ?? undefined);
  let user: string | undefined;
  const auth = h.get('authorization');
  if (auth?.startsWith('Basic ')) user = Buffer.from(auth.slice(6), 'base64').toString().split(':')[0] || undefined;
  return { tenantId, sandboxId: sandboxId!, user };
}

/** E2B resolves relative paths against the user's home. */
export function resolvePath(p: string, user: string | undefined): string {
  const home = user === 'root' ? '/root' : '/home/user';
  if (p === '~' || p === '') return home;
  if (p.startsWith('~/')) return path.posix.join(home, p.slice(2));
  return path.posix.isAbsolute(p) ? p : path.posix.join(home, p);
}

const CONNECT_CODE: Partial<Record<string, Code>> = {
  FILE_NOT_FOUND: Code.NotFound,
  SANDBOX_NOT_FOUND: Code.NotFound,
  PROCESS_NOT_FOUND: Code.NotFound,
  FILE_EXISTS: Code.AlreadyExists,
  PERMISSION_DENIED: Code.PermissionDenied,
  UNAUTHENTICATED: Code.Unauthenticated,
  BAD_REQUEST: Code.InvalidArgument,
  INVALID_PATH: Code.InvalidArgument,
  NOT_A_DIRECTORY: Code.InvalidArgument,
  IS_A_DIRECTORY: Code.InvalidArgument,
  COMMAND_FAILED_TO_START: Code.InvalidArgument,
  SANDBOX_NOT_RUNNING: Code.FailedPrecondition,
  SANDBOX_INVALID_STATE: Code.FailedPrecondition,
  DIRECTORY_NOT_EMPTY: Code.FailedPrecondition,
  TIMEOUT: Code.DeadlineExceeded,
  AGENT_UNAVAILABLE: Code.Unavailable,
  AGENT_DISCONNECTED: Code.Unavailable,
};

/** A SPACE error as a Connect error (the SDK turns NotFound into NotFoundError, and so on). */
export function toConnectError(err: unknown): ConnectError {
  if (err instanceof ConnectError) return err;
  const e = toSpaceError(err);
  return new ConnectError(`${e.code}: ${e.message}`, CONNECT_CODE[e.code] ?? Code.Internal);
}

function guard<A extends unknown[], R>(fn: (...a: A) => Promise<R>): (...a: A) => Promise<R> {
  return async (...a) => {
    try {
      return await fn(...a);
    } catch (err) {
      throw toConnectError(err);
    }
  };
}


const TYPE: Record<AgentEntry['type'], FileType> = { file: FileType.FILE, dir: FileType.DIRECTORY, symlink: FileType.SYMLINK, other: FileType.UNSPECIFIED };

function permissions(e: AgentEntry): string {
  const t = e.type === 'dir' ? 'd' : e.type === 'symlink' ? 'l' : '-';
  let s = '';
  for (let i = 8; i >= 0; i--) s += e.mode & (1 << i) ? 'rwx'[(8 - i) % 3] : '-';
  return t + s;
}

/** An agent entry as E2B's EntryInfo. */
function entry(e: AgentEntry): MessageInitShape<typeof EntryInfoSchema> {
  return {
    name: e.name,
    type: TYPE[e.type],
    path: e.path,
    size: BigInt(e.size),
    mode: e.mode,
    permissions: permissions(e),
    owner: e.owner ?? '',
    group: e.group ?? '',
    modifiedTime: timestampFromMs(e.mtimeMs),
    // E2B gives a link's target as an absolute path (SPACE's own API gives readlink's text).
    ...(e.symlinkTarget !== undefined ? { symlinkTarget: path.posix.resolve(path.posix.dirname(e.path), e.symlinkTarget) } : {}),
    ...(e.metadata ? { metadata: e.metadata } : {}),
  };
}

/** Errors of a call whose sandbox went away under it. */
const SANDBOX_GONE = new Set(['AGENT_DISCONNECTED', 'AGENT_UNAVAILABLE', 'SANDBOX_NOT_RUNNING', 'SANDBOX_NOT_FOUND']);

const EXEC_SIGNAL: Partial<Record<Signal, string>> = { [Signal.SIGTERM]: 'SIGTERM', [Signal.SIGKILL]: 'SIGKILL' };

type ProcessEventInit = MessageInitShape<typeof StartResponseSchema>['event'];

/**
 * Streams a process's events: start, output, keepalives while it is quiet, end. Ends when the
 * process exits or the client goes away (the process keeps running: E2B processes outlive
 * their stream).
 */
async function* processEvents(call: AgentCall, pid: number, ctx: HandlerContext): AsyncGenerator<{ event: ProcessEventInit }> {
  const q = new AsyncQueue<{ event: ProcessEventInit }>();
  q.push({ event: { event: { case: 'start', value: { pid } } } });
  const interval = Number(ctx.requestHeader.get('keepalive-ping-interval') ?? 0);
  const keepalive = interval > 0 ? setInterval(() => q.push({ event: { event: { case: 'keepalive', value: {} } } }), Math.max(1, interval) * 1000) : undefined;
  let finished = false;
  /** Set when the sandbox itself went away under the process (killed, timed out, crashed). */
  let lost: SpaceError | undefined;
  const onAbort = () => call.cancel('client went away');
  ctx.signal.addEventListener('abort', onAbort, { once: true });
  void (async () => {
    try {
      for await (const c of call.output()) {
        const out = c.channel === Channel.Stderr ? 'stderr' : c.channel === Channel.Pty ? 'pty' : 'stdout';
        q.push({ event: { event: { case: 'data', value: { output: { case: out, value: new Uint8Array(c.data) } } } } });
      }
      const end = await call.done;
      const code = typeof end.exitCode === 'number' ? end.exitCode : -1;
      const sig = typeof end.signal === 'string' ? end.signal : undefined;
      q.push({ event: { event: { case: 'end', value: { exitCode: code, exited: end.exitCode !== null && end.exitCode !== undefined, status: sig ? `signal: ${sig.replace(/^SIG/, '').toLowerCase()}` : `exit status ${code}`, ...(end.timedOut ? { error: 'timed out' } : {}) } } } });
    } catch (err) {
      const e = toSpaceError(err);
      if (SANDBOX_GONE.has(e.code)) lost = e;
      else if (!ctx.signal.aborted) q.push({ event: { event: { case: 'end', value: { exitCode: -1, exited: false, status: 'error', error: e.message } } } });
    } finally {
      finished = true;
      q.close();
    }
  })();
  try {
    yield* q;
    // Unavailable is how E2B says the sandbox ended (its SDK raises its end-of-life TimeoutError),
    // not an exit of the command.
    if (lost) throw new ConnectError(`The sandbox ended while the command ran (${lost.code}): it was killed or reached its timeout`, Code.Unavailable);
  } finally {
    clearInterval(keepalive);
    ctx.signal.removeEventListener('abort', onAbort);
    if (!finished) call.cancel('stream closed');
  }
}

const EVENT_TYPE = { create: EventType.CREATE, write: EventType.WRITE, remove: EventType.REMOVE } as const;
type FsEventInit = MessageInitShape<typeof FilesystemEventSchema>;

/**
 * Watches a directory through the agent; `onEvent` gets each change (with its entry when
 * asked). Resolves to a stop function once the watch is in place.
 */
async function watch(svc: SandboxService, c: EnvdCaller, dir: string, recursive: boolean, includeEntry: boolean, onEvent: (e: FsEventInit) => void, onEnd: (err?: unknown) => void): Promise<() => void> {
  const root = resolvePath(dir, c.user);
  const call = await svc.call(c.tenantId, c.sandboxId, 'files', { op: 'watch', path: root, recursive });
  await call.reply;
  void (async () => {
    let buf = '';
    try {
      for await (const chunk of call.output()) {
        buf += chunk.data.toString();
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const ev = JSON.parse(buf.slice(0, i)) as { name: string; type: keyof typeof EVENT_TYPE };
          buf = buf.slice(i + 1);
          let entryInfo: ReturnType<typeof entry> | undefined;
          if (includeEntry && ev.type !== 'remove') {
            entryInfo = await svc.unary(c.tenantId, c.sandboxId, 'files', { op: 'stat', path: path.posix.join(root, ev.name) }).then((r) => entry(r.entry as AgentEntry), () => undefined);
          }
          onEvent({ name: ev.name, type: EVENT_TYPE[ev.type], ...(entryInfo ? { entry: entryInfo } : {}) });
        }
      }
      await call.done;
      onEnd();
    } catch (err) {
      onEnd(err);
    }
  })();
  return () => call.cancel('watch stopped');
}

/** Registers the Connect services (use with `fastifyConnectPlugin`). */
export function envdRoutes(deps: EnvdDeps): (router: ConnectRouter) => void {
  const { service: svc, tokens } = deps;
  const who = (ctx: HandlerContext) => envdCaller(tokens, ctx.requestHeader);

  const pidOf = async (c: EnvdCaller, sel: ProcessSelector | undefined): Promise<number> => {
    if (sel?.selector.case === 'pid') return sel.selector.value;
    if (sel?.selector.case === 'tag') {
      const tag = sel.selector.value;
      const r = await svc.unary(c.tenantId, c.sandboxId, 'exec', { op: 'ps' });
      const p = ((r.processes ?? []) as { pid: number; tag?: string; running: boolean }[]).find((x) => x.tag === tag && x.running);
      if (!p) throw new SpaceError('PROCESS_NOT_FOUND', `No running process tagged ${JSON.stringify(tag)}`);
      return p.pid;
    }
    throw new SpaceError('BAD_REQUEST', 'Select the process by pid or tag');
  };
  const attach = async (c: EnvdCaller, pid: number) => {
    const call = await svc.call(c.tenantId, c.sandboxId, 'exec', { op: 'attach', pid });
    await call.reply;
    return call;
  };
  const unary = (c: EnvdCaller, req: Parameters<SandboxService['unary']>[3]) => svc.unary(c.tenantId, c.sandboxId, req.op === 'stdin' || req.op === 'signal' || req.op === 'resize' || req.op === 'ps' ? 'exec' : 'files', req);

  /** Polling watchers (CreateWatcher / GetWatcherEvents / RemoveWatcher). */
  const watchers = new Map<string, { owner: string; queue: AsyncQueue<FsEventInit>; stop: () => void }>();
  const ownWatcher = (c: EnvdCaller, id: string) => {
    const w = watchers.get(id);
    if (!w || w.owner !== `${c.tenantId}/${c.sandboxId}`) throw new ConnectError(`No watcher ${id}`, Code.NotFound);
    return w;
  };

  return (router) => {
    router.service(Process, {
      async *start(req, ctx) {
        let call: AgentCall;
        let pid: number;
        try {
          const c = who(ctx);
          const cfg = req.process;
          if (!cfg?.cmd) throw new SpaceError('BAD_REQUEST', 'process.cmd is required');
          const exec: ExecRequest = {
            op: 'exec',
            argv: [cfg.cmd, ...cfg.args],
            env: cfg.envs,
            ...(cfg.cwd ? { cwd: resolvePath(cfg.cwd, c.user) } : {}),
            ...(c.user ? { user: c.user } : {}),
            ...(req.pty?.size ? { pty: { cols: req.pty.size.cols || 80, rows: req.pty.size.rows || 24 } } : {}),
            ...(req.tag ? { tag: req.tag } : {}),
            stdin: req.stdin ?? true,
            // E2B processes outlive the stream that started them.
            background: true,
          };
          const started = await svc.call(c.tenantId, c.sandboxId, 'exec', exec);
          pid = ((await started.reply) as { pid: number }).pid;
          started.cancel('background');
          call = await attach(c, pid);
        } catch (err) {
          throw toConnectError(err);
        }
        yield* processEvents(call, pid, ctx);
      },
      async *connect(req, ctx) {
        let call: AgentCall;
        let pid: number;
        try {
          const c = who(ctx);
          pid = await pidOf(c, req.process);
          // Refuse an unknown pid now: attaching would only fail once the stream has started.
          const r = await svc.unary(c.tenantId, c.sandboxId, 'exec', { op: 'ps' });
          if (!((r.processes ?? []) as { pid: number }[]).some((x) => x.pid === pid)) throw new SpaceError('PROCESS_NOT_FOUND', `No process ${pid} in sandbox ${c.sandboxId}`);
          call = await attach(c, pid);
        } catch (err) {
          throw toConnectError(err);
        }
        yield* processEvents(call, pid, ctx);
      },
      list: guard(async (_req, ctx) => {
        const r = await unary(who(ctx), { op: 'ps' });
        const procs = (r.processes ?? []) as { pid: number; argv: string[]; cwd: string; tag?: string; running: boolean }[];
        return { processes: procs.filter((p) => p.running).map((p) => ({ pid: p.pid, config: { cmd: p.argv[0] ?? '', args: p.argv.slice(1), envs: {}, cwd: p.cwd }, ...(p.tag ? { tag: p.tag } : {}) })) };
      }),
      sendInput: guard(async (req, ctx) => {
        const c = who(ctx);
        const pid = await pidOf(c, req.process);
        const data = req.input?.input.value;
        if (data?.length) await unary(c, { op: 'stdin', pid, data: Buffer.from(data).toString('base64') });
        return {};
      }),
      closeStdin: guard(async (req, ctx) => {
        const c = who(ctx);
        await unary(c, { op: 'stdin', pid: await pidOf(c, req.process), data: '', eof: true });
        return {};
      }),
      sendSignal: guard(async (req, ctx) => {
        const c = who(ctx);
        const signal = EXEC_SIGNAL[req.signal];
        if (!signal) throw new SpaceError('BAD_REQUEST', 'signal must be SIGTERM or SIGKILL');
        await unary(c, { op: 'signal', pid: await pidOf(c, req.process), signal });
        return {};
      }),
      update: guard(async (req, ctx) => {
        const c = who(ctx);
        if (req.pty?.size) await unary(c, { op: 'resize', pid: await pidOf(c, req.process), cols: req.pty.size.cols, rows: req.pty.size.rows });
        return {};
      }),
      streamInput: guard(async (reqs, ctx) => {
        const c = who(ctx);
        let pid: number | undefined;
        for await (const r of reqs) {
          if (r.event.case === 'start') pid = await pidOf(c, r.event.value.process);
          else if (r.event.case === 'data') {
            if (pid === undefined) throw new SpaceError('BAD_REQUEST', 'Send the start event (the process) before data');
            const data = r.event.value.input?.input.value;
            if (data?.length) await unary(c, { op: 'stdin', pid, data: Buffer.from(data).toString('base64') });
          }
        }
        return {};
      }),
    });

    router.service(Filesystem, {
      stat: guard(async (req, ctx) => {
        const c = who(ctx);
        const r = await unary(c, { op: 'stat', path: resolvePath(req.path, c.user), metadata: true });
        return { entry: entry(r.entry as AgentEntry) };
      }),
      listDir: guard(async (req, ctx) => {
        const c = who(ctx);
        const r = await unary(c, { op: 'list', path: resolvePath(req.path, c.user), depth: req.depth || 1, metadata: true });
        return { entries: (r.entries as AgentEntry[]).map(entry) };
      }),
      makeDir: guard(async (req, ctx) => {
        const c = who(ctx);
        const p = resolvePath(req.path, c.user);
        const exists = await unary(c, { op: 'stat', path: p }).then(
          () => true,
          () => false,
        );
        if (exists) throw new ConnectError(`directory ${p} already exists`, Code.AlreadyExists);
        await unary(c, { op: 'mkdir', path: p, ...(c.user ? { user: c.user } : {}) });
        const r = await unary(c, { op: 'stat', path: p });
        return { entry: entry(r.entry as AgentEntry) };
      }),
      move: guard(async (req, ctx) => {
        const c = who(ctx);
        const to = resolvePath(req.destination, c.user);
        await unary(c, { op: 'rename', from: resolvePath(req.source, c.user), to });
        const r = await unary(c, { op: 'stat', path: to, metadata: true });
        return { entry: entry(r.entry as AgentEntry) };
      }),
      remove: guard(async (req, ctx) => {
        const c = who(ctx);
        try {
          await unary(c, { op: 'remove', path: resolvePath(req.path, c.user), recursive: true });
        } catch (err) {
          // E2B's semantics: removing what is not there is not an error.
          if (!(err instanceof SpaceError && err.code === 'FILE_NOT_FOUND')) throw err;
        }
        return {};
      }),
      async *watchDir(req, ctx) {
        const q = new AsyncQueue<MessageInitShape<typeof WatchDirResponseSchema>>();
        let stop: () => void;
        try {
          stop = await watch(svc, who(ctx), req.path, req.recursive, req.includeEntry, (e) => q.push({ event: { case: 'filesystem', value: e } }), () => q.close());
        } catch (err) {
          throw toConnectError(err);
        }
        const interval = Number(ctx.requestHeader.get('keepalive-ping-interval') ?? 0);
        const keepalive = interval > 0 ? setInterval(() => q.push({ event: { case: 'keepalive', value: {} } }), interval * 1000) : undefined;
        ctx.signal.addEventListener('abort', () => q.close(), { once: true });
        try {
          yield { event: { case: 'start', value: {} } };
          yield* q;
        } finally {
          clearInterval(keepalive);
          stop();
        }
      },
      createWatcher: guard(async (req, ctx) => {
        const c = who(ctx);
        const id = `w${randomUUID()}`;
        const q = new AsyncQueue<FsEventInit>();
        const stop = await watch(svc, c, req.path, req.recursive, req.includeEntry, (e) => q.push(e), () => q.close());
        watchers.set(id, { owner: `${c.tenantId}/${c.sandboxId}`, queue: q, stop });
        return { watcherId: id };
      }),
      getWatcherEvents: guard(async (req, ctx) => {
        const w = ownWatcher(who(ctx), req.watcherId);
        return { events: w.queue.drain() };
      }),
      removeWatcher: guard(async (req, ctx) => {
        const w = ownWatcher(who(ctx), req.watcherId);
        w.stop();
        watchers.delete(req.watcherId);
        return {};
      }),
    });
  };
}

/** Streams a file out of the sandbox (GET /files). */
export async function readFile(svc: SandboxService, c: EnvdCaller, p: string): Promise<Readable> {
  const call = await svc.call(c.tenantId, c.sandboxId, 'files', { op: 'read', path: resolvePath(p, c.user) });
  await call.reply;
  async function* body(): AsyncGenerator<Buffer> {
    let done = false;
    try {
      for await (const chunk of call.output()) yield chunk.data;
      await call.done;
      done = true;
    } finally {
      if (!done) call.cancel('client went away');
    }
  }
  return Readable.from(body(), { objectMode: false });
}

/**
 * Writes a stream into a file of the sandbox (POST /files), with `metadata` (the SDK's
 * `X-Metadata-*` headers) set on it; resolves to its entry.
 */
export async function writeFile(svc: SandboxService, c: EnvdCaller, p: string, data: AsyncIterable<Buffer>, metadata?: Record<string, string>): Promise<{ name: string; type: 'file'; path: string; metadata?: Record<string, string> }> {
  const target = resolvePath(p, c.user);
  const parent = path.posix.dirname(target);
  await svc.unary(c.tenantId, c.sandboxId, 'files', { op: 'mkdir', path: parent, ...(c.user ? { user: c.user } : {}) });
  const call = await svc.call(c.tenantId, c.sandboxId, 'files', { op: 'write', path: target, ...(c.user ? { user: c.user } : {}), ...(metadata ? { metadata } : {}) });
  await call.reply;
  try {
    for await (const chunk of data) await call.write(Channel.File, chunk);
  } catch (err) {
    call.cancel('upload failed');
    await call.done.catch(() => {});
    throw err;
  }
  call.end({});
  await call.done;
  return { name: path.posix.basename(target), type: 'file', path: target, ...(metadata ? { metadata } : {}) };
}
