// Many creates at once: each one succeeds or gets CAPACITY_EXHAUSTED (429, Retry-After) —
// never a timeout or a half-made sandbox — and each sandbox records where its creation time went.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { api, startTestDaemon } from './helpers.mjs';

describe('concurrent creates', () => {
  let fx;
  before(async () => {
    fx = await startTestDaemon({ maxSandboxes: 6 });
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('50 creates at once on 2 cores: 6 succeed, the rest get CAPACITY_EXHAUSTED, nothing is left half-made', async () => {
    const results = await Promise.all(Array.from({ length: 50 }, () => api(fx, 'POST', '/v1/sandboxes', { json: { memoryMb: 128 } })));
    const ok = results.filter((r) => r.status === 201);
    const refused = results.filter((r) => r.status === 429);
    for (const r of ok) fx.track(r.body.id);
    assert.equal(ok.length + refused.length, 50, `unexpected answers: ${JSON.stringify(results.filter((r) => r.status !== 201 && r.status !== 429).map((r) => r.body))}`);
    assert.equal(ok.length, 6);
    for (const r of refused) {
      assert.equal(r.body.error.code, 'CAPACITY_EXHAUSTED');
      assert.ok(Number(r.headers.get('retry-after')) > 0);
    }
    const all = await Sandbox.list({ ...fx.conn, limit: 100 });
    assert.deepEqual(all.items.map((s) => s.state).sort(), Array(6).fill('running'), 'only the 6 created exist, all running');
    for (const r of ok) {
      const t = r.body.createTimings;
      const start = t?.source === 'boot' ? t.bootMs : t?.restoreMs;
      assert.ok(t && ['boot', 'snapshot'].includes(t.source) && start > 0 && t.totalMs >= start && t.queueMs >= 0 && t.agentMs >= 0 && t.identityMs >= 0, JSON.stringify(t));
    }
    for (const r of ok) await Sandbox.kill(r.body.id, fx.conn);
  });
});
