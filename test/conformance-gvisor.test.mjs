// The driver conformance suite on gVisor (real runsc). No skips. Its daemon keeps its metadata
// in PostgreSQL and its blobs (template images) in S3 — a throwaway PostgreSQL and OpenStack
// Swift (test/postgres.mjs, test/s3-server.mjs): every other daemon of the suite uses the
// embedded defaults, so this one shows a whole node working on the external stores.
import assert from 'node:assert/strict';
import { after } from 'node:test';
import { conformance } from './conformance/suite.mjs';
import { startPostgresAndS3 } from './s3-server.mjs';

const [pg, s3] = await startPostgresAndS3();
Object.assign(process.env, s3.env);
after(async () => {
  const rows = pg.psql('SELECT count(*) FROM sandboxes', 'space');
  assert.ok(Number(rows.trim()) > 0, 'the daemon stored its sandboxes in PostgreSQL');
  await Promise.all([pg.stop(), s3.stop()]);
});

conformance({ name: 'gvisor', label: 'gvisor (metadata in PostgreSQL, blobs in S3)', daemonOpts: { database: pg.url, blobStore: s3.url }, skip: [] });
