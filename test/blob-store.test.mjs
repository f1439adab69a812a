// The local blob stores — the default `<data>/blobs` and `--blob-store file:///PATH` — through
// the shared blob store suite, and the daemon's refusals of bad --blob-store URLs.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { claimBlobStore, openBlobStore } from '../packages/server/dist/blob-store.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { blobSuite } from './blob-suite.mjs';

const dirs = [];
const tmp = () => {
  const d = mkdtempSync('/tmp/spb-');
  dirs.push(d);
  return d;
};
after(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

blobSuite('local directory', { open: async () => new LocalBlobStore(tmp()) });
blobSuite('file:// (as --blob-store opens it)', { open: async () => (await openBlobStore(`file://${tmp()}/shared`, '/nonexistent')).store });

describe('--blob-store', () => {
  it('refuses what it cannot use, saying what to write instead', async () => {
    for (const bad of ['file://host/x', 'file:///', 'file://relative', 'ftp://x/y', 's3://user:secret@bucket', 's3://Bad_Bucket', 's3://bucket?endpoint=ftp://x', 'nonsense']) {
      await assert.rejects(openBlobStore(bad, tmp()), (e) => e.code === 'CONFIG_INVALID' && !e.message.includes('secret'), bad);
    }
  });

  it('sweeps a crash\'s partial files from a local store when it opens it', async () => {
    const d = tmp();
    const { writeFileSync, mkdirSync, existsSync } = await import('node:fs');
    mkdirSync(`${d}/chunks/t1`, { recursive: true });
    writeFileSync(`${d}/chunks/t1/p1.tmp-0123456789ab`, 'half');
    writeFileSync(`${d}/chunks/t1/p2`, 'whole');
    const { store } = await openBlobStore(`file://${d}`, '/nonexistent');
    assert.equal(existsSync(`${d}/chunks/t1/p1.tmp-0123456789ab`), false);
    assert.deepEqual(await store.list('chunks/t1'), ['chunks/t1/p2']);
  });

  it('belongs to one deployment: a second database is refused (BLOB_STORE_IN_USE) and its collection never runs there', async () => {
    const d = tmp();
    const blobs = new LocalBlobStore(`${d}/blobs`);
    const a = SqliteStore.open(`${d}/a.db`);
    const b = SqliteStore.open(`${d}/b.db`);
    await claimBlobStore(blobs, a, 'test');
    await claimBlobStore(blobs, a, 'test'); // again (a restart, every collection): fine
    await assert.rejects(claimBlobStore(blobs, b, 'test'), (e) => e.code === 'BLOB_STORE_IN_USE' && /give each deployment its own/.test(e.message));
    const other = new LocalBlobStore(`${d}/other`);
    await claimBlobStore(other, b, 'test');
    const { writeFileSync } = await import('node:fs');
    writeFileSync(`${d}/other/meta/deployment.json`, 'garbage');
    await assert.rejects(claimBlobStore(other, b, 'test'), (e) => e.code === 'BLOB_STORE_IN_USE' && /unreadable/.test(e.message));
    await a.close();
    await b.close();
  });
});
