/**
 * The E2B-compatible listener: one address serves both what `E2B_API_URL` and what
 * `E2B_SANDBOX_URL` point at (they share no path: in-sandbox requests carry
 * `E2b-Sandbox-Id`). A listener of its own, because the SDK builds some in-sandbox URLs from
 * the origin alone, so the API cannot live under a path prefix of SPACE's own.
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from 'fastify';
import multipart from '@fastify/multipart';
import { fastifyConnectPlugin } from '@connectrpc/connect-fastify';
import { SpaceError, fileMetadataFromHeaders, type ApiKeys, type SandboxService } from '@space/core';
import { AccessTokens, SignedFileOwners, type SignedFileQuery } from './access.js';
import { registerControl } from './control.js';
import { registerVolumes } from './volumes.js';
import { envdCaller, envdRoutes, readFile, writeFile } from './envd.js';

/** Deps of {@link buildE2bApp}. */
export interface E2bAppDeps {
  service: SandboxService;
  keys: ApiKeys;
  tokens: AccessTokens;
  /** Largest file upload, bytes. */
  maxUploadBytes: number;
  logger: false | FastifyBaseLogger;
  /** What E2B's `allowInternetAccess: true` does (see {@link ControlDeps.internet}). @default "allow" */
  internet?: 'allow' | 'deny';
  /** The ingress domain, the `domain` of every sandbox (see {@link ControlDeps.ingressDomain}); absent: ingress off. */
  ingressDomain?: string;
  /** Whether ports may be public (see {@link ControlDeps.publicTraffic}). @default "allow" */
  publicTraffic?: 'allow' | 'deny';
  /**
   * Called on the app before any route or hook of its own: the daemon registers forwarding
   * there (requests for sandboxes another node of the cluster runs go to that node).
   */
  beforeRoutes?: (app: FastifyInstance) => void;
}

/** E2B's error shape: `{ code: <HTTP status>, message }`. */
function sendE2bError(reply: FastifyReply, err: unknown): FastifyReply {
  const fe = err as { statusCode?: number; message?: string };
  let status: number;
  let message: string;
  if (err instanceof SpaceError) {
    status = err.status;
    // Signed URLs fail with envd's own messages, which clients match on.
    message = (err as SpaceError & { e2bExact?: boolean }).e2bExact ? err.message : `${err.code}: ${err.message}`;
  } else if (fe?.statusCode && fe.statusCode >= 400 && fe.statusCode < 500) {
    status = fe.statusCode;
    message = fe.message ?? 'bad request';
  } else {
    status = 500;
    message = 'internal error; see the daemon log';
    reply.log.error({ err }, 'e2b api error');
  }
  if (!reply.request.raw.complete) reply.header('connection', 'close');
  if (status === 429) reply.header('retry-after', String((err as SpaceError).details?.retryAfterS ?? 5));
  return reply.code(status).type('application/json').send({ code: status, message });
}

/**
 * Builds the E2B-compatible app (not listening).
 *
 * @example
 * const app = await buildE2bApp({ service, keys, tokens: new AccessTokens(secret), maxUploadBytes: 1 << 30, logger: false });
 * await app.listen({ host: '127.0.0.1', port: 7071 });
 */
export async function buildE2bApp(deps: E2bAppDeps): Promise<FastifyInstance> {
  const app = Fastify({ ...(deps.logger ? { loggerInstance: deps.logger } : { logger: false }), bodyLimit: 1024 * 1024, return503OnClosing: true });
  app.setErrorHandler((err, _req, reply) => sendE2bError(reply, err));
  // A signed file URL (downloadUrl/uploadUrl, opened anywhere with no headers) names no
  // sandbox: it is matched first, and then named in E2b-Sandbox-Id like the SDK's own calls —
  // so a node that does not run it forwards it (beforeRoutes), and the node that does checks
  // the signature against that one sandbox. A bad signature gets envd's exact 401 body.
  const owners = new SignedFileOwners(deps.tokens, { all: () => deps.service.unendedSandboxes(), one: (id) => deps.service.unendedSandbox(id) });
  const signed = new WeakMap<object, { tenantId: string; sandboxId: string }>();
  app.addHook('onRequest', async (req) => {
    const q = req.query as SignedFileQuery;
    if (req.routeOptions.url !== '/files' || req.headers['x-access-token'] || q.signature === undefined) return;
    const hint = req.headers['e2b-sandbox-id'];
    try {
      const c = await owners.match(q, req.method === 'GET' ? 'read' : 'write', typeof hint === 'string' ? hint : undefined);
      signed.set(req, c);
      req.headers['e2b-sandbox-id'] = c.sandboxId;
    } catch (err) {
      throw (err as SpaceError).code === 'UNAUTHENTICATED' ? Object.assign(err as Error, { e2bExact: true }) : err;
    }
  });
  deps.beforeRoutes?.(app);
  app.setNotFoundHandler((req, reply) => reply.code(404).send({ code: 404, message: `No route ${req.method} ${req.url.split('?')[0]} in SPACE's E2B-compatible API` }));
  app.addContentTypeParser('application/octet-stream', { bodyLimit: deps.maxUploadBytes }, (_req, payload, done) => done(null, payload));
  // preservePath: the SDK's files.write([{path, data}, ...]) names each part by its full path.
  await app.register(multipart, { preservePath: true, limits: { fileSize: deps.maxUploadBytes, files: 1000 } });

  registerControl(app, deps);
  registerVolumes(app, deps);

  // ---- envd over plain HTTP
  const caller = (headers: Record<string, string | string[] | undefined>) => envdCaller(deps.tokens, { get: (n) => (typeof headers[n] === 'string' ? (headers[n] as string) : null) });
  app.get('/health', async (req, reply) => {
    const c = caller(req.headers);
    const sb = await deps.service.get(c.tenantId, c.sandboxId);
    // 502 is how E2B says "not running" (the SDK's isRunning() reads it as false).
    return reply.code(sb.state === 'running' ? 204 : 502).send(sb.state === 'running' ? undefined : { code: 502, message: `sandbox ${sb.id} is ${sb.state}` });
  });
  /** Who calls /files: the SDK's headers, or a signature in the query (matched on arrival, above). */
  const fileCaller = (req: { headers: Record<string, string | string[] | undefined>; query: SignedFileQuery }) => {
    const c = signed.get(req);
    return c ? { ...c, user: req.query.username || undefined } : caller(req.headers);
  };
  app.get<{ Querystring: SignedFileQuery }>('/files', async (req, reply) => {
    const c = fileCaller(req);
    if (!req.query.path) return reply.code(400).send({ code: 400, message: 'path is required' });
    const stream = await readFile(deps.service, { ...c, user: req.query.username || c.user }, req.query.path);
    return reply.header('content-type', 'application/octet-stream').send(stream);
  });
  app.post<{ Querystring: SignedFileQuery }>('/files', async (req) => {
    const c = { ...fileCaller(req), ...(req.query.username ? { user: req.query.username } : {}) };
    const metadata = fileMetadataFromHeaders(req.headers);
    if (req.isMultipart()) {
      const out = [];
      for await (const part of req.files()) {
        const target = req.query.path ?? part.filename;
        if (!target) throw new SpaceError('BAD_REQUEST', 'Each file needs a path (the path query or the part\'s filename)');
        out.push(await writeFile(deps.service, c, target, part.file, metadata));
      }
      return out;
    }
    if (!req.query.path) throw new SpaceError('BAD_REQUEST', 'path is required');
    if (req.headers['content-encoding'] && req.headers['content-encoding'] !== 'identity') {
      const { createGunzip } = await import('node:zlib');
      if (req.headers['content-encoding'] !== 'gzip') throw new SpaceError('BAD_REQUEST', `Content-Encoding ${req.headers['content-encoding']} is not supported (gzip is)`);
      return [await writeFile(deps.service, c, req.query.path, (req.body as NodeJS.ReadableStream).pipe(createGunzip()), metadata)];
    }
    return [await writeFile(deps.service, c, req.query.path, req.body as AsyncIterable<Buffer>, metadata)];
  });

  // ---- envd Connect RPC (process.Process, filesystem.Filesystem)
  await app.register(fastifyConnectPlugin, { routes: envdRoutes(deps) });
  return app;
}
