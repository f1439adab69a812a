/**
 * @space/store-postgres — the {@link MetadataStore} on PostgreSQL (`spaced --database
 * postgres://…`): `@space/store-sql`'s queries through Kysely's PostgreSQL dialect and
 * node-postgres' pool. Migrations run under an advisory lock, so nodes starting together
 * cannot apply one twice; read-modify-writes lock the row they read.
 */
import pg from 'pg';
import { Kysely, PostgresDialect, sql, type PostgresPool, type PostgresPoolClient } from 'kysely';
import { SpaceError, isUnreachableError, type BlobCollectionLock, type Logger, type MetadataStore } from '@space/core';
import { SqlStore, type Schema, type SqlFlavour } from '@space/store-sql';
import { postgresBlobLock } from './blob-lock.js';

export { postgresBlobLock, type PostgresBlobLockOptions } from './blob-lock.js';

/**
 * Ordered migrations in PostgreSQL's words; the index + 1 is the version kept in
 * `space_schema`. The tables and columns are `@space/store-sqlite`'s (the queries are shared):
 * change both together. Text columns sort bytewise (`COLLATE "C"`), as SQLite's do, so
 * listings and ISO-time comparisons agree on both databases whatever the server's locale.
 */
export const MIGRATIONS: string[] = [
  `CREATE TABLE sandboxes (
     seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     id TEXT COLLATE "C" NOT NULL UNIQUE,
     tenant_id TEXT COLLATE "C" NOT NULL,
     state TEXT COLLATE "C" NOT NULL,
     created_at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX sandboxes_tenant ON sandboxes(tenant_id, seq);
   CREATE INDEX sandboxes_state ON sandboxes(state);
   CREATE TABLE sandbox_labels (
     sandbox_id TEXT COLLATE "C" NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
     key TEXT COLLATE "C" NOT NULL,
     value TEXT COLLATE "C" NOT NULL,
     PRIMARY KEY (sandbox_id, key));
   CREATE INDEX sandbox_labels_kv ON sandbox_labels(key, value);
   CREATE TABLE api_keys (
     id TEXT COLLATE "C" PRIMARY KEY,
     tenant_id TEXT COLLATE "C" NOT NULL,
     name TEXT COLLATE "C" NOT NULL,
     hash TEXT COLLATE "C" NOT NULL UNIQUE,
     prefix TEXT COLLATE "C" NOT NULL,
     admin INTEGER NOT NULL,
     created_at TEXT COLLATE "C" NOT NULL,
     revoked_at TEXT COLLATE "C");
   CREATE TABLE snapshots (
     id TEXT COLLATE "C" PRIMARY KEY,
     sandbox_id TEXT COLLATE "C" NOT NULL,
     created_at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at);
   CREATE TABLE sandbox_events (
     seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     sandbox_id TEXT COLLATE "C" NOT NULL,
     at TEXT COLLATE "C" NOT NULL,
     type TEXT COLLATE "C" NOT NULL,
     message TEXT NOT NULL);
   CREATE INDEX sandbox_events_sandbox ON sandbox_events(sandbox_id, seq);
   CREATE TABLE templates (
     tenant_id TEXT COLLATE "C" NOT NULL,
     name TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL,
     PRIMARY KEY (tenant_id, name));
   CREATE TABLE tenant_keys (
     id TEXT COLLATE "C" PRIMARY KEY,
     tenant_id TEXT COLLATE "C" NOT NULL,
     created_at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX tenant_keys_tenant ON tenant_keys(tenant_id, created_at);
   CREATE TABLE data_keys (
     object_key TEXT COLLATE "C" PRIMARY KEY,
     tenant_id TEXT COLLATE "C" NOT NULL,
     key_id TEXT COLLATE "C" NOT NULL,
     wrapped BYTEA NOT NULL);
   CREATE INDEX data_keys_tenant ON data_keys(tenant_id, key_id);
   CREATE TABLE secrets (
     tenant_id TEXT COLLATE "C" NOT NULL,
     name TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL,
     sealed BYTEA NOT NULL,
     PRIMARY KEY (tenant_id, name));
   CREATE TABLE egress_log (
     seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     sandbox_id TEXT COLLATE "C" NOT NULL,
     at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX egress_log_sandbox ON egress_log(sandbox_id, seq);
   CREATE INDEX egress_log_at ON egress_log(at);
   CREATE TABLE tenant_cas (
     tenant_id TEXT COLLATE "C" PRIMARY KEY,
     cert_pem TEXT NOT NULL,
     sealed_key BYTEA NOT NULL,
     created_at TEXT COLLATE "C" NOT NULL);
   CREATE TABLE intents (
     id TEXT COLLATE "C" PRIMARY KEY,
     sandbox_id TEXT COLLATE "C" NOT NULL,
     started_at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE TABLE port_exposures (
     sandbox_id TEXT COLLATE "C" NOT NULL,
     port INTEGER NOT NULL,
     doc TEXT NOT NULL,
     PRIMARY KEY (sandbox_id, port));
   CREATE TABLE ingress_log (
     seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
     sandbox_id TEXT COLLATE "C" NOT NULL,
     at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX ingress_log_sandbox ON ingress_log(sandbox_id, seq);
   CREATE INDEX ingress_log_at ON ingress_log(at);
   CREATE TABLE volumes (
     id TEXT COLLATE "C" PRIMARY KEY,
     tenant_id TEXT COLLATE "C" NOT NULL,
     name TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL,
     UNIQUE (tenant_id, name));
   CREATE TABLE volume_snapshots (
     id TEXT COLLATE "C" PRIMARY KEY,
     volume_id TEXT COLLATE "C" NOT NULL,
     created_at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX volume_snapshots_volume ON volume_snapshots(volume_id, created_at);`,
  `CREATE TABLE space_meta (
     key TEXT COLLATE "C" PRIMARY KEY,
     value TEXT NOT NULL);`,
  `CREATE TABLE nodes (
     name TEXT COLLATE "C" PRIMARY KEY,
     heartbeat_at TEXT COLLATE "C" NOT NULL,
     doc TEXT NOT NULL);`,
  // The owning node as a column: a node's own sandboxes are one indexed query (admission, usage,
  // arrivals), not a read of every node's (a cost that grew with the cluster); nodes by their
  // last heartbeat (the silent ones are what each node looks for after every heartbeat).
  `ALTER TABLE sandboxes ADD COLUMN node TEXT COLLATE "C";
   UPDATE sandboxes SET node = doc::jsonb ->> 'node';
   CREATE INDEX sandboxes_node_state ON sandboxes(node, state);
   CREATE INDEX nodes_heartbeat ON nodes(heartbeat_at);`,
];

/** Advisory-lock keys (first half: "SPCE"): migrations. */
const LOCK_SPACE = 0x53504345;
const LOCK_MIGRATE = 1;
/** First half of a node's lock ("SPCN"); the second is PostgreSQL's hashtext() of its name. */
const LOCK_NODES = 0x5350434e;

const POSTGRES: SqlFlavour = {
  docField: (field) => sql<string>`(doc::jsonb ->> ${field})`,
  isUniqueViolation: (err) => (err as { code?: string }).code === '23505',
  lockRows: true,
  // Top-level fields replaced (jsonb's `||` is shallow, like an object spread), removed ones dropped.
  patchDoc: (patch, remove) => sql<string>`((doc::jsonb - ${remove}::text[]) || ${patch}::jsonb)::text`,
};

/** PostgreSQL's SQLSTATEs (beside class 08, connection exceptions) that mean "the server is not there now", not "the query is wrong". */
const SERVER_GONE = new Set(['57P01', '57P02', '57P03', '53300']);

/** Whether `err` says PostgreSQL cannot be reached (as opposed to refusing a query). */
export function isUnreachable(err: unknown): boolean {
  const e = err as { code?: string; message?: string } | undefined;
  const code = e?.code ?? '';
  if (isUnreachableError(err) || SERVER_GONE.has(code) || code.startsWith('08')) return true;
  return /Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error|connect ECONNREFUSED/.test(e?.message ?? '');
}

/** `host:port/db` of a connection URL, without its user or password, for messages. */
function where(url: string): string {
  try {
    const u = new URL(url);
    return `${u.hostname || u.searchParams.get('host') || 'localhost'}:${u.port || '5432'}${u.pathname}`;
  } catch {
    return 'the configured server';
  }
}

/** The error a caller sees when the database cannot answer. */
function unavailable(url: string, err: unknown): SpaceError {
  const e = err as { code?: string; message?: string };
  return new SpaceError('METADATA_UNAVAILABLE', `Cannot reach PostgreSQL at ${where(url)} (${e.code ?? e.message ?? String(err)})`, { cause: err });
}

/** Kysely's view of the pool, with "the server is gone" turned into METADATA_UNAVAILABLE. */
function guardedPool(pool: pg.Pool, url: string): PostgresPool {
  const guard = (err: unknown): never => {
    throw isUnreachable(err) ? unavailable(url, err) : err;
  };
  return {
    async connect(): Promise<PostgresPoolClient> {
      const client = await pool.connect().catch(guard);
      return {
        query: ((text: unknown, params?: unknown[]) => {
          if (typeof text !== 'string') return client.query(text as never);
          return client.query(text, params).catch(guard);
        }) as unknown as PostgresPoolClient['query'],
        release: (destroy?: boolean) => client.release(destroy),
      };
    },
    end: () => pool.end(),
  };
}

/** Options of {@link PostgresStore.open}. */
export interface PostgresStoreOptions {
  /** Where pool errors and a lost daemon lock are reported. */
  logger?: Logger;
  /** Connections in the pool. @default 10 */
  poolSize?: number;
  /** Longest a statement may run on the server before PostgreSQL cancels it. @default 30000 */
  statementTimeoutMs?: number;
  /** Longest to wait for a connection. @default 5000 */
  connectTimeoutMs?: number;
  /**
   * Hold an advisory lock on the node's name for the store's life, so that no second daemon
   * runs as the same node (`DATABASE_IN_USE`): it would take the first one's sandboxes for its
   * own crashed ones. Daemons with different names share the database as a cluster. @default true
   */
  exclusive?: boolean;
  /** The node this store is opened for (`--node-name`): the name the lock is held on. @default "default" */
  node?: string;
}

/**
 * PostgreSQL metadata store. The URL names server, user and database; the password comes from
 * `PGPASSWORD` or `~/.pgpass` (node-postgres reads both), or from the URL when the URL itself
 * comes from the environment (`SPACE_DATABASE`).
 *
 * @example
 * const store = await PostgresStore.open('postgres://space@db.internal:5432/space');
 * await store.insertSandbox(sb);
 * await store.close();
 */
export class PostgresStore extends SqlStore implements MetadataStore {
  private closed = false;
  private relock: NodeJS.Timeout | undefined;
  private locked: Promise<void> = Promise.resolve();
  private onLocked: (() => void) | undefined;

  private constructor(
    db: Kysely<Schema>,
    /** How to connect (the lock's connection is made again with it: keep-alive, timeouts). */
    private readonly config: pg.ClientConfig,
    private lockClient: pg.Client | undefined,
    private readonly url: string,
    private readonly opts: PostgresStoreOptions,
    private readonly pool: pg.Pool,
  ) {
    super(db, POSTGRES);
    if (lockClient) this.watchLock(lockClient);
  }

  /**
   * Connects, migrates and (unless `exclusive: false`) takes the node's name in the database
   * for this daemon. Fails with `METADATA_UNAVAILABLE` saying which and why when the server
   * cannot be reached, refuses the credentials or has no such database; `DATABASE_IN_USE` when
   * another daemon runs as the same node.
   */
  static async open(url: string, opts: PostgresStoreOptions = {}): Promise<PostgresStore> {
    const config: pg.PoolConfig = {
      connectionString: url,
      max: opts.poolSize ?? 10,
      connectionTimeoutMillis: opts.connectTimeoutMs ?? 5000,
      idleTimeoutMillis: 30_000,
      statement_timeout: opts.statementTimeoutMs ?? 30_000,
      application_name: 'spaced',
      keepAlive: true,
    };
    const pool = new pg.Pool(config);
    // An idle connection the server drops must not take the daemon down with it.
    pool.on('error', (err) => opts.logger?.warn({ err: err.message }, 'PostgreSQL dropped an idle connection'));
    // A connection can report its end more than once (the server's goodbye, then the socket's
    // close), after the pool has stopped listening to it: every one keeps a listener for life.
    pool.on('connect', (client) => client.on('error', () => {}));
    let lockClient: pg.Client | undefined;
    try {
      await migrate(pool, url);
      if (opts.exclusive ?? true) lockClient = await takeNode(config, url, opts.node ?? 'default');
    } catch (err) {
      await pool.end().catch(() => {});
      throw err;
    }
    const db = new Kysely<Schema>({ dialect: new PostgresDialect({ pool: guardedPool(pool, url) }) });
    return new PostgresStore(db, config, lockClient, url, opts, pool);
  }

  /** Keeps the daemon's lock: a dropped lock connection is re-taken as soon as the server answers. */
  private watchLock(client: pg.Client): void {
    let lost = false;
    client.on('error', (err) => {
      // The server's goodbye and the socket's close are two errors of one loss.
      if (this.closed || lost) return;
      lost = true;
      this.opts.logger?.error({ err: err.message, database: where(this.url) }, 'lost the connection that holds this daemon\'s database lock; retaking it');
      this.lockClient = undefined;
      this.locked = new Promise((resolve) => (this.onLocked = resolve));
      const retry = (delayMs: number) => {
        this.relock = setTimeout(() => {
          takeNode(this.config, this.url, this.opts.node ?? 'default').then(
            (c) => {
              if (this.closed) return void c.end().catch(() => {});
              this.lockClient = c;
              this.watchLock(c);
              this.onLocked?.();
              this.opts.logger?.info({ database: where(this.url) }, 'database lock retaken');
            },
            (e: unknown) => {
              this.opts.logger?.error({ err: (e as Error).message }, 'cannot retake the database lock yet');
              retry(Math.min(delayMs * 2, 30_000));
            },
          );
        }, delayMs);
        this.relock.unref();
      };
      retry(500);
    });
  }

  /** The deployment's blob collection lock (see {@link postgresBlobLock}). */
  blobCollectionLock(): BlobCollectionLock {
    return postgresBlobLock(this.pool, { failed: (err) => (isUnreachable(err) ? unavailable(this.url, err) : err) });
  }

  /**
   * Resolves once this store holds its node's lock: at once, except after the lock's
   * connection was lost, until it is retaken (`exclusive: false`: at once).
   */
  whenLocked(): Promise<void> {
    return this.locked;
  }

  override async close(): Promise<void> {
    this.closed = true;
    clearTimeout(this.relock);
    await this.lockClient?.end().catch(() => {});
    // Kysely's destroy ends the pool it was given.
    await this.db.destroy();
  }
}

/** Explains a failed first connection: unreachable, credentials, or no such database. */
function startError(url: string, err: unknown): SpaceError {
  const e = err as { code?: string; message?: string };
  if (e.code === '28P01' || e.code === '28000') return new SpaceError('METADATA_UNAVAILABLE', `PostgreSQL at ${where(url)} refused the credentials (${e.message}): check the user in --database and the password in PGPASSWORD or ~/.pgpass`, { cause: err });
  if (e.code === '3D000') return new SpaceError('METADATA_UNAVAILABLE', `PostgreSQL at ${where(url)}: ${e.message} — create it first (createdb) or name another in --database`, { cause: err });
  if (isUnreachable(err)) return new SpaceError('METADATA_UNAVAILABLE', `Cannot reach PostgreSQL at ${where(url)} (${e.code ?? e.message}): is it running and reachable from this node?`, { cause: err });
  return new SpaceError('METADATA_UNAVAILABLE', `PostgreSQL at ${where(url)} failed: ${e.message ?? String(err)}`, { cause: err });
}

/** Applies the migrations this database lacks, one node at a time. */
async function migrate(pool: pg.Pool, url: string): Promise<void> {
  const client = await pool.connect().catch((err: unknown) => {
    throw startError(url, err);
  });
  try {
    await client.query('BEGIN');
    await client.query('SELECT pg_advisory_xact_lock($1, $2)', [LOCK_SPACE, LOCK_MIGRATE]);
    await client.query('CREATE TABLE IF NOT EXISTS space_schema (version INTEGER NOT NULL)');
    const r = await client.query<{ version: number }>('SELECT version FROM space_schema');
    const version = r.rows[0]?.version ?? 0;
    if (version > MIGRATIONS.length) throw new SpaceError('CONFIG_INVALID', `Database ${where(url)} has schema version ${version}, newer than this SPACE (${MIGRATIONS.length}); upgrade SPACE`);
    for (let v = version; v < MIGRATIONS.length; v++) await client.query(MIGRATIONS[v]!);
    if (r.rows.length === 0) await client.query('INSERT INTO space_schema (version) VALUES ($1)', [MIGRATIONS.length]);
    else await client.query('UPDATE space_schema SET version = $1', [MIGRATIONS.length]);
    await client.query('COMMIT');
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err instanceof SpaceError ? err : startError(url, err);
  } finally {
    client.release();
  }
}

/**
 * A connection holding the lock on node `node`'s name, or DATABASE_IN_USE. (Two names whose
 * hashes collide would refuse each other: the message names the node, so a rename fixes it.)
 */
async function takeNode(config: pg.ClientConfig, url: string, node: string): Promise<pg.Client> {
  const client = new pg.Client({ ...config, application_name: `spaced ${node} (lock)` });
  try {
    await client.connect();
    const r = await client.query<{ ok: boolean }>('SELECT pg_try_advisory_lock($1, hashtext($2)) AS ok', [LOCK_NODES, node]);
    if (!r.rows[0]?.ok) throw new SpaceError('DATABASE_IN_USE', `Another SPACE daemon runs as node ${JSON.stringify(node)} on the database at ${where(url)}: give this one its own --node-name, or stop the other`, { details: { node } });
    return client;
  } catch (err) {
    await client.end().catch(() => {});
    throw err instanceof SpaceError ? err : startError(url, err);
  }
}
