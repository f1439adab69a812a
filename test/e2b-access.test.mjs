// Fast lane: the E2B API's signed file URLs matched to their sandbox (SignedFileOwners) — found
// when created after the last read of the candidates, refused once their sandbox ended, checked
// against the one sandbox a forwarding node names, and a flood of bad signatures answered with
// one read of the candidates at a time rather than one read each.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { AccessTokens, SignedFileOwners } from '../packages/e2b/dist/index.js';
import { fileSignature } from '../packages/e2b/dist/access.js';

/** A store of live sandboxes that counts its reads; `all()` waits for `gate` when one is set. */
function source() {
  const live = new Map();
  const s = {
    live,
    reads: 0,
    gate: undefined,
    async all() {
      s.reads++;
      const snapshot = [...live.values()];
      if (s.gate) await s.gate;
      return snapshot;
    },
    async one(id) {
      return live.get(id);
    },
  };
  return s;
}

describe('signed file URLs: SignedFileOwners', () => {
  const tokens = new AccessTokens(randomBytes(32));
  const url = (sb, path = '/tmp/f', op = 'read') => ({ path, username: 'user', signature: fileSignature(path, op, 'user', tokens.issue(sb.tenantId, sb.id)) });

  it('finds the sandbox a URL was made for, one created after the last read included; reads again only on a miss', async () => {
    const src = source();
    const owners = new SignedFileOwners(tokens, src);
    const a = { id: 'sba', tenantId: 't1' };
    src.live.set(a.id, a);
    assert.deepEqual(await owners.match(url(a), 'read'), { tenantId: 't1', sandboxId: 'sba' });
    assert.deepEqual(await owners.match(url(a, '/etc/x'), 'read'), { tenantId: 't1', sandboxId: 'sba' });
    assert.equal(src.reads, 1, 'the second URL matched in memory');
    const b = { id: 'sbb', tenantId: 't2' };
    src.live.set(b.id, b);
    assert.deepEqual(await owners.match(url(b, '/up', 'write'), 'write'), { tenantId: 't2', sandboxId: 'sbb' });
    assert.equal(src.reads, 2);
    // A read signature is not a write one.
    await assert.rejects(owners.match(url(b, '/up', 'read'), 'write'), { code: 'UNAUTHENTICATED', message: 'invalid signature' });
  });

  it('a URL dies with its sandbox, whatever is in memory', async () => {
    const src = source();
    const owners = new SignedFileOwners(tokens, src);
    const a = { id: 'sba', tenantId: 't1' };
    src.live.set(a.id, a);
    await owners.match(url(a), 'read');
    src.live.delete(a.id);
    await assert.rejects(owners.match(url(a), 'read'), { code: 'UNAUTHENTICATED', message: 'invalid signature' });
  });

  it('a named sandbox (a forwarded URL) is the only one checked, with no read of the others', async () => {
    const src = source();
    const owners = new SignedFileOwners(tokens, src);
    const a = { id: 'sba', tenantId: 't1' };
    const b = { id: 'sbb', tenantId: 't1' };
    src.live.set(a.id, a).set(b.id, b);
    assert.deepEqual(await owners.match(url(a), 'read', 'sba'), { tenantId: 't1', sandboxId: 'sba' });
    // Another sandbox named: refused, though the signature is a's.
    await assert.rejects(owners.match(url(a), 'read', 'sbb'), { message: 'invalid signature' });
    await assert.rejects(owners.match(url(a), 'read', 'nope'), { message: 'invalid signature' });
    assert.equal(src.reads, 0);
  });

  it('missing and expired signatures keep envd\'s messages', async () => {
    const src = source();
    const owners = new SignedFileOwners(tokens, src);
    const a = { id: 'sba', tenantId: 't1' };
    src.live.set(a.id, a);
    await assert.rejects(owners.match({ path: '/x' }, 'read'), { message: 'missing signature query parameter' });
    const exp = Math.floor(Date.now() / 1000) - 10;
    const q = { path: '/x', username: 'user', signature: fileSignature('/x', 'read', 'user', tokens.issue('t1', 'sba'), exp), signature_expiration: String(exp) };
    await assert.rejects(owners.match(q, 'read'), { message: 'signature is already expired' });
  });

  it('100 bad signatures at once: the candidates are read twice at most, not once each', async () => {
    const src = source();
    const owners = new SignedFileOwners(tokens, src);
    src.live.set('sba', { id: 'sba', tenantId: 't1' });
    let open;
    src.gate = new Promise((r) => (open = r));
    const bad = Array.from({ length: 100 }, (_, i) => owners.match({ path: `/x${i}`, signature: 'v1_' + 'A'.repeat(43) }, 'read').then(() => 'matched', (e) => e.message));
    await new Promise((r) => setImmediate(r));
    open();
    src.gate = undefined;
    assert.deepEqual(new Set(await Promise.all(bad)), new Set(['invalid signature']));
    assert.ok(src.reads <= 2, `${src.reads} reads`);
  });

  it('a read that fails fails the requests waiting on it (the store\'s error), and the next request reads again', async () => {
    const src = source();
    const owners = new SignedFileOwners(tokens, src);
    const a = { id: 'sba', tenantId: 't1' };
    src.live.set(a.id, a);
    const all = src.all;
    src.all = async () => {
      throw Object.assign(new Error('database gone'), { code: 'METADATA_UNAVAILABLE' });
    };
    await assert.rejects(owners.match(url(a), 'read'), { code: 'METADATA_UNAVAILABLE' });
    src.all = all;
    assert.deepEqual(await owners.match(url(a), 'read'), { tenantId: 't1', sandboxId: 'sba' });
  });
});
