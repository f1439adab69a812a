/**
 * Wires the ingress into the daemon: the listener (@space/ingress), its backend (exposures
 * from the service, the sandbox's address from the sandbox network), and the URLs and signed
 * links the API hands out.
 */
import { readFileSync } from 'node:fs';
import { EVERY_PORT, SpaceError, type Logger, type PortExposure, type Sandbox, type SandboxNetwork, type SandboxService } from '@space/core';
import { IngressServer, SIGNED_LINK_PATH, ingressHost, localNamesResolve, makePass, type IngressRoute } from '@space/ingress';
import type { NodeInfo } from '@space/api';
import { nodeUnavailable } from './forward.js';

/** Ingress settings (flags `--ingress-listen`, `--ingress-domain`, `--ingress-cert`, `--ingress-key`, `--ingress-max-connections`). */
export interface IngressOptions {
  /** `HOST:PORT`, or `off`. @default "127.0.0.1:7072" (port 0 when the API listens on port 0) */
  listen?: string;
  /** Host names are `PORT-SANDBOXID.<domain>`. @default "localhost:<the ingress port>" */
  domain?: string;
  /** PEM files of the operator's (wildcard) certificate and key; plain HTTP without. */
  certFile?: string;
  keyFile?: string;
  /** Connections the ingress holds open to one sandbox at once (`--ingress-max-connections`); more wait in turn. @default 256 */
  maxConnectionsPerSandbox?: number;
}

/** A port's addresses as the API returns them. */
export interface PortUrls {
  /** The port's origin, e.g. `http://8000-sb….localhost:7072/` (every port: `http://{port}-sb….localhost:7072/`). */
  url: string;
  /** A link that sets the pass cookie and redirects to `/`: valid until `signedUrlExpiresAt` (none for every port). */
  signedUrl?: string;
  signedUrlExpiresAt?: string;
}

/** How long a request waits for its sandbox to wake (autoResume) before it gets 504. */
export const WAKE_TIMEOUT_MS = 60_000;

/** How long a signed link lives when the exposure itself has no end: 24 hours. */
export const SIGNED_LINK_S = 24 * 3600;

/** The running ingress. */
export interface Ingress {
  url: string;
  domain: string;
  /** The URLs of an exposure. */
  urls(e: PortExposure): PortUrls;
  close(): Promise<void>;
}

/**
 * Starts the ingress listener for `service`; undefined when `listen` is `off` or there is no
 * sandbox network (nothing could be reached).
 * @example const ingress = await startIngress({ service, network, secret, logger }, { listen: '127.0.0.1:7072' });
 */
export async function startIngress(deps: { service: SandboxService; network: SandboxNetwork | undefined; secret: Buffer; logger: Logger; nodes?: () => Promise<Pick<NodeInfo, 'name' | 'state' | 'heartbeatAt' | 'ingressUrl'>[]> }, opts: { listen: string; domain?: string; certFile?: string; keyFile?: string; wakeTimeoutMs?: number; maxConnectionsPerSandbox?: number }): Promise<Ingress | undefined> {
  if (opts.listen === 'off') return undefined;
  const wakeTimeoutMs = opts.wakeTimeoutMs ?? WAKE_TIMEOUT_MS;
  const { service, network, secret, logger } = deps;
  if (!network) {
    logger.warn({}, 'ingress off: the daemon runs without a sandbox network (--egress off), so no sandbox port can be reached');
    return undefined;
  }
  const m = /^(\[[^\]]+\]|[^:]+):(\d{1,5})$/.exec(opts.listen);
  if (!m) throw new SpaceError('CONFIG_INVALID', `--ingress-listen must be HOST:PORT or off; got ${JSON.stringify(opts.listen)}`);
  if ((opts.certFile === undefined) !== (opts.keyFile === undefined)) throw new SpaceError('CONFIG_INVALID', 'Give both --ingress-cert and --ingress-key (PEM files), or neither');
  let tls: { cert: Buffer; key: Buffer } | undefined;
  try {
    tls = opts.certFile && opts.keyFile ? { cert: readFileSync(opts.certFile), key: readFileSync(opts.keyFile) } : undefined;
  } catch (err) {
    throw new SpaceError('CONFIG_INVALID', `Cannot read the ingress certificate or key: ${(err as Error).message}`, { cause: err });
  }
  const toRoute = (e: PortExposure, tenantId: string): IngressRoute => ({ sandboxId: e.sandboxId, tenantId, port: e.port, public: e.public, tokenHash: e.tokenHash, ...(e.expiresAt ? { expiresAt: e.expiresAt } : {}), ...(e.hostHeader ? { hostHeader: e.hostHeader } : {}) });
  // The sandbox each route was found with, for connect (no second read of the store per request).
  const found = new WeakMap<IngressRoute, Sandbox>();
  let domain = opts.domain ?? '';
  const server = new IngressServer({
    domain: '',
    secret,
    ...(tls ? { tls } : {}),
    ...(opts.maxConnectionsPerSandbox !== undefined ? { maxConnectionsPerSandbox: opts.maxConnectionsPerSandbox } : {}),
    backend: {
      async route(id, port) {
        const r = await service.ingressRoute(id, port);
        if (!r) return undefined;
        const route = toRoute(r.exposure, r.sandbox.tenantId);
        found.set(route, r.sandbox);
        return route;
      },
      async connect(route) {
        // A sleeping sandbox is woken for the request (autoResume); the request waits that long at most.
        let timer: NodeJS.Timeout | undefined;
        const wakeLimit = new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new SpaceError('TIMEOUT', `Sandbox ${route.sandboxId} did not wake within ${wakeTimeoutMs} ms; it goes on waking: try again in a moment`)), wakeTimeoutMs);
        });
        try {
          const sb = found.get(route);
          if (!sb) throw new SpaceError('PORT_NOT_EXPOSED');
          // Not forwarded between nodes yet (docs/cluster.md): the link works at its node's ingress.
          if (!service.owns(sb)) throw new SpaceError('SANDBOX_ON_OTHER_NODE', `Sandbox ${sb.id} runs on node ${sb.node ?? '(none recorded)'}: its ports are reached through that node's ingress`, { details: { sandboxId: sb.id, node: sb.node } });
          await Promise.race([service.ingressReady(sb), wakeLimit]);
        } finally {
          clearTimeout(timer);
        }
        const address = network.addressOf(route.sandboxId);
        if (!address) throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${route.sandboxId} has no network link right now; try again in a moment`);
        return address;
      },
      // A cluster's: another node's sandbox is served by that node's ingress.
      async forwardTo(route, forwarded) {
        const sb = found.get(route);
        if (!sb || service.owns(sb) || !deps.nodes) return undefined;
        if (forwarded) throw new SpaceError('SANDBOX_ON_OTHER_NODE', `Sandbox ${sb.id} runs on node ${sb.node ?? '(none recorded)'}, and another node's ingress sent this request here`);
        const node = sb.node ? (await deps.nodes()).find((n) => n.name === sb.node) : undefined;
        if (node?.state !== 'up') throw nodeUnavailable(sb, node);
        if (!node.ingressUrl) throw new SpaceError('NODE_UNAVAILABLE', `Sandbox ${sb.id} runs on node ${node.name}, which runs no ingress`);
        return node.ingressUrl;
      },
      log(e) {
        logger.debug({ ingress: e }, 'ingress request');
        service.recordIngress(e).catch((err: unknown) => logger.error({ err, ingress: e }, 'ingress audit entry not written'));
      },
    },
  });
  const host = m[1]!.replace(/^\[|\]$/g, '');
  const { url, port } = await server.listen(host, Number(m[2]));
  domain ||= `localhost:${port}`;
  server.domain = domain;
  const scheme = tls ? 'https' : 'http';
  logger.info({ ingress: url, domain }, 'ingress listening');
  void localNamesResolve(domain).then((ok) => {
    if (!ok) logger.warn({ domain }, `Preview names under ${domain} do not resolve to loopback through this host's resolver: browsers and curl reach them, programs that ask the system (Node's fetch, Python) get ENOTFOUND. Install libnss-myhostname (./space does), or give --ingress-domain a name with wildcard DNS (docs/ingress.md)`);
  });
  return {
    url,
    domain,
    urls(e) {
      if (e.port === EVERY_PORT) return { url: `${scheme}://{port}-${e.sandboxId}.${domain}/` };
      const origin = `${scheme}://${ingressHost(e.port, e.sandboxId, domain)}/`;
      const exp = e.expiresAt ? Math.floor(Date.parse(e.expiresAt) / 1000) : Math.floor(Date.now() / 1000) + SIGNED_LINK_S;
      const pass = makePass(secret, { sandboxId: e.sandboxId, port: e.port, tokenHash: e.tokenHash }, exp);
      return { url: origin, signedUrl: `${origin.slice(0, -1)}${SIGNED_LINK_PATH}?pass=${pass}&next=/`, signedUrlExpiresAt: new Date(exp * 1000).toISOString() };
    },
    close: () => server.close(),
  };
}

