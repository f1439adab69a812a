// Templates as objects: built from an OCI layout and a `docker save` tarball made by the test
// itself, with a start command, restored (not booted) by every create, each copy with its own
// identity; warm pools; bad input leaves nothing behind.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { api, eventually, startTestDaemon } from './helpers.mjs';
import { templateImagesDir } from '../packages/server/dist/index.js';
import { makeDockerSave, makeOciImage } from './oci-image.mjs';

// This suite counts root file systems in its template cache, so it has a cache of its own: the
// shared one (SPACE_TEMPLATES_DIR) gains and loses entries of the suites running beside it.
const templatesDir = mkdtempSync('/tmp/spt-tpl-');

/** The template cache entries (rootfs directories, finished or not) that exist now. */
const cacheEntries = () => new Set(readdirSync(templatesDir).filter((d) => d.startsWith('t-')));

describe('templates', () => {
  let fx;
  let work;
  const marker = `m${Date.now().toString(36)}${process.pid}`;
  before(async () => {
    fx = await startTestDaemon({ templatesDir });
    work = mkdtempSync('/tmp/spt-img-');
  });
  after(async () => {
    for (const t of await Templates.list(fx.conn).catch(() => [])) if (!t.builtin) await Templates.remove(t.name, fx.conn).catch(() => {});
    assert.deepEqual(await fx.close(), []);
    rmSync(work, { recursive: true, force: true });
    rmSync(templatesDir, { recursive: true, force: true });
  });

  it('builds from an OCI layout tarball with a start command; creates restore it, each with its own identity', async () => {
    const steps = [];
    const t = await Templates.build({
      ...fx.conn,
      name: 'app',
      image: await makeOciImage(work, { marker }),
      start: { cmd: 'head -c 8 /dev/urandom | od -An -tx1 | tr -d " \\n" > /tmp/started; while true; do sleep 1; done', readyCmd: 'test -s /tmp/started' },
      env: { TPLVAR: 'from-template' },
      onProgress: (p, s) => steps.push(s),
    });
    assert.equal(t.state, 'ready');
    assert.equal(t.source.type, 'upload');
    assert.equal(t.source.format, 'oci');
    assert.ok(t.image && t.image.sizeBytes > 0, 'the template snapshot was taken');
    assert.ok(steps.includes('applying layer 2 of 2') && steps.includes('taking the template snapshot'), `progress steps: ${steps.join(', ')}`);

    const a = await fx.create({ template: 'app', memoryMb: 512, env: { MINE: 'a' } });
    const b = await fx.create({ template: 'app', memoryMb: 512, env: { MINE: 'b' } });
    for (const sb of [a, b]) {
      assert.equal(sb.info.createTimings.source, 'snapshot', 'restored from the template snapshot, not booted');
      assert.ok(sb.info.createTimings.restoreMs > 0 && sb.info.createTimings.identityMs >= 0);
    }
    const hostSeconds = Math.round(Date.now() / 1000);
    const out = async (sb) => (await sb.commands.run('cat /opt/app/hello.txt /opt/app/layer2.txt; ls /opt/app; echo "$APPVAR $TPLVAR $MINE $SPACE_SANDBOX_ID"; hostname; date +%s; cat /tmp/started; echo; ps')).stdout.split('\n');
    const [oa, ob] = [await out(a), await out(b)];
    for (const [sb, o, mine] of [[a, oa, 'a'], [b, ob, 'b']]) {
      assert.equal(o[0], `hello from the image ${marker}`);
      assert.equal(o[1], 'from layer 2');
      assert.deepEqual(o.slice(2, 4), ['hello.txt', 'layer2.txt'], 'the whiteout in layer 2 removed remove-me');
      assert.equal(o[4], `from-image-config from-template ${mine} ${sb.id}`, 'image env, template env, own env, own id');
      assert.equal(o[5], sb.id, 'its own hostname');
      assert.ok(Math.abs(Number(o[6]) - hostSeconds) <= 5, `wall clock ${o[6]} vs host ${hostSeconds}`);
      assert.match(o[7], /^[0-9a-f]{16}$/, 'the start command ran in the template');
      assert.ok(o.some((l) => l.includes('while true; do sleep 1; done')), 'the start command is still running');
    }
    assert.equal(oa[7], ob[7], 'both copies come from the same template snapshot (same file written by the start command)');
    const rnd = async (sb) => (await sb.commands.run('head -c 16 /dev/urandom | od -An -tx1')).stdout;
    assert.notEqual(await rnd(a), await rnd(b), 'the kernel random generator is not duplicated');
    // Separate socket directories and network namespaces on the host.
    const rid = (sb) => readFileSync(path.join(fx.dataDir, 'sandboxes', sb.id, 'runtime-id'), 'utf8').trim();
    const [ra, rb] = [rid(a), rid(b)];
    assert.ok(ra && rb && ra !== rb && ra.startsWith(a.id) && rb.startsWith(b.id));
    assert.ok(existsSync(path.join(fx.dataDir, 'sandboxes', a.id, 'sock')) && existsSync(path.join(fx.dataDir, 'sandboxes', b.id, 'sock')));

    // In use: cannot be removed.
    const rm = await api(fx, 'DELETE', '/v1/templates/app');
    assert.equal(rm.status, 409);
    assert.equal(rm.body.error.code, 'TEMPLATE_IN_USE');
    await a.kill();
    await b.kill();
    const before = cacheEntries();
    await Templates.remove('app', fx.conn);
    assert.equal((await api(fx, 'GET', '/v1/templates/app')).body.error.code, 'TEMPLATE_NOT_FOUND');
    assert.ok([...before].length > [...cacheEntries()].length, 'its root file system was deleted');
  });

  it('builds from a docker save tarball; the name must be new', async () => {
    const file = await makeDockerSave(work, { marker });
    const t = await Templates.build({ ...fx.conn, name: 'dock', image: file });
    assert.equal(t.source.format, 'docker');
    const sb = await fx.create({ template: 'dock' });
    assert.equal((await sb.commands.run('cat /opt/app/hello.txt; ls /opt/app')).stdout, `hello from the image ${marker}\nhello.txt\nlayer2.txt\n`);
    await sb.kill();
    await assert.rejects(Templates.build({ ...fx.conn, name: 'dock', image: file }), { code: 'TEMPLATE_EXISTS' });
    await assert.rejects(Templates.build({ ...fx.conn, name: 'minimal', image: file }), { code: 'TEMPLATE_EXISTS' });
    await Templates.remove('dock', fx.conn);
  });

  it('a second tenant neither sees nor uses another tenant\'s template', async () => {
    const file = await makeOciImage(work, { marker: `${marker}t` });
    await Templates.build({ ...fx.conn, name: 'private', image: file });
    const other = await api(fx, 'POST', '/v1/keys', { json: { tenant: 'other' } });
    const conn2 = { ...fx.conn, apiKey: other.body.key };
    assert.deepEqual((await Templates.list(conn2)).map((t) => t.name).sort(), ['base', 'minimal']);
    await assert.rejects(Sandbox.create({ ...conn2, template: 'private' }), { code: 'TEMPLATE_NOT_FOUND' });
    await assert.rejects(Templates.remove('private', conn2), { code: 'TEMPLATE_NOT_FOUND' });
    await Templates.remove('private', fx.conn);
  });

  it('warm pool: creates take a ready sandbox that gets its own identity; the pool refills and drains', async () => {
    const file = await makeOciImage(work, { marker: `${marker}p` });
    await Templates.build({ ...fx.conn, name: 'pooled', image: file, poolSize: 2 });
    await eventually(async () => (await Templates.get('pooled', fx.conn)).pool.ready === 2, { tries: 600 });
    const sb = await fx.create({ template: 'pooled', memoryMb: 512, env: { WHO: 'pool-user' } });
    assert.equal(sb.info.createTimings.source, 'pool');
    assert.equal(sb.info.template, 'pooled');
    assert.equal((await sb.commands.run('echo $WHO $SPACE_SANDBOX_ID; hostname')).stdout, `pool-user ${sb.id}\n${sb.id}\n`);
    // Another size than the pool's restores instead.
    const big = await fx.create({ template: 'pooled', memoryMb: 768 });
    assert.equal(big.info.createTimings.source, 'snapshot');
    await eventually(async () => (await Templates.get('pooled', fx.conn)).pool.ready === 2, { tries: 600 });
    const t = await Templates.setPool('pooled', 0, fx.conn);
    assert.deepEqual(t.pool, { size: 0, ready: 0 });
    await sb.kill();
    await big.kill();
    await Templates.remove('pooled', fx.conn);
    // Built-in pools are the node's: a tenant key that is not admin may not size them.
    const user = await api(fx, 'POST', '/v1/keys', { json: {} });
    const r = await api(fx, 'PUT', '/v1/templates/minimal/pool', { key: user.body.key, json: { size: 1 } });
    assert.equal(r.status, 403);
  });

  it('bad input: unknown template, broken tarball, corrupt layer, start command that fails or never gets ready — clear codes, nothing left', async () => {
    const beforeCache = cacheEntries();
    const r = await api(fx, 'POST', '/v1/sandboxes', { json: { template: 'nope' } });
    assert.equal(r.status, 404);
    assert.equal(r.body.error.code, 'TEMPLATE_NOT_FOUND');
    assert.ok(r.body.error.details.available.includes('minimal'));

    const junk = path.join(work, 'junk.tar');
    writeFileSync(junk, Buffer.alloc(10_000, 7));
    await assert.rejects(Templates.build({ ...fx.conn, name: 'junk', image: junk }), (e) => e.code === 'TEMPLATE_IMAGE_INVALID' && /tar/.test(e.message));
    const corrupt = await makeOciImage(work, { marker: `${marker}c`, corrupt: true });
    await assert.rejects(Templates.build({ ...fx.conn, name: 'corrupt', image: corrupt }), (e) => e.code === 'TEMPLATE_IMAGE_INVALID' && /does not match its digest/.test(e.message));

    const good = await makeOciImage(work, { marker: `${marker}s` });
    await assert.rejects(Templates.build({ ...fx.conn, name: 'exits', image: good, start: { cmd: 'echo boom; exit 3', readyCmd: 'test -f /nonexistent' } }), (e) => e.code === 'TEMPLATE_START_FAILED' && /code 3/.test(e.message) && /boom/.test(e.message));
    await assert.rejects(Templates.build({ ...fx.conn, name: 'slow', image: good, start: { cmd: 'sleep 1000', readyCmd: 'test -f /never', readyTimeoutMs: 1000 } }), (e) => e.code === 'TEMPLATE_START_TIMEOUT');
    await assert.rejects(Templates.build({ ...fx.conn, name: 'Bad Name', image: good }), { code: 'BAD_REQUEST' });
    await assert.rejects(Templates.build({ ...fx.conn, name: 'nopkg', packages: ['space-no-such-package-xyz'] }), (e) => e.code === 'TEMPLATE_BUILD_FAILED' && /space-no-such-package-xyz/.test(e.message));

    assert.deepEqual((await Templates.list(fx.conn)).map((t) => t.name).sort(), ['base', 'minimal'], 'no half-built template is listed');
    assert.deepEqual([...cacheEntries()].filter((e) => !beforeCache.has(e)), [], 'no root file system left behind');
    assert.deepEqual(readdirSync(templateImagesDir(fx.dataDir)).filter((d) => !d.startsWith('minimal-')), [], 'no template snapshot left behind');
    const stored = path.join(fx.dataDir, 'blobs', 'templates', 'default');
    assert.deepEqual(existsSync(stored) ? readdirSync(stored) : [], [], 'no stored template image left behind');
    assert.deepEqual(readdirSync(path.join(fx.dataDir, 'uploads')).flatMap((d) => readdirSync(path.join(fx.dataDir, 'uploads', d))), [], 'uploads are consumed');
  });
});
