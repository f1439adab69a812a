/**
 * @space/store-sqlite — the embedded {@link MetadataStore}: SQLite in WAL mode, one file in the
 * data directory. The queries are `@space/store-sql`'s, shared with PostgreSQL.
 */
import Database from 'better-sqlite3';
import { Kysely, SqliteDialect, sql } from 'kysely';
import { SpaceError, type MetadataStore } from '@space/core';
import { SqlStore, type Schema, type SqlFlavour } from '@space/store-sql';

/**
 * Ordered migrations; the index + 1 is the schema version recorded in `PRAGMA user_version`.
 * `@space/store-postgres` keeps the same list in PostgreSQL's words: change both together.
 */
export const MIGRATIONS: string[] = [
  `CREATE TABLE sandboxes (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     id TEXT NOT NULL UNIQUE,
     tenant_id TEXT NOT NULL,
     state TEXT NOT NULL,
     created_at TEXT NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX sandboxes_tenant ON sandboxes(tenant_id, seq);
   CREATE INDEX sandboxes_state ON sandboxes(state);
   CREATE TABLE sandbox_labels (
     sandbox_id TEXT NOT NULL REFERENCES sandboxes(id) ON DELETE CASCADE,
     key TEXT NOT NULL,
     value TEXT NOT NULL,
     PRIMARY KEY (sandbox_id, key));
   CREATE INDEX sandbox_labels_kv ON sandbox_labels(key, value);
   CREATE TABLE api_keys (
     id TEXT PRIMARY KEY,
     tenant_id TEXT NOT NULL,
     name TEXT NOT NULL,
     hash TEXT NOT NULL UNIQUE,
     prefix TEXT NOT NULL,
     admin INTEGER NOT NULL,
     created_at TEXT NOT NULL,
     revoked_at TEXT);`,
  `CREATE TABLE snapshots (
     id TEXT PRIMARY KEY,
     sandbox_id TEXT NOT NULL,
     created_at TEXT NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at);
   CREATE TABLE sandbox_events (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     sandbox_id TEXT NOT NULL,
     at TEXT NOT NULL,
     type TEXT NOT NULL,
     message TEXT NOT NULL);
   CREATE INDEX sandbox_events_sandbox ON sandbox_events(sandbox_id, seq);`,
  `CREATE TABLE templates (
     tenant_id TEXT NOT NULL,
     name TEXT NOT NULL,
     doc TEXT NOT NULL,
     PRIMARY KEY (tenant_id, name));`,
  `CREATE TABLE tenant_keys (
     id TEXT PRIMARY KEY,
     tenant_id TEXT NOT NULL,
     created_at TEXT NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX tenant_keys_tenant ON tenant_keys(tenant_id, created_at);
   CREATE TABLE data_keys (
     object_key TEXT PRIMARY KEY,
     tenant_id TEXT NOT NULL,
     key_id TEXT NOT NULL,
     wrapped BLOB NOT NULL);
   CREATE INDEX data_keys_tenant ON data_keys(tenant_id, key_id);`,
  `CREATE TABLE secrets (
     tenant_id TEXT NOT NULL,
     name TEXT NOT NULL,
     doc TEXT NOT NULL,
     sealed BLOB NOT NULL,
     PRIMARY KEY (tenant_id, name));
   CREATE TABLE egress_log (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     sandbox_id TEXT NOT NULL,
     at TEXT NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX egress_log_sandbox ON egress_log(sandbox_id, seq);
   CREATE INDEX egress_log_at ON egress_log(at);
   CREATE TABLE tenant_cas (
     tenant_id TEXT PRIMARY KEY,
     cert_pem TEXT NOT NULL,
     sealed_key BLOB NOT NULL,
     created_at TEXT NOT NULL);`,
  `CREATE TABLE intents (
     id TEXT PRIMARY KEY,
     sandbox_id TEXT NOT NULL,
     started_at TEXT NOT NULL,
     doc TEXT NOT NULL);`,
  `CREATE TABLE port_exposures (
     sandbox_id TEXT NOT NULL,
     port INTEGER NOT NULL,
     doc TEXT NOT NULL,
     PRIMARY KEY (sandbox_id, port));`,
  `CREATE TABLE ingress_log (
     seq INTEGER PRIMARY KEY AUTOINCREMENT,
     sandbox_id TEXT NOT NULL,
     at TEXT NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX ingress_log_sandbox ON ingress_log(sandbox_id, seq);
   CREATE INDEX ingress_log_at ON ingress_log(at);`,
  `CREATE TABLE volumes (
     id TEXT PRIMARY KEY,
     tenant_id TEXT NOT NULL,
     name TEXT NOT NULL,
     doc TEXT NOT NULL,
     UNIQUE (tenant_id, name));
   CREATE TABLE volume_snapshots (
     id TEXT PRIMARY KEY,
     volume_id TEXT NOT NULL,
     created_at TEXT NOT NULL,
     doc TEXT NOT NULL);
   CREATE INDEX volume_snapshots_volume ON volume_snapshots(volume_id, created_at);`,
  `CREATE TABLE space_meta (
     key TEXT PRIMARY KEY,
     value TEXT NOT NULL);`,
  `CREATE TABLE nodes (
     name TEXT PRIMARY KEY,
     heartbeat_at TEXT NOT NULL,
     doc TEXT NOT NULL);`,
  // The owning node as a column: a node's own sandboxes are one indexed query (admission, usage,
  // arrivals), not a read of every node's (a cost that grew with the cluster); nodes by their
  // last heartbeat (the silent ones are what each node looks for after every heartbeat).
  `ALTER TABLE sandboxes ADD COLUMN node TEXT;
   UPDATE sandboxes SET node = json_extract(doc, '$.node');
   CREATE INDEX sandboxes_node_state ON sandboxes(node, state);
   CREATE INDEX nodes_heartbeat ON nodes(heartbeat_at);`,
];

const SQLITE: SqlFlavour = {
  docField: (field) => sql<string>`json_extract(doc, ${'$.' + field})`,
  isUniqueViolation: (err) => (err as { code?: string }).code === 'SQLITE_CONSTRAINT_UNIQUE',
  lockRows: false,
};

/**
 * SQLite metadata store.
 *
 * @example
 * const store = SqliteStore.open('/var/lib/space/space.db');
 * await store.insertSandbox(sb);
 */
export class SqliteStore extends SqlStore implements MetadataStore {
  /** Opens (and migrates) the database at `file`; `:memory:` for tests. */
  static open(file: string): SqliteStore {
    const raw = new Database(file);
    raw.pragma('journal_mode = WAL');
    raw.pragma('synchronous = NORMAL');
    raw.pragma('foreign_keys = ON');
    raw.pragma('busy_timeout = 5000');
    const version = raw.pragma('user_version', { simple: true }) as number;
    if (version > MIGRATIONS.length) {
      raw.close();
      throw new SpaceError('INTERNAL', `Database ${file} has schema version ${version}, newer than this SPACE (${MIGRATIONS.length}); upgrade SPACE`);
    }
    raw.transaction(() => {
      for (let v = version; v < MIGRATIONS.length; v++) raw.exec(MIGRATIONS[v]!);
      raw.pragma(`user_version = ${MIGRATIONS.length}`);
    })();
    return new SqliteStore(new Kysely<Schema>({ dialect: new SqliteDialect({ database: raw }) }), SQLITE);
  }
}
