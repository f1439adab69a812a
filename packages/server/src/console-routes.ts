/**
 * What the web console needs of the daemon, all of it public API any client may use: the
 * console's static files at `/` and `/console/…` (built into @space/console's dist/, read once),
 * sign-in and sign-out (`/v1/session`), a live stream of the tenant's changes (`GET /v1/events`,
 * server-sent events) and a terminal over a WebSocket (`GET /v1/sandboxes/:id/terminal`).
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import type { EgressLogEntry } from '@space/api';
import { consoleDir } from '@space/console';
import { SpaceError, toSpaceError, type SandboxChange, type SandboxService, type SecretService } from '@space/core';
import websocket from '@fastify/websocket';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { Type } from 'typebox';
import { ConsoleSessions, sessionCookie, sessionCookieOf } from './console-session.js';
import { FORWARDED_BY, type ForwardTarget } from './forward.js';
import { followPeerEvents } from './peer-events.js';
import { IdParams } from './schemas.js';

/** Security headers of every console page: nothing but the daemon's own scripts runs. */
const PAGE_HEADERS = {
  'content-security-policy': "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
  'x-frame-options': 'DENY',
};

const TYPES: Record<string, string> = { '.js': 'text/javascript; charset=utf-8', '.css': 'text/css; charset=utf-8', '.html': 'text/html; charset=utf-8', '.svg': 'image/svg+xml', '.map': 'application/json' };

interface Asset {
  body: Buffer;
  /** The same, gzipped once at start (served to clients that accept it). */
  gzip: Buffer;
  type: string;
  etag: string;
}

/** The built console's files, by URL path (`/console/assets/app.js`), and its page; undefined when it was not built. */
function loadAssets(): { page: Asset; files: Map<string, Asset> } | undefined {
  const index = path.join(consoleDir, 'index.html');
  if (!existsSync(index)) return undefined;
  const asset = (file: string): Asset => {
    const body = readFileSync(file);
    return { body, gzip: gzipSync(body, { level: 9 }), type: TYPES[path.extname(file)] ?? 'application/octet-stream', etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 22)}"` };
  };
  const files = new Map<string, Asset>();
  const dir = path.join(consoleDir, 'assets');
  for (const f of existsSync(dir) ? readdirSync(dir) : []) files.set(`/console/assets/${f}`, asset(path.join(dir, f)));
  return { page: asset(index), files };
}

/** Whether `p` (a path without query) is a console page or asset, served without authentication. */
export function isConsolePath(p: string): boolean {
  return p === '/' || p === '/console' || p.startsWith('/console/');
}

/** What the console's routes need. */
export interface ConsoleDeps {
  service: SandboxService;
  secrets?: SecretService;
  sessions: ConsoleSessions;
  /** In a cluster: this node and the others, whose live changes the event stream relays too. */
  cluster?: { self: string; nodes(): Promise<ForwardTarget[]> };
}

/** Registers the console's pages, sign-in and its live streams. */
export async function registerConsole(app: FastifyInstance, deps: ConsoleDeps): Promise<void> {
  const { service: svc, sessions } = deps;
  const built = loadAssets();

  // ---- pages and assets
  /** Sends an asset, gzipped when the client accepts it. */
  const send = (req: FastifyRequest, reply: FastifyReply, a: Asset) => {
    const gz = /\bgzip\b/.test(String(req.headers['accept-encoding'] ?? ''));
    return reply
      .headers({ ...PAGE_HEADERS, etag: a.etag, 'cache-control': 'no-cache', vary: 'accept-encoding', ...(gz ? { 'content-encoding': 'gzip' } : {}) })
      .type(a.type)
      .send(gz ? a.gzip : a.body);
  };
  const page = async (req: FastifyRequest, reply: FastifyReply) => {
    if (!built) throw new SpaceError('CONSOLE_NOT_BUILT');
    return send(req, reply, built.page);
  };
  app.get('/', { schema: { hide: true } }, page);
  // Browsers ask for it whatever the page says.
  app.get('/favicon.ico', { schema: { hide: true } }, async (_req, reply) => reply.redirect('/console/assets/icon.svg', 301));
  app.get('/console', { schema: { hide: true } }, page);
  app.get('/console/*', { schema: { hide: true } }, async (req, reply) => {
    const p = req.url.split('?')[0]!;
    if (!p.startsWith('/console/assets/')) return page(req, reply);
    const a = built?.files.get(p);
    if (!a) throw new SpaceError('BAD_REQUEST', `No console asset ${p}`);
    if (req.headers['if-none-match'] === a.etag) return reply.code(304).send();
    return send(req, reply, a);
  });

  // ---- sign-in
  const SessionSchema = Type.Object({ tenantId: Type.String(), keyId: Type.String(), admin: Type.Boolean(), csrfToken: Type.String(), expiresAt: Type.String() });
  app.post('/v1/session', {
    schema: {
      tags: ['console'],
      security: [],
      description: 'Signs in with an API key: answers the session and sets it as an HttpOnly, SameSite=Strict cookie. Requests with that cookie instead of a bearer key act as the key; those that change anything must send the csrfToken as `X-CSRF-Token`.',
      body: Type.Object({ apiKey: Type.String({ minLength: 1, maxLength: 256 }) }, { additionalProperties: false }),
      response: { 200: SessionSchema },
    },
  }, async (req, reply) => {
    const { cookie, session } = await sessions.signIn((req.body as { apiKey: string }).apiKey);
    return reply.header('set-cookie', sessionCookie(cookie, req.protocol === 'https')).header('cache-control', 'no-store').send(session);
  });
  app.get('/v1/session', { schema: { tags: ['console'], description: 'The console session of the cookie (with its CSRF token); 401 when it ended.', response: { 200: SessionSchema } } }, async (req, reply) => {
    const s = await sessions.session(sessionCookieOf(req.headers.cookie));
    if (!s) throw new SpaceError('UNAUTHENTICATED', 'No console session: sign in with POST /v1/session');
    return reply.header('cache-control', 'no-store').send(s);
  });
  app.delete('/v1/session', { schema: { tags: ['console'], description: 'Signs out: clears the session cookie (revoke the API key to end every session it opened).' } }, async (req, reply) => reply.header('set-cookie', sessionCookie(undefined, req.protocol === 'https')).code(204).send());

  // ---- live changes (server-sent events)
  app.get('/v1/events', {
    schema: {
      tags: ['sessions'],
      description: 'A stream (text/event-stream) of the tenant\'s changes as they happen, on every node of the cluster: `sandbox` (a record as written), `event` (a sandbox event), `egress` (a request through the egress proxy). A comment every 15 s keeps it open.',
    },
  }, async (req, reply) => {
    const tenant = req.principal.tenantId;
    const raw = reply.raw;
    reply.hijack();
    raw.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-store', 'x-accel-buffering': 'no', connection: 'keep-alive' });
    raw.write('retry: 2000\n\n');
    const tenantOf = new Map<string, string>();
    const write = (block: string) => {
      // A client that reads nothing is let go instead of buffering without end.
      if (raw.writableLength > 1 << 20) return void raw.destroy();
      raw.write(block);
    };
    const send = (type: string, data: unknown) => write(`event: ${type}\ndata: ${JSON.stringify(data)}\n\n`);
    const onChange = (c: SandboxChange) => {
      if (c.kind === 'sandbox') {
        if (tenantOf.size > 10_000) tenantOf.clear();
        tenantOf.set(c.sandbox.id, c.sandbox.tenantId);
        if (c.sandbox.tenantId === tenant) send('sandbox', c.sandbox);
        return;
      }
      const known = tenantOf.get(c.event.sandboxId);
      if (known !== undefined) return void (known === tenant && send('event', c.event));
      // A sandbox not seen yet: looked up once (another tenant's is remembered as not ours).
      if (tenantOf.size > 10_000) tenantOf.clear();
      void svc.find(tenant, c.event.sandboxId).then(
        () => (tenantOf.set(c.event.sandboxId, tenant), send('event', c.event)),
        () => tenantOf.set(c.event.sandboxId, ''),
      );
    };
    const onAudit = (e: EgressLogEntry) => e.tenantId === tenant && send('egress', e);
    const stops = [svc.onChange(onChange), deps.secrets?.onAudit(onAudit)];
    // The other nodes' changes, asked of them as this client (a relayed request follows no further).
    if (deps.cluster && !req.headers[FORWARDED_BY]) {
      const credentials = Object.fromEntries((['authorization', 'cookie'] as const).flatMap((h) => (req.headers[h] ? [[h, req.headers[h]]] : [])));
      stops.push(followPeerEvents({ self: deps.cluster.self, nodes: deps.cluster.nodes, credentials, write }));
    }
    const ping = setInterval(() => raw.write(': ping\n\n'), 15_000);
    raw.on('close', () => {
      clearInterval(ping);
      for (const s of stops) s?.();
    });
  });

  // ---- terminal (WebSocket)
  await app.register(websocket, { options: { maxPayload: 1 << 20 } });
  app.get('/v1/sandboxes/:id/terminal', {
    websocket: true,
    schema: {
      tags: ['commands'],
      params: IdParams,
      querystring: Type.Object({ cols: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 80 })), rows: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 24 })) }),
      description: 'A terminal (the login shell in a PTY) over a WebSocket: binary frames carry its output and your keystrokes; text frames carry JSON: `{"type":"resize","cols":…,"rows":…}` from you, `{"type":"start","pid":…}` and `{"type":"exit","exitCode":…}` from the daemon. Closing the socket hangs the shell up (SIGHUP). An unknown sandbox, or a page of another origin with the console\'s cookie, is refused before the upgrade (404, 403).',
    },
    // Before the upgrade, so that a refusal is an ordinary HTTP answer with its code.
    preValidation: async (req) => {
      // A page of another origin must not drive a terminal with the browser's cookie.
      const origin = req.headers.origin;
      if (origin && sessionCookieOf(req.headers.cookie) !== undefined && (URL.canParse(origin) ? new URL(origin).host : undefined) !== req.headers.host) throw new SpaceError('FORBIDDEN', `A page of ${origin} cannot open a terminal with this console's session`);
      await svc.find(req.principal.tenantId, (req.params as { id: string }).id);
    },
  }, async (socket, req) => {
    const q = req.query as { cols?: number; rows?: number };
    const { id } = req.params as { id: string };
    let call: Awaited<ReturnType<SandboxService['call']>>;
    let pid: number;
    try {
      call = await svc.call(req.principal.tenantId, id, 'exec', { op: 'exec', pty: { cols: q.cols ?? 80, rows: q.rows ?? 24 }, stdin: true, background: false });
      pid = ((await call.reply) as { pid: number }).pid;
    } catch (err) {
      const e = toSpaceError(err);
      socket.send(JSON.stringify({ type: 'error', code: e.code, message: e.message }));
      return void socket.close(1011, e.code);
    }
    socket.send(JSON.stringify({ type: 'start', pid }));
    const unary = (r: Record<string, unknown>) => svc.unary(req.principal.tenantId, id, 'exec', { ...r, pid } as never).catch(() => {});
    socket.on('message', (data: Buffer, binary: boolean) => {
      if (binary) return void unary({ op: 'stdin', data: data.toString('base64') });
      try {
        const m = JSON.parse(data.toString('utf8')) as { type?: string; cols?: number; rows?: number; data?: string };
        if (m.type === 'resize' && Number.isInteger(m.cols) && Number.isInteger(m.rows)) void unary({ op: 'resize', cols: Math.min(1000, Math.max(1, m.cols!)), rows: Math.min(1000, Math.max(1, m.rows!)) });
        else if (m.type === 'input' && typeof m.data === 'string') void unary({ op: 'stdin', data: Buffer.from(m.data).toString('base64') });
      } catch {
        // not JSON: ignored
      }
    });
    // A closed socket hangs the shell up, as closing a terminal window does (SIGHUP), so that no
    // login shell stays behind in the sandbox for each page that opened one.
    let exited = false;
    socket.on('close', () => {
      if (!exited) void unary({ op: 'signal', signal: 'SIGHUP' });
      call.cancel('terminal closed');
    });
    try {
      for await (const c of call.output()) {
        socket.send(c.data);
      }
      const end = await call.done;
      exited = true;
      socket.send(JSON.stringify({ type: 'exit', exitCode: end.exitCode ?? null }));
      socket.close(1000, 'exited');
    } catch (err) {
      const e = toSpaceError(err);
      if (socket.readyState === socket.OPEN) {
        socket.send(JSON.stringify({ type: 'error', code: e.code, message: e.message }));
        socket.close(1011, e.code);
      }
    }
  });
}
