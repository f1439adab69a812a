// The HTTP API's contract: authentication, tenancy, validation with stable error codes,
// listing with filters and pages, OpenAPI, and an agent that dies mid-stream.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startDaemon, templateImagesDir } from '../packages/server/dist/index.js';
import { Nodes, Sandbox, SpaceError } from '../packages/sdk/dist/index.js';
import { TEMPLATES_DIR, api, egressRange, eventually, leftovers, makeNodeKey, removeDataDir, startTestDaemon } from './helpers.mjs';

describe('HTTP API', () => {
  let fx;
  let sb;
  let tenantB;
  before(async () => {
    fx = await startTestDaemon({ maxUploadBytes: 1024 * 1024, maxSandboxes: 6, nodeName: 'node-a' });
    sb = await fx.create({ metadata: { team: 'red', run: '1' } });
    const k = await api(fx, 'POST', '/v1/keys', { json: { tenant: 'tenant-b', name: 'b' } });
    assert.equal(k.status, 201);
    tenantB = { apiUrl: fx.url, apiKey: k.body.key };
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('health, version and the OpenAPI document need no key; everything else does', async () => {
    assert.equal((await api(fx, 'GET', '/v1/health', { key: null })).status, 200);
    assert.equal((await api(fx, 'GET', '/v1/version', { key: null })).body.api, 'v1');
    const doc = await api(fx, 'GET', '/openapi.json', { key: null });
    assert.equal(doc.body.openapi, '3.0.3');
    assert.ok(doc.body.paths['/v1/sandboxes'].post, 'create is documented');
    assert.ok(doc.body.paths['/v1/sandboxes/{id}/commands'].post, 'exec is documented');
    const r = await api(fx, 'GET', '/v1/sandboxes', { key: null });
    assert.equal(r.status, 401);
    assert.equal(r.body.error.code, 'UNAUTHENTICATED');
    assert.equal((await api(fx, 'GET', '/v1/sandboxes', { key: 'space_wrong' })).body.error.code, 'UNAUTHENTICATED');
  });

  it('the node: registered with its capacity, heartbeating; its sandboxes carry its name; listed for admin keys only', async () => {
    const nodes = await Nodes.list(fx.conn);
    assert.equal(nodes.length, 1);
    const [n] = nodes;
    assert.deepEqual([n.name, n.state, n.url, n.maxSandboxes, n.drivers.includes('gvisor')], ['node-a', 'up', fx.url, 6, true]);
    assert.ok(n.cpus > 0 && n.memoryMb > 0 && n.sandboxes >= 1, JSON.stringify(n));
    // Placement's view: the memory its sandboxes' limits reserve, its budget, its host's load.
    assert.ok(Math.abs(n.maxMemoryMb - n.memoryMb * 2) <= 2, `the default budget is twice the host's memory: ${JSON.stringify(n)}`);
    assert.ok(n.memoryReservedMb >= sb.info.memoryMb, JSON.stringify(n));
    assert.equal(typeof n.load, 'number');
    assert.ok(Date.parse(n.heartbeatAt) >= Date.parse(n.startedAt));
    assert.equal((await api(fx, 'GET', `/v1/sandboxes/${sb.id}`)).body.node, 'node-a');
    const b = await api(fx, 'GET', '/v1/nodes', { key: tenantB.apiKey });
    assert.deepEqual([b.status, b.body.error.code], [403, 'FORBIDDEN']);
  });

  it('another tenant can neither see, exec in, read from nor kill the sandbox', async () => {
    await assert.rejects(Sandbox.connect(sb.id, tenantB), (e) => e.code === 'SANDBOX_NOT_FOUND');
    const list = await Sandbox.list(tenantB);
    assert.equal(list.items.length, 0);
    for (const [m, p, json] of [
      ['POST', `/v1/sandboxes/${sb.id}/commands`, { cmd: 'true' }],
      ['GET', `/v1/sandboxes/${sb.id}/files/content?path=/etc/passwd`],
      ['DELETE', `/v1/sandboxes/${sb.id}`],
    ]) {
      const r = await api(fx, m, p, { key: tenantB.apiKey, json });
      assert.equal(r.status, 404, `${m} ${p}`);
      assert.equal(r.body.error.code, 'SANDBOX_NOT_FOUND', 'same answer as for an unknown id');
    }
    assert.equal((await sb.refresh()).state, 'running');
    const mine = await fx.create({}, tenantB);
    assert.equal(mine.info.tenantId, 'tenant-b');
    assert.equal((await Sandbox.list(tenantB)).items.length, 1);
    await assert.rejects(Sandbox.connect(mine.id, fx.conn), (e) => e.code === 'SANDBOX_NOT_FOUND');
    await mine.kill();
  });

  it('a non-admin key cannot mint keys for other tenants; revoked keys stop working', async () => {
    const r = await api(fx, 'POST', '/v1/keys', { key: tenantB.apiKey, json: { tenant: 'default' } });
    assert.equal(r.body.error.code, 'FORBIDDEN');
    const k2 = await api(fx, 'POST', '/v1/keys', { key: tenantB.apiKey, json: { name: 'second' } });
    assert.equal(k2.status, 201);
    assert.equal(k2.body.record.tenantId, 'tenant-b');
    assert.equal(k2.body.record.hash, undefined, 'hashes never leave the daemon');
    const del = await api(fx, 'DELETE', `/v1/keys/${k2.body.record.id}`, { key: k2.body.key });
    assert.ok(del.body.revokedAt);
    assert.equal((await api(fx, 'GET', '/v1/sandboxes', { key: k2.body.key })).status, 401);
  });

  it('bad input gets a stable code and a hint, and changes nothing', async () => {
    const before = (await Sandbox.list(fx.conn)).items.length;
    const cases = [
      [{ memoryMb: 1 }, 400, 'INVALID_LIMITS'],
      [{ cpu: 99 }, 400, 'INVALID_LIMITS'],
      [{ timeoutMs: 5 }, 400, 'INVALID_LIMITS'],
      [{ template: 'nope' }, 404, 'TEMPLATE_NOT_FOUND'],
      [{ env: { 'BAD KEY': 'x' } }, 400, 'BAD_REQUEST'],
      [{ unknownField: 1 }, 400, 'BAD_REQUEST'],
      [{ memoryMb: 'lots' }, 400, 'BAD_REQUEST'],
    ];
    for (const [body, status, code] of cases) {
      const r = await api(fx, 'POST', '/v1/sandboxes', { json: body });
      assert.equal(r.status, status, JSON.stringify(body));
      assert.equal(r.body.error.code, code, JSON.stringify(body));
      assert.ok(r.body.error.message.length > 10);
    }
    const bad = await api(fx, 'POST', '/v1/sandboxes', { body: '{not json', headers: { 'content-type': 'application/json' } });
    assert.deepEqual([bad.status, bad.body.error.code], [400, 'INVALID_JSON']);
    assert.equal((await api(fx, 'GET', '/v1/sandboxes/sbdoesnotexist000000')).body.error.code, 'SANDBOX_NOT_FOUND');
    const both = await api(fx, 'POST', `/v1/sandboxes/${sb.id}/commands`, { json: { cmd: 'true', argv: ['true'] } });
    assert.equal(both.body.error.code, 'BAD_REQUEST');
    const nul = await api(fx, 'GET', `/v1/sandboxes/${sb.id}/files/stat?path=${encodeURIComponent('/tmp/a\0b')}`);
    assert.equal(nul.body.error.code, 'INVALID_PATH');
    assert.equal((await Sandbox.list(fx.conn)).items.length, before, 'no sandbox was created by bad requests');
  });

  it('uploads beyond the configured limit are refused with PAYLOAD_TOO_LARGE and leave no file', async () => {
    await assert.rejects(sb.files.write('/tmp/too-big', Buffer.alloc(2 * 1024 * 1024)), (e) => e instanceof SpaceError && e.code === 'PAYLOAD_TOO_LARGE');
    async function* chunks() {
      for (let i = 0; i < 40; i++) yield Buffer.alloc(64 * 1024, 1);
    }
    await assert.rejects(sb.files.write('/tmp/too-big-stream', chunks()), (e) => e.code === 'PAYLOAD_TOO_LARGE');
    const ls = await sb.commands.run('ls -a /tmp');
    assert.doesNotMatch(ls.stdout, /too-big/, 'neither the file nor its temporary remains');
  });

  it('lists filter by state and labels and page with a cursor', async () => {
    const a = await fx.create({ metadata: { team: 'blue' } });
    const b = await fx.create({ metadata: { team: 'blue', run: '2' } });
    await b.kill();
    const blue = await Sandbox.list({ ...fx.conn, metadata: { team: 'blue' } });
    assert.deepEqual(blue.items.map((s) => s.id).sort(), [a.id, b.id].sort());
    const blueRunning = await Sandbox.list({ ...fx.conn, metadata: { team: 'blue' }, state: ['running'] });
    assert.deepEqual(blueRunning.items.map((s) => s.id), [a.id]);
    const two = await Sandbox.list({ ...fx.conn, metadata: { team: 'blue', run: '2' } });
    assert.deepEqual(two.items.map((s) => s.id), [b.id]);
    const seen = [];
    let cursor;
    do {
      const page = await Sandbox.list({ ...fx.conn, limit: 1, ...(cursor ? { cursor } : {}) });
      assert.ok(page.items.length <= 1);
      seen.push(...page.items.map((s) => s.id));
      cursor = page.nextCursor;
    } while (cursor);
    assert.equal(new Set(seen).size, seen.length, 'no sandbox appears twice across pages');
    assert.ok(seen.includes(sb.id) && seen.includes(a.id) && seen.includes(b.id));
    assert.equal((await api(fx, 'GET', '/v1/sandboxes?state=bogus')).body.error.code, 'BAD_REQUEST');
    await a.kill();
  });

  it('beyond maxSandboxes a create gets CAPACITY_EXHAUSTED (429 with Retry-After), never a half-made sandbox', async () => {
    const made = [];
    let refused;
    for (let i = 0; i < 8 && !refused; i++) {
      const r = await api(fx, 'POST', '/v1/sandboxes', { json: { memoryMb: 128 } });
      if (r.status === 201) made.push(fx.track(r.body.id));
      else refused = r;
    }
    assert.ok(refused, 'a create was refused');
    assert.equal(refused.status, 429);
    assert.equal(refused.body.error.code, 'CAPACITY_EXHAUSTED');
    assert.ok(Number(refused.headers.get('retry-after')) > 0);
    const starting = (await Sandbox.list({ ...fx.conn, state: ['starting'] })).items;
    assert.equal(starting.length, 0);
    for (const id of made) await Sandbox.kill(id, fx.conn);
  });

  it('an agent that dies mid-stream ends the stream with an error; the daemon stays up', async () => {
    const victim = await fx.create();
    const events = [];
    const run = victim.commands.run('echo before; sleep 1000', { onStdout: (d) => events.push(d) }).then(() => undefined, (e) => e);
    await eventually(() => events.join('').includes('before'));
    // PID 1 inside the sandbox is the agent; killing it stops the sandbox.
    await victim.commands.run('kill -9 1', { user: 'root' }).catch(() => {});
    const err = await run;
    assert.ok(err instanceof SpaceError && err.code === 'AGENT_DISCONNECTED', `stream ended with ${err?.code}`);
    const info = await eventually(async () => {
      const i = await victim.refresh();
      return i.state === 'dead' ? i : undefined;
    });
    assert.equal(info.endReason, 'crashed');
    assert.equal((await api(fx, 'GET', '/v1/health')).status, 200);
    assert.equal((await sb.commands.run('echo still')).stdout, 'still\n', 'other sandboxes are unaffected');
  });

  it('a sandbox is killed when its timeout expires', async () => {
    const t = await fx.create({ timeoutMs: 2000 });
    const info = await eventually(async () => {
      const i = await t.refresh();
      return i.state === 'killed' ? i : undefined;
    });
    assert.equal(info.endReason, 'timeout');
  });
});

describe('a daemon that cannot start', () => {
  it('its port taken: start fails with EADDRINUSE and stops what it had started, so the same data directory starts next time', async () => {
    const held = net.createServer();
    await new Promise((r) => held.listen(0, '127.0.0.1', r));
    const dataDir = mkdtempSync('/tmp/spt-');
    makeNodeKey(dataDir);
    const opts = { dataDir, templatesDir: TEMPLATES_DIR, logLevel: 'silent', egress: { range: egressRange(dataDir) } };
    try {
      // Its E2B API and ingress (the two ports above) and its service start before the API's
      // listener fails; before, they stayed up (an embedding process never exited).
      await assert.rejects(startDaemon({ ...opts, listen: `127.0.0.1:${held.address().port}` }), (e) => e.code === 'EADDRINUSE');
      assert.deepEqual(leftovers(dataDir, []), []);
      assert.ok(!existsSync(path.join(dataDir, 'spaced.json')), 'no state file says it runs');
      assert.ok(!existsSync(path.dirname(templateImagesDir(dataDir))), 'its template images are out of RAM');
      // Nothing of it holds the data directory, the egress range or the node's lock.
      const d = await startDaemon({ ...opts, listen: '127.0.0.1:0' });
      assert.equal((await fetch(`${d.url}/v1/health`)).status, 200);
      await d.close();
    } finally {
      held.close();
      // With disks on, the pool stays mounted after the daemon (removeDataDir unmounts it).
      removeDataDir(dataDir);
    }
  });
});
