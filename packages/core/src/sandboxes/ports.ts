/**
 * Exposed ports: which ports of a sandbox the ingress may reach, public or behind an access
 * token. Core keeps the records (the token's hash only) and answers the ingress; the ingress
 * listener itself lives in @space/ingress and the daemon wires the two.
 */
import { createHash, randomBytes } from 'node:crypto';
import { SpaceError } from '../errors.js';
import { TERMINAL_STATES, assertAllowed, type Sandbox } from '../model.js';
import type { IngressLogEntry, IngressLogPage, PortExposure } from '../records.js';
import type { SandboxContext } from './context.js';

/** What {@link Ports.expose} takes. */
export interface ExposeRequest {
  port: number;
  /** Reachable without the token. @default false */
  public?: boolean;
  /** The exposure ends after this many seconds (1 s to 30 days); absent: while the sandbox lives. */
  expiresInS?: number;
}

/**
 * The port number of an exposure that opens every port of its sandbox: E2B's model, where each
 * port has a host (`sandbox.getHost(port)`), public or behind the sandbox's traffic token. Only
 * the E2B-compatible API makes one ({@link Ports.exposeEvery}).
 */
export const EVERY_PORT = 0;

/**
 * Checks a Host header for requests into a sandbox (E2B's `maskRequestHost`): a host name with
 * an optional port, `${PORT}` standing for the port. Throws BAD_REQUEST.
 * @example checkHostHeader('localhost:${PORT}');
 */
export function checkHostHeader(h: unknown): void {
  if (typeof h !== 'string' || h.length === 0 || h.length > 255 || !/^(?:[A-Za-z0-9._-]|\$\{PORT\})+(?::(?:\d{1,5}|\$\{PORT\}))?$/.test(h)) {
    throw new SpaceError('BAD_REQUEST', `The Host header for requests into the sandbox must be a host name with an optional port, \`\${PORT}\` standing for the port (e.g. "localhost:\${PORT}"); got ${JSON.stringify(h)}`);
  }
}

/** What {@link Ports.exposeEvery} takes. */
export interface ExposeEveryRequest {
  /** Reachable without the token (E2B's `allowPublicTraffic`). */
  public: boolean;
  /** The access token (the caller derives it, e.g. E2B's `trafficAccessToken`); only its hash is kept. */
  token: string;
  /** The Host header requests reach the sandbox with, `${PORT}` replaced by the port (E2B's `maskRequestHost`); absent: the client's. */
  hostHeader?: string;
}

/** Longest exposure a request may ask for: 30 days. */
export const MAX_EXPOSURE_S = 30 * 24 * 3600;

/**
 * A new access token (`sat_` + 256 random bits, URL-safe) and its SHA-256 (hex), the form the
 * ingress compares.
 */
function newToken(): { token: string; tokenHash: string } {
  const token = `sat_${randomBytes(32).toString('base64url')}`;
  return { token, tokenHash: hashToken(token) };
}

const hashToken = (token: string) => createHash('sha256').update(token).digest('hex');

const live = (e: PortExposure) => !e.expiresAt || Date.parse(e.expiresAt) > Date.now();

/** A sandbox's exposed ports. Built by the facade (SandboxService). */
export class Ports {
  constructor(private readonly c: SandboxContext) {}

  /**
   * Exposes `port` of a sandbox (again: a new token, which ends the old one and every pass
   * signed for it). Returns the record and the token, which is not kept.
   */
  expose(tenantId: string, id: string, req: ExposeRequest): Promise<{ exposure: PortExposure; token: string }> {
    const { port } = req;
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new SpaceError('INVALID_PORT', `port must be an integer from 1 to 65535; got ${JSON.stringify(port)}`);
    if (req.public !== undefined && typeof req.public !== 'boolean') throw new SpaceError('BAD_REQUEST', 'public must be true or false');
    const ttl = req.expiresInS;
    if (ttl !== undefined && (!Number.isInteger(ttl) || ttl < 1 || ttl > MAX_EXPOSURE_S)) throw new SpaceError('BAD_REQUEST', `expiresInS must be an integer from 1 to ${MAX_EXPOSURE_S} (30 days); got ${JSON.stringify(ttl)}`);
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'exposePort');
      const { token, tokenHash } = newToken();
      const now = Date.now();
      const exposure: PortExposure = { sandboxId: id, port, public: req.public ?? false, tokenHash, createdAt: new Date(now).toISOString(), ...(ttl ? { expiresAt: new Date(now + ttl * 1000).toISOString() } : {}) };
      await this.c.store.putExposure(exposure);
      await this.c.event(id, 'port-exposed', `port ${port} exposed${exposure.public ? ' publicly' : ''}${exposure.expiresAt ? ` until ${exposure.expiresAt}` : ''}`);
      return { exposure, token };
    });
  }

  /**
   * Opens every port of a sandbox ({@link EVERY_PORT}), public or behind `token`; a port exposed
   * on its own keeps its own token. Used by the E2B-compatible API, whose sandboxes work so.
   * @example await ports.exposeEvery(tenantId, id, { public: false, token: trafficAccessToken });
   */
  exposeEvery(tenantId: string, id: string, req: ExposeEveryRequest): Promise<PortExposure> {
    if (typeof req.token !== 'string' || req.token.length < 32) throw new SpaceError('BAD_REQUEST', 'An access token must be a string of at least 32 characters');
    const h = req.hostHeader;
    if (h !== undefined) checkHostHeader(h);
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'exposePort');
      const exposure: PortExposure = { sandboxId: id, port: EVERY_PORT, public: req.public, tokenHash: hashToken(req.token), createdAt: new Date().toISOString(), ...(h ? { hostHeader: h } : {}) };
      await this.c.store.putExposure(exposure);
      await this.c.event(id, 'port-exposed', `every port exposed${exposure.public ? ' publicly' : ' behind the traffic token'}`);
      return exposure;
    });
  }

  /** A sandbox's exposed ports that have not expired. */
  async list(tenantId: string, id: string): Promise<PortExposure[]> {
    await this.c.hooks.get(tenantId, id);
    return (await this.c.store.listExposures(id)).filter(live);
  }

  /** Closes `port` ({@link EVERY_PORT}: the opening of every port) (PORT_NOT_EXPOSED when it was not exposed). */
  unexpose(tenantId: string, id: string, port: number): Promise<void> {
    return this.c.withLock(id, async () => {
      await this.c.hooks.get(tenantId, id);
      if (!(await this.c.store.getExposure(id, port))) throw new SpaceError('PORT_NOT_EXPOSED', `Port ${port} of ${id} is not exposed`);
      await this.c.store.deleteExposures(id, port);
      await this.c.event(id, 'port-closed', port === EVERY_PORT ? 'every port closed (ports exposed on their own stay open)' : `port ${port} no longer exposed`);
    });
  }

  /** Appends one ingress request to the audit log. */
  async audit(e: IngressLogEntry): Promise<void> {
    await this.c.store.insertIngressLog(e);
  }

  /** A sandbox's ingress log, newest first (an ended sandbox's too, until it is pruned). */
  async log(tenantId: string, id: string, limit: number, cursor?: string): Promise<IngressLogPage> {
    await this.c.hooks.get(tenantId, id);
    return this.c.store.listIngressLog(id, limit, cursor);
  }

  /**
   * For the ingress, before it forwards a request: `found` (the sandbox {@link route} gave for
   * the request, not read again) running, woken first when it sleeps and was created with
   * `autoResume` (concurrent first requests wake it once); counts as activity for its idle
   * timeout. Throws SANDBOX_INVALID_STATE (409) with what to do.
   */
  async ready(found: Sandbox): Promise<Sandbox> {
    const id = found.id;
    let sb = found;
    this.c.live.entry(id).lastActive = Date.now();
    if ((sb.state === 'hibernated' || sb.state === 'paused') && sb.autoResume) sb = await this.c.hooks.sessions.awaken(sb.tenantId, id, true);
    if (sb.state !== 'running') {
      const verb = sb.state === 'paused' ? 'resume' : 'wake';
      const how = sb.state === 'paused' || sb.state === 'hibernated' ? `: \`space ${verb} ${id}\`, or create it with autoResume to have requests ${verb} it` : ': wait until it runs';
      throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${id} is ${sb.state}${how}`, { details: { sandboxId: id, state: sb.state } });
    }
    return sb;
  }

  /**
   * For the ingress: the exposure of `port` and its sandbox, or undefined when there is none
   * (no such sandbox, an ended one, a port not exposed or expired — all alike). A port exposed
   * on its own comes before the opening of every port ({@link EVERY_PORT}), whose exposure is
   * returned with `port` set to the port asked for.
   */
  async route(id: string, port: number): Promise<{ exposure: PortExposure; sandbox: Sandbox } | undefined> {
    if (port === EVERY_PORT) return undefined;
    let exposure = await this.c.store.getExposure(id, port);
    if (!exposure || !live(exposure)) {
      const every = await this.c.store.getExposure(id, EVERY_PORT);
      exposure = every && live(every) ? { ...every, port } : undefined;
    }
    if (!exposure) return undefined;
    const sandbox = await this.c.store.getSandbox(id);
    if (!sandbox || TERMINAL_STATES.includes(sandbox.state)) return undefined;
    return { exposure, sandbox };
  }
}
