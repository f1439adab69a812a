/**
 * The {@link BlobCollectionLock} of a deployment on PostgreSQL: one advisory lock, taken shared
 * by every node's blob writes and exclusively by a collection, each on a connection of its own
 * held for the operation (a node that dies lets its hold go with its connection). The
 * generation and the time of the last collection are a row of `space_meta`; the generation is
 * written before the collection's first deletion.
 *
 * Writers poll `pg_try_advisory_lock_shared` rather than wait in the server: a wait is a
 * statement, which the pool's statement timeout would cut. The collector waits in the server
 * (up to `collectorWaitMs`), and a waiting exclusive request makes new shared ones fail to
 * take the lock, so a steady stream of snapshots cannot keep a collection out for ever.
 */
import pg from 'pg';
import { SpaceError, type BlobCollectionLock } from '@space/core';

/** The advisory lock's keys: "SPCE", 2 (1 is the migrations'). */
const LOCK_SPACE = 0x53504345;
const LOCK_BLOBS = 2;
/** The `space_meta` row: `{"generation": N, "at": ISO time of the last collection}`. */
const META_KEY = 'blob-collection';

/** Options of {@link postgresBlobLock}. */
export interface PostgresBlobLockOptions {
  /** Longest a write waits for a collection to end, ms. @default 600000 */
  writerWaitMs?: number;
  /** Longest a collection waits for the writes under way to end, ms. @default 60000 */
  collectorWaitMs?: number;
  /** What a failed database call becomes (e.g. METADATA_UNAVAILABLE when the server is gone). @default the error itself */
  failed?: (err: unknown) => unknown;
  /**
   * Writes holding a connection of the pool at once; more wait their turn in this process. A
   * write also reads through the pool (its data keys), so the holders must leave room: with
   * every connection held by a write that waits for one, writes would time out. @default 4
   */
  maxWriters?: number;
}

interface Collected {
  generation: number;
  at?: string;
}

/**
 * @example
 * const lock = postgresBlobLock(pool);
 * await lock.writing(async (gen) => blobs.put(key, data));
 */
export function postgresBlobLock(pool: pg.Pool, opts: PostgresBlobLockOptions = {}): BlobCollectionLock {
  const failed = (err: unknown): never => {
    throw opts.failed ? opts.failed(err) : err;
  };
  /** A query whose failure says what it is (the errors of the caller's `fn` are left as they are). */
  const q = <R extends pg.QueryResultRow>(c: pg.PoolClient, text: string, values: unknown[] = []) => c.query<R>(text, values).catch(failed);
  const read = async (c: pg.PoolClient): Promise<Collected> => {
    const r = await q<{ value: string }>(c, 'SELECT value FROM space_meta WHERE key = $1', [META_KEY]);
    return r.rows[0] ? (JSON.parse(r.rows[0].value) as Collected) : { generation: 0 };
  };
  /** Runs `fn` on a connection of its own; one whose lock may not have been let go is closed, not reused. */
  const onConnection = async <T>(fn: (c: pg.PoolClient, dirty: () => void) => Promise<T>): Promise<T> => {
    const c = await pool.connect().catch(failed);
    let destroy = false;
    try {
      return await fn(c, () => (destroy = true));
    } finally {
      c.release(destroy);
    }
  };
  // Writes beyond maxWriters wait here for a turn (first come, first served).
  let writers = 0;
  const turns: (() => void)[] = [];
  const turn = async <T>(fn: () => Promise<T>): Promise<T> => {
    if (writers >= (opts.maxWriters ?? 4)) await new Promise<void>((r) => turns.push(r));
    else writers++;
    try {
      return await fn();
    } finally {
      const next = turns.shift();
      if (next) next();
      else writers--;
    }
  };
  return {
    writing: (fn) =>
      turn(() =>
        onConnection(async (c, dirty) => {
          const deadline = Date.now() + (opts.writerWaitMs ?? 600_000);
          for (let delay = 50; ; delay = Math.min(delay * 2, 1000)) {
            const r = await q<{ ok: boolean }>(c, 'SELECT pg_try_advisory_lock_shared($1, $2) AS ok', [LOCK_SPACE, LOCK_BLOBS]);
            if (r.rows[0]?.ok) break;
            if (Date.now() > deadline) throw new SpaceError('BLOB_STORE_UNAVAILABLE', `A collection of the blob store by another node has held it for over ${Math.round((opts.writerWaitMs ?? 600_000) / 1000)} s; try again later`);
            await new Promise((r) => setTimeout(r, delay));
          }
          try {
            const generation = (await read(c)).generation;
            const value = await fn(String(generation));
            // Still held? A connection the server dropped under a long write let the lock go, and
            // a collection may have run since: the write then fails rather than name lost packs.
            if ((await read(c)).generation !== generation) throw new SpaceError('BLOB_STORE_UNAVAILABLE', 'The blob store was collected during this write (its database connection was lost); try again');
            return value;
          } finally {
            await c.query('SELECT pg_advisory_unlock_shared($1, $2)', [LOCK_SPACE, LOCK_BLOBS]).catch(dirty);
          }
        }),
      ),
    collecting: (fn, o = {}) =>
      onConnection(async (c, dirty) => {
        try {
          await c.query("SELECT set_config('statement_timeout', '0', false), set_config('lock_timeout', $1, false)", [`${opts.collectorWaitMs ?? 60_000}ms`]);
          await c.query('SELECT pg_advisory_lock($1, $2)', [LOCK_SPACE, LOCK_BLOBS]);
        } catch (err) {
          dirty(); // its settings are not the pool's
          if ((err as { code?: string }).code === '55P03') return undefined; // lock_timeout: writes went on too long
          return failed(err);
        }
        try {
          await q(c, 'RESET statement_timeout');
          await q(c, 'RESET lock_timeout');
          const last = await read(c);
          if (o.minIntervalMs && last.at && Date.now() - Date.parse(last.at) < o.minIntervalMs) return undefined;
          const write = (v: Collected) => q(c, 'INSERT INTO space_meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value', [META_KEY, JSON.stringify(v)]);
          let generation = last.generation;
          const value = await fn(async () => {
            // Each time (the caller asks at most once a second): a dropped connection has let
            // the lock go, and the deletions stop.
            if (generation !== last.generation) return void (await q(c, 'SELECT 1'));
            await write({ generation: last.generation + 1, at: last.at });
            generation = last.generation + 1;
          });
          await write({ generation, at: new Date().toISOString() });
          return { value, generation: String(generation) };
        } finally {
          await c.query('SELECT pg_advisory_unlock($1, $2)', [LOCK_SPACE, LOCK_BLOBS]).catch(dirty);
        }
      }),
  };
}
