// Console sessions (packages/server/src/console-session.ts) without a daemon: the cookie is the
// key's id, tenant and expiry MACed with the deployment's secret; a forged, tampered, expired or
// foreign cookie is nobody's; a revoked key ends its sessions; the CSRF token belongs to one session.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { describe, it } from 'node:test';
import { ApiKeys } from '../packages/core/dist/index.js';
import { ConsoleSessions, sessionCookie, sessionCookieOf } from '../packages/server/dist/console-session.js';

/** The three store calls ApiKeys makes, in memory. */
function keyStore() {
  const rows = [];
  return {
    async insertApiKey(r) {
      rows.push(r);
    },
    async findApiKeyByHash(h) {
      return rows.find((r) => r.hash === h);
    },
    async listApiKeys(t) {
      return rows.filter((r) => r.tenantId === t);
    },
    async revokeApiKey(id, at) {
      const r = rows.find((x) => x.id === id);
      r.revokedAt = at;
      return r;
    },
  };
}

describe('console sessions', () => {
  const secret = randomBytes(32);
  const keys = new ApiKeys(keyStore());
  let clock = Date.parse('2026-12-03T08:00:00Z');
  const sessions = new ConsoleSessions(secret, keys, () => clock);

  it('a wrong key opens no session; the right one gives a cookie that reads back as its key', async () => {
    await assert.rejects(sessions.signIn('space_wrong'), (e) => e.code === 'UNAUTHENTICATED');
    const { key, record } = await keys.create({ tenantId: 'acme', name: 'k' });
    const { cookie, session } = await sessions.signIn(key);
    assert.ok(!cookie.includes(key), 'the key is not in the cookie');
    assert.deepEqual(await sessions.session(cookie), session);
    assert.equal(session.keyId, record.id);
    assert.equal(session.tenantId, 'acme');
    assert.equal(session.expiresAt, new Date(clock + 12 * 3600_000).toISOString());
  });

  it('a tampered, foreign or expired cookie is nobody\'s', async () => {
    const { key } = await keys.create({ tenantId: 'acme' });
    const { cookie } = await sessions.signIn(key);
    const [v, body, mac] = cookie.split('.');
    const claims = JSON.parse(Buffer.from(body, 'base64url').toString());
    const forgedBody = Buffer.from(JSON.stringify({ ...claims, t: 'other', a: true })).toString('base64url');
    assert.equal(await sessions.session(`${v}.${forgedBody}.${mac}`), undefined, 'another tenant in the same MAC');
    assert.equal(await sessions.session(`${v}.${body}.${mac.slice(0, -2)}xx`), undefined, 'a changed MAC');
    assert.equal(await sessions.session('garbage'), undefined);
    assert.equal(await sessions.session(undefined), undefined);
    assert.equal(await new ConsoleSessions(randomBytes(32), keys, () => clock).session(cookie), undefined, 'another deployment\'s secret');
    clock += 12 * 3600_000 + 1000;
    assert.equal(await sessions.session(cookie), undefined, 'expired');
  });

  it('a revoked key ends its sessions (within the 5 s its check is cached)', async () => {
    const { key, record } = await keys.create({ tenantId: 'acme' });
    const { cookie } = await sessions.signIn(key);
    assert.ok(await sessions.session(cookie));
    await keys.revoke({ tenantId: 'acme', keyId: record.id, admin: true }, record.id);
    clock += 5001;
    assert.equal(await sessions.session(cookie), undefined);
  });

  it('the CSRF token is the session\'s own: another session\'s, a forged or a missing one is refused', async () => {
    const { key } = await keys.create({ tenantId: 'acme' });
    const a = await sessions.signIn(key);
    const b = await sessions.signIn(key);
    assert.equal(sessions.csrfValid(a.cookie, a.session.csrfToken), true);
    assert.equal(sessions.csrfValid(a.cookie, b.session.csrfToken), false);
    assert.equal(sessions.csrfValid(a.cookie, 'forged'), false);
    assert.equal(sessions.csrfValid(a.cookie, undefined), false);
  });

  it('the cookie is HttpOnly, SameSite=Strict, Secure over TLS; sign-out clears it; it is found among others', () => {
    assert.equal(sessionCookie('v1.a.b', false), 'space_session=v1.a.b; Max-Age=43200; Path=/; HttpOnly; SameSite=Strict');
    assert.match(sessionCookie('v1.a.b', true), /; Secure$/);
    assert.equal(sessionCookie(undefined, false), 'space_session=; Max-Age=0; Path=/; HttpOnly; SameSite=Strict');
    assert.equal(sessionCookieOf('a=1; space_session=v1.x.y; b=2'), 'v1.x.y');
    assert.equal(sessionCookieOf('a=1'), undefined);
  });
});
