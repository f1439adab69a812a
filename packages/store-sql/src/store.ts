/**
 * The {@link MetadataStore}'s queries, written once with Kysely's typed query builder and run
 * on SQLite (`@space/store-sqlite`) and PostgreSQL (`@space/store-postgres`). Each of those makes
 * its tables (its own migrations, same tables and columns) and says where its SQL differs
 * ({@link SqlFlavour}).
 */
import { sql, type Generated, type Kysely, type RawBuilder } from 'kysely';
import type { Intent, ApiKeyRecord, NodeRecord, PortExposure, DataKeyRecord, EgressLogEntry, EgressLogPage, IngressLogEntry, IngressLogPage, MetadataStore, SecretRecord, TenantCaRecord, VolumeRecord, VolumeSnapshotRecord, Sandbox, SandboxEvent, SandboxPage, SandboxQuery, SandboxState, Snapshot, Template, TenantKey } from '@space/core';
import { SpaceError, checkExpectation, type SandboxExpectation } from '@space/core';

export interface SandboxTable {
  seq: Generated<number>;
  id: string;
  tenant_id: string;
  state: string;
  created_at: string;
  /** The owning node (`Sandbox.node`), for indexed per-node queries. */
  node: string | null;
  /** The whole sandbox as JSON; indexed columns above are copies for queries. */
  doc: string;
}
export interface SandboxLabelTable {
  sandbox_id: string;
  key: string;
  value: string;
}
export interface ApiKeyTable {
  id: string;
  tenant_id: string;
  name: string;
  hash: string;
  prefix: string;
  admin: number;
  created_at: string;
  revoked_at: string | null;
}
export interface SnapshotTable {
  id: string;
  sandbox_id: string;
  created_at: string;
  doc: string;
}
export interface EventTable {
  seq: Generated<number>;
  sandbox_id: string;
  at: string;
  type: string;
  message: string;
}
export interface TemplateTable {
  tenant_id: string;
  name: string;
  doc: string;
}
export interface TenantKeyTable {
  id: string;
  tenant_id: string;
  created_at: string;
  doc: string;
}
export interface DataKeyTable {
  object_key: string;
  tenant_id: string;
  key_id: string;
  wrapped: Buffer;
}
export interface SecretTable {
  tenant_id: string;
  name: string;
  doc: string;
  sealed: Buffer;
}
/** The audit logs' tables. */
type LogTable = 'egress_log' | 'ingress_log';

/** The shape of both audit logs (egress_log, ingress_log). */
export interface EgressLogTable {
  seq: Generated<number>;
  sandbox_id: string;
  at: string;
  doc: string;
}
export interface TenantCaTable {
  tenant_id: string;
  cert_pem: string;
  sealed_key: Buffer;
  created_at: string;
}
export interface IntentTable {
  id: string;
  sandbox_id: string;
  started_at: string;
  doc: string;
}

export interface PortExposureTable {
  sandbox_id: string;
  port: number;
  doc: string;
}

export interface VolumeTable {
  id: string;
  tenant_id: string;
  name: string;
  doc: string;
}

export interface VolumeSnapshotTable {
  id: string;
  volume_id: string;
  created_at: string;
  doc: string;
}

/** The nodes of the deployment. */
export interface NodeTable {
  name: string;
  heartbeat_at: string;
  doc: string;
}

/** The deployment's own settings. */
export interface MetaTable {
  key: string;
  value: string;
}

/** The tables, as both databases hold them. */
export interface Schema {
  space_meta: MetaTable;
  nodes: NodeTable;
  volumes: VolumeTable;
  volume_snapshots: VolumeSnapshotTable;
  port_exposures: PortExposureTable;
  intents: IntentTable;
  secrets: SecretTable;
  egress_log: EgressLogTable;
  ingress_log: EgressLogTable;
  tenant_cas: TenantCaTable;
  tenant_keys: TenantKeyTable;
  data_keys: DataKeyTable;
  templates: TemplateTable;
  sandboxes: SandboxTable;
  sandbox_labels: SandboxLabelTable;
  api_keys: ApiKeyTable;
  snapshots: SnapshotTable;
  sandbox_events: EventTable;
}

function toKey(r: ApiKeyTable): ApiKeyRecord {
  return {
    id: r.id,
    tenantId: r.tenant_id,
    name: r.name,
    hash: r.hash,
    prefix: r.prefix,
    admin: r.admin === 1,
    createdAt: r.created_at,
    ...(r.revoked_at ? { revokedAt: r.revoked_at } : {}),
  };
}

/** Where the SQL of the two databases differs. */
export interface SqlFlavour {
  /** A text field of the JSON document in column `doc`, as an expression. */
  docField(field: string): RawBuilder<string>;
  /** Whether `err` is the database refusing a row that breaks a unique constraint. */
  isUniqueViolation(err: unknown): boolean;
  /**
   * Whether a read-modify-write must lock the row it read (`SELECT … FOR UPDATE`): yes where
   * several connections write at once (PostgreSQL's pool, several nodes); SQLite's one
   * connection runs transactions one at a time.
   */
  lockRows: boolean;
  /**
   * The document in column `doc` with `patch` (JSON text of its top-level fields) laid over it
   * and the fields in `remove` taken out, as an expression: where the database can merge JSON
   * itself, an update is one statement (`UPDATE … RETURNING`) instead of a transaction that
   * reads, locks and writes (four round trips on PostgreSQL). Absent: read-modify-write.
   */
  patchDoc?(patch: string, remove: string[]): RawBuilder<string>;
}

/**
 * The metadata store over a Kysely connection of either database; made by `SqliteStore.open`
 * or `PostgresStore.open`, not directly.
 *
 * @example
 * class MyStore extends SqlStore { constructor(db: Kysely<Schema>) { super(db, flavour); } }
 */
export class SqlStore implements MetadataStore {
  protected constructor(
    protected readonly db: Kysely<Schema>,
    private readonly flavour: SqlFlavour,
  ) {}

  async insertSandbox(sb: Sandbox): Promise<void> {
    const row = { id: sb.id, tenant_id: sb.tenantId, state: sb.state, created_at: sb.createdAt, node: sb.node ?? null, doc: JSON.stringify(sb) };
    const labels = Object.entries(sb.metadata).map(([key, value]) => ({ sandbox_id: sb.id, key, value }));
    // One statement needs no transaction (two round trips fewer per create on PostgreSQL).
    if (!labels.length) return void (await this.db.insertInto('sandboxes').values(row).execute());
    await this.db.transaction().execute(async (tx) => {
      await tx.insertInto('sandboxes').values(row).execute();
      await tx.insertInto('sandbox_labels').values(labels).execute();
    });
  }

  async updateSandbox(id: string, patch: Partial<Omit<Sandbox, 'id' | 'tenantId'>>, expect?: SandboxExpectation): Promise<Sandbox> {
    if (this.flavour.patchDoc) return this.patchSandbox(id, patch, expect, this.flavour.patchDoc);
    return this.db.transaction().execute(async (tx) => {
      const row = await tx.selectFrom('sandboxes').select('doc').where('id', '=', id).$if(this.flavour.lockRows, (q) => q.forUpdate()).executeTakeFirst();
      if (!row) throw new SpaceError('SANDBOX_NOT_FOUND', `No sandbox ${id}`);
      const cur = JSON.parse(row.doc) as Sandbox;
      checkExpectation(cur, expect);
      const next: Sandbox = { ...cur, ...patch };
      await tx.updateTable('sandboxes').set({ state: next.state, node: next.node ?? null, doc: JSON.stringify(next) }).where('id', '=', id).execute();
      return next;
    });
  }

  /**
   * {@link updateSandbox} in one statement: the merge, the expectation (as conditions on the
   * `node` and `state` columns, which follow the document) and the answer together. A row the
   * conditions left alone is read once more to say why (not there, another node's, another state).
   */
  private async patchSandbox(id: string, patch: Partial<Omit<Sandbox, 'id' | 'tenantId'>>, expect: SandboxExpectation | undefined, patchDoc: NonNullable<SqlFlavour['patchDoc']>): Promise<Sandbox> {
    const entries = Object.entries(patch);
    // A field set to undefined leaves the document (as `{...cur, ...patch}` then JSON does).
    const merged = patchDoc(JSON.stringify(Object.fromEntries(entries.filter(([, v]) => v !== undefined))), entries.filter(([, v]) => v === undefined).map(([k]) => k));
    for (let attempt = 0; ; attempt++) {
      const row = await this.db
        .updateTable('sandboxes')
        .set({ doc: merged, ...('state' in patch && patch.state ? { state: patch.state } : {}), ...('node' in patch ? { node: patch.node ?? null } : {}) })
        .where('id', '=', id)
        .$if(expect?.node !== undefined, (q) => (expect!.node === null ? q.where('node', 'is', null) : q.where('node', '=', expect!.node!)))
        .$if(expect?.state !== undefined, (q) => q.where('state', '=', expect!.state!))
        .returning('doc')
        .executeTakeFirst();
      if (row) return JSON.parse(row.doc) as Sandbox;
      const cur = await this.getSandbox(id);
      if (!cur) throw new SpaceError('SANDBOX_NOT_FOUND', `No sandbox ${id}`);
      checkExpectation(cur, expect);
      // It met the conditions again by the time it was read (changed twice meanwhile): once more.
      if (attempt >= 2) throw new SpaceError('INTERNAL', `Sandbox ${id} kept changing under an update; try again`);
    }
  }

  async getSandbox(id: string): Promise<Sandbox | undefined> {
    const row = await this.db.selectFrom('sandboxes').select('doc').where('id', '=', id).executeTakeFirst();
    return row ? (JSON.parse(row.doc) as Sandbox) : undefined;
  }

  async listSandboxes(q: SandboxQuery): Promise<SandboxPage> {
    let qb = this.db.selectFrom('sandboxes').select(['seq', 'doc']).where('tenant_id', '=', q.tenantId);
    if (q.states?.length) qb = qb.where('state', 'in', q.states);
    for (const [k, v] of Object.entries(q.metadata ?? {})) {
      qb = qb.where(({ exists, selectFrom }) =>
        exists(selectFrom('sandbox_labels').select(sql`1`.as('one')).whereRef('sandbox_labels.sandbox_id', '=', 'sandboxes.id').where('key', '=', k).where('value', '=', v)),
      );
    }
    if (q.template !== undefined) qb = qb.where(this.flavour.docField('template'), '=', q.template);
    if (q.createdAfter !== undefined) qb = qb.where('created_at', '>=', q.createdAfter);
    if (q.createdBefore !== undefined) qb = qb.where('created_at', '<=', q.createdBefore);
    const asc = q.order === 'asc';
    if (q.cursor) {
      // A cursor is the last row's seq; an ascending one says so ("a" prefix), so it cannot be misread.
      const text = Buffer.from(q.cursor, 'base64url').toString();
      const after = Number.parseInt(asc ? text.slice(1) : text, 10);
      if (!Number.isSafeInteger(after) || (asc !== text.startsWith('a'))) throw new SpaceError('BAD_REQUEST', 'Invalid cursor: pass the nextCursor of a previous page of the same query and order unchanged');
      qb = qb.where('seq', asc ? '>' : '<', after);
    }
    const rows = await qb.orderBy('seq', asc ? 'asc' : 'desc').limit(q.limit + 1).execute();
    const page = rows.slice(0, q.limit);
    const more = rows.length > q.limit;
    return {
      items: page.map((r) => JSON.parse(r.doc) as Sandbox),
      ...(more ? { nextCursor: Buffer.from(`${asc ? 'a' : ''}${Number(page[page.length - 1]!.seq)}`).toString('base64url') } : {}),
    };
  }

  async sandboxesInStates(states: SandboxState[], opts: { node?: string } = {}): Promise<Sandbox[]> {
    const rows = await this.db
      .selectFrom('sandboxes')
      .select('doc')
      .where('state', 'in', states)
      .$if(opts.node !== undefined, (q) => q.where('node', '=', opts.node!))
      .execute();
    return rows.map((r) => JSON.parse(r.doc) as Sandbox);
  }

  async sandboxLoadByNode(states: SandboxState[]): Promise<Record<string, { sandboxes: number; memoryMb: number }>> {
    const memoryMb = sql<number | string | null>`sum(cast(${this.flavour.docField('memoryMb')} as integer))`;
    const rows = await this.db
      .selectFrom('sandboxes')
      .select(['node', (eb) => eb.fn.countAll<number | string>().as('n'), memoryMb.as('mb')])
      .where('state', 'in', states)
      .where('node', 'is not', null)
      .groupBy('node')
      .execute();
    return Object.fromEntries(rows.map((r) => [r.node!, { sandboxes: Number(r.n), memoryMb: Number(r.mb ?? 0) }]));
  }

  async insertSnapshot(sn: Snapshot): Promise<void> {
    await this.db.insertInto('snapshots').values({ id: sn.id, sandbox_id: sn.sandboxId, created_at: sn.createdAt, doc: JSON.stringify(sn) }).execute();
  }

  async getSnapshot(id: string): Promise<Snapshot | undefined> {
    const r = await this.db.selectFrom('snapshots').select('doc').where('id', '=', id).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as Snapshot) : undefined;
  }

  async listSnapshots(sandboxId: string): Promise<Snapshot[]> {
    const rows = await this.db.selectFrom('snapshots').select('doc').where('sandbox_id', '=', sandboxId).orderBy('created_at').orderBy('id').execute();
    return rows.map((r) => JSON.parse(r.doc) as Snapshot);
  }

  async listAllSnapshots(): Promise<Snapshot[]> {
    const rows = await this.db.selectFrom('snapshots').select('doc').execute();
    return rows.map((r) => JSON.parse(r.doc) as Snapshot);
  }

  async deleteSnapshot(id: string): Promise<void> {
    await this.db.deleteFrom('snapshots').where('id', '=', id).execute();
  }

  async putIntent(i: Intent): Promise<void> {
    const row = { id: i.id, sandbox_id: i.sandboxId, started_at: i.startedAt, doc: JSON.stringify(i) };
    await this.db.insertInto('intents').values(row).onConflict((oc) => oc.column('id').doUpdateSet({ doc: row.doc })).execute();
  }

  async deleteIntent(id: string): Promise<void> {
    await this.db.deleteFrom('intents').where('id', '=', id).execute();
  }

  async listIntents(): Promise<Intent[]> {
    const rows = await this.db.selectFrom('intents').select('doc').orderBy('started_at').orderBy('id').execute();
    return rows.map((r) => JSON.parse(r.doc) as Intent);
  }

  async putExposure(e: PortExposure): Promise<void> {
    const row = { sandbox_id: e.sandboxId, port: e.port, doc: JSON.stringify(e) };
    await this.db.insertInto('port_exposures').values(row).onConflict((oc) => oc.columns(['sandbox_id', 'port']).doUpdateSet({ doc: row.doc })).execute();
  }

  async getExposure(sandboxId: string, port: number): Promise<PortExposure | undefined> {
    const r = await this.db.selectFrom('port_exposures').select('doc').where('sandbox_id', '=', sandboxId).where('port', '=', port).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as PortExposure) : undefined;
  }

  async listExposures(sandboxId: string): Promise<PortExposure[]> {
    const rows = await this.db.selectFrom('port_exposures').select('doc').where('sandbox_id', '=', sandboxId).orderBy('port').execute();
    return rows.map((r) => JSON.parse(r.doc) as PortExposure);
  }

  async deleteExposures(sandboxId: string, port?: number): Promise<void> {
    let q = this.db.deleteFrom('port_exposures').where('sandbox_id', '=', sandboxId);
    if (port !== undefined) q = q.where('port', '=', port);
    await q.execute();
  }

  async insertEvent(e: SandboxEvent): Promise<void> {
    await this.db.insertInto('sandbox_events').values({ sandbox_id: e.sandboxId, at: e.at, type: e.type, message: e.message }).execute();
  }

  async listEvents(sandboxId: string, limit: number): Promise<SandboxEvent[]> {
    const rows = await this.db.selectFrom('sandbox_events').selectAll().where('sandbox_id', '=', sandboxId).orderBy('seq', 'desc').limit(limit).execute();
    return rows.reverse().map((r) => ({ sandboxId: r.sandbox_id, at: r.at, type: r.type, message: r.message }));
  }

  async countDataKeys(tenantId: string, keyId: string): Promise<number> {
    const r = await this.db.selectFrom('data_keys').select((eb) => eb.fn.countAll<number>().as('n')).where('tenant_id', '=', tenantId).where('key_id', '=', keyId).executeTakeFirstOrThrow();
    return Number(r.n);
  }

  async insertVolume(v: VolumeRecord): Promise<void> {
    try {
      await this.db.insertInto('volumes').values({ id: v.id, tenant_id: v.tenantId, name: v.name, doc: JSON.stringify(v) }).execute();
    } catch (err) {
      if (this.flavour.isUniqueViolation(err)) throw new SpaceError('VOLUME_EXISTS', `This tenant has a volume named ${JSON.stringify(v.name)} already`, { cause: err, details: { name: v.name } });
      throw err;
    }
  }

  updateVolume(id: string, patch: Partial<Pick<VolumeRecord, 'state'>>): Promise<VolumeRecord> {
    return this.patchDoc<VolumeRecord>('volumes', id, patch, () => new SpaceError('VOLUME_NOT_FOUND', `No volume ${id}`, { details: { volumeId: id } }));
  }

  /** Merges `patch` into the JSON document of row `id` of `table`, in one transaction; `missing()` when there is no such row. */
  private patchDoc<T>(table: 'volumes' | 'volume_snapshots', id: string, patch: Partial<T>, missing: () => SpaceError): Promise<T> {
    return this.db.transaction().execute(async (tx) => {
      const row = await tx.selectFrom(table).select('doc').where('id', '=', id).$if(this.flavour.lockRows, (q) => q.forUpdate()).executeTakeFirst();
      if (!row) throw missing();
      const next = { ...(JSON.parse(row.doc) as T), ...patch };
      await tx.updateTable(table).set({ doc: JSON.stringify(next) }).where('id', '=', id).execute();
      return next;
    });
  }

  async getVolume(tenantId: string, name: string): Promise<VolumeRecord | undefined> {
    const r = await this.db.selectFrom('volumes').select('doc').where('tenant_id', '=', tenantId).where('name', '=', name).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as VolumeRecord) : undefined;
  }

  async getVolumeById(id: string): Promise<VolumeRecord | undefined> {
    const r = await this.db.selectFrom('volumes').select('doc').where('id', '=', id).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as VolumeRecord) : undefined;
  }

  async listVolumes(tenantId?: string): Promise<VolumeRecord[]> {
    let q = this.db.selectFrom('volumes').select('doc').orderBy('name');
    if (tenantId !== undefined) q = q.where('tenant_id', '=', tenantId);
    return (await q.execute()).map((r) => JSON.parse(r.doc) as VolumeRecord);
  }

  async deleteVolume(id: string): Promise<void> {
    await this.db.deleteFrom('volumes').where('id', '=', id).execute();
  }

  async insertVolumeSnapshot(s: VolumeSnapshotRecord): Promise<void> {
    await this.db.insertInto('volume_snapshots').values({ id: s.id, volume_id: s.volumeId, created_at: s.createdAt, doc: JSON.stringify(s) }).execute();
  }

  updateVolumeSnapshot(id: string, patch: Partial<Pick<VolumeSnapshotRecord, 'state'>>): Promise<VolumeSnapshotRecord> {
    return this.patchDoc<VolumeSnapshotRecord>('volume_snapshots', id, patch, () => new SpaceError('SNAPSHOT_NOT_FOUND', `No volume snapshot ${id}`, { details: { snapshotId: id } }));
  }

  async getVolumeSnapshot(id: string): Promise<VolumeSnapshotRecord | undefined> {
    const r = await this.db.selectFrom('volume_snapshots').select('doc').where('id', '=', id).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as VolumeSnapshotRecord) : undefined;
  }

  async listVolumeSnapshots(volumeId?: string): Promise<VolumeSnapshotRecord[]> {
    let q = this.db.selectFrom('volume_snapshots').select('doc').orderBy('created_at').orderBy('id');
    if (volumeId !== undefined) q = q.where('volume_id', '=', volumeId);
    return (await q.execute()).map((r) => JSON.parse(r.doc) as VolumeSnapshotRecord);
  }

  async deleteVolumeSnapshot(id: string): Promise<void> {
    await this.db.deleteFrom('volume_snapshots').where('id', '=', id).execute();
  }

  async putSecret(r: SecretRecord): Promise<void> {
    const { sealed, ...rest } = r;
    const doc = JSON.stringify(rest);
    await this.db
      .insertInto('secrets')
      .values({ tenant_id: r.tenantId, name: r.name, doc, sealed })
      .onConflict((oc) => oc.columns(['tenant_id', 'name']).doUpdateSet({ doc, sealed }))
      .execute();
  }

  async getSecret(tenantId: string, name: string): Promise<SecretRecord | undefined> {
    const r = await this.db.selectFrom('secrets').select(['doc', 'sealed']).where('tenant_id', '=', tenantId).where('name', '=', name).executeTakeFirst();
    return r ? { ...(JSON.parse(r.doc) as Omit<SecretRecord, 'sealed'>), sealed: r.sealed } : undefined;
  }

  async listSecrets(tenantId: string): Promise<SecretRecord[]> {
    const rows = await this.db.selectFrom('secrets').select(['doc', 'sealed']).where('tenant_id', '=', tenantId).orderBy('name').execute();
    return rows.map((r) => ({ ...(JSON.parse(r.doc) as Omit<SecretRecord, 'sealed'>), sealed: r.sealed }));
  }

  async deleteSecret(tenantId: string, name: string): Promise<void> {
    await this.db.deleteFrom('secrets').where('tenant_id', '=', tenantId).where('name', '=', name).execute();
  }

  insertEgressLog(e: EgressLogEntry): Promise<void> {
    return this.insertLog('egress_log', e);
  }

  listEgressLog(sandboxId: string, limit: number, cursor?: string): Promise<EgressLogPage> {
    return this.listLog<EgressLogEntry>('egress_log', sandboxId, limit, cursor);
  }

  pruneEgressLog(before: string): Promise<number> {
    return this.pruneLog('egress_log', before);
  }

  insertIngressLog(e: IngressLogEntry): Promise<void> {
    return this.insertLog('ingress_log', e);
  }

  listIngressLog(sandboxId: string, limit: number, cursor?: string): Promise<IngressLogPage> {
    return this.listLog<IngressLogEntry>('ingress_log', sandboxId, limit, cursor);
  }

  pruneIngressLog(before: string): Promise<number> {
    return this.pruneLog('ingress_log', before);
  }

  private async insertLog(table: LogTable, e: { sandboxId: string; at: string }): Promise<void> {
    await this.db.insertInto(table).values({ sandbox_id: e.sandboxId, at: e.at, doc: JSON.stringify(e) }).execute();
  }

  /** A page of an audit log, newest first: the cursor is the last entry's seq. */
  private async listLog<T>(table: LogTable, sandboxId: string, limit: number, cursor?: string): Promise<{ items: (T & { seq: number })[]; nextCursor?: string }> {
    let qb = this.db.selectFrom(table).select(['seq', 'doc']).where('sandbox_id', '=', sandboxId);
    if (cursor) {
      const before = Number.parseInt(Buffer.from(cursor, 'base64url').toString(), 10);
      if (!Number.isSafeInteger(before)) throw new SpaceError('BAD_REQUEST', 'Invalid cursor: pass the nextCursor of a previous page unchanged');
      qb = qb.where('seq', '<', before);
    }
    const rows = await qb.orderBy('seq', 'desc').limit(limit + 1).execute();
    const page = rows.slice(0, limit);
    return {
      items: page.map((r) => ({ ...(JSON.parse(r.doc) as T), seq: Number(r.seq) })),
      ...(rows.length > limit ? { nextCursor: Buffer.from(String(Number(page[page.length - 1]!.seq))).toString('base64url') } : {}),
    };
  }

  private async pruneLog(table: LogTable, before: string): Promise<number> {
    const r = await this.db.deleteFrom(table).where('at', '<', before).executeTakeFirst();
    return Number(r.numDeletedRows);
  }

  async putNode(n: NodeRecord): Promise<void> {
    const doc = JSON.stringify(n);
    await this.db.insertInto('nodes').values({ name: n.name, heartbeat_at: n.heartbeatAt, doc }).onConflict((oc) => oc.column('name').doUpdateSet({ heartbeat_at: n.heartbeatAt, doc })).execute();
  }

  async listNodes(opts: { heartbeatBefore?: string } = {}): Promise<NodeRecord[]> {
    const rows = await this.db
      .selectFrom('nodes')
      .select('doc')
      .$if(opts.heartbeatBefore !== undefined, (q) => q.where('heartbeat_at', '<', opts.heartbeatBefore!))
      .orderBy('name')
      .execute();
    return rows.map((r) => JSON.parse(r.doc) as NodeRecord);
  }

  async getMeta(key: string): Promise<string | undefined> {
    const r = await this.db.selectFrom('space_meta').select('value').where('key', '=', key).executeTakeFirst();
    return r?.value;
  }

  async putMetaIfAbsent(key: string, value: string): Promise<string> {
    await this.db.insertInto('space_meta').values({ key, value }).onConflict((oc) => oc.column('key').doNothing()).execute();
    return (await this.getMeta(key))!;
  }

  async getTenantCa(tenantId: string): Promise<TenantCaRecord | undefined> {
    const r = await this.db.selectFrom('tenant_cas').selectAll().where('tenant_id', '=', tenantId).executeTakeFirst();
    return r ? { tenantId: r.tenant_id, certPem: r.cert_pem, sealedKey: r.sealed_key, createdAt: r.created_at } : undefined;
  }

  async putTenantCaIfAbsent(ca: TenantCaRecord): Promise<TenantCaRecord> {
    await this.db.insertInto('tenant_cas').values({ tenant_id: ca.tenantId, cert_pem: ca.certPem, sealed_key: ca.sealedKey, created_at: ca.createdAt }).onConflict((oc) => oc.column('tenant_id').doNothing()).execute();
    return (await this.getTenantCa(ca.tenantId))!;
  }

  async putTemplate(t: Template): Promise<void> {
    const doc = JSON.stringify(t);
    await this.db
      .insertInto('templates')
      .values({ tenant_id: t.tenantId, name: t.name, doc })
      .onConflict((oc) => oc.columns(['tenant_id', 'name']).doUpdateSet({ doc }))
      .execute();
  }

  async getTemplate(tenantId: string, name: string): Promise<Template | undefined> {
    const r = await this.db.selectFrom('templates').select('doc').where('tenant_id', '=', tenantId).where('name', '=', name).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as Template) : undefined;
  }

  async listTemplates(): Promise<Template[]> {
    const rows = await this.db.selectFrom('templates').select('doc').orderBy('name').orderBy('tenant_id').execute();
    return rows.map((r) => JSON.parse(r.doc) as Template);
  }

  async deleteTemplate(tenantId: string, name: string): Promise<void> {
    await this.db.deleteFrom('templates').where('tenant_id', '=', tenantId).where('name', '=', name).execute();
  }

  async putTenantKey(k: TenantKey): Promise<void> {
    const doc = JSON.stringify(k);
    await this.db.insertInto('tenant_keys').values({ id: k.id, tenant_id: k.tenantId, created_at: k.createdAt, doc }).onConflict((oc) => oc.column('id').doUpdateSet({ doc })).execute();
  }

  async switchTenantKey(next: TenantKey, fromId: string | undefined): Promise<void> {
    await this.db.transaction().execute(async (tx) => {
      if (fromId) {
        const r = await tx.selectFrom('tenant_keys').select('doc').where('id', '=', fromId).$if(this.flavour.lockRows, (q) => q.forUpdate()).executeTakeFirst();
        if (r) await tx.updateTable('tenant_keys').set({ doc: JSON.stringify({ ...(JSON.parse(r.doc) as TenantKey), state: 'rotating' }) }).where('id', '=', fromId).execute();
      }
      await tx.insertInto('tenant_keys').values({ id: next.id, tenant_id: next.tenantId, created_at: next.createdAt, doc: JSON.stringify(next) }).execute();
    });
  }

  async getTenantKey(id: string): Promise<TenantKey | undefined> {
    const r = await this.db.selectFrom('tenant_keys').select('doc').where('id', '=', id).executeTakeFirst();
    return r ? (JSON.parse(r.doc) as TenantKey) : undefined;
  }

  async listTenantKeys(tenantId?: string): Promise<TenantKey[]> {
    let qb = this.db.selectFrom('tenant_keys').select('doc');
    if (tenantId !== undefined) qb = qb.where('tenant_id', '=', tenantId);
    return (await qb.orderBy('created_at').orderBy('id').execute()).map((r) => JSON.parse(r.doc) as TenantKey);
  }

  async putDataKey(d: DataKeyRecord): Promise<void> {
    await this.db
      .insertInto('data_keys')
      .values({ object_key: d.objectKey, tenant_id: d.tenantId, key_id: d.keyId, wrapped: d.wrapped })
      .onConflict((oc) => oc.column('object_key').doUpdateSet({ key_id: d.keyId, wrapped: d.wrapped }))
      .execute();
  }

  async getDataKey(objectKey: string): Promise<DataKeyRecord | undefined> {
    const r = await this.db.selectFrom('data_keys').selectAll().where('object_key', '=', objectKey).executeTakeFirst();
    return r ? { objectKey: r.object_key, tenantId: r.tenant_id, keyId: r.key_id, wrapped: Buffer.from(r.wrapped) } : undefined;
  }

  async listDataKeys(tenantId: string, limit: number, exceptKeyId?: string): Promise<DataKeyRecord[]> {
    let qb = this.db.selectFrom('data_keys').selectAll().where('tenant_id', '=', tenantId);
    if (exceptKeyId) qb = qb.where('key_id', '!=', exceptKeyId);
    const rows = await qb.orderBy('object_key').limit(limit).execute();
    return rows.map((r) => ({ objectKey: r.object_key, tenantId: r.tenant_id, keyId: r.key_id, wrapped: Buffer.from(r.wrapped) }));
  }

  async deleteDataKey(objectKey: string): Promise<void> {
    await this.db.deleteFrom('data_keys').where('object_key', '=', objectKey).execute();
  }

  async insertApiKey(k: ApiKeyRecord): Promise<void> {
    await this.db
      .insertInto('api_keys')
      .values({ id: k.id, tenant_id: k.tenantId, name: k.name, hash: k.hash, prefix: k.prefix, admin: k.admin ? 1 : 0, created_at: k.createdAt, revoked_at: k.revokedAt ?? null })
      .execute();
  }

  async findApiKeyByHash(hash: string): Promise<ApiKeyRecord | undefined> {
    const r = await this.db.selectFrom('api_keys').selectAll().where('hash', '=', hash).executeTakeFirst();
    return r ? toKey(r) : undefined;
  }

  async listApiKeys(tenantId?: string): Promise<ApiKeyRecord[]> {
    let qb = this.db.selectFrom('api_keys').selectAll();
    if (tenantId) qb = qb.where('tenant_id', '=', tenantId);
    return (await qb.orderBy('created_at').execute()).map(toKey);
  }

  async revokeApiKey(id: string, at: string): Promise<ApiKeyRecord | undefined> {
    await this.db.updateTable('api_keys').set({ revoked_at: at }).where('id', '=', id).where('revoked_at', 'is', null).execute();
    const r = await this.db.selectFrom('api_keys').selectAll().where('id', '=', id).executeTakeFirst();
    return r ? toKey(r) : undefined;
  }

  async countApiKeys(): Promise<number> {
    const r = await this.db.selectFrom('api_keys').select((eb) => eb.fn.countAll<number>().as('n')).executeTakeFirstOrThrow();
    return Number(r.n);
  }

  async close(): Promise<void> {
    await this.db.destroy();
  }
}
