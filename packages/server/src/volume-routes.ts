/**
 * Routes of named volumes (`/v1/volumes`): create, list, remove, point-in-time snapshots, and
 * files moved in and out without a sandbox (what `space volume cp` calls).
 */
import { Readable } from 'node:stream';
import type { FastifyInstance } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { SpaceError, type SandboxService, type Volumes } from '@space/core';
import * as S from './schemas.js';

type App = FastifyInstance<any, any, any, any, TypeBoxTypeProvider>;

/** The node's volumes, or `VOLUMES_UNAVAILABLE`. */
function need(svc: SandboxService): Volumes {
  if (!svc.volumes?.available) throw new SpaceError('VOLUMES_UNAVAILABLE');
  return svc.volumes;
}

/** Registers the volume routes. */
export function registerVolumeRoutes(app: App, svc: SandboxService, maxUploadBytes: number): void {
  const err = { 400: S.ErrorSchema, 401: S.ErrorSchema, 404: S.ErrorSchema, 409: S.ErrorSchema };
  const tags = ['volumes'];
  app.post('/v1/volumes', { schema: { tags, body: S.CreateVolumeBody, description: 'Makes an empty volume, its files encrypted at rest under the tenant\'s key.', response: { 201: S.VolumeSchema, ...err } } }, async (req, reply) =>
    reply.code(201).send(await need(svc).create(req.principal.tenantId, req.body)),
  );
  app.get('/v1/volumes', { schema: { tags, response: { 200: Type.Object({ volumes: Type.Array(S.VolumeSchema) }), ...err } } }, async (req) => ({ volumes: await need(svc).list(req.principal.tenantId) }));
  app.get('/v1/volumes/:name', { schema: { tags, params: S.VolumeParams, response: { 200: S.VolumeSchema, ...err } } }, async (req) => {
    const v = need(svc);
    const vol = await v.get(req.principal.tenantId, req.params.name);
    const usedBytes = await v.usedBytes(req.principal.tenantId, req.params.name);
    return { ...vol, ...(usedBytes !== undefined ? { usedBytes } : {}) };
  });
  app.delete('/v1/volumes/:name', { schema: { tags, params: S.VolumeParams, description: 'Deletes a volume with its snapshots; refused (VOLUME_IN_USE) while a sandbox holds it.' } }, async (req, reply) => {
    await need(svc).remove(req.principal.tenantId, req.params.name);
    return reply.code(204).send();
  });
  app.post('/v1/volumes/:name/snapshots', { schema: { tags, params: S.VolumeParams, description: 'Copies the volume as it is now (its writers pause for the copy).', response: { 201: S.VolumeSnapshotSchema, ...err } } }, async (req, reply) =>
    reply.code(201).send(await need(svc).snapshot(req.principal.tenantId, req.params.name)),
  );
  app.get('/v1/volumes/:name/snapshots', { schema: { tags, params: S.VolumeParams, response: { 200: Type.Object({ snapshots: Type.Array(S.VolumeSnapshotSchema) }), ...err } } }, async (req) => ({
    snapshots: await need(svc).snapshots(req.principal.tenantId, req.params.name),
  }));
  app.post('/v1/volumes/:name/restore', { schema: { tags, params: S.VolumeParams, body: S.VolumeRestoreBody, description: 'Puts a snapshot\'s contents back; refused (VOLUME_IN_USE) while a sandbox holds the volume.', response: { 200: S.VolumeSchema, ...err } } }, async (req) =>
    need(svc).restore(req.principal.tenantId, req.params.name, req.body.snapshotId),
  );
  app.delete('/v1/volumes/:name/snapshots/:snapshotId', { schema: { tags, params: S.VolumeSnapshotParams } }, async (req, reply) => {
    await need(svc).removeSnapshot(req.principal.tenantId, req.params.name, req.params.snapshotId);
    return reply.code(204).send();
  });

  // ---- files, without a sandbox: reading needs no sandbox writing the volume, writing needs it free
  app.get('/v1/volumes/:name/files', { schema: { tags, params: S.VolumeParams, querystring: S.VolumeListQuery, response: { 200: Type.Object({ entries: Type.Array(S.VolumeEntrySchema) }), ...err } } }, async (req) => {
    return { entries: await need(svc).withFiles(req.principal.tenantId, req.params.name, false, (f) => f.list(req.query.path ?? '/', req.query.depth ?? 1)) };
  });
  app.get('/v1/volumes/:name/files/stat', { schema: { tags, params: S.VolumeParams, querystring: S.VolumePathQuery, response: { 200: S.VolumeEntrySchema, ...err } } }, async (req) => {
    return need(svc).withFiles(req.principal.tenantId, req.params.name, false, (f) => f.stat(req.query.path));
  });
  app.get('/v1/volumes/:name/files/content', { schema: { tags, params: S.VolumeParams, querystring: S.VolumePathQuery } }, async (req, reply) => {
    const { stream, size } = await (await need(svc).files(req.principal.tenantId, req.params.name, false)).download(req.query.path);
    return reply.header('content-type', 'application/octet-stream').header('content-length', String(size)).send(stream);
  });
  app.put('/v1/volumes/:name/files/content', { schema: { tags, params: S.VolumeParams, querystring: S.VolumePathQuery, response: { 200: S.VolumeEntrySchema, ...err } }, bodyLimit: maxUploadBytes }, async (req) => {
    const body = req.body as Readable | undefined;
    if (!body || !(body instanceof Readable)) throw new SpaceError('BAD_REQUEST', 'Send the file as the request body with Content-Type: application/octet-stream');
    return need(svc).withFiles(req.principal.tenantId, req.params.name, true, (f) => f.write(req.query.path, body));
  });
  app.post('/v1/volumes/:name/files/mkdir', { schema: { tags, params: S.VolumeParams, body: S.VolumeMkdirBody, response: { 200: S.VolumeEntrySchema, ...err } } }, async (req) => {
    return need(svc).withFiles(req.principal.tenantId, req.params.name, true, (f) => f.mkdir(req.body.path, { parents: req.body.parents ?? false }));
  });
  app.delete('/v1/volumes/:name/files', { schema: { tags, params: S.VolumeParams, querystring: S.VolumePathQuery } }, async (req, reply) => {
    await need(svc).withFiles(req.principal.tenantId, req.params.name, true, (f) => f.remove(req.query.path));
    return reply.code(204).send();
  });
}
