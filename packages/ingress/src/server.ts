/**
 * The ingress listener: routes `PORT-SANDBOXID.DOMAIN` to that sandbox's port, private by
 * default. HTTP/1.1 with keep-alive, WebSocket upgrades, streamed request and response bodies
 * with backpressure (http-proxy-3), `X-Forwarded-*` headers, TLS with the operator's
 * certificate. It forwards only to the address the backend gives for the sandbox — never to
 * anything a request names — and strips the access token and the pass cookie before the
 * request reaches the sandbox.
 */
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { createProxyServer } from 'http-proxy-3';
import { SpaceError, toSpaceError, type ErrorCode, type IngressLogEntry } from '@space/api';
import { ACCESS_TOKEN_HEADER, E2B_ACCESS_TOKEN_HEADER, PASS_COOKIE, SIGNED_LINK_PATH, checkPass, cookieValue, tokenMatches, withoutCookie } from './access.js';
import { parseIngressHost } from './host.js';
import { SandboxSlots } from './slots.js';

export type { IngressLogEntry };

/** An exposed port, as the backend knows it. */
export interface IngressRoute {
  sandboxId: string;
  tenantId: string;
  port: number;
  /** Reachable without a token. */
  public: boolean;
  /** SHA-256 (hex) of the port's access token. */
  tokenHash: string;
  /** When the exposure ends (ISO 8601); none: while the sandbox lives. */
  expiresAt?: string;
  /** The Host header the sandbox gets, `${PORT}` replaced by the port (E2B's `maskRequestHost`); none: the client's. */
  hostHeader?: string;
}

/** What the ingress asks the daemon. */
export interface IngressBackend {
  /** The exposure of `port` of `sandboxId`, or undefined (every unknown case answers the same 404). */
  route(sandboxId: string, port: number): Promise<IngressRoute | undefined>;
  /**
   * The address to connect to: the sandbox's own, after waking it when it sleeps and may be
   * woken (bounded). Throws a SpaceError to refuse (e.g. SANDBOX_INVALID_STATE, 409).
   */
  connect(route: IngressRoute): Promise<string>;
  /** Called once per request when it ends. */
  log?(entry: IngressLogEntry): void;
  /**
   * Where the request goes instead when another node of a cluster runs the sandbox: that
   * node's ingress (`http://HOST:PORT`), which checks the token, logs and serves it; undefined:
   * here. `forwarded`: another node sent it here already (never sent on again).
   */
  forwardTo?(route: IngressRoute, forwarded: boolean): Promise<string | undefined>;
}

/** Set on a request one node's ingress sends to another's: which node sent it. */
export const INGRESS_FORWARDED_BY = 'x-space-forwarded-by';

/** Options of {@link IngressServer}. */
export interface IngressServerOptions {
  /** Host names are `PORT-SANDBOXID.<domain>`, e.g. `localhost:7072`. */
  domain: string;
  /** Key of the passes (signed links and cookies): 32 random bytes kept by the node. */
  secret: Buffer;
  backend: IngressBackend;
  /** The operator's certificate and key (PEM), usually a wildcard for the domain; plain HTTP without. */
  tls?: { cert: string | Buffer; key: string | Buffer };
  /** A client must send its request headers within this. @default 10000 */
  headersTimeoutMs?: number;
  /** The whole request (headers and body) must arrive within this. @default 600000 */
  requestTimeoutMs?: number;
  /** Request headers larger than this are refused (431). @default 16384 */
  maxHeaderBytes?: number;
  /** How long a sandbox's server may take to start answering. @default 120000 */
  upstreamTimeoutMs?: number;
  /**
   * Connections the ingress holds open to one sandbox at once: requests in flight and
   * WebSockets. Requests beyond wait in turn (see `maxQueuedPerSandbox`). @default 256
   */
  maxConnectionsPerSandbox?: number;
  /** Requests that may wait for one of a sandbox's connections; beyond, 503 INGRESS_BUSY at once. @default 4096 */
  maxQueuedPerSandbox?: number;
  /** How long a request waits for one of them before 503 INGRESS_BUSY (as long as a wake may take). @default 60000 */
  queueTimeoutMs?: number;
}

const HOP_TOKEN_HEADERS = [ACCESS_TOKEN_HEADER, E2B_ACCESS_TOKEN_HEADER];

/** On a client's socket: its bytesRead when its last request ended. */
const COUNTED = Symbol('space.ingress.counted');

/** What a client could claim about where a request came from; the ingress says it instead. */
const CLIENT_FORWARDING_HEADERS = ['forwarded', 'x-forwarded-for', 'x-forwarded-host', 'x-forwarded-proto', 'x-forwarded-port', 'x-real-ip'];

/**
 * The agent for connections to sandboxes: no idle connections kept, and each one closed with a
 * reset, never a FIN. This runsc cannot checkpoint a sandbox holding an established connection
 * or one in TIME_WAIT (a failed checkpoint kills it), and TIME_WAIT falls on the side that sends
 * its FIN first — or on both when FINs cross, as when an HTTP/1.0 server closes just as the
 * client is done. A reset takes the sandbox's end straight to CLOSED: when this side is done
 * (the client's `end`/`destroySoon`), and in answer to the sandbox's own FIN. (The egress proxy
 * does the same for connections in the other direction.)
 */
class ResettingAgent extends http.Agent {
  override createConnection(options: net.NetConnectOpts): net.Socket {
    const s = net.createConnection(options);
    const reset = () => {
      if (!s.destroyed) s.resetAndDestroy();
      return s;
    };
    s.end = reset as typeof s.end;
    (s as net.Socket & { destroySoon: () => void }).destroySoon = reset;
    s.prependOnceListener('end', reset);
    return s;
  }
}

/**
 * @example
 * const ingress = new IngressServer({ domain: 'localhost:7072', secret, backend });
 * const { url } = await ingress.listen('127.0.0.1', 7072); // "http://127.0.0.1:7072"
 */
export class IngressServer {
  /** The node server (http or https). */
  readonly server: http.Server;
  /**
   * Host names are `PORT-SANDBOXID.<domain>`. May be set after {@link listen}, for a domain that
   * names the listener's port once it is known (`localhost:PORT`).
   */
  domain: string;
  private readonly proxy;
  private readonly relay;
  /** Connections open to each sandbox, and the requests waiting for one. */
  readonly slots: SandboxSlots;
  private readonly opts: Required<Omit<IngressServerOptions, 'tls'>> & Pick<IngressServerOptions, 'tls'>;

  constructor(opts: IngressServerOptions) {
    this.opts = { headersTimeoutMs: 10_000, requestTimeoutMs: 600_000, maxHeaderBytes: 16_384, upstreamTimeoutMs: 120_000, maxConnectionsPerSandbox: 256, maxQueuedPerSandbox: 4096, queueTimeoutMs: 60_000, ...opts };
    this.slots = new SandboxSlots({ max: this.opts.maxConnectionsPerSandbox, maxQueued: this.opts.maxQueuedPerSandbox, queueTimeoutMs: this.opts.queueTimeoutMs });
    this.domain = opts.domain;
    const serverOpts = { maxHeaderSize: this.opts.maxHeaderBytes, headersTimeout: this.opts.headersTimeoutMs, requestTimeout: this.opts.requestTimeoutMs };
    this.server = opts.tls ? https.createServer({ ...serverOpts, cert: opts.tls.cert, key: opts.tls.key }) : http.createServer(serverOpts);
    // One connection per request to the sandbox, and every one ends with a reset (see
    // ResettingAgent); a WebSocket's upstream answers the sandbox's FIN with a reset too.
    this.proxy = createProxyServer({ xfwd: true, proxyTimeout: this.opts.upstreamTimeoutMs, ws: true, agent: new ResettingAgent({ keepAlive: false }) });
    // To another node's ingress: the request as it came (Host, token, cookie), on a plain connection.
    this.relay = createProxyServer({ xfwd: true, proxyTimeout: this.opts.upstreamTimeoutMs, ws: true, agent: new http.Agent({ keepAlive: false }), headers: { [INGRESS_FORWARDED_BY]: 'ingress' } });
    this.proxy.on('open', (s: net.Socket) => s.prependOnceListener('end', () => s.resetAndDestroy()));
    this.server.on('request', (req, res) => void this.web(req, res));
    this.server.on('upgrade', (req, socket, head) => void this.upgrade(req, socket as net.Socket, head));
    this.server.on('clientError', (err, socket) => {
      const status = (err as NodeJS.ErrnoException).code === 'HPE_HEADER_OVERFLOW' ? '431 Request Header Fields Too Large' : '400 Bad Request';
      if (socket.writable) socket.end(`HTTP/1.1 ${status}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
      else socket.destroy();
    });
  }

  /** Starts listening; resolves to the listener's URL. */
  listen(host: string, port: number): Promise<{ url: string; port: number }> {
    return new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(port, host, () => {
        this.server.off('error', reject);
        const a = this.server.address() as net.AddressInfo;
        resolve({ url: `${this.opts.tls ? 'https' : 'http'}://${host.includes(':') ? `[${host}]` : host}:${a.port}`, port: a.port });
      });
    });
  }

  /** Stops listening and drops open connections (WebSockets included). */
  async close(): Promise<void> {
    await new Promise<void>((r) => {
      this.server.close(() => r());
      this.server.closeAllConnections();
    });
    this.proxy.close?.();
    this.relay.close?.();
  }

  /**
   * The exposed port a request is for, or the error to answer: the request line must be
   * origin-form (a path), with one Host header naming an exposed port of a live sandbox.
   */
  private async find(req: http.IncomingMessage): Promise<IngressRoute> {
    if (!req.url?.startsWith('/') || req.url.startsWith('//')) throw new SpaceError('BAD_REQUEST', 'The request target must be a path (origin-form), not an absolute URL');
    let hosts = 0;
    for (let i = 0; i < req.rawHeaders.length; i += 2) if (req.rawHeaders[i]!.toLowerCase() === 'host') hosts++;
    if (hosts !== 1) throw new SpaceError('BAD_REQUEST', 'The request must carry exactly one Host header');
    const addr = parseIngressHost(req.headers.host, this.domain);
    const route = addr ? await this.opts.backend.route(addr.sandboxId, addr.port) : undefined;
    if (!route || (route.expiresAt && Date.parse(route.expiresAt) <= Date.now())) throw new SpaceError('PORT_NOT_EXPOSED');
    return route;
  }

  /** How a request may use `route` (public, its token, a pass), or INGRESS_UNAUTHENTICATED. */
  private authorize(req: http.IncomingMessage, route: IngressRoute): IngressLogEntry['access'] {
    if (route.public) return 'public';
    const token = HOP_TOKEN_HEADERS.map((h) => req.headers[h]).find((v): v is string => typeof v === 'string');
    if (token !== undefined) {
      if (tokenMatches(token, route.tokenHash)) return 'token';
      throw new SpaceError('INGRESS_UNAUTHENTICATED', 'The access token is not this port\'s');
    }
    if (checkPass(this.opts.secret, route, cookieValue(req.headers.cookie, PASS_COOKIE)) !== undefined) return 'pass';
    throw new SpaceError('INGRESS_UNAUTHENTICATED');
  }

  /**
   * The request as the sandbox gets it: no token, no pass, no forwarding headers of the client's
   * own (the ingress is the edge: it sets X-Forwarded-* itself), the route's Host if it sets one
   * (the client's in X-Forwarded-Host).
   */
  private scrub(req: http.IncomingMessage, route: IngressRoute): void {
    for (const h of CLIENT_FORWARDING_HEADERS) delete req.headers[h];
    if (route.hostHeader) {
      req.headers['x-forwarded-host'] = req.headers.host;
      req.headers.host = route.hostHeader.replaceAll('${PORT}', String(route.port));
    }
    for (const h of HOP_TOKEN_HEADERS) delete req.headers[h];
    const cookie = withoutCookie(req.headers.cookie, PASS_COOKIE);
    if (cookie === undefined) delete req.headers.cookie;
    else req.headers.cookie = cookie;
  }

  private async web(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const started = Date.now();
    const sock = req.socket;
    // Counted from where the connection's previous request ended (its start for the first), so
    // that the request's own line and headers, read before this handler runs, are included.
    const c = sock as net.Socket & { [COUNTED]?: number };
    const [read0, written0] = [c[COUNTED] ?? 0, sock.bytesWritten];
    let route: IngressRoute | undefined;
    let access: IngressLogEntry['access'] = 'refused';
    res.once('close', () => {
      c[COUNTED] = sock.bytesRead;
      if (route) this.log(req, route, started, { status: res.statusCode, bytesIn: sock.bytesRead - read0, bytesOut: sock.bytesWritten - written0, access, websocket: false });
    });
    try {
      // Refusals of an exposed port are logged too (access "refused"); unknown hosts are not.
      const found = await this.find(req);
      // Another node runs the sandbox: its ingress checks, logs and serves the request.
      const elsewhere = await this.opts.backend.forwardTo?.(found, req.headers[INGRESS_FORWARDED_BY] !== undefined);
      if (elsewhere) {
        this.relay.web(req, res, { target: elsewhere }, (err) => {
          this.refuse(req, res, new SpaceError('NODE_UNAVAILABLE', `Sandbox ${found.sandboxId} runs on another node, whose ingress at ${elsewhere} did not answer: ${(err as Error).message}`, { cause: err }));
        });
        return;
      }
      route = found;
      if (req.url?.startsWith(`${SIGNED_LINK_PATH}?`) || req.url === SIGNED_LINK_PATH) {
        if (this.signedLink(req, res, route)) access = 'pass';
        return;
      }
      access = this.authorize(req, route);
      this.scrub(req, route);
      // A connection of the sandbox's, given back when the response ends.
      await this.holdSlot(route.sandboxId, res);
      const address = await this.opts.backend.connect(route);
      this.proxy.web(req, res, { target: `http://${address}:${route.port}` }, (err) => {
        this.refuse(req, res, new SpaceError('INGRESS_UPSTREAM_FAILED', `Nothing answered on port ${route!.port} inside ${route!.sandboxId}: ${(err as Error).message}`, { cause: err }));
      });
    } catch (err) {
      this.refuse(req, res, toSpaceError(err));
    }
  }

  /**
   * `GET /.space/auth?pass=…&next=/path`: a valid pass becomes a cookie for this host, then a
   * redirect. Returns whether the pass was valid.
   */
  private signedLink(req: http.IncomingMessage, res: http.ServerResponse, route: IngressRoute): boolean {
    const u = new URL(req.url!, 'http://ingress.invalid');
    const pass = u.searchParams.get('pass') ?? undefined;
    const exp = checkPass(this.opts.secret, route, pass);
    if (exp === undefined) {
      this.refuse(req, res, new SpaceError('INGRESS_UNAUTHENTICATED', 'This link has expired or is not valid for this port: ask for a new one (`space expose`)'));
      return false;
    }
    const next = u.searchParams.get('next') ?? '/';
    const location = next.startsWith('/') && !next.startsWith('//') && !next.includes('\\') ? next : '/';
    const maxAge = exp - Math.floor(Date.now() / 1000);
    res.writeHead(302, {
      location,
      'set-cookie': `${PASS_COOKIE}=${pass}; Max-Age=${maxAge}; Path=/; HttpOnly; SameSite=Lax${this.opts.tls ? '; Secure' : ''}`,
      'cache-control': 'no-store',
      'content-length': '0',
    });
    res.end();
    return true;
  }

  private async upgrade(req: http.IncomingMessage, socket: net.Socket, head: Buffer): Promise<void> {
    const started = Date.now();
    socket.on('error', () => {});
    try {
      const route = await this.find(req);
      const elsewhere = await this.opts.backend.forwardTo?.(route, req.headers[INGRESS_FORWARDED_BY] !== undefined);
      if (elsewhere) {
        this.relay.ws(req, socket, head, { target: elsewhere }, () => {
          if (socket.writable) socket.end(`HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
          else socket.destroy();
        });
        return;
      }
      const access = this.authorize(req, route);
      this.scrub(req, route);
      // A WebSocket holds one of the sandbox's connections for as long as it is open.
      await this.holdSlot(route.sandboxId, socket);
      const address = await this.opts.backend.connect(route);
      socket.once('close', () => this.log(req, route, started, { status: 101, bytesIn: socket.bytesRead, bytesOut: socket.bytesWritten, access, websocket: true }));
      this.proxy.ws(req, socket, head, { target: `ws://${address}:${route.port}` }, () => {
        if (socket.writable) socket.end(`HTTP/1.1 502 Bad Gateway\r\nconnection: close\r\ncontent-length: 0\r\n\r\n`);
        else socket.destroy();
      });
    } catch (err) {
      const e = toSpaceError(err);
      if (socket.writable) socket.end(`HTTP/1.1 ${e.status} ${http.STATUS_CODES[e.status] ?? ''}\r\nconnection: close\r\ncontent-type: application/json\r\n${e.code === 'INGRESS_BUSY' ? 'retry-after: 1\r\n' : ''}\r\n${JSON.stringify(e.toJSON())}`);
      else socket.destroy();
    }
  }

  /**
   * Waits for one of the sandbox's connections (see {@link SandboxSlots}) and holds it until
   * `conn` (the response, or a WebSocket's socket) closes; a client leaving while it waits gives
   * its turn up. Throws INGRESS_BUSY.
   */
  private async holdSlot(sandboxId: string, conn: http.ServerResponse | net.Socket): Promise<void> {
    const left = new AbortController();
    conn.once('close', () => left.abort(new SpaceError('TIMEOUT', 'The client left while waiting')));
    const release = await this.slots.acquire(sandboxId, left.signal);
    conn.once('close', release);
    if (conn.destroyed) release();
  }

  /** Hands one finished request to the backend's audit log. */
  private log(req: http.IncomingMessage, route: IngressRoute, started: number, e: Pick<IngressLogEntry, 'status' | 'bytesIn' | 'bytesOut' | 'access' | 'websocket'>): void {
    this.opts.backend.log?.({
      at: new Date(started).toISOString(), tenantId: route.tenantId, sandboxId: route.sandboxId, port: route.port, method: req.method ?? 'GET', path: redactPass(req.url ?? '').slice(0, 2048),
      durationMs: Date.now() - started, client: req.socket.remoteAddress ?? '', ...e,
    });
  }

  /** Answers with the error: JSON for programs, a short page for browsers. */
  private refuse(req: http.IncomingMessage, res: http.ServerResponse, e: SpaceError): void {
    if (res.headersSent) {
      res.destroy(e);
      return;
    }
    const html = (req.headers.accept ?? '').includes('text/html');
    const body = html ? page(e.status, e.code, e.message, e.hint) : JSON.stringify(e.toJSON());
    res.writeHead(e.status, { 'content-type': html ? 'text/html; charset=utf-8' : 'application/json', 'cache-control': 'no-store', 'content-length': Buffer.byteLength(body), ...(e.code === 'INGRESS_BUSY' ? { 'retry-after': '1' } : {}) });
    res.end(body);
  }
}

/** A signed link's path with its pass (a credential until it expires) left out, for the log. */
const redactPass = (url: string) => (url.startsWith(SIGNED_LINK_PATH) ? url.replace(/([?&]pass=)[^&]*/, '$1…') : url);

const esc = (s: string) => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function page(status: number, code: ErrorCode, message: string, hint: string | undefined): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><title>${status} ${esc(code)}</title></head><body><h1>${status} ${esc(code)}</h1><p>${esc(message)}</p>${hint ? `<p>${esc(hint)}</p>` : ''}<p><small>SPACE ingress</small></p></body></html>`;
}
