// The driver conformance suite on gVisor (real runsc). No skips. Its daemon keeps its metadata
// in PostgreSQL (a throwaway server, test/postgres.mjs): every other daemon of the suite uses
// the SQLite default, so this one shows a whole node working on PostgreSQL at no extra cost.
import assert from 'node:assert/strict';
import { after } from 'node:test';
import { conformance } from './conformance/suite.mjs';
import { startPostgres } from './postgres.mjs';

const pg = await startPostgres();
after(async () => {
  const rows = pg.psql('SELECT count(*) FROM sandboxes', 'space');
  assert.ok(Number(rows.trim()) > 0, 'the daemon stored its sandboxes in PostgreSQL');
  await pg.stop();
});

conformance({ name: 'gvisor', label: 'gvisor (metadata in PostgreSQL)', daemonOpts: { database: pg.url }, skip: [] });
