// A daemon on external stores (`--database postgres://…`, `--blob-store s3://…`), from outside:
// what it refuses at start, a session's state kept in them (snapshot, hibernate, wake), and what
// its users see while either is away — 503 METADATA_UNAVAILABLE / BLOB_STORE_UNAVAILABLE with a
// hint, the sandbox running on, output still streaming — and that it carries on when they are
// back. Real runsc, a throwaway PostgreSQL (test/postgres.mjs) and Swift (test/s3-server.mjs).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { S3Client, ListObjectsV2Command } from '@aws-sdk/client-s3';
import { startDaemon } from '../packages/server/dist/index.js';
import { api, makeNodeKey, startTestDaemon, TEMPLATES_DIR } from './helpers.mjs';
import { startPostgresAndS3 } from './s3-server.mjs';

const [pg, s3] = await startPostgresAndS3();
// The daemon runs in this process and reads the object store's keys as an operator's would.
Object.assign(process.env, s3.env);
after(async () => {
  await Promise.all([pg.stop(), s3.stop()]);
});

const closedPort = (p) => (p === 65535 ? 1 : p + 1);

async function objectsIn(bucket) {
  const c = new S3Client({ region: 'us-east-1', endpoint: s3.endpoint, forcePathStyle: true, credentials: s3.credentials });
  const r = await c.send(new ListObjectsV2Command({ Bucket: bucket }));
  c.destroy();
  return (r.Contents ?? []).map((o) => o.Key);
}

describe('external stores: start-up refusals', () => {
  it('spaced refuses a password on its command line (ps shows it), naming the ways that work', () => {
    const dir = mkdtempSync('/tmp/spt-');
    try {
      const r = spawnSync(process.execPath, [new URL('../packages/server/dist/main.js', import.meta.url).pathname, '--data-dir', dir, '--listen', '127.0.0.1:0', '--database', 'postgres://space:hunter2@127.0.0.1:1/space'], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(r.status, 1);
      assert.match(r.stderr, /CONFIG_INVALID: --database carries a password.*PGPASSWORD or ~\/\.pgpass.*SPACE_DATABASE/);
      assert.ok(!r.stderr.includes('hunter2'), 'the password is not echoed');
      assert.ok(!existsSync(`${dir}/spaced.json`), 'nothing started');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('an unreachable database or object store stops the start saying which and where, and leaves nothing behind', async () => {
    const dir = mkdtempSync('/tmp/spt-');
    try {
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', database: `postgres://space:pw@127.0.0.1:${closedPort(pg.port)}/space` }), (e) => e.code === 'METADATA_UNAVAILABLE' && /Cannot reach PostgreSQL at 127\.0\.0\.1:\d+\/space/.test(e.message));
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', database: pg.url, blobStore: `s3://${s3.bucket}?endpoint=http://127.0.0.1:${closedPort(Number(new URL(s3.endpoint).port))}` }), (e) => e.code === 'BLOB_STORE_UNAVAILABLE' && /Cannot reach the object store/.test(e.message));
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', database: pg.url, blobStore: `s3://no-such-bucket?endpoint=${s3.endpoint}` }), (e) => e.code === 'BLOB_STORE_UNAVAILABLE' && /No bucket no-such-bucket/.test(e.message));
      assert.ok(!existsSync(`${dir}/spaced.json`));
      assert.ok(!existsSync(`${dir}/space.db`), 'no SQLite database was made instead');
      // The refused starts let the database go: a daemon can take it now. (A database of its
      // own: its data keys are wrapped by this data directory's node key.)
      makeNodeKey(dir);
      const prefixUrl = `s3://${s3.bucket}/refusals?endpoint=${s3.endpoint}`;
      const d = await startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', templatesDir: TEMPLATES_DIR, egress: { mode: 'off' }, database: pg.freshDatabase(), blobStore: prefixUrl });
      await d.close();
      // A blob store is one deployment's: another database there would collect the first one's chunks.
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', templatesDir: TEMPLATES_DIR, egress: { mode: 'off' }, database: pg.freshDatabase(), blobStore: prefixUrl }), (e) => e.code === 'BLOB_STORE_IN_USE' && /s3:\/\/space-test\/refusals\//.test(e.message));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('external stores: a daemon on PostgreSQL and S3', () => {
  let fx;
  let sb;
  before(async () => {
    fx = await startTestDaemon({ database: pg.url, blobStore: s3.url });
    sb = await fx.create({ template: 'minimal' });
  });
  after(async () => {
    const leaks = await fx.close();
    assert.deepEqual(leaks, []);
  });

  it('a second daemon as the same node on the same database is refused (DATABASE_IN_USE)', async () => {
    const dir = mkdtempSync('/tmp/spt-');
    try {
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', database: pg.url }), (e) => e.code === 'DATABASE_IN_USE');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a session hibernates into the object store and wakes from it with its process and files', async () => {
    await sb.files.write('/tmp/note', 'kept');
    await sb.commands.run('sleep 3600', { background: true });
    const snap = await sb.snapshot({ name: 'on-s3' });
    await sb.hibernate();
    await sb.wake();
    assert.equal(await sb.files.read('/tmp/note'), 'kept');
    assert.match((await sb.commands.run('ps -eo args')).stdout, /sleep 3600/);
    const keys = await objectsIn(s3.bucket);
    assert.ok(keys.some((k) => k.startsWith('snapshots/') && k.includes(snap.id)), `the snapshot's manifest is in the bucket (${keys.length} objects)`);
    assert.ok(keys.some((k) => k.startsWith('chunks/')), 'its chunks are in the bucket');
    assert.deepEqual(readdirSync(fx.dataDir).filter((f) => f === 'blobs'), [], 'nothing in the data directory\'s blobs');
    assert.equal(pg.psql(`SELECT count(*) FROM snapshots WHERE id = '${snap.id}'`, 'space').trim(), '1', 'its record is in PostgreSQL');
  });

  it('object store down: a snapshot fails with BLOB_STORE_UNAVAILABLE, the sandbox runs on, the next snapshot works', async () => {
    const before = (await sb.snapshots()).length;
    s3.haltProxy();
    try {
      const r = await api(fx, 'POST', `/v1/sandboxes/${sb.id}/snapshots`, { json: {} });
      assert.equal(r.status, 503, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'BLOB_STORE_UNAVAILABLE');
      assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
      assert.equal((await sb.refresh()).state, 'running');
    } finally {
      await s3.resumeProxy();
    }
    assert.equal((await sb.snapshots()).length, before, 'the failed snapshot is not listed');
    await sb.snapshot();
    assert.equal((await sb.snapshots()).length, before + 1);
  });

  it('database down: 503 METADATA_UNAVAILABLE with a hint, the sandbox runs on and a streaming command keeps streaming', async () => {
    const lines = [];
    let waiter;
    const handle = await sb.commands.start('i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done', {
      stdin: false,
      onStdout: (s) => {
        lines.push(...s.split('\n').filter(Boolean));
        waiter?.();
      },
    });
    const more = (n) => {
      const target = lines.length + n;
      return new Promise((resolve) => {
        waiter = () => lines.length >= target && resolve();
        waiter();
      });
    };
    await more(2);
    pg.halt();
    try {
      const r = await api(fx, 'GET', '/v1/sandboxes');
      assert.equal(r.status, 503);
      assert.equal(r.body.error.code, 'METADATA_UNAVAILABLE');
      assert.match(r.body.error.hint, /running sandboxes keep running/);
      const before = lines.length;
      await more(5);
      assert.ok(lines.length >= before + 5, 'output arrived while the database was down');
    } finally {
      pg.resume();
    }
    const list = await api(fx, 'GET', '/v1/sandboxes');
    assert.equal(list.status, 200, 'the daemon carries on by itself once the database is back');
    assert.deepEqual(list.body.items.map((x) => x.id), [sb.id]);
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
    await handle.kill();
  });
});
