// The blob store suite: every BlobStore (a local directory, file://, S3) runs these same tests
// against real storage:  blobSuite('local', { open })
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { Readable } from 'node:stream';
import { describe, it } from 'node:test';

async function bytesOf(stream) {
  const chunks = [];
  for await (const c of stream) chunks.push(Buffer.from(c));
  return Buffer.concat(chunks);
}

/** A stream of `n` pseudo-random bytes in 1 MiB pieces, and its SHA-256. */
function randomStream(n) {
  const hash = createHash('sha256');
  let left = n;
  const stream = new Readable({
    read() {
      if (left === 0) return void this.push(null);
      const piece = randomBytes(Math.min(left, 1 << 20));
      left -= piece.length;
      hash.update(piece);
      this.push(piece);
    },
  });
  return { stream, digest: () => hash.digest('hex') };
}

/**
 * @param {string} name
 * @param {{ open: () => Promise<object>, close?: (store: object) => Promise<void> }} h
 */
export function blobSuite(name, h) {
  describe(`blob store: ${name}`, () => {
    it('puts, stats, gets, lists and deletes; a missing blob is SNAPSHOT_NOT_FOUND', async () => {
      const s = await h.open();
      assert.equal(await s.put('snapshots/t1/sn1', Readable.from([Buffer.from('hello '), Buffer.from('world')])), 11);
      await s.put('chunks/t1/p1', Readable.from([Buffer.from('x')]));
      await s.put('chunks/t1/p2', Readable.from([Buffer.alloc(0)]));
      await s.put('chunks/t2/p1', Readable.from([Buffer.from('y')]));
      assert.equal((await bytesOf(await s.get('snapshots/t1/sn1'))).toString(), 'hello world');
      const st = await s.stat('snapshots/t1/sn1');
      assert.equal(st.size, 11);
      assert.ok(!Number.isNaN(Date.parse(st.createdAt)));
      assert.equal(await s.stat('snapshots/t1/none'), undefined);
      assert.deepEqual((await s.list('chunks/t1')).sort(), ['chunks/t1/p1', 'chunks/t1/p2']);
      assert.deepEqual((await s.list('chunks/')).sort(), ['chunks/t1', 'chunks/t2'], 'a "directory" lists its sub-directories');
      assert.deepEqual(await s.list('nothing/here'), []);
      await s.put('snapshots/t1/sn1', Readable.from([Buffer.from('replaced')]));
      assert.equal((await bytesOf(await s.get('snapshots/t1/sn1'))).toString(), 'replaced');
      await s.delete('snapshots/t1/sn1');
      await s.delete('snapshots/t1/sn1');
      await assert.rejects(s.get('snapshots/t1/sn1'), (e) => e.code === 'SNAPSHOT_NOT_FOUND');
      await assert.rejects(async () => s.put('../escape', Readable.from([Buffer.from('z')])), (e) => e.code === 'BAD_REQUEST');
      await h.close?.(s);
    });

    it('streams a 64 MiB blob both ways intact (several parts where the store uploads in parts)', async () => {
      const s = await h.open();
      const { stream, digest } = randomStream(64 << 20);
      assert.equal(await s.put('chunks/t1/big', stream), 64 << 20);
      const expected = digest();
      const got = createHash('sha256');
      let n = 0;
      for await (const c of await s.get('chunks/t1/big')) {
        got.update(c);
        n += c.length;
      }
      assert.deepEqual([n, got.digest('hex')], [64 << 20, expected]);
      await s.delete('chunks/t1/big');
      await h.close?.(s);
    });

    it('a write whose source fails leaves no blob (and the old one, if any, as it was)', async () => {
      const s = await h.open();
      await s.put('snapshots/t1/keep', Readable.from([Buffer.from('old')]));
      let sent = 0;
      const failing = new Readable({
        read() {
          if (sent++ < 3) this.push(randomBytes(4 << 20));
          else this.destroy(new Error('source broke'));
        },
      });
      await assert.rejects(s.put('snapshots/t1/keep', failing), /source broke/);
      const failing2 = new Readable({
        read() {
          this.destroy(new Error('broke at once'));
        },
      });
      await assert.rejects(s.put('snapshots/t1/new', failing2), /broke at once/);
      assert.equal((await bytesOf(await s.get('snapshots/t1/keep'))).toString(), 'old');
      assert.equal(await s.stat('snapshots/t1/new'), undefined);
      assert.deepEqual(await s.list('snapshots/t1'), ['snapshots/t1/keep']);
      await h.close?.(s);
    });
  });
}
