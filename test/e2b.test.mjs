// The published `e2b` SDK (pinned in package.json; `npm run check:e2b-latest` runs the newest), unchanged, against SPACE's E2B-compatible
// API: lifecycle, commands, PTY, files, pause/resume, fork, metrics, tenant isolation, and a
// clear error for what SPACE does not do.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
// SPACE_E2B_SDK points at another build of the SDK (scripts/check-e2b-latest.mjs: the newest).
const { CommandExitError, NotFoundError, Sandbox, SandboxNotFoundError, Volume, VolumeNotFoundError, VolumePathNotFoundError } = await import(process.env.SPACE_E2B_SDK ?? 'e2b');
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { api, cliRunner, eventually, startTestDaemon } from './helpers.mjs';

const curl = (args) => new Promise((resolve) => execFile('curl', ['-s', '--max-time', '60', ...args], (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr })));

describe('E2B-compatible API (e2b SDK)', () => {
  let fx;
  let opts;
  const made = [];
  const create = async (o = {}) => {
    const sb = await Sandbox.create('base', { ...opts, ...o });
    made.push(sb.sandboxId);
    fx.track(sb.sandboxId);
    return sb;
  };
  before(async () => {
    // Usage sampled every 300 ms so that a metrics series builds up within the test.
    fx = await startTestDaemon({ usageSampleMs: 300 });
    const key = await api(fx, 'POST', '/v1/keys', { json: { format: 'e2b', name: 'e2b' } });
    assert.match(key.body.key, /^e2b_[0-9a-f]{40}$/);
    const url = (await api(fx, 'GET', '/v1/e2b')).body.url;
    opts = { apiKey: key.body.key, apiUrl: url, sandboxUrl: url };
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('create with metadata and env vars; info; list with filters and pages; kill', async () => {
    const a = await create({ metadata: { suite: 'e2b', n: '1' }, envs: { FOO: 'bar' } });
    const b = await create({ metadata: { suite: 'e2b', n: '2' } });
    assert.match(a.sandboxId, /^[a-z0-9]+$/);
    assert.equal((await a.commands.run('echo $FOO')).stdout, 'bar\n');
    const info = await a.getInfo();
    assert.equal(info.state, 'running');
    assert.deepEqual(info.metadata, { suite: 'e2b', n: '1' });
    assert.equal(info.templateId, 'base');
    assert.ok(info.memoryMB > 0 && info.cpuCount >= 1 && info.endAt > info.startedAt);

    const only = await Sandbox.list({ ...opts, query: { metadata: { suite: 'e2b', n: '2' } } }).nextItems();
    assert.deepEqual(only.map((s) => s.sandboxId), [b.sandboxId]);
    const pager = Sandbox.list({ ...opts, limit: 1, query: { metadata: { suite: 'e2b' } } });
    const seen = [];
    while (pager.hasNext) seen.push(...(await pager.nextItems()).map((s) => s.sandboxId));
    assert.deepEqual(seen.sort(), [a.sandboxId, b.sandboxId].sort(), 'two pages of one');

    assert.equal(await a.isRunning(), true);
    await b.kill();
    assert.equal(await Sandbox.kill(b.sandboxId, opts), false, 'a killed sandbox is not found');
    await assert.rejects(Sandbox.connect(b.sandboxId, opts));
  });

  it('commands: exit codes, env, cwd, user, background + connect, stdin, kill, list', async () => {
    const sb = await create();
    const r = await sb.commands.run('echo out; echo err >&2; pwd; whoami', { envs: { X: '1' }, cwd: '/tmp' });
    assert.deepEqual([r.exitCode, r.stdout, r.stderr], [0, 'out\n/tmp\nuser\n', 'err\n']);
    assert.equal((await sb.commands.run('whoami', { user: 'root' })).stdout, 'root\n');
    assert.equal((await sb.commands.run('echo $X', { envs: { X: 'per-command' } })).stdout, 'per-command\n');
    const err = await sb.commands.run('echo nope >&2; exit 7').catch((e) => e);
    assert.ok(err instanceof CommandExitError);
    assert.equal(err.exitCode, 7);
    assert.equal(err.stderr, 'nope\n');

    // background, then connect from another handle (both get the output, as in E2B), stdin, then kill
    const chunks = [];
    const again = [];
    const h = await sb.commands.run('read line; echo "got $line"; sleep 1000', { background: true, stdin: true, onStdout: (d) => chunks.push(d) });
    assert.ok(h.pid > 0);
    const listed = await sb.commands.list();
    assert.ok(listed.some((p) => p.pid === h.pid));
    const second = await sb.commands.connect(h.pid, { onStdout: (d) => again.push(d) });
    await sb.commands.sendStdin(h.pid, 'hello\n');
    await eventually(() => chunks.join('').includes('got hello') && again.join('').includes('got hello'), { tries: 300 });
    assert.deepEqual([chunks.join(''), again.join('')], ['got hello\n', 'got hello\n']);
    assert.equal(await sb.commands.kill(h.pid), true);
    const end = await second.wait().catch((e) => e);
    assert.ok(end instanceof CommandExitError, 'a killed command ends with an error');
    assert.ok(!(await sb.commands.list()).some((p) => p.pid === h.pid));
  });

  it('PTY: create, input, resize, ^C, kill', async () => {
    const sb = await create();
    let out = '';
    const pty = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => (out += Buffer.from(d).toString()) });
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo pty-$((6*7))\n'));
    const until = (re) => eventually(() => re.test(out), { tries: 300 }).catch(() => assert.match(out, re));
    await until(/24 80/);
    await until(/pty-42/);
    await sb.pty.resize(pty.pid, { cols: 100, rows: 30 });
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'));
    await until(/30 100/);
    // ^C stops the foreground job, as in any terminal (typed once the job runs).
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('sleep 100\n'));
    await eventually(async () => (await sb.commands.run('pgrep -x -f "sleep 100" || true')).stdout.trim() !== '', { tries: 100 });
    await sb.pty.sendInput(pty.pid, new Uint8Array([3]));
    await sb.pty.sendInput(pty.pid, new TextEncoder().encode('echo "rc=$?"\n'));
    await until(/rc=130/);
    assert.equal(await sb.pty.kill(pty.pid), true);
  });

  it('files: write text/bytes/stream, read, list with depth, exists, makeDir, rename, remove, watch', async () => {
    const sb = await create();
    await sb.files.write('/tmp/t/a.txt', 'text');
    await sb.files.write('/tmp/t/b.bin', new Uint8Array([0, 1, 2, 255]));
    await sb.files.write('/tmp/t/c.txt', new Blob(['streamed ', 'data']).stream());
    await sb.files.write('rel.txt', 'in home');
    assert.equal(await sb.files.read('/tmp/t/a.txt'), 'text');
    assert.deepEqual([...(await sb.files.read('/tmp/t/b.bin', { format: 'bytes' }))], [0, 1, 2, 255]);
    assert.equal(await sb.files.read('/tmp/t/c.txt'), 'streamed data');
    assert.equal(await sb.files.read('/home/user/rel.txt'), 'in home');
    assert.equal(await sb.files.makeDir('/tmp/t/sub/deep'), true);
    assert.equal(await sb.files.makeDir('/tmp/t/sub/deep'), false, 'exists already');
    const flat = await sb.files.list('/tmp/t');
    assert.deepEqual(flat.map((e) => `${e.name}:${e.type}`).sort(), ['a.txt:file', 'b.bin:file', 'c.txt:file', 'sub:dir']);
    const deep = await sb.files.list('/tmp/t', { depth: 3 });
    assert.ok(deep.some((e) => e.path === '/tmp/t/sub/deep' && e.type === 'dir'));
    assert.equal(await sb.files.exists('/tmp/t/a.txt'), true);
    assert.equal(await sb.files.exists('/tmp/t/nope'), false);
    const moved = await sb.files.rename('/tmp/t/a.txt', '/tmp/t/renamed.txt');
    assert.equal(moved.path, '/tmp/t/renamed.txt');
    await sb.files.remove('/tmp/t/sub');
    assert.equal(await sb.files.exists('/tmp/t/sub'), false);
    await assert.rejects(sb.files.read('/tmp/t/missing'), (e) => e instanceof NotFoundError);

    const events = [];
    const w = await sb.files.watchDir('/tmp/t', (e) => events.push(`${e.type} ${e.name}`), { recursive: true });
    await sb.files.write('/tmp/t/new.txt', 'x');
    await sb.commands.run('mkdir -p /tmp/t/d && echo y > /tmp/t/d/inner.txt && rm /tmp/t/c.txt');
    const want = ['create new.txt', 'create d/inner.txt', 'remove c.txt'];
    await eventually(() => want.every((x) => events.includes(x)), { tries: 300 }).catch(() => {});
    assert.deepEqual(want.filter((x) => !events.includes(x)), [], `events: ${events.join(', ')}`);
    await w.stop();
  });

  it('set timeout, metrics, pause and connect (resume) with files and processes intact, fork', async () => {
    const sb = await create();
    await sb.setTimeout(600_000);
    assert.ok((await sb.getInfo()).endAt.getTime() > Date.now() + 500_000);
    const metrics = await sb.getMetrics();
    assert.ok(metrics.length >= 1 && metrics[0].memUsed > 0 && metrics[0].cpuCount >= 1, JSON.stringify(metrics));

    await sb.files.write('/tmp/state.txt', 'kept');
    await sb.commands.run('python3 -c "import time\nwhile True: time.sleep(1)" >/dev/null 2>&1 &', { background: false });
    assert.equal(await sb.pause(), true);
    assert.equal((await sb.getInfo()).state, 'paused');
    assert.equal(await sb.isRunning(), false);
    assert.equal(await Sandbox.pause(sb.sandboxId, opts), false, 'pausing a paused sandbox says so');
    const back = await Sandbox.connect(sb.sandboxId, opts);
    assert.equal((await back.getInfo()).state, 'running');
    assert.equal(await back.files.read('/tmp/state.txt'), 'kept');
    assert.match((await back.commands.run('ps -eo args')).stdout, /time\.sleep/, 'the process survived the pause');

    const forks = await sb.fork({ count: 2 });
    assert.equal(forks.length, 2);
    for (const f of forks) {
      assert.ok(f instanceof Sandbox, String(f));
      made.push(f.sandboxId);
      fx.track(f.sandboxId);
      assert.equal(await f.files.read('/tmp/state.txt'), 'kept');
    }
    await forks[0].files.write('/tmp/state.txt', 'diverged');
    assert.equal(await forks[1].files.read('/tmp/state.txt'), 'kept');
  });

  it('another tenant\'s E2B key sees and touches nothing; a bad access token is refused', async () => {
    const sb = await create();
    const other = await api(fx, 'POST', '/v1/keys', { json: { tenant: 'someone-else', format: 'e2b' } });
    const o2 = { ...opts, apiKey: other.body.key };
    assert.deepEqual(await Sandbox.list(o2).nextItems(), []);
    await assert.rejects(Sandbox.getInfo(sb.sandboxId, o2), (e) => e instanceof NotFoundError);
    assert.equal(await Sandbox.kill(sb.sandboxId, o2), false);
    await assert.rejects(Sandbox.connect(sb.sandboxId, o2));
    const forged = await fetch(`${opts.sandboxUrl}/files?path=/etc/hostname`, { headers: { 'E2b-Sandbox-Id': sb.sandboxId, 'X-Access-Token': 'c29tZW9uZS1lbHNl.forged' } });
    assert.equal(forged.status, 401);
    assert.equal((await forged.json()).code, 401);
    assert.equal((await sb.commands.run('true')).exitCode, 0, 'still fine for its owner');
  });

  it('`space e2b env` gives the four settings; with them in the environment the SDK needs no options', async () => {
    const home = mkdtempSync('/tmp/spe-home-');
    const space = cliRunner(home, { SPACE_URL: fx.url, SPACE_API_KEY: fx.key });
    const r = await space('e2b', 'env');
    assert.equal(r.code, 0, r.stderr);
    const env = Object.fromEntries(r.stdout.trim().split('\n').map((l) => l.split('=')));
    assert.deepEqual(Object.keys(env), ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_VOLUME_API_URL', 'E2B_API_KEY']);
    assert.equal(env.E2B_VOLUME_API_URL, opts.apiUrl);
    assert.equal(env.E2B_API_URL, opts.apiUrl);
    assert.match(env.E2B_API_KEY, /^e2b_[0-9a-f]{40}$/);
    assert.equal((await space('e2b', 'env')).stdout, r.stdout, 'the key is made once and reused');
    rmSync(home, { recursive: true, force: true });
    const saved = { ...process.env };
    Object.assign(process.env, env);
    try {
      const sb = await Sandbox.create();
      made.push(sb.sandboxId);
      fx.track(sb.sandboxId);
      assert.equal((await sb.commands.run('echo $((20+22))')).stdout, '42\n');
      await sb.kill();
    } finally {
      for (const k of Object.keys(env)) if (saved[k] === undefined) delete process.env[k];
    }
  });

  it('files.write of several files writes each at its own path; remove of a missing path does not throw; fork of a killed sandbox is SandboxNotFoundError', async () => {
    const sb = await create();
    const written = await sb.files.write([
      { path: '/tmp/multi/a/one.txt', data: 'one' },
      { path: '/tmp/multi/b/c/two.txt', data: 'two' },
    ]);
    assert.deepEqual(written.map((w) => w.path), ['/tmp/multi/a/one.txt', '/tmp/multi/b/c/two.txt']);
    assert.equal(await sb.files.read('/tmp/multi/a/one.txt'), 'one');
    assert.equal(await sb.files.read('/tmp/multi/b/c/two.txt'), 'two');
    assert.equal(await sb.files.exists('/home/user/one.txt'), false, 'not flattened into the home directory');
    await sb.files.remove('/tmp/multi/never-existed');
    await sb.files.remove('/tmp/multi/a/one.txt');
    assert.equal(await sb.files.exists('/tmp/multi/a/one.txt'), false);
    const id = sb.sandboxId;
    await sb.kill();
    await assert.rejects(Sandbox.fork(id, opts), (err) => err instanceof SandboxNotFoundError);
  });

  it('entry info names owner and group, gives a symlink\'s absolute target; connect to a missing pid rejects', async () => {
    const sb = await create();
    const passwd = await sb.files.getInfo('/etc/passwd');
    assert.deepEqual([passwd.owner, passwd.group], ['root', 'root']);
    await sb.files.write('/home/user/owned.txt', 'x');
    const mine = await sb.files.getInfo('/home/user/owned.txt');
    assert.deepEqual([mine.owner, mine.group], ['user', 'user']);
    await sb.commands.run('cd /tmp && ln -s ../etc/hostname rel && ln -s /etc/passwd abs');
    assert.equal((await sb.files.getInfo('/tmp/rel')).symlinkTarget, '/etc/hostname');
    assert.equal((await sb.files.getInfo('/tmp/abs')).symlinkTarget, '/etc/passwd');
    assert.ok((await sb.files.list('/tmp')).some((e) => e.name === 'rel' && e.symlinkTarget === '/etc/hostname' && e.owner === 'user'));
    await assert.rejects(sb.commands.connect(999999));
    await sb.kill();
  });

  it('list: order, template and startedAfter filter across pages as E2B\'s API does', async () => {
    const tag = { suite: `list-${Date.now()}` };
    const a = await create({ metadata: tag });
    await new Promise((r) => setTimeout(r, 20));
    const mid = new Date();
    await new Promise((r) => setTimeout(r, 20));
    const b = await Sandbox.create('minimal', { ...opts, metadata: tag });
    made.push(b.sandboxId);
    fx.track(b.sandboxId);
    const ids = async (o) => (await Sandbox.list({ ...opts, ...o, query: { metadata: tag, ...(o.query ?? {}) } }).nextItems()).map((x) => x.sandboxId);
    assert.deepEqual(await ids({ order: 'asc' }), [a.sandboxId, b.sandboxId]);
    assert.deepEqual(await ids({ order: 'desc' }), [b.sandboxId, a.sandboxId]);
    assert.deepEqual(await ids({ query: { template: 'minimal' } }), [b.sandboxId]);
    assert.deepEqual(await ids({ query: { startedAfter: mid } }), [b.sandboxId]);
    const pager = Sandbox.list({ ...opts, query: { metadata: tag }, order: 'asc', limit: 1 });
    assert.deepEqual((await pager.nextItems()).map((x) => x.sandboxId), [a.sandboxId]);
    assert.equal(pager.hasNext, true);
    assert.deepEqual((await pager.nextItems()).map((x) => x.sandboxId), [b.sandboxId]);
    const bad = await fetch(`${opts.apiUrl}/v2/sandboxes?order=sideways`, { headers: { 'X-API-KEY': opts.apiKey } });
    assert.equal(bad.status, 400);
    await a.kill();
    await b.kill();
  });

  it('snapshots: Sandbox.create(snapshotId) starts from it (twice), listSnapshots filters by name, deleteSnapshot deletes', async () => {
    const sb = await create();
    await sb.files.write('/home/user/state.txt', 'from the snapshot');
    const keep = await sb.createSnapshot({ name: 'keep' });
    const other = await sb.createSnapshot({ name: 'other' });
    await sb.files.write('/home/user/state.txt', 'changed later');
    const byName = await Sandbox.listSnapshots({ ...opts, sandboxId: sb.sandboxId, name: 'keep' }).nextItems();
    assert.deepEqual(byName.map((x) => x.snapshotId), [keep.snapshotId]);
    for (let i = 0; i < 2; i++) {
      const copy = await Sandbox.create(keep.snapshotId, opts);
      made.push(copy.sandboxId);
      fx.track(copy.sandboxId);
      assert.notEqual(copy.sandboxId, sb.sandboxId);
      assert.equal(await copy.files.read('/home/user/state.txt'), 'from the snapshot');
      await copy.kill();
    }
    assert.equal(await Sandbox.deleteSnapshot(other.snapshotId, opts), true);
    assert.equal(await Sandbox.deleteSnapshot(other.snapshotId, opts), false, 'gone: 404');
    const left = await Sandbox.listSnapshots({ ...opts, sandboxId: sb.sandboxId }).nextItems();
    assert.deepEqual(left.map((x) => x.snapshotId), [keep.snapshotId]);
    await assert.rejects(Sandbox.create('sn000000000000000000', opts));
    // The snapshot a paused (hibernated) sandbox sleeps in holds its state: not deletable.
    await sb.pause();
    const sleeping = (await Sandbox.listSnapshots({ ...opts, sandboxId: sb.sandboxId }).nextItems()).at(-1);
    assert.notEqual(sleeping.snapshotId, keep.snapshotId);
    await assert.rejects(Sandbox.deleteSnapshot(sleeping.snapshotId, opts), /wake or kill the sandbox first/);
    await Sandbox.kill(sb.sandboxId, opts);
  });

  it('a command whose sandbox is killed under it ends with the SDK\'s end-of-life TimeoutError, not a command exit', async () => {
    const sb = await create();
    const running = sb.commands.run('sleep 60').then(() => undefined, (err) => err);
    await eventually(async () => (await sb.commands.list()).some((p) => p.cmd === '/bin/bash' || p.args?.join(' ').includes('sleep 60')), { tries: 100 });
    await Sandbox.kill(sb.sandboxId, opts);
    const err = await running;
    assert.ok(err, 'the command did not end in an error');
    // (by name: the SDK may throw it from its CommonJS build, another class object)
    assert.equal(err.name, 'TimeoutError', `${err.name}: ${err.message}`);
    assert.match(err.message, /sandbox ended while the command ran/);
  });

  it('setTimeout shortens as well as extends; connect() never shortens a running sandbox\'s timeout', async () => {
    const sb = await create({ timeoutMs: 3_600_000 });
    const endsIn = async () => Date.parse((await sb.getInfo()).endAt) - Date.now();
    assert.ok((await endsIn()) > 3_500_000);
    await Sandbox.connect(sb.sandboxId, { ...opts, timeoutMs: 60_000 });
    assert.ok((await endsIn()) > 3_500_000, 'connect with a shorter timeout leaves the hour');
    await sb.setTimeout(30_000);
    const short = await endsIn();
    assert.ok(short > 0 && short <= 30_000, `setTimeout(30 s) shortened it (ends in ${short} ms)`);
    await Sandbox.connect(sb.sandboxId, { ...opts, timeoutMs: 600_000 });
    assert.ok((await endsIn()) > 590_000, 'connect with a longer timeout extends it');
    await sb.kill();
  });

  it('allowInternetAccess: true (what SDKs before 2.51 send on every create) opens public destinations through the proxy', async () => {
    const open = await create({ allowInternetAccess: true });
    assert.equal((await api(fx, 'GET', `/v1/sandboxes/${open.sandboxId}/egress`)).body.publicInternet, true);
    const closed = await create({ allowInternetAccess: false });
    assert.equal((await api(fx, 'GET', `/v1/sandboxes/${closed.sandboxId}/egress`)).body.publicInternet, undefined, 'false keeps SPACE\'s default deny');
    for (const sb of [open, closed]) await sb.kill();
  });

  for (const version of ['2.45.0', '2.50.0']) {
    it(`the e2b SDK ${version} (sends allowInternetAccess: true by default) creates, runs a command and kills`, async () => {
      const old = await import(`e2b-${version.replace(/\./g, '-')}`);
      const sb = await old.Sandbox.create('base', opts);
      made.push(sb.sandboxId);
      fx.track(sb.sandboxId);
      assert.equal((await sb.commands.run('echo $((6*7))')).stdout, '42\n');
      await sb.kill();
    });
  }

  it('an operator can pin E2B sandboxes to deny (--e2b-internet deny): allowInternetAccess: true is then refused, saying so', async () => {
    const pinned = await startTestDaemon({ e2bInternet: 'deny' });
    try {
      const key = (await api(pinned, 'POST', '/v1/keys', { json: { format: 'e2b', name: 'e2b' } })).body.key;
      const url = (await api(pinned, 'GET', '/v1/e2b')).body.url;
      const o = { apiKey: key, apiUrl: url, sandboxUrl: url };
      await assert.rejects(Sandbox.create('minimal', { ...o, allowInternetAccess: true }), /switched off for E2B sandboxes on this SPACE node \(--e2b-internet deny\)/);
      const sb = await Sandbox.create('minimal', { ...o, allowInternetAccess: false });
      pinned.track(sb.sandboxId);
      assert.equal((await api(pinned, 'GET', `/v1/sandboxes/${sb.sandboxId}/egress`)).body.publicInternet, undefined);
    } finally {
      assert.deepEqual(await pinned.close(), []);
    }
  });

  it('signed file URLs (downloadUrl/uploadUrl) work as the SDK builds them, with no headers; bad and expired ones get envd\'s 401', async () => {
    const sb = await create();
    await sb.files.write('/tmp/signed.txt', 'by url');
    // A browser or curl: no E2B headers at all, only the URL.
    const down = await sb.downloadUrl('/tmp/signed.txt');
    assert.match(down, /[?&]signature=v1_/);
    const r = await fetch(down);
    assert.equal(r.status, 200);
    assert.equal(await r.text(), 'by url');
    const expiring = await sb.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 60 });
    assert.match(expiring, /signature_expiration=\d+/);
    assert.equal(await (await fetch(expiring)).text(), 'by url');
    const up = await sb.uploadUrl('/tmp/uploaded.txt');
    const form = new FormData();
    form.append('file', new Blob(['uploaded by url']), 'uploaded.txt');
    const u = await fetch(up, { method: 'POST', body: form });
    assert.equal(u.status, 200, await u.clone().text());
    assert.equal(await sb.files.read('/tmp/uploaded.txt'), 'uploaded by url');
    // A signature for reading is not one for writing, nor for another path.
    assert.equal((await fetch(down.replace('signed.txt', 'other.txt'))).status, 401);
    const wrongOp = await fetch(down, { method: 'POST', body: form });
    assert.equal(wrongOp.status, 401);
    assert.deepEqual(await wrongOp.json(), { code: 401, message: 'invalid signature' });
    const expired = await sb.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: -10 });
    const e = await fetch(expired);
    assert.equal(e.status, 401);
    assert.deepEqual(await e.json(), { code: 401, message: 'signature is already expired' });
    const tampered = new URL(down);
    tampered.searchParams.set('signature', 'v1_' + 'A'.repeat(43));
    assert.deepEqual(await (await fetch(tampered)).json(), { code: 401, message: 'invalid signature' });
    // Once the sandbox is gone its URLs are dead.
    await sb.kill();
    assert.equal((await fetch(down)).status, 401);
  });

  it('getMetrics returns a series over time and honours start and end', async () => {
    const sb = await create();
    await sb.commands.run('i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done');
    await eventually(async () => (await sb.getMetrics()).length >= 4, { tries: 100 });
    const all = await sb.getMetrics();
    const times = all.map((m) => m.timestamp.getTime());
    assert.deepEqual(times, [...times].sort((a, b) => a - b), 'oldest first');
    assert.ok(all.every((m) => m.memUsed > 0 && m.memTotal === 512 * 1048576 && m.cpuCount === 1 && m.cpuUsedPct >= 0), JSON.stringify(all[0]));
    // A window strictly inside the series: fewer samples, all within it (E2B's range is in whole seconds).
    const mid = new Date(Math.floor(times.at(-1) / 1000) * 1000);
    const later = await sb.getMetrics({ start: mid });
    assert.ok(later.length >= 1 && later.length < all.length + 5, `${later.length} of ${all.length}`);
    assert.ok(later.every((m) => m.timestamp.getTime() >= mid.getTime()));
    const earlier = await sb.getMetrics({ end: new Date(times[0] - 5000) });
    assert.deepEqual(earlier, [], 'nothing before the sandbox existed');
    await sb.kill();
  });

  it('watchDir reports changes promptly (a directory made and filled at once included); a missing path or a file is rejected', async () => {
    const sb = await create();
    await sb.files.makeDir('/tmp/w');
    const events = [];
    let onChange = () => {};
    const w = await sb.files.watchDir('/tmp/w', (e) => {
      events.push(`${e.type} ${e.name}`);
      onChange();
    }, { recursive: true });
    // Each step waits for its events (bounded: "promptly" is well under 10 s) before the next.
    const step = async (run, want) => {
      const seen = new Promise((resolve) => (onChange = () => want.every((x) => events.includes(x)) && resolve()));
      await run();
      onChange();
      let timer;
      await Promise.race([seen, new Promise((_, reject) => (timer = setTimeout(() => reject(new Error(`waiting for ${want}; events: ${events.join(', ')}`)), 10_000)))]);
      clearTimeout(timer);
    };
    await step(() => sb.files.write('/tmp/w/a.txt', '1'), ['create a.txt']);
    await step(() => sb.commands.run('echo 2 >> /tmp/w/a.txt'), ['write a.txt']);
    await step(() => sb.commands.run('mkdir /tmp/w/d && echo y > /tmp/w/d/inner.txt'), ['create d', 'create d/inner.txt']);
    await step(() => sb.commands.run('rm /tmp/w/a.txt'), ['remove a.txt']);
    assert.equal(events.filter((e) => e === 'remove a.txt').length, 1, events.join(', '));
    await w.stop();
    await assert.rejects(sb.files.watchDir('/tmp/nowhere', () => {}), (e) => e instanceof NotFoundError);
    await sb.files.write('/tmp/plain.txt', 'x');
    await assert.rejects(sb.files.watchDir('/tmp/plain.txt', () => {}), (e) => e.name === 'InvalidArgumentError' || /not a directory/.test(e.message));
    await sb.kill();
  });

  it('file metadata: written with the file, read by getInfo and list, kept across rename, overwrite and fork', async () => {
    const sb = await create();
    const w = await sb.files.write('/home/user/doc.txt', 'x', { metadata: { Owner: 'agent-7', 'step.n': '3' } });
    // Header names have no case: keys come back lowercased.
    assert.deepEqual(w.metadata, { owner: 'agent-7', 'step.n': '3' }, 'the write returns it');
    assert.deepEqual((await sb.files.getInfo('/home/user/doc.txt')).metadata, { owner: 'agent-7', 'step.n': '3' });
    // Several files in one call, and a streamed (octet-stream) upload.
    await sb.files.write([{ path: '/tmp/m/a.txt', data: 'a' }, { path: '/tmp/m/b.txt', data: 'b' }], { metadata: { batch: '1' } });
    await sb.files.write('/tmp/m/c.txt', new Blob(['c']).stream(), { metadata: { streamed: 'yes' } });
    await sb.files.write('/tmp/m/plain.txt', 'p');
    const listed = Object.fromEntries((await sb.files.list('/tmp/m')).map((e) => [e.name, e.metadata]));
    assert.deepEqual(listed, { 'a.txt': { batch: '1' }, 'b.txt': { batch: '1' }, 'c.txt': { streamed: 'yes' }, 'plain.txt': undefined });
    // A rename keeps it (it lives on the file, not its name); an overwrite merges keys.
    const moved = await sb.files.rename('/home/user/doc.txt', '/home/user/renamed.txt');
    assert.deepEqual(moved.metadata, { owner: 'agent-7', 'step.n': '3' });
    await sb.files.write('/home/user/renamed.txt', 'y', { metadata: { 'step.n': '4' } });
    assert.deepEqual((await sb.files.getInfo('/home/user/renamed.txt')).metadata, { owner: 'agent-7', 'step.n': '4' });
    assert.equal(await sb.files.read('/home/user/renamed.txt'), 'y');
    // A bad key is refused by the SDK; one the SDK lets through but SPACE cannot store writes nothing.
    await assert.rejects(sb.files.write('/tmp/bad.txt', 'x', { metadata: { 'a b': 'c' } }), /Invalid metadata key/);
    await assert.rejects(sb.files.write('/tmp/long.txt', 'x', { metadata: { k: 'v'.repeat(5000) } }), /metadata value/);
    assert.equal(await sb.files.exists('/tmp/long.txt'), false, 'nothing was written');
    // In a snapshot's copy it is there too.
    const [fork] = await sb.fork({ count: 1 });
    assert.deepEqual((await fork.files.getInfo('/home/user/renamed.txt')).metadata, { owner: 'agent-7', 'step.n': '4' });
    await fork.kill();
    await sb.kill();
  });

  it('ports: getHost(port) reaches a server inside (public, as in E2B); allowPublicTraffic: false needs the trafficAccessToken; maskRequestHost; autoResume wakes it on a request', async () => {
    // A server that answers with the Host header it got and a count kept in memory.
    const server = `import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        body = f"{self.headers['host']} {n}".encode()
        self.send_response(200); self.send_header('content-length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
`;
    const serve = async (sb) => {
      await sb.files.write('/tmp/serve.py', server);
      await sb.commands.run('python3 /tmp/serve.py', { background: true });
    };
    const pub = await create();
    await serve(pub);
    const host = pub.getHost(8000);
    assert.match(host, new RegExp(`^8000-${pub.sandboxId}\\.localhost:\\d+$`), 'the sandbox\'s domain is the ingress\'s');
    assert.equal(pub.trafficAccessToken, undefined, 'a public sandbox has no traffic token');
    // The URL as the SDK gives it (curl resolves *.localhost to loopback, as browsers do).
    const first = await eventually(async () => {
      const r = await curl([`http://${host}/`]);
      return r.code === 0 && r.stdout.startsWith(host) && r;
    });
    assert.match(first.stdout, new RegExp(`^${host.replace(/\./g, '\\.')} \\d+$`), 'the client\'s Host reaches the server');
    // And from code, as an agent calls its own preview URL: Node's fetch resolves *.localhost
    // through the system (nss-myhostname, installed by the set-up).
    assert.match(await (await fetch(`http://${host}/`)).text(), new RegExp(`^${host.replace(/\./g, '\\.')} \\d+$`));
    assert.equal((await pub.getInfo()).network?.allowPublicTraffic, true);

    const priv = await create({ network: { allowPublicTraffic: false, maskRequestHost: 'localhost:${PORT}' }, lifecycle: { onTimeout: 'pause', autoResume: true } });
    await serve(priv);
    assert.match(priv.trafficAccessToken, /^tat_/);
    const url = `http://${priv.getHost(8000)}/`;
    const withToken = ['-H', `e2b-traffic-access-token: ${priv.trafficAccessToken}`, url];
    await eventually(async () => (await curl(withToken)).stdout.startsWith('localhost:8000'));
    assert.equal((await curl(['-o', '/dev/null', '-w', '%{http_code}', url])).stdout, '401', 'no token');
    assert.equal((await curl(['-o', '/dev/null', '-w', '%{http_code}', '-H', `e2b-traffic-access-token: ${priv.envdAccessToken ?? 'x'.repeat(40)}`, url])).stdout, '401', 'the envd token opens no port');
    const again = await Sandbox.connect(priv.sandboxId, opts);
    assert.equal(again.trafficAccessToken, priv.trafficAccessToken, 'connect hands the same token out');
    const info = await priv.getInfo();
    assert.deepEqual([info.network?.allowPublicTraffic, info.network?.maskRequestHost, info.lifecycle?.autoResume, info.lifecycle?.onTimeout], [false, 'localhost:${PORT}', true, 'pause']);

    // autoResume: paused (E2B's pause), a request wakes it and the server's memory is intact.
    const before = Number((await curl(withToken)).stdout.split(' ')[1]);
    await priv.pause();
    assert.equal((await priv.getInfo()).state, 'paused');
    const woken = await curl(withToken);
    assert.equal(woken.stdout, `localhost:8000 ${before + 1}`, 'woken by the request, with its state');
    assert.equal((await priv.getInfo()).state, 'running');
    await Promise.all([pub.kill(), priv.kill()]);
    assert.equal((await curl(['-o', '/dev/null', '-w', '%{http_code}', `http://${host}/`])).stdout, '404', 'a killed sandbox\'s ports are gone');
  });

  it('what SPACE cannot honour is refused with the SDK\'s error shape and says what', async () => {
    await assert.rejects(Sandbox.create('base', { ...opts, network: { allowOut: ['example.com'], rules: { '*': [{ transform: { headers: { 'X-A': 'b' } } }] } } }), /bare "\*" is not a host/);
    await assert.rejects(Sandbox.create('base', { ...opts, network: { allowOut: ['not a host!'] } }), /EGRESS_POLICY_INVALID|not a host|domain/i);
    await assert.rejects(Sandbox.create('no-such-template', opts), /TEMPLATE_NOT_FOUND/);
    await assert.rejects(Sandbox.create('base', { ...opts, network: { maskRequestHost: 'a b' } }), /Host header.*host name/);
    // A files-only pause is refused, never silently turned into a full one.
    await assert.rejects(Sandbox.create('base', { ...opts, lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } }), /keepMemory: false.*keeps memory/);
    const sb = await create();
    await assert.rejects(sb.pause({ keepMemory: false }), /keepMemory: false/);
    assert.equal((await sb.getInfo()).state, 'running');
    await sb.kill();
    const bad = await fetch(`${opts.apiUrl}/sandboxes`, { method: 'POST', headers: { 'X-API-KEY': 'e2b_0000000000000000000000000000000000000000', 'content-type': 'application/json' }, body: '{}' });
    assert.equal(bad.status, 401);
    assert.deepEqual(Object.keys(await bad.json()).sort(), ['code', 'message']);
  });
});

describe('E2B-compatible API with --e2b-public-traffic deny', () => {
  let fx, opts;
  before(async () => {
    fx = await startTestDaemon({ e2bPublicTraffic: 'deny' });
    const key = await api(fx, 'POST', '/v1/keys', { json: { format: 'e2b', name: 'e2b' } });
    const url = (await api(fx, 'GET', '/v1/e2b')).body.url;
    opts = { apiKey: key.body.key, apiUrl: url, sandboxUrl: url };
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('every port needs the traffic token, which create hands out; allowPublicTraffic: true is refused and makes nothing', async () => {
    const before = (await api(fx, 'GET', '/v1/sandboxes')).body.items.length;
    await assert.rejects(Sandbox.create('base', { ...opts, network: { allowPublicTraffic: true } }), /--e2b-public-traffic deny/);
    assert.equal((await api(fx, 'GET', '/v1/sandboxes')).body.items.length, before, 'no sandbox was made');
    const sb = await Sandbox.create('base', opts);
    fx.track(sb.sandboxId);
    assert.match(sb.trafficAccessToken, /^tat_/, 'private by the operator\'s rule');
    await sb.commands.run('cd /tmp && python3 -m http.server 8000', { background: true });
    const url = `http://${sb.getHost(8000)}/`;
    await eventually(async () => (await curl(['-o', '/dev/null', '-w', '%{http_code}', '-H', `e2b-traffic-access-token: ${sb.trafficAccessToken}`, url])).stdout === '200');
    assert.equal((await curl(['-o', '/dev/null', '-w', '%{http_code}', url])).stdout, '401');
    const ports = (await api(fx, 'GET', `/v1/sandboxes/${sb.sandboxId}/ports`)).body.ports;
    assert.deepEqual(ports.map((p) => [p.port, p.public, p.signedUrl]), [[0, false, undefined]]);
    assert.match(ports[0].url, new RegExp(`^http://\\{port\\}-${sb.sandboxId}\\.localhost:\\d+/$`));
    await sb.kill();
  });
});

describe('E2B-compatible API: volumes (a daemon with disks)', () => {
  let fx;
  let opts;
  before(async () => {
    // Volumes mount into gVisor sandboxes that have disks (their mount points land there).
    fx = await startTestDaemon({ disks: { mode: 'on' } });
    const key = await api(fx, 'POST', '/v1/keys', { json: { format: 'e2b', name: 'e2b' } });
    const url = (await api(fx, 'GET', '/v1/e2b')).body.url;
    opts = { apiKey: key.body.key, apiUrl: url, sandboxUrl: url };
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('volumes: Volume.create, files written and read without a sandbox, volumeMounts on create, one writer at a time, destroy', async () => {
    // The SDK's volume content client goes to E2B_VOLUME_API_URL (SPACE's E2B listener).
    process.env.E2B_VOLUME_API_URL = opts.apiUrl;
    try {
      const vol = await Volume.create('e2b-vol', opts);
      assert.match(vol.volumeId, /^vol-/);
      await vol.writeFile('/in/hello.txt', 'from the SDK');
      await vol.makeDir('/out');
      assert.deepEqual((await vol.list('/')).map((e) => `${e.name}:${e.type}`), ['in:directory', 'out:directory']);
      assert.equal((await vol.getInfo('/in/hello.txt')).size, 12);
      assert.ok((await vol.getInfo('/in/hello.txt')).mtime instanceof Date);
      assert.equal(await vol.exists('/nope'), false);
      await assert.rejects(vol.readFile('/nope'), VolumePathNotFoundError);
      assert.deepEqual((await Volume.list(opts)).map((v) => v.name), ['e2b-vol']);
      const again = await Volume.connect(vol.volumeId, opts);
      assert.equal(await again.readFile('/in/hello.txt'), 'from the SDK');
      const sb = await Sandbox.create('base', { ...opts, volumeMounts: { '/data': vol } });
      fx.track(sb.sandboxId);
      assert.equal((await sb.commands.run('cat /data/in/hello.txt && echo inside > /data/out/x.txt')).stdout, 'from the SDK');
      assert.deepEqual((await sb.getInfo()).volumeMounts, [{ name: 'e2b-vol', path: '/data' }]);
      await assert.rejects(Sandbox.create('base', { ...opts, volumeMounts: { '/data': 'e2b-vol' } }), /VOLUME_IN_USE/);
      await assert.rejects(vol.writeFile('/y', 'y'), /VOLUME_IN_USE/);
      await sb.kill();
      assert.equal(await vol.readFile('/out/x.txt'), 'inside\n');
      await vol.remove('/out/x.txt');
      assert.equal(await vol.exists('/out/x.txt'), false);
      // Another volume's token opens nothing here.
      const other = await Volume.create('e2b-other', opts);
      const forged = new Volume(vol.volumeId, vol.name, other.token, undefined, false);
      await assert.rejects(forged.readFile('/in/hello.txt'), /UNAUTHENTICATED|401/);
      assert.equal(await Volume.destroy(other.volumeId, opts), true);
      assert.equal(await Volume.destroy(vol.volumeId, opts), true);
      assert.equal(await Volume.destroy(vol.volumeId, opts), false);
      await assert.rejects(Volume.getInfo(vol.volumeId, opts), VolumeNotFoundError);
      await assert.rejects(Sandbox.create('base', { ...opts, volumeMounts: { '/data': 'e2b-vol' } }), /VOLUME_NOT_FOUND/);
    } finally {
      delete process.env.E2B_VOLUME_API_URL;
    }
  });

});
