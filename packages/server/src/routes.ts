/**
 * Routes of the v1 API. Command output streams as NDJSON over HTTP (one JSON event per
 * line: `start`, `stdout`/`stderr`/`pty` with base64 `data`, then `exit` or `error`).
 * File contents stream raw. Both apply backpressure to the process or file in the sandbox.
 */
import { Readable } from 'node:stream';
import type { FastifyInstance, FastifyReply } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { AsyncQueue, SANDBOX_STATES, type AgentCall, type Progress, type Sandbox, type Template, type PortExposure, SpaceError, checkPath, fileMetadataFromHeaders, toSpaceError, asErrorCode } from '@space/core';
import { Channel, type ExecRequest } from '@space/protocol';
import type { AppDeps } from './deps.js';
import { placeElsewhere, relayToNode } from './forward.js';
import { Type } from 'typebox';
import * as S from './schemas.js';
import { VERSION } from './version.js';

type App = FastifyInstance<any, any, any, any, TypeBoxTypeProvider>;

const CHANNEL_NAME: Record<number, string> = { [Channel.Stdout]: 'stdout', [Channel.Stderr]: 'stderr', [Channel.Pty]: 'pty' };

/** NDJSON events of a command stream; the call is cancelled if the client goes away. */
function streamCall(reply: FastifyReply, call: AgentCall, pid: number): FastifyReply {
  async function* events(): AsyncGenerator<string> {
    let finished = false;
    try {
      yield JSON.stringify({ type: 'start', pid }) + '\n';
      for await (const c of call.output()) yield JSON.stringify({ type: CHANNEL_NAME[c.channel] ?? 'stdout', data: c.data.toString('base64') }) + '\n';
      const end = await call.done;
      finished = true;
      yield JSON.stringify({ type: 'exit', exitCode: end.exitCode ?? null, signal: end.signal ?? null, ...(end.timedOut ? { timedOut: true } : {}), ...(end.dropped ? { dropped: end.dropped } : {}) }) + '\n';
    } catch (err) {
      finished = true;
      const e = toSpaceError(err);
      yield JSON.stringify({ type: 'error', code: e.code, message: e.message }) + '\n';
    } finally {
      if (!finished) call.cancel('client went away');
    }
  }
  reply.raw.on('close', () => call.cancel('client went away'));
  return reply.code(200).header('content-type', 'application/x-ndjson').header('cache-control', 'no-store').send(Readable.from(events(), { objectMode: false, highWaterMark: 16 }));
}

function labelsOf(label: string | string[] | undefined): Record<string, string> | undefined {
  if (label === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const l of Array.isArray(label) ? label : [label]) {
    const i = l.indexOf('=');
    if (i < 1) throw new SpaceError('BAD_REQUEST', `label filter ${JSON.stringify(l)} must look like key=value`);
    out[l.slice(0, i)] = l.slice(i + 1);
  }
  return out;
}

const STATES = new Set<string>(SANDBOX_STATES);

/** Registers every v1 route. */
export async function registerRoutes(app: App, deps: AppDeps): Promise<void> {
  const { service: svc, keys } = deps;
  const err = { 400: S.ErrorSchema, 401: S.ErrorSchema, 404: S.ErrorSchema, 409: S.ErrorSchema };

  app.get('/v1/health', { schema: { tags: ['system'], security: [], description: 'Liveness, and which run of the daemon answers (`instance`, as in its state file spaced.json).' } }, async () => ({ status: 'ok', ...(deps.instance ? { instance: deps.instance } : {}) }));
  app.get('/v1/version', { schema: { tags: ['system'], security: [] } }, async () => ({ version: VERSION, api: 'v1', drivers: deps.drivers.map((d) => d.name) }));
  app.get('/v1/e2b', { schema: { tags: ['system'], description: 'Where the E2B-compatible API listens (null when it is off): set E2B_API_URL and E2B_SANDBOX_URL to it.' } }, async () => ({ url: deps.e2bUrl ?? null }));
  app.get('/v1/doctor', { schema: { tags: ['system'] } }, async () => ({ drivers: await Promise.all(deps.drivers.map((d) => d.doctor())) }));

  // ---- sandboxes
  app.post('/v1/sandboxes', { schema: { tags: ['sandboxes'], body: S.CreateSandboxBody, response: { 201: S.SandboxSchema, ...err } } }, async (req, reply) => {
    const ac = new AbortController();
    reply.raw.on('close', () => { if (!reply.raw.writableEnded) ac.abort(); });
    let sb;
    try {
      // A drained node places every create elsewhere.
      if (deps.cluster?.draining()) throw new SpaceError('CAPACITY_EXHAUSTED', `Node ${deps.cluster.self} is drained: it takes no new sandboxes`, { details: { retryAfterS: 5 } });
      sb = await svc.create(req.principal.tenantId, req.body, ac.signal);
    } catch (err) {
      // Full here: another node of the cluster with room takes it (CAPACITY_EXHAUSTED when none can).
      if (err instanceof SpaceError && err.code === 'CAPACITY_EXHAUSTED' && deps.cluster && deps.nodes && (await placeElsewhere(req, reply, await deps.nodes(), { self: deps.cluster.self }))) return reply;
      throw err;
    }
    return reply.code(201).send(sb);
  });
  app.get('/v1/sandboxes', { schema: { tags: ['sandboxes'], querystring: S.ListQuery } }, async (req) => {
    const states = req.query.state?.split(',').filter(Boolean);
    for (const s of states ?? []) if (!STATES.has(s)) throw new SpaceError('BAD_REQUEST', `Unknown state ${JSON.stringify(s)}; use ${[...STATES].join(', ')}`);
    const metadata = labelsOf(req.query.label);
    return svc.list(req.principal.tenantId, {
      ...(states?.length ? { states: states as Sandbox['state'][] } : {}),
      ...(metadata ? { metadata } : {}),
      limit: req.query.limit ?? 50,
      ...(req.query.cursor ? { cursor: req.query.cursor } : {}),
    });
  });
  app.get('/v1/sandboxes/:id', { schema: { tags: ['sandboxes'], params: S.IdParams, response: { 200: S.SandboxSchema, ...err } } }, async (req) => svc.find(req.principal.tenantId, req.params.id));
  app.delete('/v1/sandboxes/:id', { schema: { tags: ['sandboxes'], params: S.IdParams, response: { 200: S.SandboxSchema, ...err } } }, async (req) => svc.kill(req.principal.tenantId, req.params.id));
  app.get('/v1/sandboxes/:id/usage', { schema: { tags: ['sandboxes'], params: S.IdParams } }, async (req) => svc.usage(req.principal.tenantId, req.params.id));

  // ---- stateful sessions
  const sbOut = { response: { 200: S.SandboxSchema, ...err } };
  /** The cluster this node is part of, or BAD_REQUEST for a deployment of one node. */
  const requireCluster = () => {
    if (!deps.cluster) throw new SpaceError('BAD_REQUEST', 'This daemon is the only node of its deployment (nodes share a PostgreSQL database to form a cluster: docs/cluster.md)');
    return deps.cluster;
  };
  app.post('/v1/sandboxes/:id/pause', { schema: { tags: ['sessions'], params: S.IdParams, ...sbOut } }, async (req) => svc.pause(req.principal.tenantId, req.params.id));
  app.post('/v1/sandboxes/:id/resume', { schema: { tags: ['sessions'], params: S.IdParams, ...sbOut } }, async (req) => svc.resume(req.principal.tenantId, req.params.id));
  app.post('/v1/sandboxes/:id/hibernate', { schema: { tags: ['sessions'], params: S.IdParams, ...sbOut } }, async (req) => svc.hibernate(req.principal.tenantId, req.params.id));
  app.post('/v1/sandboxes/:id/wake', { schema: { tags: ['sessions'], params: S.IdParams, ...sbOut } }, async (req) => svc.wake(req.principal.tenantId, req.params.id));
  app.post('/v1/sandboxes/:id/snapshots', { schema: { tags: ['sessions'], params: S.IdParams, body: Type.Optional(S.SnapshotBody), response: { 201: S.SnapshotSchema, ...err } } }, async (req, reply) =>
    reply.code(201).send(await svc.snapshot(req.principal.tenantId, req.params.id, req.body?.name !== undefined ? { name: req.body.name } : {})),
  );
  app.get('/v1/sandboxes/:id/snapshots', { schema: { tags: ['sessions'], params: S.IdParams, response: { 200: Type.Object({ snapshots: Type.Array(S.SnapshotSchema) }), ...err } } }, async (req) => ({ snapshots: await svc.snapshots(req.principal.tenantId, req.params.id) }));
  app.delete('/v1/sandboxes/:id/snapshots/:snapshotId', { schema: { tags: ['sessions'], params: S.SnapshotParams, description: 'Deletes a snapshot of the sandbox (not the one a hibernated sandbox sleeps in: 409).' } }, async (req, reply) => {
    const snaps = await svc.snapshots(req.principal.tenantId, req.params.id);
    if (!snaps.some((s) => s.id === req.params.snapshotId)) throw new SpaceError('SNAPSHOT_NOT_FOUND', `Sandbox ${req.params.id} has no snapshot ${JSON.stringify(req.params.snapshotId)}`);
    await svc.removeSnapshot(req.principal.tenantId, req.params.snapshotId);
    return reply.code(204).send();
  });
  app.post('/v1/sandboxes/:id/rollback', { schema: { tags: ['sessions'], params: S.IdParams, body: S.RollbackBody, ...sbOut } }, async (req) => svc.rollback(req.principal.tenantId, req.params.id, req.body.snapshotId));
  app.post('/v1/sandboxes/:id/fork', { schema: { tags: ['sessions'], params: S.IdParams, body: Type.Optional(S.ForkBody) } }, async (req, reply) => {
    const results = await svc.fork(req.principal.tenantId, req.params.id, { count: req.body?.count ?? 1, ...(req.body?.snapshotId ? { snapshotId: req.body.snapshotId } : {}) });
    return reply.code(201).send({ results });
  });
  app.post('/v1/sandboxes/:id/move', { schema: { tags: ['sessions'], params: S.IdParams, body: S.MoveBody, description: 'Moves the sandbox to another node of the cluster: hibernated here, woken there (if it ran). A disk goes with it; sandboxes with volumes do not move.', ...sbOut } }, async (req) => {
    const cluster = requireCluster();
    const target = (await cluster.nodes()).find((n) => n.name === req.body.node);
    if (!target) throw new SpaceError('BAD_REQUEST', `No node ${JSON.stringify(req.body.node)} in this deployment; \`space nodes\` lists them`);
    if (target.state !== 'up') throw new SpaceError('NODE_UNAVAILABLE', `Node ${target.name} is ${target.state} (last heartbeat ${target.heartbeatAt}); move to a node that is up`);
    const { sandbox, wasRunning } = await svc.move(req.principal.tenantId, req.params.id, target.name);
    if (!wasRunning) return sandbox;
    // It ran here: it runs there again. The wake goes to the node that owns it now.
    const r = await fetch(new URL(`/v1/sandboxes/${sandbox.id}/wake`, target.url), { method: 'POST', headers: { authorization: req.headers.authorization ?? `Bearer ${String(req.headers['x-api-key'] ?? '')}` }, signal: AbortSignal.timeout(600_000) }).catch((err: unknown) => {
      throw new SpaceError('NODE_UNAVAILABLE', `Sandbox ${sandbox.id} moved to node ${target.name} (hibernated), which did not answer its wake: ${(err as Error).message}; wake it again (\`space wake\`)`, { cause: err });
    });
    const body = (await r.json().catch(() => ({}))) as { error?: { code?: string; message?: string } };
    if (r.ok) return body as Sandbox;
    throw new SpaceError(asErrorCode(body.error?.code), `Sandbox ${sandbox.id} moved to node ${target.name} (hibernated), whose wake failed: ${body.error?.message ?? r.status}; wake it again (\`space wake\`)`);
  });
  app.put('/v1/sandboxes/:id/snapshot-policy', { schema: { tags: ['sessions'], params: S.IdParams, body: S.PolicyBody, ...sbOut } }, async (req) => svc.setSnapshotPolicy(req.principal.tenantId, req.params.id, req.body));
  // ---- ingress: exposed ports
  const requireIngress = () => {
    if (!deps.ingress) throw new SpaceError('INGRESS_UNAVAILABLE');
    return deps.ingress;
  };
  const exposed = (e: PortExposure, token?: string) => ({ port: e.port, public: e.public, ...requireIngress().urls(e), createdAt: e.createdAt, ...(e.expiresAt ? { expiresAt: e.expiresAt } : {}), ...(token ? { token } : {}) });
  app.post('/v1/sandboxes/:id/ports', { schema: { tags: ['ingress'], params: S.IdParams, body: S.ExposeBody, description: 'Exposes a port through the ingress (again: with a new token, which ends the old one and its links). The token is in this answer only.', response: { 201: S.ExposedPortSchema, ...err } } }, async (req, reply) => {
    requireIngress();
    const { exposure, token } = await svc.exposePort(req.principal.tenantId, req.params.id, req.body);
    return reply.code(201).send(exposed(exposure, token));
  });
  app.get('/v1/sandboxes/:id/ports', { schema: { tags: ['ingress'], params: S.IdParams, description: 'Exposed ports, each with a fresh signed link (no token).', response: { 200: Type.Object({ ports: Type.Array(S.ExposedPortSchema) }), ...err } } }, async (req) => {
    requireIngress();
    return { ports: (await svc.exposedPorts(req.principal.tenantId, req.params.id)).map((e) => exposed(e)) };
  });
  app.get('/v1/sandboxes/:id/ingress/log', { schema: { tags: ['ingress'], params: S.IdParams, querystring: S.AuditLogQuery, description: 'Every request through the ingress to the sandbox\'s ports (refusals of an exposed port included), newest first.' } }, async (req) =>
    svc.ingressLog(req.principal.tenantId, req.params.id, req.query.limit ?? 100, req.query.cursor),
  );
  app.delete('/v1/sandboxes/:id/ports/:port', { schema: { tags: ['ingress'], params: S.PortParams, description: 'Stops exposing a port; its token and links stop working at once.' } }, async (req, reply) => {
    await svc.unexposePort(req.principal.tenantId, req.params.id, req.params.port);
    return reply.code(204).send();
  });
  // ---- egress: policy, secrets, audit log
  app.get('/v1/sandboxes/:id/egress', { schema: { tags: ['egress'], params: S.IdParams, response: { 200: S.EgressPolicySchema, ...err } } }, async (req) => {
    const sb = await svc.get(req.principal.tenantId, req.params.id);
    return sb.egress ?? { domains: [], cidrs: [], ports: [80, 443], passthrough: [] };
  });
  app.put('/v1/sandboxes/:id/egress', { schema: { tags: ['egress'], params: S.IdParams, body: S.EgressPolicyBody, description: 'Replaces the egress policy; applies from the next request on.', ...sbOut } }, async (req) => svc.setEgress(req.principal.tenantId, req.params.id, req.body));
  app.post('/v1/sandboxes/:id/secrets', { schema: { tags: ['egress'], params: S.IdParams, body: S.AttachSecretsBody, description: 'Attaches secrets to a running sandbox: placeholders in env vars of their names for processes started from now on.', ...sbOut } }, async (req) =>
    svc.attachSecrets(req.principal.tenantId, req.params.id, req.body.names),
  );
  app.delete('/v1/sandboxes/:id/secrets/:name', { schema: { tags: ['egress'], params: S.SandboxSecretParams, description: 'Detaches a secret; the proxy stops swapping its placeholder at the next request.', ...sbOut } }, async (req) =>
    svc.detachSecret(req.principal.tenantId, req.params.id, req.params.name),
  );
  app.get('/v1/sandboxes/:id/egress/log', { schema: { tags: ['egress'], params: S.IdParams, querystring: S.AuditLogQuery, description: 'Every request through the egress proxy, newest first.' } }, async (req) => {
    const sb = await svc.get(req.principal.tenantId, req.params.id);
    return requireSecrets().log(sb.id, req.query.limit ?? 100, req.query.cursor);
  });
  const requireSecrets = () => {
    if (!deps.secrets) throw new SpaceError('EGRESS_UNAVAILABLE', 'This daemon runs sandboxes without a network (--egress off)');
    return deps.secrets;
  };
  app.get('/v1/secrets', { schema: { tags: ['egress'], response: { 200: Type.Object({ secrets: Type.Array(S.SecretSchema) }), ...err } } }, async (req) => ({ secrets: await requireSecrets().list(req.principal.tenantId) }));
  app.get('/v1/secrets/:name', { schema: { tags: ['egress'], params: S.SecretParams, response: { 200: S.SecretSchema, ...err } } }, async (req) => requireSecrets().get(req.principal.tenantId, req.params.name));
  app.put('/v1/secrets/:name', { schema: { tags: ['egress'], params: S.SecretParams, body: S.SetSecretBody, description: 'Creates or replaces a secret (stored encrypted; the value is never returned). Sandboxes use the new value from their next request.', response: { 200: S.SecretSchema, ...err } } }, async (req) =>
    requireSecrets().set(req.principal.tenantId, { name: req.params.name, ...req.body }),
  );
  app.delete('/v1/secrets/:name', { schema: { tags: ['egress'], params: S.SecretParams } }, async (req, reply) => {
    await requireSecrets().remove(req.principal.tenantId, req.params.name);
    return reply.code(204).send();
  });

  app.get('/v1/sandboxes/:id/events', { schema: { tags: ['sessions'], params: S.IdParams } }, async (req) => ({ events: await svc.events(req.principal.tenantId, req.params.id) }));

  // ---- commands
  app.post('/v1/sandboxes/:id/commands', { schema: { tags: ['commands'], params: S.IdParams, body: S.ExecBody } }, async (req, reply) => {
    const b = req.body;
    // A terminal with neither runs the user's login shell (as ssh does).
    if (b.cmd !== undefined && b.argv !== undefined) throw new SpaceError('BAD_REQUEST', 'Give cmd (a shell command line) or argv (a program and its arguments), not both');
    if (b.cmd === undefined && b.argv === undefined && !b.pty) throw new SpaceError('BAD_REQUEST', 'Give cmd (a shell command line) or argv (a program and its arguments); only a terminal (pty) may omit both to get the login shell');
    if (b.cwd !== undefined) checkPath(b.cwd, 'cwd');
    const r: ExecRequest = {
      op: 'exec',
      ...(b.argv ? { argv: b.argv } : b.cmd !== undefined ? { shell: b.cmd } : {}),
      ...(b.env ? { env: b.env } : {}),
      ...(b.cwd ? { cwd: b.cwd } : {}),
      ...(b.user ? { user: b.user } : {}),
      ...(b.timeoutMs ? { timeoutMs: b.timeoutMs } : {}),
      ...(b.pty ? { pty: b.pty } : {}),
      ...(b.tag ? { tag: b.tag } : {}),
      stdin: !!b.stdin,
      background: !!b.background,
    };
    const call = await svc.call(req.principal.tenantId, req.params.id, 'exec', r);
    const { pid } = (await call.reply) as { pid: number };
    if (b.background) {
      call.cancel('background');
      return reply.code(201).send({ pid });
    }
    return streamCall(reply, call, pid);
  });
  app.get('/v1/sandboxes/:id/commands', { schema: { tags: ['commands'], params: S.IdParams } }, async (req) => {
    const r = await svc.unary(req.principal.tenantId, req.params.id, 'exec', { op: 'ps' });
    return { processes: Array.isArray(r.processes) ? r.processes.slice(0, 10_000) : [] };
  });
  app.get('/v1/sandboxes/:id/commands/:pid/output', { schema: { tags: ['commands'], params: S.PidParams } }, async (req, reply) => {
    const call = await svc.call(req.principal.tenantId, req.params.id, 'exec', { op: 'attach', pid: req.params.pid });
    await call.reply;
    return streamCall(reply, call, req.params.pid);
  });
  app.post('/v1/sandboxes/:id/commands/:pid/stdin', { schema: { tags: ['commands'], params: S.PidParams, body: S.StdinBody } }, async (req) => {
    await svc.unary(req.principal.tenantId, req.params.id, 'exec', { op: 'stdin', pid: req.params.pid, data: req.body.data ?? '', ...(req.body.eof ? { eof: true } : {}) });
    return {};
  });
  app.post('/v1/sandboxes/:id/commands/:pid/signal', { schema: { tags: ['commands'], params: S.PidParams, body: S.SignalBody } }, async (req) => {
    await svc.unary(req.principal.tenantId, req.params.id, 'exec', { op: 'signal', pid: req.params.pid, signal: req.body.signal });
    return {};
  });
  app.post('/v1/sandboxes/:id/commands/:pid/resize', { schema: { tags: ['commands'], params: S.PidParams, body: S.ResizeBody } }, async (req) => {
    await svc.unary(req.principal.tenantId, req.params.id, 'exec', { op: 'resize', pid: req.params.pid, cols: req.body.cols, rows: req.body.rows });
    return {};
  });

  // ---- files
  app.get('/v1/sandboxes/:id/files', { schema: { tags: ['files'], params: S.IdParams, querystring: S.ListFilesQuery } }, async (req) => {
    const r = await svc.unary(req.principal.tenantId, req.params.id, 'files', { op: 'list', path: checkPath(req.query.path), ...(req.query.depth ? { depth: req.query.depth } : {}), ...(req.query.metadata ? { metadata: true } : {}) });
    return { entries: r.entries };
  });
  app.get('/v1/sandboxes/:id/files/stat', { schema: { tags: ['files'], params: S.IdParams, querystring: S.StatQuery } }, async (req) => {
    const r = await svc.unary(req.principal.tenantId, req.params.id, 'files', { op: 'stat', path: checkPath(req.query.path), ...(req.query.metadata ? { metadata: true } : {}) });
    return r.entry;
  });
  app.post('/v1/sandboxes/:id/files/mkdir', { schema: { tags: ['files'], params: S.IdParams, body: S.MkdirBody } }, async (req) => {
    await svc.unary(req.principal.tenantId, req.params.id, 'files', { op: 'mkdir', path: checkPath(req.body.path), ...(req.body.user ? { user: req.body.user } : {}) });
    return {};
  });
  app.post('/v1/sandboxes/:id/files/rename', { schema: { tags: ['files'], params: S.IdParams, body: S.RenameBody } }, async (req) => {
    await svc.unary(req.principal.tenantId, req.params.id, 'files', { op: 'rename', from: checkPath(req.body.from, 'from'), to: checkPath(req.body.to, 'to') });
    return {};
  });
  app.delete('/v1/sandboxes/:id/files', { schema: { tags: ['files'], params: S.IdParams, querystring: S.RemoveQuery } }, async (req) => {
    await svc.unary(req.principal.tenantId, req.params.id, 'files', { op: 'remove', path: checkPath(req.query.path), recursive: !!req.query.recursive });
    return {};
  });
  app.get('/v1/sandboxes/:id/files/content', { schema: { tags: ['files'], params: S.IdParams, querystring: S.PathQuery } }, async (req, reply) => {
    const call = await svc.call(req.principal.tenantId, req.params.id, 'files', { op: 'read', path: checkPath(req.query.path) });
    const { size: told } = (await call.reply) as { size?: unknown };
    const size = typeof told === 'number' && Number.isSafeInteger(told) && told >= 0 ? told : undefined;
    // The body must be exactly the length announced: a short one would leave the client
    // waiting, a long one would run into the next response on its keep-alive connection.
    // Anything else cuts the response (an error thrown after the headers destroys it).
    const broken = (what: string) => {
      const err = new SpaceError('AGENT_PROTOCOL_ERROR', `The agent of sandbox ${req.params.id} sent ${what} than the ${size} bytes it announced for ${req.query.path}`);
      req.log.warn({ code: err.code }, err.message);
      return err;
    };
    async function* body(): AsyncGenerator<Buffer> {
      let done = false;
      let sent = 0;
      try {
        for await (const c of call.output()) {
          sent += c.data.length;
          if (size !== undefined && sent > size) throw broken('more');
          yield c.data;
        }
        await call.done;
        if (size !== undefined && sent < size) throw broken('fewer');
        done = true;
      } catch (err) {
        if (err instanceof SpaceError && err.code !== 'AGENT_PROTOCOL_ERROR') req.log.warn({ code: err.code }, `download of ${req.query.path} cut: ${err.message}`);
        throw err;
      } finally {
        if (!done) call.cancel('client went away');
      }
    }
    reply.raw.on('close', () => call.cancel('client went away'));
    if (size !== undefined) reply.header('content-length', String(size));
    return reply.header('content-type', 'application/octet-stream').send(Readable.from(body(), { objectMode: false }));
  });
  app.put('/v1/sandboxes/:id/files/content', { schema: { tags: ['files'], params: S.IdParams, querystring: S.UploadQuery }, bodyLimit: deps.maxUploadBytes }, async (req) => {
    const declared = Number(req.headers['content-length'] ?? NaN);
    if (declared > deps.maxUploadBytes) throw new SpaceError('PAYLOAD_TOO_LARGE', `Upload of ${declared} bytes exceeds the limit of ${deps.maxUploadBytes} bytes`);
    const body = req.body as Readable | Buffer | undefined;
    if (!body || !(body instanceof Readable)) throw new SpaceError('BAD_REQUEST', 'Send the file as the request body with Content-Type: application/octet-stream');
    const metadata = fileMetadataFromHeaders(req.headers);
    const call = await svc.call(req.principal.tenantId, req.params.id, 'files', {
      op: 'write',
      path: checkPath(req.query.path),
      ...(req.query.mode !== undefined ? { mode: req.query.mode } : {}),
      ...(req.query.user ? { user: req.query.user } : {}),
      ...(metadata ? { metadata } : {}),
    });
    await call.reply;
    let size = 0;
    try {
      for await (const chunk of body as AsyncIterable<Buffer>) {
        size += chunk.length;
        if (size > deps.maxUploadBytes) throw new SpaceError('PAYLOAD_TOO_LARGE', `Upload exceeds the limit of ${deps.maxUploadBytes} bytes`);
        await call.write(Channel.File, chunk);
      }
    } catch (e) {
      // Wait until the agent has removed its temporary file, so a failed upload leaves nothing.
      call.cancel('upload failed');
      await Promise.race([call.done.catch(() => {}), new Promise((r) => setTimeout(r, 10_000).unref())]);
      throw e;
    }
    call.end({});
    const end = await call.done;
    return { path: req.query.path, size: end.size ?? size };
  });

  // ---- API keys
  app.get('/v1/keys', { schema: { tags: ['keys'] } }, async (req) => ({ keys: await keys.list(req.principal) }));
  app.post('/v1/keys', { schema: { tags: ['keys'], body: S.CreateKeyBody } }, async (req, reply) => {
    const tenant = req.body.tenant ?? req.principal.tenantId;
    if ((tenant !== req.principal.tenantId || req.body.admin) && !req.principal.admin) throw new SpaceError('FORBIDDEN', 'Only an admin key may create admin keys or keys of another tenant');
    const created = await keys.create({ tenantId: tenant, ...(req.body.name ? { name: req.body.name } : {}), admin: !!req.body.admin, ...(req.body.format ? { format: req.body.format } : {}) });
    return reply.code(201).send(created);
  });
  app.delete('/v1/keys/:keyId', { schema: { tags: ['keys'], params: S.KeyParams } }, async (req) => keys.revoke(req.principal, req.params.keyId));

  // ---- encryption keys (bring your own key)
  const ek = deps.encryptionKeys;
  const adminOnly = (req: { principal: { admin: boolean } }) => {
    if (!req.principal.admin) throw new SpaceError('FORBIDDEN', 'Managing encryption keys needs an admin key of the tenant');
  };
  app.get('/v1/encryption-keys', { schema: { tags: ['encryption'] } }, async (req) => ({ keys: await ek.list(req.principal.tenantId) }));
  app.post('/v1/encryption-keys', { schema: { tags: ['encryption'], body: S.SetKeyBody, description: 'Sets the tenant\'s key; with a key already active this rotates: every data key is re-wrapped under the new one, online.' } }, async (req, reply) => {
    adminOnly(req);
    return reply.code(201).send(await ek.set(req.principal.tenantId, req.body));
  });
  app.post('/v1/encryption-keys/:keyId/revoke', { schema: { tags: ['encryption'], params: S.KeyParams } }, async (req) => {
    adminOnly(req);
    return ek.revoke(req.principal.tenantId, req.params.keyId);
  });
  app.post('/v1/encryption-keys/:keyId/enable', { schema: { tags: ['encryption'], params: S.KeyParams } }, async (req) => {
    adminOnly(req);
    return ek.enable(req.principal.tenantId, req.params.keyId);
  });
  app.delete('/v1/encryption-keys/:keyId', { schema: { tags: ['encryption'], params: S.KeyParams, querystring: Type.Object({ shred: Type.Optional(Type.Boolean()) }) } }, async (req) => {
    adminOnly(req);
    return ek.destroy(req.principal.tenantId, req.params.keyId, !!(req.query as { shred?: boolean }).shred);
  });

  app.get('/v1/nodes', { schema: { tags: ['system'], description: 'The deployment\'s nodes: state (up, stopped, lost), capacity, sandboxes running, last heartbeat. Admin keys only.' } }, async (req) => {
    if (!req.principal.admin) throw new SpaceError('FORBIDDEN', 'Listing nodes needs an admin key');
    return { nodes: deps.nodes ? await deps.nodes() : [] };
  });

  for (const [verb, on] of [['drain', true], ['undrain', false]] as const) {
    app.post(`/v1/nodes/:name/${verb}`, { schema: { tags: ['system'], params: S.NodeParams, description: on ? 'Drains a node: no new sandbox is placed there, and every session it runs is moved to the node with most room (hibernated there, woken if it ran). With `Accept: application/x-ndjson` the answer streams each session as it moves (DrainEvent lines), then the result. Admin keys only.' : 'Ends a drain: the node takes new sandboxes again. Admin keys only.' } }, async (req, reply) => {
      if (!req.principal.admin) throw new SpaceError('FORBIDDEN', `${on ? 'Draining' : 'Undraining'} a node needs an admin key`);
      const cluster = requireCluster();
      if (req.params.name === cluster.self) {
        // A drain takes a move per session: asked for NDJSON, it says each one as it goes.
        if (on && String(req.headers.accept ?? '').includes('application/x-ndjson')) return eventStream(reply, (emit) => cluster.drain(true, emit));
        return cluster.drain(on);
      }
      const node = (await cluster.nodes()).find((n) => n.name === req.params.name);
      if (!node) throw new SpaceError('BAD_REQUEST', `No node ${JSON.stringify(req.params.name)} in this deployment; \`space nodes\` lists them`);
      if (node.state !== 'up' || req.headers['x-space-forwarded-by']) throw new SpaceError('NODE_UNAVAILABLE', `Node ${node.name} is ${node.state} (last heartbeat ${node.heartbeatAt}); it must be up to move its sessions off`);
      await relayToNode(req, reply, node, { self: cluster.self });
      return reply;
    });
  }

  app.post('/v1/admin/gc', { schema: { tags: ['system'], description: 'Deletes snapshot chunks no snapshot references (also runs every 10 minutes; in a cluster every node\'s snapshot writes wait while it runs: docs/cluster.md). Admin keys only.' } }, async (req) => {
    if (!req.principal.admin) throw new SpaceError('FORBIDDEN', 'Garbage collection needs an admin key');
    return { deletedChunks: deps.gc ? await deps.gc() : 0 };
  });

  // ---- templates
  const tpl = svc.templates;
  const view = (t: Template) => ({
    name: t.name,
    builtin: t.tenantId === '',
    state: t.state === 'building' ? ('building' as const) : tpl.rootfsReady(t) ? ('ready' as const) : ('missing' as const),
    source: t.source,
    ...(t.start ? { start: t.start } : {}),
    env: t.env,
    pool: svc.pool.status(t),
    ...(t.image ? { image: { sizeBytes: t.image.sizeBytes, captureMs: t.image.captureMs, createdAt: t.image.createdAt } } : {}),
    ...(t.rootfsBytes !== undefined ? { rootfsBytes: t.rootfsBytes } : {}),
    createdAt: t.createdAt,
    ...(t.readyAt ? { readyAt: t.readyAt } : {}),
  });
  const tOut = { response: { 200: S.TemplateSchema, ...err } };
  app.get('/v1/templates', { schema: { tags: ['templates'], response: { 200: Type.Object({ templates: Type.Array(S.TemplateSchema) }) } } }, async (req) => ({ templates: (await tpl.list(req.principal.tenantId)).map(view) }));
  app.get('/v1/templates/:name', { schema: { tags: ['templates'], params: S.TemplateParams, ...tOut } }, async (req) => view(await tpl.resolve(req.principal.tenantId, req.params.name)));
  app.post('/v1/templates', { schema: { tags: ['templates'], body: S.BuildTemplateBody, description: 'Builds a template. Streams NDJSON: `progress` events, then `done` with the template or `error`.' } }, async (req, reply) =>
    progressStream(reply, (progress, signal) => tpl.build(req.principal.tenantId, req.body, progress, signal).then(view)),
  );
  app.post('/v1/templates/:name/build', { schema: { tags: ['templates'], params: S.TemplateParams, description: 'Makes a template ready (builds a built-in on first use, retakes a stale snapshot). Streams NDJSON like POST /v1/templates.' } }, async (req, reply) =>
    progressStream(reply, (progress) => tpl.prepare(req.principal.tenantId, req.params.name, progress).then(view)),
  );
  app.delete('/v1/templates/:name', { schema: { tags: ['templates'], params: S.TemplateParams } }, async (req, reply) => {
    await tpl.remove(req.principal.tenantId, req.params.name);
    return reply.code(204).send();
  });
  app.put('/v1/templates/:name/pool', { schema: { tags: ['templates'], params: S.TemplateParams, body: S.PoolBody, ...tOut } }, async (req) => view(await tpl.setPool(req.principal.tenantId, req.params.name, req.body.size, req.principal.admin)));
  app.post('/v1/template-uploads', { schema: { tags: ['templates'], description: 'Uploads an image tarball (application/octet-stream) for a template build; kept for an hour.', response: { 201: S.UploadSchema, ...err } }, bodyLimit: deps.maxUploadBytes }, async (req, reply) => {
    const body = req.body as Readable | undefined;
    if (!body || !(body instanceof Readable)) throw new SpaceError('BAD_REQUEST', 'Send the tarball as the request body with Content-Type: application/octet-stream');
    return reply.code(201).send(await tpl.saveUpload(req.principal.tenantId, body));
  });
}

/**
 * Runs a long operation and streams the events it emits as NDJSON, then `{"type":"done","result"}`
 * or `{"type":"error","code","message"}` (with `step` when `errorStep` says which). The operation
 * goes on if the client goes away (a drain: the node is drained either way), unless
 * `abortOnClose`: then its signal is aborted.
 */
function eventStream(reply: FastifyReply, run: (emit: (ev: object) => void, signal: AbortSignal) => Promise<unknown>, opts: { abortOnClose?: boolean; errorStep?: () => string } = {}): FastifyReply {
  const ac = new AbortController();
  const lines = new AsyncQueue<string>();
  const push = (line: object) => lines.push(JSON.stringify(line) + '\n');
  let finished = false;
  void run(push, ac.signal)
    .then(
      (result) => push({ type: 'done', result }),
      (e: unknown) => {
        const se = toSpaceError(e);
        push({ type: 'error', code: se.code, message: se.message, ...(opts.errorStep ? { step: (se.details?.step as string | undefined) ?? opts.errorStep() } : {}), ...(se.hint ? { hint: se.hint } : {}) });
      },
    )
    .finally(() => {
      finished = true;
      lines.close();
    });
  if (opts.abortOnClose) {
    reply.raw.on('close', () => {
      if (!finished) ac.abort(new SpaceError('BAD_REQUEST', 'the client went away'));
    });
  }
  return reply.code(200).header('content-type', 'application/x-ndjson').header('cache-control', 'no-store').send(Readable.from(lines, { objectMode: false }));
}

/**
 * Runs a long operation and streams its progress as NDJSON: `{"type":"progress","percent","step"}`
 * lines, then `{"type":"done","result"}` or `{"type":"error","code","message","step"}`. The
 * operation is aborted if the client goes away.
 */
function progressStream(reply: FastifyReply, run: (progress: Progress, signal: AbortSignal) => Promise<unknown>): FastifyReply {
  let lastStep = '';
  const stream = (emit: (ev: object) => void, signal: AbortSignal) =>
    run((percent, step) => {
      lastStep = step;
      emit({ type: 'progress', percent, step });
    }, signal);
  return eventStream(reply, stream, { abortOnClose: true, errorStep: () => lastStep });
}
