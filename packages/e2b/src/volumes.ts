/**
 * E2B's volumes on SPACE's: the control routes (`/volumes`, the team's API key) and the volume
 * content API (`/volumecontent/{volumeID}/…`, the volume's own token) that the `e2b` SDK's
 * `Volume` class calls through `E2B_VOLUME_API_URL`. A volume is mounted by one sandbox
 * read-write at a time (SPACE's rule; E2B's network volumes have none): a second is refused.
 */
import type { Readable } from 'node:stream';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { VolumeEntry } from '@space/api';
import { SpaceError, type ApiKeys, type SandboxService, type VolumeFileMeta, type VolumeFiles, type Volumes } from '@space/core';
import type { AccessTokens } from './access.js';

/** What the volume routes need. */
export interface VolumeRouteDeps {
  service: SandboxService;
  keys: ApiKeys;
  tokens: AccessTokens;
}

type Q = Record<string, string | undefined>;

/** E2B's entry: its times as ISO strings, `unknown` for what is neither file, directory nor link. */
function e2bEntry(e: VolumeEntry) {
  return { name: e.name, path: e.path, type: e.type === 'other' ? 'unknown' : e.type, size: e.size, mode: e.mode, uid: e.uid, gid: e.gid, atime: e.atime, mtime: e.mtime, ctime: e.ctime, ...(e.target !== undefined ? { target: e.target } : {}) };
}

/** A number from the query (uid, gid, mode), or undefined. */
function int(q: Q, k: string): number | undefined {
  if (q[k] === undefined || q[k] === '') return undefined;
  const n = Number(q[k]);
  if (!Number.isInteger(n) || n < 0) throw new SpaceError('BAD_REQUEST', `${k} must be a non-negative integer`);
  return n;
}

/** Registers E2B's volume routes on `app`. */
export function registerVolumes(app: FastifyInstance, deps: VolumeRouteDeps): void {
  const volumes = (): Volumes => {
    if (!deps.service.volumes?.available) throw new SpaceError('VOLUMES_UNAVAILABLE');
    return deps.service.volumes;
  };
  const tenantOf = async (req: FastifyRequest): Promise<string> => {
    const key = req.headers['x-api-key'];
    return (await deps.keys.verify(typeof key === 'string' ? key : undefined)).tenantId;
  };
  const info = (tenantId: string, v: { id: string; name: string }) => ({ volumeID: v.id, name: v.name, token: deps.tokens.volume(tenantId, v.id) });

  app.post('/volumes', async (req, reply) => {
    const tenantId = await tenantOf(req);
    const name = (req.body as { name?: unknown } | undefined)?.name;
    return reply.code(201).send(info(tenantId, await volumes().create(tenantId, { name })));
  });
  app.get('/volumes', async (req) => {
    const tenantId = await tenantOf(req);
    return (await volumes().list(tenantId)).map((v) => ({ volumeID: v.id, name: v.name }));
  });
  app.get<{ Params: { id: string } }>('/volumes/:id', async (req) => {
    const tenantId = await tenantOf(req);
    return info(tenantId, await volumes().get(tenantId, req.params.id));
  });
  app.delete<{ Params: { id: string } }>('/volumes/:id', async (req, reply) => {
    const tenantId = await tenantOf(req);
    await volumes().remove(tenantId, req.params.id);
    return reply.code(204).send();
  });

  // ---- content: the volume's token, not an API key
  /** Runs `fn` on the volume's files (written when `write`), for the holder of its token. */
  const withFiles = <T>(req: FastifyRequest<{ Params: { id: string } }>, write: boolean, fn: (f: VolumeFiles) => Promise<T>): Promise<T> =>
    volumes().withFiles(deps.tokens.verifyVolume(req.params.id, req.headers.authorization), req.params.id, write, fn);
  /** Owner and mode from the query (uid, gid, mode), each checked once. */
  const meta = (q: Q): VolumeFileMeta => {
    const out: VolumeFileMeta = {};
    for (const k of ['uid', 'gid', 'mode'] as const) {
      const n = int(q, k);
      if (n !== undefined) out[k] = n;
    }
    return out;
  };
  app.get<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/dir', async (req) => withFiles(req, false, async (f) => (await f.list(req.query.path ?? '/', int(req.query, 'depth') ?? 1)).map(e2bEntry)));
  app.post<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/dir', async (req, reply) =>
    reply.code(201).send(await withFiles(req, true, async (f) => e2bEntry(await f.mkdir(req.query.path ?? '', { ...meta(req.query), parents: req.query.force === 'true' })))),
  );
  app.get<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/path', async (req) => withFiles(req, false, async (f) => e2bEntry(await f.stat(req.query.path ?? '/'))));
  app.patch<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/path', async (req) => {
    const b = (req.body ?? {}) as Q;
    return withFiles(req, true, async (f) => e2bEntry(await f.setMeta(req.query.path ?? '', meta(Object.fromEntries(Object.entries(b).map(([k, v]) => [k, v === undefined || v === null ? undefined : String(v)]))))));
  });
  app.delete<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/path', async (req, reply) => {
    await withFiles(req, true, (f) => f.remove(req.query.path ?? ''));
    return reply.code(204).send();
  });
  app.get<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/file', async (req, reply) => {
    const tenantId = deps.tokens.verifyVolume(req.params.id, req.headers.authorization);
    const { stream, size } = await (await volumes().files(tenantId, req.params.id, false)).download(req.query.path ?? '');
    return reply.header('content-type', 'application/octet-stream').header('content-length', String(size)).send(stream);
  });
  app.put<{ Params: { id: string }; Querystring: Q }>('/volumecontent/:id/file', async (req) => {
    const body = req.body as Readable | undefined;
    if (!body || typeof (body as Readable).pipe !== 'function') throw new SpaceError('BAD_REQUEST', 'Send the file as the body with Content-Type: application/octet-stream');
    // Like E2B's, a write replaces a file that exists.
    return withFiles(req, true, async (f) => e2bEntry(await f.write(req.query.path ?? '', body, meta(req.query))));
  });
}
