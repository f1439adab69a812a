/**
 * The egress proxy: the only destination a sandbox's network reaches. An HTTP forward proxy
 * (absolute-form requests, `http://` and `https://`: the proxy speaks TLS upstream) and CONNECT. Tunnels are intercepted: TLS is terminated with a
 * certificate from the tenant's CA, each request inside is checked and forwarded over a new,
 * verified TLS connection; `passthrough` destinations are tunnelled as raw TCP instead.
 *
 * Every request is checked against the sandbox's current policy (so changes apply at the next
 * request), gets the values of the secrets whose placeholders it carries (only for the
 * secrets' hosts; a placeholder bound for any other host blocks the request), and is audited.
 * Parsing is Node's (llhttp, strict): conflicting Content-Length / Transfer-Encoding and other
 * smuggling shapes are rejected before they reach this code. The proxy never follows redirects:
 * a 3xx goes back to the sandbox, whose next request is checked again.
 */
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import tls from 'node:tls';
import type { Duplex } from 'node:stream';
import { cidrList, hostMatches, type EgressLogEntry, type EgressPolicy, type ErrorCode, type SecretAttachment, type SecretInfo } from '@space/core';
import { AddressRules, Resolver, family, unmap } from './addresses.js';
import type { TenantCas } from './ca.js';

/** What the proxy knows of the sandbox behind a connection, fetched for every request. */
export interface EgressContext {
  sandboxId: string;
  tenantId: string;
  policy: EgressPolicy;
  secrets: SecretAttachment[];
}

/** Options of {@link EgressProxy}. */
export interface EgressProxyOptions {
  /** Address and port to listen on (the sandbox network's proxy address). */
  host: string;
  port: number;
  /** The sandbox whose link has `address`; undefined refuses the connection. */
  sandboxAt(address: string): string | undefined;
  /** A sandbox's current policy and secrets (asked for every request, so changes apply at once). */
  context(sandboxId: string): Promise<EgressContext | undefined>;
  /** A secret without its value (undefined when it no longer exists). */
  describe(tenantId: string, name: string): Promise<SecretInfo | undefined>;
  /** A secret with its value, unsealed only when a request needs it (undefined when it no longer exists). */
  reveal(tenantId: string, name: string): Promise<(SecretInfo & { value: string }) | undefined>;
  cas: TenantCas;
  /** Receives every request's audit entry. */
  audit(e: EgressLogEntry): void;
  /** Ranges never reachable whatever the policy (besides metadata addresses): the sandbox network. */
  neverReach?: string[];
  /** Endpoints never reachable (the daemon's own listeners). */
  forbiddenEndpoint?(ip: string, port: number): boolean;
  /** Extra CA certificates (PEM) trusted for upstream TLS, besides the system roots. */
  upstreamCa?: string;
  /** Names resolved without DNS (`name → ip`). */
  hosts?: Record<string, string>;
  /** Connect timeout upstream, ms. @default 10000 */
  connectTimeoutMs?: number;
  logger?: { warn(o: object, msg: string): void };
}

interface Tunnel {
  sandboxId: string;
  host: string;
  port: number;
}

/** A refused request: its status for the sandbox and the reason for the audit log. */
class Refusal extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const HOP_BY_HOP = ['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'proxy-authenticate', 'te', 'trailer', 'transfer-encoding', 'upgrade'];

function refusalBody(message: string): string {
  return JSON.stringify({ error: { code: 'EGRESS_DENIED' satisfies ErrorCode, message, hint: 'Allow the destination in the sandbox\'s egress policy, or check which hosts the secret is for.' } });
}

/** `host[:port]` of a Host header or CONNECT authority, lowercased, brackets removed. */
function splitAuthority(a: string, defaultPort: number): { host: string; port: number } | undefined {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]/@\s]+))(?::(\d{1,5}))?$/.exec(a);
  if (!m) return undefined;
  const port = m[3] ? Number(m[3]) : defaultPort;
  if (!(port >= 1 && port <= 65535)) return undefined;
  return { host: (m[1] ?? m[2]!).toLowerCase().replace(/\.$/, ''), port };
}

/**
 * The egress proxy.
 *
 * @example
 * const proxy = new EgressProxy({ host: '10.231.0.1', port: 3128, sandboxAt, reveal, cas, audit: (e) => void store.insertEgressLog(e) });
 * await proxy.listen();
 */
export class EgressProxy {
  private readonly server: http.Server;
  private readonly inner: http.Server;
  /** The sandbox of each accepted connection. */
  private readonly owners = new WeakMap<object, string>();
  private readonly tunnels = new WeakMap<object, Tunnel>();
  private readonly resolver: Resolver;
  private readonly rules: AddressRules;
  private readonly httpAgent = new http.Agent({ keepAlive: true, maxSockets: 256, timeout: 300_000 });
  private readonly httpsAgent: https.Agent;
  private readonly sockets = new Set<Duplex>();

  constructor(private readonly opts: EgressProxyOptions) {
    this.resolver = new Resolver(opts.hosts);
    this.rules = new AddressRules(opts.neverReach ?? []);
    this.httpsAgent = new https.Agent({ keepAlive: true, maxSockets: 256, timeout: 300_000, ca: [...tls.rootCertificates, ...(opts.upstreamCa ? [opts.upstreamCa] : [])] });
    const serverOpts: http.ServerOptions = { requestTimeout: 0, headersTimeout: 30_000, keepAliveTimeout: 60_000, maxHeaderSize: 64 * 1024 };
    this.server = http.createServer(serverOpts, (req, res) => void this.onRequest(req, res));
    this.inner = http.createServer(serverOpts, (req, res) => void this.onRequest(req, res));
    this.server.on('connection', (s: net.Socket) => {
      this.track(s);
      // When the sandbox closes first, answer its FIN with a reset: a graceful close would leave
      // its end in TIME_WAIT for a minute, and this runsc cannot checkpoint a sandbox holding
      // one (a failed checkpoint kills it). The reset takes the endpoint straight to CLOSED; it
      // must go out before Node's own graceful end (so it runs first), as TIME_WAIT ignores resets.
      s.prependOnceListener('end', () => s.resetAndDestroy());
      lingerInsteadOfFin(s);
      const id = this.opts.sandboxAt(unmap(s.remoteAddress ?? ''));
      if (id) this.owners.set(s, id);
      else s.destroy();
    });
    this.server.on('connect', (req: http.IncomingMessage, s: Duplex, head: Buffer) => void this.onConnect(req, s, head));
    for (const srv of [this.server, this.inner]) srv.on('clientError', (err: NodeJS.ErrnoException, s: Duplex) => void this.onClientError(err, s));
  }

  private track(s: Duplex): void {
    this.sockets.add(s);
    s.once('close', () => this.sockets.delete(s));
  }

  /** Starts listening. */
  async listen(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(this.opts.port, this.opts.host, () => {
        this.server.off('error', reject);
        resolve();
      });
    });
  }

  /** The port it listens on. */
  get port(): number {
    return (this.server.address() as net.AddressInfo).port;
  }

  /** Stops listening and closes every connection. */
  async close(): Promise<void> {
    const closed = new Promise<void>((r) => this.server.close(() => r()));
    for (const s of this.sockets) s.destroy();
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
    await closed;
  }

  /** The current context of the sandbox behind `socket` (a connection or a tunnel's TLS socket). */
  private async contextOf(socket: object): Promise<EgressContext | undefined> {
    const id = this.tunnels.get(socket)?.sandboxId ?? this.owners.get(socket);
    return id ? this.opts.context(id) : undefined;
  }

  private audit(base: Omit<EgressLogEntry, 'at' | 'durationMs'>, t0: number): void {
    try {
      this.opts.audit({ ...base, at: new Date().toISOString(), durationMs: Math.round(performance.now() - t0) });
    } catch (err) {
      this.opts.logger?.warn({ err }, 'egress audit entry lost');
    }
  }

  /** Is `host:port` open by the policy (or by an attached secret's hosts)? Throws a Refusal if not. */
  private checkDestination(ctx: EgressContext, host: string, port: number, secretHosts: string[]): void {
    const p = ctx.policy;
    if (!p.ports.includes(port)) throw new Refusal(403, `Port ${port} is not allowed by the egress policy (allowed: ${p.ports.join(', ') || 'none'})`);
    if (net.isIP(host)) {
      const bl = cidrList(p.cidrs);
      if (bl.check(host, family(host))) return;
      // Public internet: any public address not denied; the address rules refuse the rest (private, metadata, ...).
      const why = p.publicInternet ? (this.denied(p, host) ?? this.rules.refusal(host, bl)) : `${host} is not in an allowed CIDR of the egress policy`;
      if (why) throw new Refusal(403, why);
      return;
    }
    if ([...p.domains, ...secretHosts].some((d) => hostMatches(d, host))) return;
    // Public internet: any name not denied; the address it resolves to is checked when connecting (pickAddress).
    const why = p.publicInternet ? this.denied(p, host) : `${host} is not an allowed domain of the egress policy`;
    if (why) throw new Refusal(403, why);
  }

  /** Why the policy's deny lists refuse `hostOrAddress` (not listed as allowed), if they do. */
  private denied(p: EgressContext['policy'], hostOrAddress: string): string | undefined {
    if (!p.deny) return undefined;
    if (net.isIP(hostOrAddress)) {
      const a = hostOrAddress;
      return cidrList(p.deny.cidrs ?? []).check(a, family(a)) ? `${a} is in a denied CIDR of the egress policy` : undefined;
    }
    return (p.deny.domains ?? []).some((d) => hostMatches(d, hostOrAddress)) ? `${hostOrAddress} is a denied domain of the egress policy` : undefined;
  }

  /** Resolves `host` and returns the first address the rules allow; throws a Refusal if none. */
  private async pickAddress(ctx: EgressContext, host: string, port: number): Promise<string> {
    let addrs: string[];
    try {
      addrs = await this.resolver.lookup(host);
    } catch (err) {
      throw new Refusal(502, err instanceof Error ? err.message : String(err));
    }
    const allowed = cidrList(ctx.policy.cidrs);
    // A name open only because the internet is (not listed) must not resolve into a denied range.
    const listed = net.isIP(host) ? allowed.check(host, family(host)) : ctx.policy.domains.some((d) => hostMatches(d, host));
    const deniedAt = (a: string) => (ctx.policy.publicInternet && !listed && !allowed.check(a, family(a)) ? this.denied(ctx.policy, a) : undefined);
    let why = `${host} has no address`;
    for (const a of addrs) {
      const r = this.rules.refusal(a, allowed) ?? deniedAt(a) ?? (this.opts.forbiddenEndpoint?.(a, port) ? `${a}:${port} is the SPACE daemon itself` : undefined);
      if (!r) return a;
      why = r;
    }
    throw new Refusal(403, why);
  }

  /** Hosts of the attached secrets (reachable without a policy entry). */
  private async secretHosts(ctx: EgressContext): Promise<string[]> {
    const out: string[] = [];
    // A header rule (E2B's network rules) grants no access: only secrets open their hosts.
    for (const a of ctx.secrets.filter((x) => !x.rule)) {
      const s = await this.opts.describe(ctx.tenantId, a.name).catch(() => undefined);
      if (s) out.push(...s.hosts);
    }
    return out;
  }

  private async onConnect(req: http.IncomingMessage, sock: Duplex, head: Buffer): Promise<void> {
    const t0 = performance.now();
    this.track(sock);
    sock.on('error', () => {});
    const ctx = await this.contextOf(req.socket);
    if (!ctx) return void sock.destroy();
    const dest = splitAuthority(req.url ?? '', 443);
    const base = { sandboxId: ctx.sandboxId, tenantId: ctx.tenantId, method: 'CONNECT', scheme: 'https' as const, host: dest?.host ?? String(req.url).slice(0, 255), port: dest?.port ?? 0, bytesIn: 0, bytesOut: 0, secrets: [] as string[] };
    const refuse = (status: number, reason: string) => {
      const body = refusalBody(reason);
      sock.end(`HTTP/1.1 ${status} ${http.STATUS_CODES[status]}\r\nContent-Type: application/json\r\nX-Space-Egress-Error: EGRESS_DENIED\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      this.audit({ ...base, status, decision: 'denied', reason }, t0);
    };
    if (!dest) return refuse(400, `Invalid CONNECT target ${JSON.stringify(req.url)}: use host:port`);
    try {
      const pass = ctx.policy.passthrough.includes(`${net.isIPv6(dest.host) ? `[${dest.host}]` : dest.host}:${dest.port}`);
      if (pass) {
        const address = await this.pickAddress(ctx, dest.host, dest.port);
        return this.passthrough(sock, head, dest, address, base, t0);
      }
      this.checkDestination(ctx, dest.host, dest.port, await this.secretHosts(ctx));
      const secureContext = await this.opts.cas.serverContext(ctx.tenantId, dest.host);
      sock.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) sock.unshift(head);
      const tlsSock = new tls.TLSSocket(sock, {
        isServer: true,
        secureContext,
        ALPNProtocols: ['http/1.1'],
        SNICallback: (sni, cb) => {
          if (sni.toLowerCase().replace(/\.$/, '') === dest.host) return cb(null, secureContext);
          this.audit({ ...base, decision: 'denied', reason: `TLS server name ${sni} differs from the CONNECT host ${dest.host}` }, t0);
          cb(new Error('SNI does not match the CONNECT host'));
        },
      });
      tlsSock.on('error', () => sock.destroy());
      this.tunnels.set(tlsSock, { sandboxId: ctx.sandboxId, host: dest.host, port: dest.port });
      this.track(tlsSock);
      this.inner.emit('connection', tlsSock);
    } catch (err) {
      if (err instanceof Refusal) return refuse(err.status, err.message);
      refuse(502, err instanceof Error ? err.message : String(err));
    }
  }

  /** A raw TCP tunnel to a passthrough destination (no interception, no secrets). */
  private passthrough(sock: Duplex, head: Buffer, dest: { host: string; port: number }, address: string, base: Omit<EgressLogEntry, 'at' | 'durationMs' | 'decision'>, t0: number): void {
    const up = net.connect({ host: address, port: dest.port, timeout: this.opts.connectTimeoutMs ?? 10_000 });
    this.track(up);
    let bytesOut = head.length;
    let bytesIn = 0;
    let done = false;
    const finish = (reason?: string) => {
      if (done) return;
      done = true;
      this.audit({ ...base, method: 'TCP', scheme: 'tcp', status: reason ? 502 : 200, bytesIn, bytesOut, decision: 'allowed', ...(reason ? { reason } : {}) }, t0);
      up.destroy();
      sock.destroy();
    };
    up.once('timeout', () => finish('upstream connect timed out'));
    up.once('error', (e) => finish(e.message));
    up.once('connect', () => {
      up.setTimeout(0);
      sock.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) up.write(head);
      sock.on('data', (d: Buffer) => (bytesOut += d.length));
      up.on('data', (d: Buffer) => (bytesIn += d.length));
      sock.pipe(up);
      up.pipe(sock);
      up.once('close', () => finish());
      sock.once('close', () => finish());
    });
  }

  private async onRequest(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const t0 = performance.now();
    const tunnel = this.tunnels.get(req.socket);
    const ctx = await this.contextOf(req.socket);
    if (!ctx) return void req.socket.destroy();
    let scheme: 'http' | 'https' = tunnel ? 'https' : 'http';
    let dest: { host: string; port: number } | undefined;
    let path = '/';
    const base = { sandboxId: ctx.sandboxId, tenantId: ctx.tenantId, method: req.method ?? 'GET', scheme, host: '', port: 0, bytesIn: 0, bytesOut: 0, secrets: [] as string[] };
    const refuse = (status: number, reason: string) => {
      this.audit({ ...base, ...(dest ?? {}), path, status, decision: 'denied', reason }, t0);
      if (res.headersSent) return void res.destroy();
      const body = refusalBody(reason);
      res.writeHead(status, { 'content-type': 'application/json', 'x-space-egress-error': 'EGRESS_DENIED', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    };
    try {
      const hostHeader = req.headers.host;
      if (tunnel) {
        const h = hostHeader ? splitAuthority(hostHeader, tunnel.port) : undefined;
        if (!h || h.host !== tunnel.host || h.port !== tunnel.port) {
          dest = { host: tunnel.host, port: tunnel.port };
          throw new Refusal(421, `Host header ${JSON.stringify(hostHeader ?? '')} does not match the TLS server name ${tunnel.host}`);
        }
        dest = h;
        path = req.url ?? '/';
        if (!path.startsWith('/')) throw new Refusal(400, 'Inside a tunnel, send origin-form request targets (/path)');
      } else {
        let url: URL;
        try {
          url = new URL(req.url ?? '');
        } catch {
          throw new Refusal(400, 'This is the egress proxy: send absolute URLs (http://host/path), e.g. through HTTP_PROXY, or CONNECT for https');
        }
        // `GET https://…` to the proxy (busybox wget, some older clients): the proxy speaks TLS upstream.
        if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new Refusal(400, `Only http and https URLs go through the egress proxy, not ${url.protocol}`);
        if (url.username || url.password) throw new Refusal(400, 'Credentials in the URL are not forwarded');
        scheme = url.protocol === 'https:' ? 'https' : 'http';
        base.scheme = scheme;
        const defaultPort = scheme === 'https' ? 443 : 80;
        dest = splitAuthority(url.host, defaultPort);
        if (!dest) throw new Refusal(400, `Invalid host ${url.host}`);
        const h = hostHeader ? splitAuthority(hostHeader, defaultPort) : undefined;
        if (h && (h.host !== dest.host || h.port !== dest.port)) throw new Refusal(400, `Host header ${JSON.stringify(hostHeader)} does not match the request's URL host ${url.host}`);
        path = `${url.pathname}${url.search}`;
      }
      const { host, port } = dest;
      // Secrets: placeholders found in the request, checked against the secrets' hosts.
      const headers: Record<string, string | string[]> = {};
      for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !HOP_BY_HOP.includes(k)) headers[k] = v;
      for (const c of (req.headers.connection ?? '').split(',')) delete headers[c.trim().toLowerCase()];
      const injected: string[] = [];
      const secretHosts: string[] = [];
      for (const a of ctx.secrets) {
        const inHeaders = Object.entries(headers).some(([k, v]) => carries(k, v, a.placeholder));
        const inPath = path.includes(a.placeholder);
        const info = await this.opts.describe(ctx.tenantId, a.name);
        if (!info) continue;
        if (!a.rule) secretHosts.push(...info.hosts);
        const forHost = info.hosts.some((h) => hostMatches(h, host));
        if ((inHeaders || inPath) && !forHost) throw new Refusal(403, `The placeholder of secret ${a.name} was sent to ${host}, which is not one of its hosts (${info.hosts.join(', ')}); the request was not sent`);
        if (!forHost || (!inHeaders && !inPath && !info.header)) continue;
        // Unsealed only now, for a request that carries it (revocation applies at once).
        const s = await this.opts.reveal(ctx.tenantId, a.name);
        if (!s) continue;
        if (inHeaders || inPath) {
          for (const [k, v] of Object.entries(headers)) headers[k] = Array.isArray(v) ? v.map((x) => substitute(k, x, a.placeholder, s.value)) : substitute(k, v, a.placeholder, s.value);
          if (inPath) path = path.split(a.placeholder).join(encodeURIComponent(s.value));
          injected.push(a.name);
        }
        if (s.header) {
          headers[s.header.toLowerCase()] = (s.format ?? '{value}').split('{value}').join(s.value);
          if (!injected.includes(a.name)) injected.push(a.name);
        }
      }
      base.secrets = injected;
      this.checkDestination(ctx, host, port, secretHosts);
      const address = await this.pickAddress(ctx, host, port);
      headers.host = port === (scheme === 'https' ? 443 : 80) ? (net.isIPv6(host) ? `[${host}]` : host) : `${net.isIPv6(host) ? `[${host}]` : host}:${port}`;
      await this.forward(req, res, { scheme, host, port, address, path, headers }, base, t0);
    } catch (err) {
      if (err instanceof Refusal) return refuse(err.status, err.message);
      refuse(502, err instanceof Error ? err.message : String(err));
    }
  }

  /** Sends the request upstream and streams the response back; audits it when done. */
  private forward(req: http.IncomingMessage, res: http.ServerResponse, to: { scheme: 'http' | 'https'; host: string; port: number; address: string; path: string; headers: Record<string, string | string[]> }, base: Omit<EgressLogEntry, 'at' | 'durationMs' | 'decision'>, t0: number): Promise<void> {
    return new Promise<void>((resolve) => {
      let bytesOut = 0;
      let bytesIn = 0;
      let status: number | undefined;
      let done = false;
      const finish = (reason?: string) => {
        if (done) return;
        done = true;
        this.audit({ ...base, host: to.host, port: to.port, path: to.path, ...(status ? { status } : { status: 502 }), bytesIn, bytesOut, decision: 'allowed', ...(reason ? { reason } : {}) }, t0);
        resolve();
      };
      const opts: https.RequestOptions = {
        host: to.address,
        port: to.port,
        method: req.method,
        path: to.path,
        headers: to.headers,
        setHost: false,
        timeout: this.opts.connectTimeoutMs ?? 10_000,
        ...(to.scheme === 'https' ? { agent: this.httpsAgent, servername: net.isIP(to.host) ? undefined : to.host, checkServerIdentity: (_h: string, cert: tls.PeerCertificate) => tls.checkServerIdentity(to.host, cert) } : { agent: this.httpAgent }),
      };
      const up = (to.scheme === 'https' ? https : http).request(opts, (ures) => {
        status = ures.statusCode ?? 502;
        const h: Record<string, string | string[]> = {};
        for (const [k, v] of Object.entries(ures.headers)) if (v !== undefined && !HOP_BY_HOP.includes(k)) h[k] = v;
        res.writeHead(status, ures.statusMessage, h);
        ures.on('data', (d: Buffer) => (bytesIn += d.length));
        ures.pipe(res);
        ures.once('end', () => finish());
        ures.once('error', (e) => {
          res.destroy();
          finish(e.message);
        });
      });
      up.once('timeout', () => up.destroy(new Error('upstream timed out')));
      // The timeout is for connecting: a reused keep-alive socket is connected already.
      up.once('socket', (s) => (s.connecting ? s.once('connect', () => up.setTimeout(0)) : up.setTimeout(0)));
      up.once('error', (e: NodeJS.ErrnoException) => {
        const reason = `upstream ${to.host}:${to.port}: ${e.code ?? ''} ${e.message}`.replace(/\s+/g, ' ').trim();
        if (!res.headersSent) {
          const body = JSON.stringify({ error: { code: 'EGRESS_UPSTREAM_FAILED' satisfies ErrorCode, message: reason } });
          res.writeHead(502, { 'content-type': 'application/json', 'x-space-egress-error': 'EGRESS_UPSTREAM_FAILED', 'content-length': Buffer.byteLength(body) });
          res.end(body);
        } else res.destroy();
        finish(reason);
      });
      res.once('close', () => {
        if (!res.writableFinished) up.destroy();
        finish(res.writableFinished ? undefined : 'the sandbox closed the connection');
      });
      req.on('data', (d: Buffer) => (bytesOut += d.length));
      req.pipe(up);
    });
  }

  private async onClientError(err: NodeJS.ErrnoException, s: Duplex): Promise<void> {
    const t = this.tunnels.get(s);
    const ctx = await this.contextOf(s).catch(() => undefined);
    if (ctx && err.code !== 'ECONNRESET') {
      this.audit({ sandboxId: ctx.sandboxId, tenantId: ctx.tenantId, method: '?', scheme: t ? 'https' : 'http', host: t?.host ?? '', port: t?.port ?? 0, status: 400, bytesIn: 0, bytesOut: 0, secrets: [], decision: 'denied', reason: `malformed request (${err.code ?? err.message}): refused` }, performance.now());
    }
    if (s.writable && err.code !== 'ECONNRESET') {
      const body = refusalBody(`Malformed HTTP request (${err.code ?? 'parse error'})`);
      s.end(`HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nX-Space-Egress-Error: EGRESS_DENIED\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
    } else s.destroy();
  }
}

/** How long the proxy waits for a sandbox to close a connection the proxy is done with. */
const CLOSE_GRACE_MS = 2_000;

/**
 * Makes the proxy never the first to send a FIN to a sandbox: when it would end a connection
 * (a `Connection: close` response, an upstream that ended a passthrough tunnel), it sends what
 * it has and waits for the sandbox to close (answered with a reset, see above), resetting
 * after {@link CLOSE_GRACE_MS} if it does not. Two FINs crossing (both sides closing at once)
 * would leave the sandbox's end in TIME_WAIT, which this runsc cannot checkpoint. Responses
 * are delimited by length or chunks, so no client waits for the close to read them.
 */
function lingerInsteadOfFin(s: net.Socket): void {
  let timer: NodeJS.Timeout | undefined;
  const end = ((chunk?: unknown, encoding?: unknown, cb?: unknown) => {
    const done = [chunk, encoding, cb].find((x) => typeof x === 'function') as (() => void) | undefined;
    if (chunk !== undefined && chunk !== null && typeof chunk !== 'function') s.write(chunk as Buffer, typeof encoding === 'string' ? (encoding as BufferEncoding) : undefined);
    if (!timer) {
      timer = setTimeout(() => s.resetAndDestroy(), CLOSE_GRACE_MS);
      s.once('close', () => clearTimeout(timer));
    }
    done?.();
    return s;
  }) as typeof s.end;
  s.end = end;
}

/** True when header `k` carries `ph` (also inside HTTP Basic credentials). */
function carries(k: string, v: string | string[], ph: string): boolean {
  const vals = Array.isArray(v) ? v : [v];
  return vals.some((x) => x.includes(ph) || (k === 'authorization' && basicDecoded(x)?.includes(ph)));
}

function basicDecoded(v: string): string | undefined {
  const m = /^Basic\s+([A-Za-z0-9+/=]+)$/i.exec(v.trim());
  return m ? Buffer.from(m[1]!, 'base64').toString('utf8') : undefined;
}

function substitute(k: string, v: string, ph: string, value: string): string {
  if (v.includes(ph)) return v.split(ph).join(value);
  const dec = k === 'authorization' ? basicDecoded(v) : undefined;
  if (dec?.includes(ph)) return `Basic ${Buffer.from(dec.split(ph).join(value)).toString('base64')}`;
  return v;
}
