/**
 * The E2B control plane (what `E2B_API_URL` points at), as an adapter over SPACE's
 * `SandboxService`: create, connect/resume, pause, kill, timeout, info, list, metrics,
 * snapshots and fork. Authenticated with `X-API-KEY` (any SPACE key; `space e2b env` makes an
 * E2B-shaped one). Errors are E2B's `{ code: <HTTP status>, message }`. Anything the SDK can
 * ask for that SPACE cannot honour is refused with 400 and says what, never ignored.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import net from 'node:net';
import { EVERY_PORT, SpaceError, asErrorCode, checkHostHeader, checkHeaderRules, parseCidr, type ApiKeys, type EgressPolicy, type HeaderRule, type PortExposure, type Sandbox, type SandboxService, type Snapshot } from '@space/core';
import type { AccessTokens } from './access.js';
import type { VolumeMount } from '@space/api';

/** The envd version SPACE reports: new enough that the SDK enables every feature it speaks. */
export const ENVD_VERSION = '0.6.4';

/** E2B's default template is `base`, which SPACE has too (Debian with bash). */
const DEFAULT_TEMPLATE = 'base';

/** Deps of the control plane. */
export interface ControlDeps {
  service: SandboxService;
  keys: ApiKeys;
  tokens: AccessTokens;
  /**
   * What `allowInternetAccess: true` does: `allow` (E2B's meaning: any public destination
   * through the egress proxy) or `deny` (the operator pins E2B-created sandboxes to SPACE's
   * default deny, and such creates are refused saying so). @default "allow"
   */
  internet?: 'allow' | 'deny';
  /**
   * The ingress domain (`PORT-ID.<domain>` reaches a sandbox's port): the `domain` of every
   * sandbox, so the SDK's `getHost(port)` works. Absent: the ingress is off, and E2B sandboxes
   * have no ports to reach.
   */
  ingressDomain?: string;
  /**
   * What E2B's `allowPublicTraffic` may be: `allow` (E2B's meaning and default: every port of
   * the sandbox reachable without a token) or `deny` (the operator keeps E2B sandboxes private:
   * every port needs the `trafficAccessToken`, and `allowPublicTraffic: true` is refused).
   * @default "allow"
   */
  publicTraffic?: 'allow' | 'deny';
}

type Body = Record<string, unknown>;

/** E2B's `volumeMounts` (`[{ name, path }]`) as SPACE's volume mounts (read-write). */
function volumeMounts(v: unknown): VolumeMount[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw new SpaceError('BAD_REQUEST', 'volumeMounts must be a list of { name, path }');
  return v.map((m: { name?: unknown; path?: unknown }) => {
    if (typeof m?.name !== 'string' || typeof m?.path !== 'string') throw new SpaceError('BAD_REQUEST', 'Each of volumeMounts is { name, path }');
    return { volume: m.name, path: m.path };
  });
}

function unsupported(what: string, why?: string): SpaceError {
  return new SpaceError('BAD_REQUEST', `${what} is not supported by SPACE's E2B-compatible API${why ? ` (${why})` : ''}`);
}

const KEEP_MEMORY_FALSE = 'Pausing without memory (keepMemory: false)';
const KEEP_MEMORY_WHY = "SPACE's pause keeps memory, processes and files, and costs no more: pause with keepMemory left at true. A files-only pause needs sandbox disks, which SPACE does not have yet";

/** E2B's selector for all traffic (its SDK exports it as ALL_TRAFFIC). */
const ALL_TRAFFIC = new Set(['0.0.0.0/0', '::/0']);

/**
 * E2B's `network` ({allowOut, denyOut}) as a SPACE egress policy. E2B's rules: a destination in
 * allowOut is allowed (allow beats deny); else one in denyOut is refused; else it is allowed
 * only when allowOut was not given and the sandbox has internet access. So: allowOut's names
 * and ranges become the policy's domains and cidrs; "all traffic" in allowOut, or no allowOut
 * with internet access, opens the public internet (`publicInternet`), unless denyOut holds all
 * traffic; denyOut's names and ranges become the policy's deny lists.
 */
export function networkPolicy(network: unknown, internet: boolean): Partial<EgressPolicy> {
  if (typeof network !== 'object' || network === null || Array.isArray(network)) throw new SpaceError('BAD_REQUEST', 'network must be an object with allowOut and denyOut');
  const n = network as Record<string, unknown>;
  if (n.egressProxy !== undefined && n.egressProxy !== null) throw unsupported('network.egressProxy', 'every SPACE sandbox already reaches the network only through SPACE\'s egress proxy');
  for (const k of Object.keys(n)) if (!['allowOut', 'denyOut', 'rules', 'egressProxy', 'maskRequestHost', 'allowPublicTraffic'].includes(k)) throw new SpaceError('BAD_REQUEST', `Unknown network option ${JSON.stringify(k)}`);
  const split = (v: unknown, field: string) => {
    if (v === undefined || v === null) return undefined;
    if (!Array.isArray(v) || v.length > 256 || v.some((x) => typeof x !== 'string')) throw new SpaceError('BAD_REQUEST', `network.${field} must be a list of at most 256 addresses, CIDRs or host names`);
    const out = { all: false, domains: [] as string[], cidrs: [] as string[] };
    for (const raw of v as string[]) {
      const x = raw.trim().toLowerCase();
      if (ALL_TRAFFIC.has(x)) out.all = true;
      else if (net.isIP(x)) out.cidrs.push(`${x}/${net.isIPv4(x) ? 32 : 128}`);
      else if (parseCidr(x)) out.cidrs.push(x);
      else out.domains.push(x);
    }
    return out;
  };
  const allow = split(n.allowOut, 'allowOut');
  const deny = split(n.denyOut, 'denyOut');
  const open = (allow?.all || (allow === undefined && internet)) && !deny?.all;
  return {
    domains: allow?.domains ?? [],
    cidrs: allow?.cidrs ?? [],
    ...(open ? { publicInternet: true } : {}),
    ...(open && deny && (deny.domains.length || deny.cidrs.length) ? { deny: { domains: deny.domains, cidrs: deny.cidrs } } : {}),
  };
}

/**
 * E2B's header transforms (`network.rules`: `{ "api.example.com": [{ transform: { headers:
 * { Authorization: "Bearer …" } } }] }`) as SPACE header rules: the proxy sets those headers
 * on requests to those hosts, the values stay outside the sandbox, and (as in E2B) a rule
 * opens nothing: allowOut still decides where the sandbox may go. Undefined when not given.
 */
export function networkRules(network: unknown): HeaderRule[] | undefined {
  if (typeof network !== 'object' || network === null) return undefined;
  const rules = (network as Record<string, unknown>).rules;
  if (rules === undefined || rules === null) return undefined;
  if (typeof rules !== 'object' || Array.isArray(rules)) throw new SpaceError('BAD_REQUEST', 'network.rules must map host names to lists of rules');
  const out: HeaderRule[] = [];
  for (const [host, list] of Object.entries(rules as Record<string, unknown>)) {
    if (host === '*') throw new SpaceError('BAD_REQUEST', 'network.rules: a bare "*" is not a host; use "*.example.com"');
    if (!Array.isArray(list)) throw new SpaceError('BAD_REQUEST', `network.rules[${JSON.stringify(host)}] must be a list of rules`);
    for (const rule of list as { transform?: { headers?: unknown } }[]) {
      const headers = strMap(rule?.transform?.headers, `network.rules[${JSON.stringify(host)}] transform.headers`) ?? {};
      for (const [header, value] of Object.entries(headers)) out.push({ hosts: [host], header, value });
    }
  }
  return out;
}

/** E2B's `state`: running or paused (SPACE's paused and hibernated). */
function e2bState(sb: Sandbox): 'running' | 'paused' {
  return sb.state === 'paused' || sb.state === 'hibernated' ? 'paused' : 'running';
}

function strMap(v: unknown, what: string): Record<string, string> | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'object' || Array.isArray(v) || Object.values(v).some((x) => typeof x !== 'string')) throw new SpaceError('BAD_REQUEST', `${what} must be an object of strings`);
  return v as Record<string, string>;
}

function seconds(v: unknown, what: string): number | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new SpaceError('BAD_REQUEST', `${what} must be a whole number of seconds`);
  return v * 1000;
}

/** What an E2B sandbox's ports are: E2B's `allowPublicTraffic` and `maskRequestHost`. */
interface IngressWish {
  public?: boolean;
  hostHeader?: string;
}

/** E2B's `network.allowPublicTraffic` and `network.maskRequestHost` (undefined: not given). */
export function ingressWish(network: unknown): IngressWish {
  if (typeof network !== 'object' || network === null) return {};
  const n = network as Record<string, unknown>;
  const out: IngressWish = {};
  if (n.allowPublicTraffic !== undefined && n.allowPublicTraffic !== null) {
    if (typeof n.allowPublicTraffic !== 'boolean') throw new SpaceError('BAD_REQUEST', 'network.allowPublicTraffic must be true or false');
    out.public = n.allowPublicTraffic;
  }
  if (n.maskRequestHost !== undefined && n.maskRequestHost !== null) {
    checkHostHeader(n.maskRequestHost);
    out.hostHeader = n.maskRequestHost as string;
  }
  return out;
}

/** Registers the control-plane routes on `app`. */
export function registerControl(app: FastifyInstance, deps: ControlDeps): void {
  const { service: svc, tokens } = deps;
  const tenantOf = async (req: FastifyRequest): Promise<string> => {
    const key = req.headers['x-api-key'];
    return (await deps.keys.verify(typeof key === 'string' ? key : undefined)).tenantId;
  };

  // ---- ingress: every port of an E2B sandbox has a host (E2B's model), public or behind its traffic token
  const ingressOff = 'the ingress is off on this SPACE node (spaced --ingress-listen off, or no sandbox network), so no port of a sandbox can be reached';
  /** Refuses what this node cannot give (checked before anything changes). */
  const checkWish = (wish: IngressWish): void => {
    if (!deps.ingressDomain && (wish.public || wish.hostHeader)) throw unsupported(wish.public ? 'network.allowPublicTraffic: true' : 'network.maskRequestHost', ingressOff);
    if (wish.public && deps.publicTraffic === 'deny') throw new SpaceError('BAD_REQUEST', 'Public traffic to sandboxes is switched off for E2B sandboxes on this SPACE node (--e2b-public-traffic deny): create with network.allowPublicTraffic: false and send the sandbox\'s trafficAccessToken in the e2b-traffic-access-token header');
  };
  /** Opens every port of `sb` as E2B would: public unless asked (or the operator says) otherwise. */
  const openPorts = async (sb: Sandbox, wish: IngressWish): Promise<void> => {
    checkWish(wish);
    if (!deps.ingressDomain) return;
    const pub = wish.public ?? deps.publicTraffic !== 'deny';
    await svc.exposeEveryPort(sb.tenantId, sb.id, { public: pub, token: tokens.traffic(sb.tenantId, sb.id), ...(wish.hostHeader ? { hostHeader: wish.hostHeader } : {}) });
  };
  /** The ports' opening of `sb` (E2B's view): undefined when none. */
  const portsOf = async (sb: Sandbox) => (deps.ingressDomain ? (await svc.exposedPorts(sb.tenantId, sb.id)).find((e) => e.port === EVERY_PORT) : undefined);
  /** `domain` and `trafficAccessToken` of a response about `sb`, whose opening of every port is `every`. */
  const access = (sb: Sandbox, every: PortExposure | undefined) => ({ domain: deps.ingressDomain ?? null, trafficAccessToken: every && !every.public ? tokens.traffic(sb.tenantId, sb.id) : null });
  const created = async (sb: Sandbox) => ({
    sandboxID: sb.id,
    templateID: sb.template,
    clientID: 'space',
    envdVersion: ENVD_VERSION,
    envdAccessToken: tokens.issue(sb.tenantId, sb.id),
    ...access(sb, await portsOf(sb)),
  });
  const listed = (sb: Sandbox) => ({
    templateID: sb.template,
    sandboxID: sb.id,
    clientID: 'space',
    startedAt: sb.startedAt ?? sb.createdAt,
    endAt: sb.expiresAt ?? new Date(Date.parse(sb.createdAt) + 100 * 365 * 86_400_000).toISOString(),
    cpuCount: Math.max(1, Math.round(sb.cpu)),
    memoryMB: sb.memoryMb,
    diskSizeMB: sb.diskMb ?? 0,
    metadata: sb.metadata,
    state: e2bState(sb),
    envdVersion: ENVD_VERSION,
  });
  const detail = async (sb: Sandbox) => {
    const every = await portsOf(sb);
    return {
      ...listed(sb),
      envdAccessToken: tokens.issue(sb.tenantId, sb.id),
      ...access(sb, every),
      network: { allowPublicTraffic: every?.public ?? false, ...(every?.hostHeader ? { maskRequestHost: every.hostHeader } : {}) },
      lifecycle: { onTimeout: sb.onTimeout === 'hibernate' ? 'pause' : 'kill', autoResume: !!sb.autoResume },
      volumeMounts: (sb.volumes ?? []).map((m) => ({ name: m.volume, path: m.path })),
    };
  };

  // ---- create
  const create = async (req: FastifyRequest) => {
    const tenantId = await tenantOf(req);
    const b = (req.body ?? {}) as Body;
    const egressHint = "a SPACE sandbox reaches only its egress proxy: allow destinations with SPACE's API (PUT /v1/sandboxes/{id}/egress, `space egress allow ID --domain HOST`), see docs/egress.md";
    if (b.mcp !== undefined && b.mcp !== null) throw unsupported('"mcp" (an MCP gateway inside the sandbox)', 'SPACE serves MCP from outside the sandbox instead: `space mcp`, see docs/mcp.md');
    if (b.iam !== undefined && b.iam !== null) throw unsupported('"iam"');
    const volumes = volumeMounts(b.volumeMounts);
    // E2B SDKs before 2.51 send allowInternetAccess: true on every create: E2B's meaning, through the proxy.
    const internet = b.allow_internet_access === true;
    const egress = b.network !== undefined && b.network !== null ? networkPolicy(b.network, internet) : internet ? { publicInternet: true } : undefined;
    if (egress?.publicInternet && !internet && deps.internet === 'deny') throw new SpaceError('BAD_REQUEST', `Internet access (network.allowOut with all traffic) is switched off for E2B sandboxes on this SPACE node (--e2b-internet deny): list the destinations instead, or ${egressHint}`);
    if (internet && deps.internet === 'deny') throw new SpaceError('BAD_REQUEST', `Internet access (allowInternetAccess: true, which E2B SDKs before 2.51 send by default) is switched off for E2B sandboxes on this SPACE node (--e2b-internet deny): create with allowInternetAccess: false and ${egressHint}`);
    if (b.allow_internet_access !== undefined && b.allow_internet_access !== null && typeof b.allow_internet_access !== 'boolean') throw new SpaceError('BAD_REQUEST', 'allow_internet_access must be true or false');
    if (b.autoPauseMemory === false) throw unsupported(KEEP_MEMORY_FALSE, KEEP_MEMORY_WHY);
    const autoResume = (b.autoResume as { enabled?: unknown } | undefined)?.enabled;
    if (autoResume !== undefined && typeof autoResume !== 'boolean') throw new SpaceError('BAD_REQUEST', 'autoResume.enabled must be true or false');
    if (autoResume && b.autoPause !== true) throw new SpaceError('BAD_REQUEST', "autoResume can only be true when onTimeout action is 'pause'");
    if (autoResume && !deps.ingressDomain) throw unsupported('Resuming on traffic (autoResume)', ingressOff);
    const wish = ingressWish(b.network);
    checkWish(wish);
    if (b.secure === false) throw unsupported('Sandboxes without an access token (secure: false)');
    const template = b.templateID === undefined ? DEFAULT_TEMPLATE : b.templateID;
    if (typeof template !== 'string') throw new SpaceError('BAD_REQUEST', 'templateID must be a string');
    const timeoutMs = seconds(b.timeout, 'timeout') ?? 300_000;
    const env = strMap(b.envVars, 'envVars');
    const metadata = strMap(b.metadata, 'metadata');
    // Sandbox.create(snapshotId): E2B snapshots are templates; SPACE forks the snapshot.
    const headers = b.network !== undefined && b.network !== null ? networkRules(b.network) : undefined;
    if (/^sn[a-z0-9]{18}$/.test(template)) {
      if (headers?.length) throw new SpaceError('BAD_REQUEST', 'A sandbox started from a snapshot keeps the snapshot\'s network rules: create it without network.rules and set them with updateNetwork');
      if (env || metadata) throw new SpaceError('BAD_REQUEST', 'A sandbox started from a snapshot has the snapshot\'s environment and labels: create it without envs and metadata');
      if (autoResume) throw new SpaceError('BAD_REQUEST', 'A sandbox started from a snapshot keeps the snapshot\'s lifecycle: create it without autoResume');
      if (volumes?.length) throw new SpaceError('BAD_REQUEST', 'A sandbox started from a snapshot has the snapshot\'s volume mounts: create it without volumeMounts');
      const snapshot = await svc.getSnapshot(tenantId, template);
      const [r] = await svc.fork(tenantId, snapshot.sandboxId, { count: 1, snapshotId: snapshot.id });
      if (!r || 'error' in r) throw new SpaceError(asErrorCode(r?.error.code), r?.error.message ?? 'the fork returned nothing');
      const sb = await svc.setTimeout(tenantId, r.sandbox.id, timeoutMs);
      await openPorts(sb, wish);
      return created(sb);
    }
    const sb = await svc.create(tenantId, { template, timeoutMs, ...(volumes ? { volumes } : {}), ...(env ? { env } : {}), ...(metadata ? { metadata } : {}), ...(b.autoPause === true ? { onTimeout: 'hibernate' as const } : {}), ...(autoResume ? { autoResume: true } : {}), ...(egress ? { egress } : {}), ...(headers?.length ? { headers } : {}) });
    try {
      await openPorts(sb, wish);
    } catch (err) {
      await svc.kill(tenantId, sb.id).catch(() => {});
      throw err;
    }
    return created(sb);
  };
  app.post('/sandboxes', async (req, reply) => reply.code(201).send(await create(req)));
  app.post('/v2/sandboxes', async (req, reply) => reply.code(201).send(await create(req)));

  // ---- network: sandbox.updateNetwork({allowOut, denyOut}) replaces the egress policy
  app.put<{ Params: { id: string } }>('/sandboxes/:id/network', async (req, reply) => {
    const tenantId = await tenantOf(req);
    const sb = await svc.get(tenantId, req.params.id);
    const policy = networkPolicy(req.body ?? {}, !!sb.egress?.publicInternet);
    const wish = ingressWish(req.body);
    checkWish(wish);
    if (policy.publicInternet && !sb.egress?.publicInternet && deps.internet === 'deny') throw new SpaceError('BAD_REQUEST', 'Internet access is switched off for E2B sandboxes on this SPACE node (--e2b-internet deny): list the destinations instead');
    // Checked before anything changes: a bad rule leaves the policy as it was.
    const rules = checkHeaderRules(networkRules(req.body ?? {}) ?? []);
    await svc.setEgress(tenantId, sb.id, { ...(sb.egress ?? {}), ...policy, ...(policy.publicInternet ? {} : { publicInternet: false }), ...(policy.deny ? {} : { deny: undefined }) });
    // E2B: the update replaces the rules too; leaving them out clears them.
    if (rules.length || sb.secrets?.some((a) => a.rule)) await svc.setHeaderRules(tenantId, sb.id, rules);
    if (wish.public !== undefined || wish.hostHeader !== undefined) {
      const every = await portsOf(sb);
      const hostHeader = wish.hostHeader ?? every?.hostHeader;
      await openPorts(sb, { public: wish.public ?? every?.public ?? deps.publicTraffic !== 'deny', ...(hostHeader ? { hostHeader } : {}) });
    }
    return reply.code(204).send();
  });

  // ---- connect / resume: 200 when it was running, 201 when it had to be resumed
  const connect = async (req: FastifyRequest<{ Params: { id: string } }>, mustBePaused: boolean) => {
    const tenantId = await tenantOf(req);
    const b = (req.body ?? {}) as Body;
    if (b.memory === false) throw unsupported('Resuming by rebooting (onResume: "reboot")');
    let sb = await svc.get(tenantId, req.params.id);
    if (sb.state === 'killed' || sb.state === 'dead') throw new SpaceError('SANDBOX_NOT_FOUND', `Sandbox ${sb.id} has ended`);
    let resumed = false;
    if (sb.state === 'hibernated') {
      sb = await svc.wake(tenantId, sb.id);
      resumed = true;
    } else if (sb.state === 'paused') {
      sb = await svc.resume(tenantId, sb.id);
      resumed = true;
    } else if (mustBePaused) throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${sb.id} is already running`);
    // Connecting extends a sandbox's life to at least `timeout` from now, never shortens it
    // (the SDK sends its 5-minute default on every connect).
    const timeoutMs = seconds(b.timeout, 'timeout');
    const endsAt = sb.expiresAt ? Date.parse(sb.expiresAt) : Number.POSITIVE_INFINITY;
    if (timeoutMs !== undefined && Date.now() + timeoutMs > endsAt) sb = await svc.setTimeout(tenantId, sb.id, timeoutMs);
    return { resumed, body: await created(sb) };
  };
  for (const p of ['/sandboxes/:id/connect', '/v2/sandboxes/:id/connect']) {
    app.post<{ Params: { id: string } }>(p, async (req, reply) => {
      const r = await connect(req, false);
      return reply.code(r.resumed ? 201 : 200).send(r.body);
    });
  }
  app.post<{ Params: { id: string } }>('/sandboxes/:id/resume', async (req, reply) => reply.code(201).send((await connect(req, true)).body));

  app.post<{ Params: { id: string } }>('/sandboxes/:id/pause', async (req, reply) => {
    const tenantId = await tenantOf(req);
    const sb = await svc.get(tenantId, req.params.id);
    if ((req.body as Body | undefined)?.memory === false) throw unsupported(KEEP_MEMORY_FALSE, KEEP_MEMORY_WHY);
    if (sb.state !== 'running') throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${sb.id} is not running (${e2bState(sb)})`);
    await svc.hibernate(tenantId, sb.id);
    return reply.code(204).send();
  });

  app.delete<{ Params: { id: string } }>('/sandboxes/:id', async (req, reply) => {
    const tenantId = await tenantOf(req);
    const sb = await svc.get(tenantId, req.params.id);
    if (sb.state === 'killed' || sb.state === 'dead') throw new SpaceError('SANDBOX_NOT_FOUND', `Sandbox ${sb.id} has ended`);
    await svc.kill(tenantId, sb.id);
    return reply.code(204).send();
  });

  app.post<{ Params: { id: string } }>('/sandboxes/:id/timeout', async (req, reply) => {
    const tenantId = await tenantOf(req);
    const timeoutMs = seconds(((req.body ?? {}) as Body).timeout, 'timeout');
    if (timeoutMs === undefined) throw new SpaceError('BAD_REQUEST', 'timeout (seconds) is required');
    await svc.setTimeout(tenantId, req.params.id, timeoutMs);
    return reply.code(204).send();
  });

  app.get<{ Params: { id: string } }>('/sandboxes/:id', async (req) => {
    const sb = await svc.get(await tenantOf(req), req.params.id);
    if (sb.state === 'killed' || sb.state === 'dead') throw new SpaceError('SANDBOX_NOT_FOUND', `Sandbox ${sb.id} has ended`);
    return await detail(sb);
  });

  /** E2B's metrics: a series of samples (one per 5 s) between `start` and `end` (unix seconds). */
  app.get<{ Params: { id: string }; Querystring: { start?: string; end?: string } }>('/sandboxes/:id/metrics', async (req) => {
    const tenantId = await tenantOf(req);
    const sb = await svc.get(tenantId, req.params.id);
    const seconds = (v: string | undefined, name: string) => {
      if (v === undefined || v === '') return undefined;
      const n = Number(v);
      if (!Number.isInteger(n) || n < 0) throw new SpaceError('BAD_REQUEST', `${name} must be a time in unix seconds; got ${JSON.stringify(v)}`);
      return n * 1000;
    };
    const start = seconds(req.query.start, 'start');
    const end = seconds(req.query.end, 'end');
    if (start !== undefined && end !== undefined && start > end) throw new SpaceError('BAD_REQUEST', 'start must not be after end');
    if (sb.state !== 'running' && sb.state !== 'paused') return [];
    const cpuCount = Math.max(1, Math.round(sb.cpu));
    const point = (at: number, cpuUsedPct: number, memUsed: number, diskUsed = 0) => ({ timestamp: new Date(at).toISOString(), timestampUnix: Math.floor(at / 1000), cpuCount, cpuUsedPct, memUsed, memTotal: sb.memoryMb * 1048576, diskUsed, diskTotal: (sb.diskMb ?? 0) * 1048576 });
    const series = await svc.usageSeries(tenantId, sb.id, { ...(start !== undefined ? { start } : {}), ...(end !== undefined ? { end: end + 999 } : {}) });
    if (series.length) return series.map((x) => point(x.at, x.cpuPct, x.memBytes, x.diskBytes));
    // Not sampled yet (it just started): one reading now, if now is in the range.
    const now = Date.now();
    if ((start !== undefined && now < start) || (end !== undefined && now > end + 999)) return [];
    const u = await svc.usage(tenantId, sb.id);
    const elapsedNs = (now - Date.parse(sb.startedAt ?? sb.createdAt)) * 1e6;
    return [point(now, u.cpuNs !== undefined && elapsedNs > 0 ? Math.round((u.cpuNs / elapsedNs / sb.cpu) * 10_000) / 100 : 0, u.cgroupBytes ?? u.rssBytes, u.diskUsedBytes)];
  });

  // ---- list: metadata filter arrives URL-encoded twice ("k%3Dv" pairs of encoded keys and values)
  const list = async (req: FastifyRequest<{ Querystring: Record<string, string | undefined> }>, v2: boolean) => {
    const tenantId = await tenantOf(req);
    const q = req.query;
    let metadata: Record<string, string> | undefined;
    if (q.metadata) {
      metadata = {};
      for (const [k, v] of new URLSearchParams(q.metadata)) metadata[decodeURIComponent(k)] = decodeURIComponent(v);
    }
    const wanted = (q.state ?? (v2 ? 'running,paused' : 'running')).split(',').map((s) => s.trim());
    for (const s of wanted) if (s !== 'running' && s !== 'paused') throw new SpaceError('BAD_REQUEST', `state must be running or paused; got ${JSON.stringify(s)}`);
    const states = [...(wanted.includes('running') ? (['starting', 'running'] as const) : []), ...(wanted.includes('paused') ? (['paused', 'hibernated'] as const) : [])];
    const limit = q.limit ? Number(q.limit) : 100;
    if (!Number.isInteger(limit) || limit < 1 || limit > 1000) throw new SpaceError('BAD_REQUEST', 'limit must be from 1 to 1000');
    if (q.order !== undefined && q.order !== 'asc' && q.order !== 'desc') throw new SpaceError('BAD_REQUEST', 'order must be asc or desc');
    const page = await svc.list(tenantId, {
      states: [...states],
      ...(metadata ? { metadata } : {}),
      ...(q.template ? { template: q.template } : {}),
      ...(q.startedAfter ? { createdAfter: q.startedAfter } : {}),
      ...(q.startedBefore ? { createdBefore: q.startedBefore } : {}),
      ...(q.order ? { order: q.order } : {}),
      limit,
      ...(q.nextToken ? { cursor: q.nextToken } : {}),
    });
    return page;
  };
  app.get<{ Querystring: Record<string, string | undefined> }>('/v2/sandboxes', async (req, reply) => {
    const page = await list(req, true);
    if (page.nextCursor) reply.header('x-next-token', page.nextCursor);
    return page.items.map(listed);
  });
  app.get<{ Querystring: Record<string, string | undefined> }>('/sandboxes', async (req) => (await list(req, false)).items.map(listed));

  // ---- snapshots and fork
  const snap = (s: Snapshot) => ({ snapshotID: s.id, sandboxID: s.sandboxId, names: s.name ? [s.name] : [], createdAt: s.createdAt, sizeBytes: s.sizeBytes });
  app.post<{ Params: { id: string } }>('/sandboxes/:id/snapshots', async (req, reply) => {
    const tenantId = await tenantOf(req);
    const name = ((req.body ?? {}) as Body).name;
    if (name !== undefined && typeof name !== 'string') throw new SpaceError('BAD_REQUEST', 'name must be a string');
    return reply.code(201).send(snap(await svc.snapshot(tenantId, req.params.id, name ? { name } : {})));
  });
  app.get<{ Querystring: Record<string, string | undefined> }>('/snapshots', async (req) => {
    const tenantId = await tenantOf(req);
    const ids = req.query.sandboxID ? [req.query.sandboxID] : (await svc.list(tenantId, { limit: 1000 })).items.map((s) => s.id);
    const out: ReturnType<typeof snap>[] = [];
    for (const id of ids) out.push(...(await svc.snapshots(tenantId, id)).filter((s) => req.query.name === undefined || s.name === req.query.name).map(snap));
    return out;
  });
  // Sandbox.deleteSnapshot(id): E2B deletes a snapshot as the template it is.
  app.delete<{ Params: { id: string } }>('/templates/:id', async (req, reply) => {
    const tenantId = await tenantOf(req);
    if (!/^sn[a-z0-9]{18}$/.test(req.params.id)) throw unsupported('Deleting templates', 'remove SPACE templates with `space template rm NAME`');
    await svc.removeSnapshot(tenantId, req.params.id);
    return reply.code(204).send();
  });
  app.post<{ Params: { id: string } }>('/sandboxes/:id/fork', async (req) => {
    const tenantId = await tenantOf(req);
    const b = (req.body ?? {}) as Body;
    const count = b.count === undefined ? 1 : b.count;
    if (typeof count !== 'number') throw new SpaceError('BAD_REQUEST', 'count must be a number');
    const timeoutMs = seconds(b.timeout, 'timeout');
    // An ended sandbox is gone as far as E2B is concerned (its SDK raises SandboxNotFoundError).
    const parent = await svc.get(tenantId, req.params.id);
    if (parent.state === 'killed' || parent.state === 'dead') throw new SpaceError('SANDBOX_NOT_FOUND', `Sandbox ${parent.id} has ended`);
    const results = await svc.fork(tenantId, req.params.id, { count });
    // A fork's ports are open as its parent's were.
    const every = await portsOf(parent);
    const out = [];
    for (const r of results) {
      if ('error' in r) out.push({ error: { code: new SpaceError(asErrorCode(r.error.code)).status, message: r.error.message } });
      else {
        const child = timeoutMs !== undefined ? await svc.setTimeout(tenantId, r.sandbox.id, timeoutMs) : r.sandbox;
        if (every) await openPorts(child, { public: every.public, ...(every.hostHeader ? { hostHeader: every.hostHeader } : {}) });
        out.push({ sandbox: await created(child) });
      }
    }
    return out;
  });
}
