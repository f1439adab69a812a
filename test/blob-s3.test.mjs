// The S3 blob store on a real S3-compatible server — OpenStack Swift with s3api, started by the
// harness (test/s3-server.mjs) — through the shared blob store suite, then what is S3's own:
// start-up errors that say which and why, and the server going away mid-write.
import assert from 'node:assert/strict';
import { Readable } from 'node:stream';
import { after, describe, it } from 'node:test';
import { S3BlobStore, parseS3Url } from '../packages/blob-s3/dist/index.js';
import { blobSuite } from './blob-suite.mjs';
import { startS3 } from './s3-server.mjs';

const s3 = await startS3();
after(() => s3.stop());
let n = 0;
/** A store on a prefix of its own, so each test starts empty. */
const open = (opts = {}) => S3BlobStore.open(parseS3Url(`s3://${s3.bucket}/run-${++n}?endpoint=${s3.endpoint}`), { credentials: s3.credentials, ...opts });

blobSuite('S3 (OpenStack Swift + s3api)', { open: () => open({ partSize: 5 << 20 }), close: async (s) => s.close() });

describe('S3BlobStore', () => {
  it('start-up errors say which and why: unreachable, wrong credentials, no such bucket', async () => {
    const closedPort = new URL(s3.endpoint).port === '1' ? 2 : 1;
    await assert.rejects(S3BlobStore.open(parseS3Url(`s3://${s3.bucket}?endpoint=http://127.0.0.1:${closedPort}`), { credentials: s3.credentials, maxAttempts: 1 }), (e) => e.code === 'BLOB_STORE_UNAVAILABLE' && /Cannot reach the object store/.test(e.message));
    await assert.rejects(S3BlobStore.open(parseS3Url(s3.url), { credentials: { ...s3.credentials, secretAccessKey: 'wrong' } }), (e) => e.code === 'BLOB_STORE_UNAVAILABLE' && /refused the credentials/.test(e.message) && !e.message.includes('wrong'));
    await assert.rejects(S3BlobStore.open(parseS3Url(`s3://no-such-bucket?endpoint=${s3.endpoint}`), { credentials: s3.credentials }), (e) => e.code === 'BLOB_STORE_UNAVAILABLE' && /No bucket no-such-bucket/.test(e.message));
  });

  it('the server going away: BLOB_STORE_UNAVAILABLE after its retries, nothing half-written, fine again when it is back', async () => {
    const store = await open({ maxAttempts: 2 });
    await store.put('snapshots/t1/before', Readable.from([Buffer.from('ok')]));
    s3.haltProxy();
    try {
      await assert.rejects(store.put('snapshots/t1/during', Readable.from([Buffer.alloc(12 << 20, 1)])), (e) => e.code === 'BLOB_STORE_UNAVAILABLE');
      await assert.rejects(store.get('snapshots/t1/before'), (e) => e.code === 'BLOB_STORE_UNAVAILABLE', 'not SNAPSHOT_NOT_FOUND: the blob may well be there');
    } finally {
      await s3.resumeProxy();
    }
    assert.equal(await store.stat('snapshots/t1/during'), undefined);
    assert.deepEqual(await store.list('snapshots/t1'), ['snapshots/t1/before']);
    await store.put('snapshots/t1/after', Readable.from([Buffer.from('ok')]));
    store.close();
  });
});
