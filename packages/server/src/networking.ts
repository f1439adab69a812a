/**
 * Wires sandbox networking into the daemon: the sandbox network (links into each sandbox's
 * namespace), the egress proxy on the network's proxy address, tenants' CAs and secrets.
 */
import { existsSync, promises as fs, readFileSync } from 'node:fs';
import path from 'node:path';
import net from 'node:net';
import { SecretService, SpaceError, type KeyService, type Logger, type MetadataStore, type SandboxEgressOptions, type SandboxService } from '@space/core';
import { EgressProxy, TenantCas } from '@space/egress';
import { DEFAULT_SANDBOX_RANGES, SandboxNet } from '@space/sandbox-net';
import { TRUST_FILES } from '@space/protocol';

/** Egress settings of the daemon (flags `--egress`, `--sandbox-net`, `--egress-port`, `--egress-ca-file`, `--egress-host`). */
export interface EgressOptions {
  /** "off": sandboxes get no network at all. @default "on" */
  mode?: 'on' | 'off';
  /**
   * IPv4 range of sandbox links. @default the one this data directory used before, else the
   * first free of 10.231.0.0/16 … 10.239.0.0/16 (kept in `<data>/sandbox-net`)
   */
  range?: string;
  /** Port of the egress proxy. @default 3128 */
  port?: number;
  /** A PEM file of extra CA certificates the proxy trusts upstream (a private PKI; tests). */
  upstreamCaFile?: string;
  /** Names the proxy resolves without DNS, `name → ip`. */
  hosts?: Record<string, string>;
}

/** Parses `NAME=IP[,NAME=IP]` (the --egress-host flag and SPACE_EGRESS_HOSTS). */
export function parseEgressHosts(s: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of s.split(',').map((x) => x.trim()).filter(Boolean)) {
    const i = part.indexOf('=');
    const name = part.slice(0, i).toLowerCase();
    const ip = part.slice(i + 1);
    if (i <= 0 || !net.isIP(ip)) throw new SpaceError('BAD_REQUEST', `Invalid egress host ${JSON.stringify(part)}: use NAME=IP, e.g. api.internal=10.0.0.5`);
    out[name] = ip;
  }
  return out;
}

/** The parts the daemon keeps. */
export interface Egress {
  network: SandboxNet;
  /** What SandboxService needs (call {@link start} once the service exists). */
  sandbox: SandboxEgressOptions;
  secrets: SecretService;
  /** Starts the proxy for `service`; `daemonEndpoint` says which host:ports are the daemon's own. */
  start(service: SandboxService, daemonEndpoint: (ip: string, port: number) => boolean): Promise<void>;
  close(): Promise<void>;
}

/**
 * Prepares sandbox networking. Sets up the host side now (so a host that cannot do it stops
 * the daemon with a clear error); the proxy starts with {@link Egress.start}.
 */
export async function prepareEgress(opts: EgressOptions, deps: { dataDir: string; store: MetadataStore; keys: KeyService; logger: Logger }): Promise<Egress | undefined> {
  if (opts.mode === 'off') return undefined;
  // The range must stay the same across restarts (running sandboxes keep their links).
  const rangeFile = path.join(deps.dataDir, 'sandbox-net');
  let range: string;
  let network: SandboxNet;
  try {
    range = opts.range ?? (existsSync(rangeFile) ? (await fs.readFile(rangeFile, 'utf8')).trim() : await SandboxNet.pickFree(DEFAULT_SANDBOX_RANGES, opts.port));
    network = new SandboxNet({ range, ...(opts.port ? { proxyPort: opts.port } : {}) });
    await network.init();
    await fs.writeFile(rangeFile, `${range}\n`, { mode: 0o600 });
  } catch (err) {
    if (err instanceof SpaceError && err.code === 'EGRESS_UNAVAILABLE') throw err;
    throw new SpaceError('EGRESS_UNAVAILABLE', `Cannot set up the sandbox network (${err instanceof Error ? err.message : String(err)}): run as root with iproute2 and nftables, or start with --egress off`, { cause: err });
  }
  const upstreamCa = opts.upstreamCaFile ? readFileSync(opts.upstreamCaFile, 'utf8') : undefined;
  const secrets = new SecretService({ store: deps.store, keys: deps.keys });
  const cas = new TenantCas({ store: deps.store, keys: deps.keys });
  const proxyUrl = `http://${network.proxyAddress}:${network.proxyPort}`;
  const env = {
    HTTP_PROXY: proxyUrl,
    HTTPS_PROXY: proxyUrl,
    http_proxy: proxyUrl,
    https_proxy: proxyUrl,
    NO_PROXY: 'localhost,127.0.0.1,::1',
    no_proxy: 'localhost,127.0.0.1,::1',
    SSL_CERT_FILE: TRUST_FILES.bundle,
    REQUESTS_CA_BUNDLE: TRUST_FILES.bundle,
    CURL_CA_BUNDLE: TRUST_FILES.bundle,
    NODE_EXTRA_CA_CERTS: TRUST_FILES.ca,
    NODE_USE_ENV_PROXY: '1',
  };
  let proxy: EgressProxy | undefined;
  return {
    network,
    secrets,
    sandbox: { secrets, env, trust: (tenantId) => cas.certificate(tenantId) },
    async start(service, daemonEndpoint) {
      proxy = new EgressProxy({
        host: network.proxyAddress,
        port: network.proxyPort,
        sandboxAt: (address) => network.sandboxAt(address),
        context: (id) => service.egressContext(id),
        describe: (tenantId, name) => secrets.get(tenantId, name).catch(() => undefined),
        reveal: (tenantId, name) => secrets.reveal(tenantId, name),
        cas,
        audit: (e) => void secrets.audit(e).catch((err) => deps.logger.warn({ err }, 'egress audit entry lost')),
        neverReach: [range],
        forbiddenEndpoint: daemonEndpoint,
        ...(upstreamCa ? { upstreamCa } : {}),
        ...(opts.hosts ? { hosts: opts.hosts } : {}),
        logger: deps.logger,
      });
      try {
        await proxy.listen();
      } catch (err) {
        throw new SpaceError('EGRESS_UNAVAILABLE', `The egress proxy cannot listen on ${proxyUrl} (${(err as NodeJS.ErrnoException).code ?? String(err)}): is another daemon using this sandbox network? Pass another --sandbox-net`, { cause: err });
      }
      deps.logger.info({ proxy: proxyUrl, sandboxNet: range }, 'egress proxy listening');
    },
    async close() {
      await proxy?.close();
      await network.teardown();
    },
  };
}
