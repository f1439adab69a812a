/**
 * One API on every node: a request for a sandbox another node of the cluster runs is forwarded
 * to that node's API, as it came (method, path, headers, body streamed both ways with
 * backpressure), and its answer relayed as it comes — command output, file downloads and
 * uploads included; WebSocket upgrades (the terminal) are relayed on the client's socket.
 * Forwarding rather than redirecting keeps every client (SDK, CLI, curl) unchanged: they talk
 * to any node. docs/cluster.md says why.
 */
import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';
import type { NodeInfo } from '@space/api';
import { SpaceError, type Sandbox } from '@space/core';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { createProxyServer } from 'http-proxy-3';
import { pickNode } from './node.js';

/** Set on a forwarded request (the forwarding node's name): a node never forwards it again. */
export const FORWARDED_BY = 'x-space-forwarded-by';
/** Set on every answer of a clustered node: which node answered. */
export const ANSWERED_BY = 'x-space-node';

/** Headers of one connection only (RFC 9110 §7.6.1), never forwarded. */
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authenticate', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade', 'host']);

/** A node as forwarding needs it. */
export type ForwardTarget = Pick<NodeInfo, 'name' | 'url' | 'state' | 'heartbeatAt'>;

/** What forwarding needs. */
export interface ForwardOptions {
  /** This node's name. */
  self: string;
  /** A tenant's sandbox record (any node's), or undefined. */
  find(tenantId: string, id: string): Promise<Sandbox | undefined>;
  /** Whether this node runs the sandbox. */
  owns(sb: Sandbox): boolean;
  /** The cluster's nodes, with their state (up, stopped, lost). */
  nodes(): Promise<ForwardTarget[]>;
  /**
   * The node a create of this template must run on, when this one cannot: a tenant's template
   * whose root file system is in another node's cache (the node that built it).
   */
  placeTemplate(tenantId: string, template: string): Promise<string | undefined>;
  /**
   * The node a create goes to for a warm sandbox: one whose pool of the template has one ready
   * when this node's has none (the create has the pool's shape). Undefined: it runs here.
   */
  placeWarm?(tenantId: string, body: Record<string, unknown>): Promise<ForwardTarget | undefined>;
  /** The node that keeps a tenant's volume (by name or id), when it is another node. */
  volumeNode?(tenantId: string, nameOrId: string): Promise<string | undefined>;
  /**
   * The node that keeps the volumes a create mounts, when it is another node (throws
   * `VOLUMES_ON_DIFFERENT_NODES` when they are on several).
   */
  placeVolumes?(tenantId: string, mounts: unknown): Promise<string | undefined>;
  /** Longest wait for a connection to the other node, ms. @default 5000 */
  connectTimeoutMs?: number;
  /** The JSON body of an error this module answers with itself (the API's own shape). @default SpaceError#toJSON */
  errorBody?: (e: SpaceError) => unknown;
}

/**
 * A connection per forwarded request: an idle kept-alive one the other node closes (its server
 * lets idle ones go after seconds) could fail a request written to it at that moment.
 */
const agents = { http: new http.Agent({ keepAlive: false }), https: new https.Agent({ keepAlive: false }) };

/**
 * Registers forwarding on the API: every route under `/v1/sandboxes/:id` of a sandbox of the
 * caller's tenant that another node runs goes to that node (after this node checked the API
 * key: the owner checks it again). `GET /v1/sandboxes/:id` of a sandbox whose node is down is
 * answered here from its record; anything else for it is `NODE_UNAVAILABLE`. Routes under
 * `/v1/volumes/:name` of a volume another node keeps go to that node; creates go where their
 * volumes are, where their tenant template was built, or to a node with a warm sandbox.
 *
 * @example
 * registerForwarding(app, { self: 'n1', find: (t, id) => svc.find(t, id).catch(() => undefined), owns: (sb) => svc.owns(sb), nodes: () => nodeViews(store, 30_000) });
 */
export function registerForwarding(app: FastifyInstance, opts: ForwardOptions): void {
  app.addHook('onSend', async (_req, reply, payload) => {
    reply.header(ANSWERED_BY, opts.self);
    return payload;
  });
  // A volume's requests (files streamed both ways included) go to the node that keeps it.
  app.addHook('onRequest', async (req, reply) => {
    const name = (req.params as { name?: unknown } | undefined)?.name;
    if (!req.routeOptions.url?.startsWith('/v1/volumes/:name') || typeof name !== 'string' || !req.principal || !opts.volumeNode || req.headers[FORWARDED_BY]) return;
    const at = await opts.volumeNode(req.principal.tenantId, name);
    if (at) await forward(req, reply, await upNode(at, opts.nodes, (state) => `Volume ${name} is kept on node ${at}, which ${state}`), opts, `Volume ${name} is kept`);
  });
  app.addHook('onRequest', async (req, reply) => {
    const route = req.routeOptions.url;
    const id = (req.params as { id?: unknown } | undefined)?.id;
    if (!route?.startsWith('/v1/sandboxes/:id') || typeof id !== 'string' || !req.principal) return;
    const sb = await opts.find(req.principal.tenantId, id);
    // Unknown, another tenant's, or this node's: the route answers (404 and the rest as usual).
    if (!sb || opts.owns(sb)) return;
    if (req.headers[FORWARDED_BY]) {
      throw new SpaceError('SANDBOX_ON_OTHER_NODE', `Sandbox ${sb.id} runs on node ${sb.node ?? '(none recorded)'}; node ${String(req.headers[FORWARDED_BY])} forwarded this request here (${opts.self}), which does not run it either`, { details: { sandboxId: sb.id, node: sb.node } });
    }
    const node = await recordOf(sb, opts.nodes);
    if (node?.state !== 'up') {
      // Its record is in the shared database: what it is can be said without its node. And a
      // hibernated sandbox holds nothing there: this node takes it over (SandboxService.get).
      if ((req.method === 'GET' && route === '/v1/sandboxes/:id') || sb.state === 'hibernated') return;
      throw nodeUnavailable(sb, node);
    }
    if (req.headers.upgrade) relayUpgrade(req, reply, node, opts, `Sandbox ${sb.id} runs`);
    else await forward(req, reply, node, opts, `Sandbox ${sb.id} runs`);
  });
  // Creates (body parsed by now): a tenant's template starts where its root file system is; a
  // pool-shaped create this node's pool cannot serve goes to a node whose pool can.
  app.addHook('preHandler', async (req, reply) => {
    if (req.method !== 'POST' || req.routeOptions.url !== '/v1/sandboxes' || req.headers[FORWARDED_BY]) return;
    const body = (req.body ?? {}) as Record<string, unknown>;
    // Volumes pin a create to the node that keeps them.
    const volumesAt = body.volumes !== undefined ? await opts.placeVolumes?.(req.principal.tenantId, body.volumes) : undefined;
    if (volumesAt) return forward(req, reply, await upNode(volumesAt, opts.nodes, (state) => `The volumes of this sandbox are kept on node ${volumesAt}, which ${state}`), opts, 'The volumes are kept', Buffer.from(JSON.stringify(req.body)));
    const template = body.template;
    const name = typeof template === 'string' ? await opts.placeTemplate(req.principal.tenantId, template) : undefined;
    if (name && name !== opts.self) {
      const node = await upNode(name, opts.nodes, (state) => `Template ${template} was built on node ${name}, which holds its root file system and ${state}: its sandboxes start there`, { template });
      return forward(req, reply, node, opts, `Template ${template} starts`, Buffer.from(JSON.stringify(req.body)));
    }
    // A warm sandbox elsewhere starts in milliseconds; a restore here takes hundreds.
    const warm = name ? undefined : await opts.placeWarm?.(req.principal.tenantId, body);
    if (warm) return forward(req, reply, warm, opts, 'A warm sandbox was chosen', Buffer.from(JSON.stringify(req.body)));
  });
}

/**
 * Places a create this node has no room for (`CAPACITY_EXHAUSTED`) on another node that is up,
 * runs the driver asked for and has a place and the memory for it, the least full and busy of
 * them ({@link pickNode}): the create is forwarded there, once (a forwarded create is never
 * forwarded again). Returns false when no node qualifies (the caller answers with the original
 * error).
 *
 * @example
 * if (err.code === 'CAPACITY_EXHAUSTED' && (await placeElsewhere(req, reply, await nodeViews(store, 30_000), { self: 'n1' }))) return reply;
 */
export async function placeElsewhere(req: FastifyRequest, reply: FastifyReply, nodes: NodeInfo[], opts: Pick<ForwardOptions, 'self' | 'connectTimeoutMs'>): Promise<boolean> {
  const body = (req.body ?? {}) as { driver?: unknown; memoryMb?: unknown; volumes?: unknown };
  // A forwarded create is never forwarded again; one with volumes runs where they are kept.
  if (req.headers[FORWARDED_BY] || (Array.isArray(body.volumes) && body.volumes.length)) return false;
  const target = pickNode(nodes, opts.self, { ...(typeof body.driver === 'string' ? { driver: body.driver } : {}), ...(typeof body.memoryMb === 'number' ? { memoryMb: body.memoryMb } : {}) });
  if (!target) return false;
  await forward(req, reply, target, opts, 'The sandbox was placed', Buffer.from(JSON.stringify(req.body ?? {})));
  return true;
}

/**
 * Relays an admin's request about node `target` (a drain) to that node's API.
 *
 * @example await relayToNode(req, reply, node, { self: 'n1' });
 */
export function relayToNode(req: FastifyRequest, reply: FastifyReply, target: ForwardTarget, opts: Pick<ForwardOptions, 'self' | 'connectTimeoutMs'>): Promise<void> {
  return forward(req, reply, target, opts, `The drain of node ${target.name} runs`);
}

/**
 * WebSocket upgrades (the terminal) relayed to the other node: its handshake and then both
 * directions as they come. The Host header stays the client's, so the owner's Origin check
 * compares the page's origin with the address the browser used.
 */
const upgrades = createProxyServer({ ws: true, xfwd: true, agent: agents.http });

/** The bytes a client sent after its upgrade request, kept by @fastify/websocket (empty for a client that waits for 101, as RFC 6455 asks). */
function upgradeHead(raw: http.IncomingMessage): Buffer {
  const key = Object.getOwnPropertySymbols(raw).find((s) => s.description === 'ws-head');
  const head = key ? (raw as unknown as Record<symbol, unknown>)[key] : undefined;
  return Buffer.isBuffer(head) ? head : Buffer.alloc(0);
}

/**
 * Relays a WebSocket upgrade to `node` on the client's socket (the reply is hijacked); a node
 * that does not answer gets the client a `NODE_UNAVAILABLE` answer instead of the handshake.
 */
function relayUpgrade(req: FastifyRequest, reply: FastifyReply, node: ForwardTarget, opts: Pick<ForwardOptions, 'self' | 'errorBody'>, what: string): void {
  reply.hijack();
  const socket = req.raw.socket as Socket;
  upgrades.ws(req.raw, socket, upgradeHead(req.raw), { target: node.url, headers: { [FORWARDED_BY]: opts.self }, ...(node.url.startsWith('https:') ? { agent: agents.https } : {}) }, (err: Error) => {
    if (!socket.writable) return void socket.destroy();
    const e = new SpaceError('NODE_UNAVAILABLE', `${what} on node ${node.name}, which did not answer at ${node.url}: ${err.message}`, { cause: err, details: { node: node.name } });
    const body = JSON.stringify(opts.errorBody ? opts.errorBody(e) : e.toJSON());
    socket.end(`HTTP/1.1 ${e.status} ${http.STATUS_CODES[e.status] ?? ''}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${ANSWERED_BY}: ${opts.self}\r\nconnection: close\r\n\r\n${body}`);
  });
}

/** The record of the sandbox's node, if that node ever registered. */
async function recordOf<T extends Pick<NodeInfo, 'name'>>(sb: Sandbox, nodes: () => Promise<T[]>): Promise<T | undefined> {
  return sb.node ? (await nodes()).find((n) => n.name === sb.node) : undefined;
}

/**
 * NODE_UNAVAILABLE for a sandbox whose node (its record `rec`, if registered) is not up — what
 * the API, the E2B API and the ingress answer alike.
 *
 * @example if (rec?.state !== 'up') throw nodeUnavailable(sb, rec);
 */
export function nodeUnavailable(sb: Pick<Sandbox, 'id' | 'node'>, rec: Pick<NodeInfo, 'state' | 'heartbeatAt'> | undefined): SpaceError {
  return new SpaceError('NODE_UNAVAILABLE', `Sandbox ${sb.id} runs on node ${sb.node ?? '(none recorded)'}, which ${rec ? `is ${rec.state} (last heartbeat ${rec.heartbeatAt})` : 'is not registered'}`, { details: { sandboxId: sb.id, node: sb.node } });
}

/** What forwarding on the E2B-compatible API needs: the sandbox's record by id (any tenant: the owner authenticates). */
export interface E2bForwardOptions extends Omit<ForwardOptions, 'find' | 'placeTemplate' | 'volumeNode' | 'placeVolumes'> {
  find(id: string): Promise<Sandbox | undefined>;
  /** The node that keeps volume `id` (`vol-…`, any tenant's: the owner authenticates), when it is another node. */
  volumeNode?(id: string): Promise<string | undefined>;
  /** The node that keeps the volumes of an E2B create (`volumeMounts`), when it is another node. */
  placeVolumes?(apiKey: string | undefined, mounts: { name: string; path: string }[]): Promise<string | undefined>;
}

/**
 * Registers forwarding on the E2B-compatible API (before its routes), and says on every answer
 * which node answered (`x-space-node`): a request naming a
 * sandbox another node runs — in the path (`/sandboxes/:id…`, `/v2/sandboxes/:id…`) or, for
 * envd's calls, in `E2b-Sandbox-Id` — goes to that node's E2B listener as it came (`url` of
 * the targets is that listener's). The owner authenticates it (API key or access token): this
 * node only relays to a node of the deployment, never elsewhere.
 *
 * @example
 * registerE2bForwarding(e2bApp, { self: 'n1', find: (id) => store.getSandbox(id), owns, nodes: e2bNodes, errorBody: (e) => ({ code: e.status, message: e.message }) });
 */
export function registerE2bForwarding(app: FastifyInstance, opts: E2bForwardOptions): void {
  app.addHook('onSend', async (_req, reply, payload) => {
    reply.header(ANSWERED_BY, opts.self);
    return payload;
  });
  app.addHook('onRequest', async (req, reply) => {
    const route = req.routeOptions.url ?? '';
    const fromPath = route.startsWith('/sandboxes/:id') || route.startsWith('/v2/sandboxes/:id') ? (req.params as { id?: unknown } | undefined)?.id : undefined;
    const id = fromPath ?? req.headers['e2b-sandbox-id'];
    if (typeof id !== 'string' || id.length >= 64 || req.headers[FORWARDED_BY]) return;
    const sb = await opts.find(id);
    if (!sb || opts.owns(sb)) return;
    const node = await recordOf(sb, opts.nodes);
    if (node?.state !== 'up') throw nodeUnavailable(sb, node);
    await forward(req, reply, node, opts, `Sandbox ${sb.id} runs`);
  });
  // E2B's volume API names a volume by id: its requests go to the node that keeps it.
  app.addHook('onRequest', async (req, reply) => {
    const route = req.routeOptions.url ?? '';
    const id = (req.params as { id?: unknown } | undefined)?.id;
    if (!(route.startsWith('/volumes/:id') || route.startsWith('/volumecontent/:id')) || typeof id !== 'string' || id.length >= 64 || !opts.volumeNode || req.headers[FORWARDED_BY]) return;
    const at = await opts.volumeNode(id);
    if (at) await forward(req, reply, await upNode(at, opts.nodes, (state) => `Volume ${id} is kept on node ${at}, which ${state}`), opts, `Volume ${id} is kept`);
  });
  // A create mounting volumes (E2B's volumeMounts) goes to the node that keeps them.
  app.addHook('preHandler', async (req, reply) => {
    const mounts = (req.body as { volumeMounts?: unknown } | undefined)?.volumeMounts;
    if (req.method !== 'POST' || (req.routeOptions.url !== '/sandboxes' && req.routeOptions.url !== '/v2/sandboxes') || !Array.isArray(mounts) || !mounts.length || !opts.placeVolumes || req.headers[FORWARDED_BY]) return;
    const key = req.headers['x-api-key'];
    const at = await opts.placeVolumes(typeof key === 'string' ? key : undefined, mounts as { name: string; path: string }[]);
    if (at) await forward(req, reply, await upNode(at, opts.nodes, (state) => `The volumes of this sandbox are kept on node ${at}, which ${state}`), opts, 'The volumes are kept', Buffer.from(JSON.stringify(req.body)));
  });
}

/** Node `name` when it is up; else NODE_UNAVAILABLE saying `message(its state)`. */
async function upNode(name: string, nodes: () => Promise<ForwardTarget[]>, message: (state: string) => string, details: Record<string, unknown> = {}): Promise<ForwardTarget> {
  const node = (await nodes()).find((n) => n.name === name);
  if (!node || node.state !== 'up') throw new SpaceError('NODE_UNAVAILABLE', message(node ? `is ${node.state}` : 'is not registered'), { details: { ...details, node: name } });
  return node;
}

/**
 * Relays the request to `node` and its answer back; resolves when the exchange has ended. The
 * body is streamed from the client, or is `body` when this node has read it already (JSON).
 * `what` names what runs there, for the error when the node does not answer.
 */
function forward(req: FastifyRequest, reply: FastifyReply, node: ForwardTarget, opts: Pick<ForwardOptions, 'self' | 'connectTimeoutMs' | 'errorBody'>, what: string, body?: Buffer): Promise<void> {
  reply.hijack();
  const target = new URL(req.raw.url ?? '/', node.url);
  const headers: http.OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(req.headers)) if (!HOP_BY_HOP.has(k) && v !== undefined) headers[k] = v;
  headers[FORWARDED_BY] = opts.self;
  headers['x-forwarded-for'] = [req.headers['x-forwarded-for'], req.socket.remoteAddress].filter(Boolean).join(', ');
  // A body of unknown length goes on chunked, as it came.
  if (req.headers['transfer-encoding'] && !req.headers['content-length']) headers['transfer-encoding'] = 'chunked';
  if (body) {
    headers['content-type'] = 'application/json';
    headers['content-length'] = String(body.length);
    delete headers['transfer-encoding'];
  }
  const out = reply.raw;
  return new Promise<void>((resolve) => {
    const lib = target.protocol === 'https:' ? https : http;
    const up = lib.request(target, { method: req.method, headers, agent: target.protocol === 'https:' ? agents.https : agents.http });
    const fail = (err: Error) => {
      if (!out.headersSent) {
        const e = new SpaceError('NODE_UNAVAILABLE', `${what} on node ${node.name}, which did not answer at ${node.url}: ${err.message}`, { cause: err, details: { node: node.name } });
        const body = JSON.stringify(opts.errorBody ? opts.errorBody(e) : e.toJSON());
        out.writeHead(e.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), [ANSWERED_BY]: opts.self, connection: 'close' });
        out.end(body);
      } else out.destroy(err);
      req.raw.destroy();
      resolve();
    };
    const connectTimer = setTimeout(() => up.destroy(new Error(`no connection within ${opts.connectTimeoutMs ?? 5000} ms`)), opts.connectTimeoutMs ?? 5000);
    up.on('socket', (s) => {
      if (!s.connecting) clearTimeout(connectTimer);
      else s.once('connect', () => clearTimeout(connectTimer));
    });
    up.on('error', (err) => {
      clearTimeout(connectTimer);
      fail(err);
    });
    up.on('response', (res) => {
      clearTimeout(connectTimer);
      const h: http.OutgoingHttpHeaders = {};
      for (const [k, v] of Object.entries(res.headers)) if (!HOP_BY_HOP.has(k) && v !== undefined) h[k] = v;
      out.writeHead(res.statusCode ?? 502, h);
      // Streamed as it comes (command output, downloads); a client that stops reading slows the
      // other node down through both sockets' buffers.
      res.pipe(out);
      res.on('error', (err) => out.destroy(err));
      res.on('aborted', () => out.destroy());
      out.on('close', () => {
        if (!res.complete) res.destroy();
        resolve();
      });
    });
    // The client went away before the answer: the other node stops too.
    out.on('close', () => {
      if (!out.writableFinished) up.destroy();
      resolve();
    });
    if (body) up.end(body);
    else req.raw.pipe(up);
  });
}
