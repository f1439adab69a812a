/**
 * The HTTP application: Fastify with JSON-schema validation (TypeBox), OpenAPI generated from
 * the route schemas and served at /openapi.json, bearer-key authentication, and one error
 * mapping from the core registry.
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from 'fastify';
import swagger from '@fastify/swagger';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { ApiKeys, SpaceError, type CreateSandboxOpts, type KeyService, type Principal, type SandboxService, type SecretService } from '@space/core';
import type { SandboxDriver } from '@space/core';
import type { AppDeps } from './deps.js';
import { ConsoleSessions, csrfRefused, CSRF_HEADER, sessionCookieOf } from './console-session.js';
import { isConsolePath, registerConsole } from './console-routes.js';
import { registerForwarding } from './forward.js';
import { pickWarmNode } from './node.js';
import { registerRoutes } from './routes.js';
import { registerVolumeRoutes } from './volume-routes.js';

export type { AppDeps } from './deps.js';
import { VERSION } from './version.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal: Principal;
  }
}


const PUBLIC = new Set(['/v1/health', '/v1/version', '/openapi.json', '/favicon.ico']);
/** Methods that change nothing: a console session needs no CSRF token for them. */
const SAFE = new Set(['GET', 'HEAD', 'OPTIONS']);

function bearer(req: FastifyRequest): string | undefined {
  const h = req.headers.authorization;
  if (h?.startsWith('Bearer ')) return h.slice(7).trim();
  const k = req.headers['x-api-key'];
  return typeof k === 'string' ? k : undefined;
}

/** Maps any error to the registry's JSON shape and status. */
export function sendError(reply: FastifyReply, err: unknown): FastifyReply {
  let e: SpaceError;
  const fe = err as { code?: string; statusCode?: number; validation?: unknown; message?: string };
  if (err instanceof SpaceError) e = err;
  else if (fe?.validation) e = new SpaceError('BAD_REQUEST', `Invalid request: ${fe.message}`, { cause: err });
  else if (fe?.code === 'FST_ERR_CTP_BODY_TOO_LARGE') e = new SpaceError('PAYLOAD_TOO_LARGE', undefined, { cause: err });
  else if (fe?.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') e = new SpaceError('BAD_REQUEST', `Unsupported Content-Type: ${fe.message}`, { cause: err });
  else if (fe?.code === 'FST_ERR_CTP_EMPTY_JSON_BODY' || (fe?.statusCode === 400 && err instanceof SyntaxError) || fe?.code === 'FST_ERR_CTP_INVALID_JSON_BODY') {
    e = new SpaceError('INVALID_JSON', `The request body is not valid JSON: ${fe.message}`, { cause: err });
  } else if (fe?.statusCode && fe.statusCode >= 400 && fe.statusCode < 500) e = new SpaceError('BAD_REQUEST', fe.message, { cause: err });
  else e = new SpaceError('INTERNAL', 'Internal error', { cause: err });
  if (e.code === 'INTERNAL') reply.log.error({ err }, 'internal error');
  // A request body we did not read to the end leaves the connection unusable: close it.
  if (!reply.request.raw.complete) reply.header('connection', 'close');
  if (e.code === 'CAPACITY_EXHAUSTED') reply.header('retry-after', String(e.details?.retryAfterS ?? 5));
  return reply.code(e.status).type('application/json').send(e.toJSON());
}

/**
 * Builds the Fastify app (not listening).
 *
 * @example
 * const app = await buildApp({ service, keys, encryptionKeys, sessionSecret: randomBytes(32), drivers: [driver], maxUploadBytes: 1 << 30, logger: false });
 * await app.listen({ host: '127.0.0.1', port: 7070 });
 */
export async function buildApp(deps: AppDeps): Promise<FastifyInstance> {
  const app = Fastify({
    ...(deps.logger ? { loggerInstance: deps.logger } : { logger: false }),
    bodyLimit: 1024 * 1024,
    return503OnClosing: true,
    // One access-log line per request (onResponse below) instead of two.
    logController: new LogController({ disableRequestLogging: true }),
    ajv: { customOptions: { removeAdditional: false, coerceTypes: 'array', useDefaults: true } },
  }).withTypeProvider<TypeBoxTypeProvider>();

  await app.register(swagger, {
    openapi: {
      info: { title: 'SPACE API', version: VERSION, description: 'Stateful sandboxes for AI agents. Authenticate with `Authorization: Bearer <API key>`. Errors are `{ error: { code, message, hint? } }` with stable codes.' },
      components: { securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } } },
      security: [{ bearer: [] }],
    },
  });

  // Raw bodies (file uploads) stream through untouched; their size is enforced while streaming.
  app.addContentTypeParser('application/octet-stream', { bodyLimit: deps.maxUploadBytes }, (_req, payload, done) => done(null, payload));

  app.setErrorHandler((err, _req, reply) => sendError(reply, err));
  app.addHook('onResponse', async (req, reply) => {
    req.log.info({ method: req.method, url: req.url.split('?')[0], status: reply.statusCode, ms: Math.round(reply.elapsedTime * 100) / 100, tenant: req.principal?.tenantId }, 'request');
  });
  app.setNotFoundHandler((req, reply) => sendError(reply, new SpaceError('BAD_REQUEST', `No route ${req.method} ${req.url.split('?')[0]}; see GET /openapi.json`)));

  // A bearer key, or else the console's session cookie (whose requests that change anything
  // must carry its CSRF token): console-session.ts.
  const sessions = new ConsoleSessions(deps.sessionSecret, deps.keys);
  app.addHook('onRequest', async (req) => {
    const p = req.url.split('?')[0]!;
    if (PUBLIC.has(p) || (p === '/v1/session' && req.method === 'POST') || (isConsolePath(p) && req.method === 'GET')) return;
    const key = bearer(req);
    const cookie = key === undefined ? sessionCookieOf(req.headers.cookie) : undefined;
    if (cookie === undefined) {
      req.principal = await deps.keys.verify(key);
      return;
    }
    const s = await sessions.session(cookie);
    if (!s) throw new SpaceError('UNAUTHENTICATED', 'The console session ended (it expired, or its API key was revoked): sign in again');
    const token = req.headers[CSRF_HEADER];
    if (!SAFE.has(req.method) && !sessions.csrfValid(cookie, typeof token === 'string' ? token : undefined)) throw csrfRefused();
    req.principal = ConsoleSessions.principal(s);
  });
  // After authentication: only a tenant's requests for its own sandboxes are forwarded.
  if (deps.cluster) {
    const svc = deps.service;
    const cluster = deps.cluster;
    registerForwarding(app, {
      self: deps.cluster.self,
      find: (tenantId, id) => svc.find(tenantId, id).catch(() => undefined),
      owns: (sb) => svc.owns(sb),
      nodes: deps.cluster.nodes,
      placeTemplate: (tenantId, name) => svc.templates.placement(tenantId, name),
      ...(svc.volumes ? { volumeNode: (tenantId: string, name: string) => svc.volumes!.nodeOf(tenantId, name), placeVolumes: (tenantId: string, mounts: unknown) => svc.volumes!.nodeOfMounts(tenantId, mounts) } : {}),
      placeWarm: async (tenantId, body) => {
        const key = await svc.poolShortHere(tenantId, body as CreateSandboxOpts);
        return key ? pickWarmNode(await cluster.nodes(), cluster.self, key, deps.drivers[0]!.name) : undefined;
      },
    });
  }

  app.get('/openapi.json', { schema: { hide: true } }, async () => app.swagger());
  await registerConsole(app, { service: deps.service, sessions, ...(deps.secrets ? { secrets: deps.secrets } : {}), ...(deps.cluster ? { cluster: deps.cluster } : {}) });
  await registerRoutes(app, deps);
  registerVolumeRoutes(app, deps.service, deps.maxUploadBytes);
  return app;
}
