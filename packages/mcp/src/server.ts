/**
 * `space mcp`: SPACE as a Model Context Protocol server, over stdio (for clients that spawn
 * it) or the protocol's streamable HTTP transport (for remote clients). It holds no key of its
 * own over HTTP: each client's bearer token is its SPACE API key, used for every daemon call
 * of its session, so the daemon's tenancy and limits apply unchanged.
 */
import { createHash, randomUUID } from 'node:crypto';
import http from 'node:http';
import { McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { SubscribeRequestSchema, UnsubscribeRequestSchema, isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';
import { Sandbox, SpaceError, type ConnectionOpts } from '@space/sdk';
import { registerTools } from './tools.js';

/** The server's name and version as MCP clients see them. */
export const SERVER_INFO = { name: 'space', version: '0.1.0' } as const;
/** How often subscribed resources are checked for changes. */
const WATCH_EVERY_MS = 2000;

/**
 * One MCP server bound to one connection (daemon URL + API key): tools, resources, and
 * change notifications for subscribed resources.
 *
 * @example
 * const { server, close } = createMcpServer({ apiUrl: 'http://127.0.0.1:7070', apiKey: key });
 * await server.connect(new StdioServerTransport());
 */
export function createMcpServer(conn: ConnectionOpts): { server: McpServer; close(): void } {
  const server = new McpServer(SERVER_INFO, {
    capabilities: { resources: { subscribe: true, listChanged: true }, tools: {} },
    instructions:
      'SPACE gives you isolated Linux sandboxes that keep their state for hours. Create one (template "base" has python, node, gcc, git), run commands, read and write files. Before a risky change take a snapshot; roll back if it goes wrong; fork into several sandboxes to try alternatives side by side and keep the one that works. Kill sandboxes you no longer need.',
  });
  const c = () => conn;
  registerTools(server, c);

  server.registerResource('sandboxes', 'space://sandboxes', { title: 'Your sandboxes', description: 'Every sandbox that has not ended: id, state, template, driver, memory.', mimeType: 'application/json' }, async (uri) => {
    const page = await Sandbox.list({ ...conn, state: ['starting', 'running', 'paused', 'hibernated'], limit: 100 });
    return { contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify(page.items.map(summary), null, 1) }] };
  });
  server.registerResource(
    'sandbox',
    new ResourceTemplate('space://sandboxes/{sandboxId}', { list: undefined }),
    { title: 'A sandbox', description: 'One sandbox: state, template, limits, times.', mimeType: 'application/json' },
    async (uri, { sandboxId }) => {
      const s = await Sandbox.connect(String(sandboxId), conn);
      return { contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify(summary(s.info), null, 1) }] };
    },
  );
  server.registerResource(
    'snapshots',
    new ResourceTemplate('space://sandboxes/{sandboxId}/snapshots', { list: undefined }),
    { title: 'A sandbox\'s snapshot timeline', description: 'The snapshots of one sandbox, oldest first: id, name, trigger (manual or rolling), time, size, downtime, parent.', mimeType: 'application/json' },
    async (uri, { sandboxId }) => {
      const snaps = await (await Sandbox.connect(String(sandboxId), conn)).snapshots();
      const rows = snaps.map((x) => ({ snapshotId: x.id, name: x.name ?? null, trigger: x.trigger, createdAt: x.createdAt, sizeBytes: x.sizeBytes, downtimeMs: x.downtimeMs, parentSnapshotId: x.parentSnapshotId ?? null }));
      return { contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify(rows, null, 1) }] };
    },
  );

  // Subscriptions: the client is told (resources/updated) when a subscribed resource changes.
  const subscribed = new Set<string>();
  const last = new Map<string, string>();
  let timer: NodeJS.Timeout | undefined;
  const fingerprint = async (uri: string): Promise<string> => {
    const m = /^space:\/\/sandboxes(?:\/(sb[a-z0-9]{18})(\/snapshots)?)?$/.exec(uri);
    if (!m) return '';
    try {
      if (!m[1]) return JSON.stringify((await Sandbox.list({ ...conn, state: ['starting', 'running', 'paused', 'hibernated'], limit: 100 })).items.map((s) => [s.id, s.state]));
      const s = await Sandbox.connect(m[1], conn);
      return m[2] ? JSON.stringify((await s.snapshots()).map((x) => x.id)) : `${s.info.state}`;
    } catch (err) {
      return err instanceof SpaceError ? err.code : 'error';
    }
  };
  const watch = async () => {
    for (const uri of subscribed) {
      const f = await fingerprint(uri);
      if (last.has(uri) && last.get(uri) !== f) await server.server.sendResourceUpdated({ uri }).catch(() => {});
      last.set(uri, f);
    }
    if (subscribed.size) timer = setTimeout(() => void watch(), WATCH_EVERY_MS);
    else timer = undefined;
  };
  server.server.setRequestHandler(SubscribeRequestSchema, async (req) => {
    const uri = req.params.uri;
    if (!/^space:\/\/sandboxes(\/sb[a-z0-9]{18}(\/snapshots)?)?$/.test(uri)) throw new Error(`Cannot subscribe to ${uri}: use space://sandboxes, space://sandboxes/ID or space://sandboxes/ID/snapshots`);
    subscribed.add(uri);
    last.set(uri, await fingerprint(uri));
    timer ??= setTimeout(() => void watch(), WATCH_EVERY_MS);
    return {};
  });
  server.server.setRequestHandler(UnsubscribeRequestSchema, async (req) => {
    subscribed.delete(req.params.uri);
    last.delete(req.params.uri);
    return {};
  });
  return {
    server,
    close() {
      subscribed.clear();
      if (timer) clearTimeout(timer);
    },
  };
}

function summary(s: Sandbox['info']): Record<string, unknown> {
  return { sandboxId: s.id, state: s.state, template: s.template, driver: s.driver, cpu: s.cpu, memoryMb: s.memoryMb, createdAt: s.createdAt, expiresAt: s.expiresAt ?? null, metadata: s.metadata };
}

/**
 * Serves MCP over stdio until stdin closes.
 *
 * @example
 * await serveStdio({ apiUrl: 'http://127.0.0.1:7070', apiKey: key });
 */
export async function serveStdio(conn: ConnectionOpts): Promise<void> {
  const { server, close } = createMcpServer(conn);
  const transport = new StdioServerTransport();
  await server.connect(transport);
  await new Promise<void>((resolve) => {
    transport.onclose = () => resolve();
    process.stdin.once('end', () => resolve());
  });
  close();
  await server.close();
}

/** Options of {@link serveHttp}. */
export interface HttpOptions {
  /** Address to listen on, `HOST:PORT` (port 0: any free port). */
  listen: string;
  /** The SPACE daemon (its URL); keys come from each client. */
  apiUrl: string;
  /** A session without requests for this long is closed. @default 1 h */
  idleMs?: number;
}

/** A running HTTP MCP server. */
export interface HttpMcp {
  /** Where clients connect, e.g. `http://127.0.0.1:7080/mcp`. */
  url: string;
  close(): Promise<void>;
}

/**
 * Serves MCP over streamable HTTP at `/mcp`. Every request needs `Authorization: Bearer
 * <SPACE API key>`; the key is checked against the daemon before a session starts, and a
 * session only ever answers the key that opened it.
 *
 * @example
 * const mcp = await serveHttp({ listen: '127.0.0.1:7080', apiUrl: 'http://127.0.0.1:7070' });
 * console.log(mcp.url);
 */
export async function serveHttp(opts: HttpOptions): Promise<HttpMcp> {
  const sessions = new Map<string, { transport: StreamableHTTPServerTransport; keyHash: string; close(): void; seen: number }>();
  const keyHash = (k: string) => createHash('sha256').update(k).digest('hex');
  const refuse = (res: http.ServerResponse, status: number, code: string, message: string) => {
    res.writeHead(status, { 'content-type': 'application/json', ...(status === 401 ? { 'www-authenticate': 'Bearer realm="space"' } : {}) });
    res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: `${code}: ${message}`, data: { code } }, id: null }));
  };
  const readJson = (req: http.IncomingMessage): Promise<unknown> =>
    new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let n = 0;
      req.on('data', (d: Buffer) => {
        n += d.length;
        if (n > 16 * 1024 * 1024) {
          reject(new SpaceError('PAYLOAD_TOO_LARGE', 'MCP request over 16 MiB'));
          req.destroy();
        } else chunks.push(d);
      });
      req.on('end', () => {
        try {
          resolve(chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : undefined);
        } catch {
          reject(new SpaceError('INVALID_JSON', 'The MCP request body is not JSON'));
        }
      });
      req.on('error', reject);
    });

  const httpServer = http.createServer((req, res) => {
    void (async () => {
      const url = new URL(req.url ?? '/', 'http://mcp');
      if (url.pathname !== '/mcp') return refuse(res, 404, 'NOT_FOUND', 'MCP is served at /mcp');
      const auth = /^Bearer (\S+)$/i.exec(req.headers.authorization ?? '');
      if (!auth) return refuse(res, 401, 'UNAUTHENTICATED', 'Send your SPACE API key as Authorization: Bearer <key>');
      const key = auth[1]!;
      const sid = req.headers['mcp-session-id'];
      const body = req.method === 'POST' ? await readJson(req) : undefined;
      if (typeof sid === 'string') {
        const s = sessions.get(sid);
        if (!s) return refuse(res, 404, 'SESSION_NOT_FOUND', 'No such MCP session (it ended or the server restarted): initialize again');
        if (s.keyHash !== keyHash(key)) return refuse(res, 401, 'UNAUTHENTICATED', 'This session belongs to another key');
        s.seen = Date.now();
        return s.transport.handleRequest(req, res, body);
      }
      if (req.method !== 'POST' || !isInitializeRequest(body)) return refuse(res, 400, 'BAD_REQUEST', 'Start a session with an initialize request (POST /mcp)');
      const conn = { apiUrl: opts.apiUrl, apiKey: key };
      try {
        await Sandbox.list({ ...conn, limit: 1 });
      } catch (err) {
        if (err instanceof SpaceError && (err.code === 'UNAUTHENTICATED' || err.code === 'FORBIDDEN')) return refuse(res, 401, 'UNAUTHENTICATED', 'The SPACE daemon does not know this API key');
        return refuse(res, 503, err instanceof SpaceError ? err.code : 'DAEMON_UNREACHABLE', `Cannot reach the SPACE daemon at ${opts.apiUrl}: ${err instanceof Error ? err.message : String(err)}`);
      }
      const mcp = createMcpServer(conn);
      const transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => {
          sessions.set(id, { transport, keyHash: keyHash(key), close: mcp.close, seen: Date.now() });
        },
      });
      transport.onclose = () => {
        if (transport.sessionId) sessions.delete(transport.sessionId);
        mcp.close();
      };
      await mcp.server.connect(transport);
      await transport.handleRequest(req, res, body);
    })().catch((err) => {
      if (!res.headersSent) refuse(res, err instanceof SpaceError ? 400 : 500, err instanceof SpaceError ? err.code : 'INTERNAL', err instanceof Error ? err.message : String(err));
      else res.end();
    });
  });
  httpServer.headersTimeout = 30_000;
  httpServer.requestTimeout = 0; // event streams stay open
  const idleMs = opts.idleMs ?? 3_600_000;
  const sweeper = setInterval(() => {
    for (const [id, s] of sessions) if (Date.now() - s.seen > idleMs) void s.transport.close().finally(() => sessions.delete(id));
  }, 60_000);
  sweeper.unref();
  const m = /^(.*):(\d+)$/.exec(opts.listen);
  if (!m) throw new SpaceError('CONFIG_INVALID', `--http takes HOST:PORT, not ${JSON.stringify(opts.listen)}`);
  await new Promise<void>((resolve, reject) => {
    httpServer.once('error', reject);
    httpServer.listen(Number(m[2]), m[1]!.replace(/^\[|\]$/g, ''), () => resolve());
  });
  const addr = httpServer.address() as { address: string; port: number };
  const host = addr.address.includes(':') ? `[${addr.address}]` : addr.address;
  return {
    url: `http://${host}:${addr.port}/mcp`,
    async close() {
      clearInterval(sweeper);
      for (const s of sessions.values()) await s.transport.close().catch(() => {});
      sessions.clear();
      await new Promise<void>((resolve) => httpServer.close(() => resolve()));
      httpServer.closeAllConnections();
    },
  };
}
