// Named volumes (issue 23) on gVisor: a tenant's persistent, size-bounded file systems that
// outlive sandboxes, encrypted at rest; mounted read-write by one sandbox or read-only by many;
// kept through hibernation, snapshots and forks (not rolled back with them); their own
// snapshots; files copied in and out without a sandbox; the daemon SIGKILLed while a sandbox
// writes one and while one is being copied.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Sandbox, Volumes } from '../packages/sdk/dist/index.js';
import { cliRunner, contentsAtRest, crashableSpaced, eventually, rejectionCode, startTestDaemon } from './helpers.mjs';

/** Whether the volume's image is a clean ext4 (it must be closed). */
function fsckClean(dataDir, volumeId) {
  const r = spawnSync('e2fsck', ['-fn', path.join(dataDir, 'volumes', volumeId, 'volume.img')], { encoding: 'utf8' });
  return r.status === 0 || `${r.status}: ${r.stdout}${r.stderr}`;
}

describe('volumes (gVisor)', () => {
  let fx;
  before(async () => {
    fx = await startTestDaemon({ disks: { mode: 'on' } });
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('a volume written by one sandbox is read by another after the first is killed; a second writer is refused; :ro mounts share it and refuse writes', async () => {
    const v = await Volumes.create('shared', { ...fx.conn, sizeMb: 256 });
    assert.deepEqual([v.name, v.sizeMb, v.mountedBy], ['shared', 256, []]);
    const a = await fx.create({ template: 'minimal', volumes: [{ volume: 'shared', path: '/data' }] });
    assert.deepEqual(a.info.volumes, [{ volume: 'shared', path: '/data' }]);
    const w = await a.commands.run('echo from-a > /data/a.txt && id -u && stat -c %U /data && touch ~/in-my-home', { user: 'user' });
    assert.equal(w.exitCode, 0, w.stderr);
    assert.equal(w.stdout, '1000\nuser\n', 'the default user owns the volume (and, in minimal, its home)');
    assert.equal(await rejectionCode(fx.create({ template: 'minimal', volumes: [{ volume: 'shared', path: '/data' }] })), 'VOLUME_IN_USE');
    assert.equal(await rejectionCode(fx.create({ template: 'minimal', volumes: [{ volume: 'shared', path: '/data', readOnly: true }] })), 'VOLUME_IN_USE', 'no reader while a sandbox writes it');
    assert.equal(await rejectionCode(Volumes.remove('shared', fx.conn)), 'VOLUME_IN_USE');
    assert.deepEqual((await Volumes.get('shared', fx.conn)).mountedBy, [{ sandboxId: a.id, path: '/data', readOnly: false }]);
    await a.kill();
    assert.deepEqual((await Volumes.get('shared', fx.conn)).mountedBy, []);
    const r1 = await fx.create({ template: 'minimal', volumes: [{ volume: 'shared', path: '/mnt/in', readOnly: true }] });
    const r2 = await fx.create({ template: 'minimal', volumes: [{ volume: 'shared', path: '/mnt/in', readOnly: true }] });
    for (const r of [r1, r2]) assert.equal(await r.files.read('/mnt/in/a.txt'), 'from-a\n');
    const ro = await r1.commands.run('echo x > /mnt/in/b.txt');
    assert.notEqual(ro.exitCode, 0);
    assert.match(ro.stderr, /Read-only file system/);
    assert.equal(await rejectionCode(fx.create({ template: 'minimal', volumes: [{ volume: 'shared', path: '/data' }] })), 'VOLUME_IN_USE', 'no writer while sandboxes read it');
    await r1.kill();
    await r2.kill();
    await Volumes.remove('shared', fx.conn);
    assert.deepEqual(await Volumes.list(fx.conn), []);
    assert.deepEqual(readdirSync(path.join(fx.dataDir, 'volumes')).filter((n) => n.startsWith('vol-')), [], 'a removed volume leaves nothing');
  });

  it('bad input is refused with its code and changes nothing', async () => {
    await Volumes.create('ok', { ...fx.conn, sizeMb: 64 });
    const before = JSON.stringify(await Volumes.list(fx.conn));
    for (const sizeMb of [0, -1, 63, 10 ** 7]) assert.equal(await rejectionCode(Volumes.create('v2', { ...fx.conn, sizeMb })), 'INVALID_LIMITS', `sizeMb ${sizeMb}`);
    for (const name of ['', 'UPPER', '../x', 'a b', 'x'.repeat(64)]) assert.equal(await rejectionCode(Volumes.create(name, fx.conn)), 'BAD_REQUEST', `name ${JSON.stringify(name)}`);
    assert.equal(await rejectionCode(Volumes.create('ok', fx.conn)), 'VOLUME_EXISTS');
    assert.equal(await rejectionCode(Volumes.get('nope', fx.conn)), 'VOLUME_NOT_FOUND');
    assert.equal(await rejectionCode(Volumes.remove('nope', fx.conn)), 'VOLUME_NOT_FOUND');
    const sandboxes = (await Sandbox.list(fx.conn)).items.length;
    assert.equal(await rejectionCode(fx.create({ volumes: [{ volume: 'nope', path: '/data' }] })), 'VOLUME_NOT_FOUND');
    for (const p of ['data', '/', '/a/../b', '/a/./b', '/proc', '/dev/x', '/sys/fs', '/.space', '/tmp']) {
      assert.equal(await rejectionCode(fx.create({ volumes: [{ volume: 'ok', path: p }] })), 'INVALID_PATH', `path ${p}`);
    }
    assert.equal(await rejectionCode(fx.create({ volumes: [{ volume: 'ok', path: '/a' }, { volume: 'ok', path: '/b' }] })), 'BAD_REQUEST', 'one volume twice');
    assert.equal((await Sandbox.list(fx.conn)).items.length, sandboxes, 'no sandbox was made');
    assert.equal(JSON.stringify(await Volumes.list(fx.conn)), before);
    await Volumes.remove('ok', fx.conn);
  });

  it('a full volume gives its writer ENOSPC; the sandbox and its agent carry on', async () => {
    await Volumes.create('small', { ...fx.conn, sizeMb: 64 });
    const sb = await fx.create({ template: 'minimal', volumes: [{ volume: 'small', path: '/data' }] });
    const full = await sb.commands.run('dd if=/dev/zero of=/data/big bs=1M count=100');
    assert.notEqual(full.exitCode, 0);
    assert.match(full.stderr, /No space left on device/);
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
    assert.equal((await sb.refresh()).state, 'running');
    const used = (await Volumes.get('small', fx.conn)).usedBytes;
    assert.ok(used > 50 * 1048576 && used <= 64 * 1048576, `usedBytes ${used}`);
    await sb.kill();
    await Volumes.remove('small', fx.conn);
  });

  it('a volume keeps its files through hibernate → wake (closed while it sleeps) and is not rolled back; forks of a read-only mount share it, a writer cannot be forked', async () => {
    await Volumes.create('keep', { ...fx.conn, sizeMb: 128 });
    const sb = await fx.create({ template: 'minimal', volumes: [{ volume: 'keep', path: '/data' }] });
    await sb.files.write('/data/f', 'one');
    const s1 = await sb.snapshot();
    await sb.files.write('/data/f', 'two');
    const volId = (await Volumes.get('keep', fx.conn)).id;
    const mounted = () => readFileSync('/proc/self/mountinfo', 'utf8').includes(path.join(fx.dataDir, 'volumes', volId, 'mnt'));
    assert.ok(mounted(), 'open while its sandbox runs');
    await sb.hibernate();
    // While the session sleeps its volume is closed: ciphertext at rest, its key out of the kernel.
    await eventually(() => !mounted());
    assert.equal(await rejectionCode(fx.create({ template: 'minimal', volumes: [{ volume: 'keep', path: '/x', readOnly: true }] })), 'VOLUME_IN_USE', 'and still held');
    await sb.wake();
    assert.ok(mounted(), 'the wake opened it again');
    assert.equal(await sb.files.read('/data/f'), 'two');
    await sb.rollback(s1.id);
    assert.equal(await sb.files.read('/data/f'), 'two', 'a volume is not rolled back with the sandbox');
    assert.equal(await rejectionCode(sb.fork({ count: 1 })), 'VOLUME_IN_USE');
    await sb.kill();
    const reader = await fx.create({ template: 'minimal', volumes: [{ volume: 'keep', path: '/data', readOnly: true }] });
    const forks = await reader.fork({ count: 2 });
    assert.equal(forks.length, 2);
    for (const f of forks) {
      fx.track(f);
      assert.deepEqual(f.info.volumes, [{ volume: 'keep', path: '/data', readOnly: true }]);
      assert.equal(await f.files.read('/data/f'), 'two');
    }
    assert.equal((await Volumes.get('keep', fx.conn)).mountedBy.length, 3);
    for (const s of [reader, ...forks]) await s.kill();
    await Volumes.remove('keep', fx.conn);
  });

  it('snapshots of a volume restore its files; files go in and out without a sandbox; links a sandbox planted are not followed', async () => {
    await Volumes.create('snap', { ...fx.conn, sizeMb: 128 });
    await Volumes.write('snap', '/in/data.csv', 'a,b\n1,2\n', fx.conn);
    const s1 = await Volumes.snapshot('snap', fx.conn);
    await Volumes.write('snap', '/in/data.csv', 'changed', fx.conn);
    const sb = await fx.create({ template: 'minimal', volumes: [{ volume: 'snap', path: '/data' }] });
    assert.equal(await sb.files.read('/data/in/data.csv'), 'changed');
    assert.equal((await sb.commands.run('ln -s /etc/passwd /data/link && ln -s / /data/root && echo out > /data/out.txt')).exitCode, 0);
    assert.equal(await rejectionCode(Volumes.write('snap', '/x', 'x', fx.conn)), 'VOLUME_IN_USE', 'files go into a volume no sandbox holds');
    assert.equal(await rejectionCode(Volumes.read('snap', '/out.txt', fx.conn)), 'VOLUME_IN_USE', 'nor out of one a sandbox writes');
    assert.equal(await rejectionCode(Volumes.restore('snap', s1.id, fx.conn)), 'VOLUME_IN_USE');
    await sb.kill();
    assert.equal(await Volumes.read('snap', '/out.txt', fx.conn), 'out\n');
    assert.equal(await rejectionCode(Volumes.read('snap', '/link', fx.conn)), 'INVALID_PATH', 'a link to the host is not followed');
    assert.equal(await rejectionCode(Volumes.read('snap', '/root/etc/passwd', fx.conn)), 'INVALID_PATH');
    assert.equal(await rejectionCode(Volumes.write('snap', '/root/tmp/x', 'x', fx.conn)), 'INVALID_PATH');
    assert.equal(await rejectionCode(Volumes.read('snap', '/../../etc/passwd', fx.conn)), 'INVALID_PATH');
    const names = (await Volumes.entries('snap', '/', fx.conn)).map((e) => `${e.name}:${e.type}`);
    assert.deepEqual(names, ['in:directory', 'link:symlink', 'out.txt:file', 'root:symlink']);
    await Volumes.restore('snap', s1.id, fx.conn);
    assert.equal(await Volumes.read('snap', '/in/data.csv', fx.conn), 'a,b\n1,2\n');
    assert.equal(await rejectionCode(Volumes.read('snap', '/out.txt', fx.conn)), 'FILE_NOT_FOUND', 'the restore put the whole volume back');
    assert.equal(await rejectionCode(Volumes.restore('snap', 'vs-nope', fx.conn)), 'SNAPSHOT_NOT_FOUND');
    assert.deepEqual((await Volumes.snapshots('snap', fx.conn)).map((s) => s.id), [s1.id]);
    await Volumes.remove('snap', fx.conn);
  });

  it('no plaintext of a file written to a volume is anywhere under the data directory or in the blob store', async () => {
    const marker = `VOLUME-PLAINTEXT-${randomBytes(8).toString('hex')}`;
    const fileName = `NAME-${randomBytes(6).toString('hex')}`;
    await Volumes.create('secret', { ...fx.conn, sizeMb: 128 });
    const sb = await fx.create({ template: 'minimal', volumes: [{ volume: 'secret', path: '/data' }] });
    assert.equal((await sb.commands.run(`for i in $(seq 2000); do echo ${marker}; done > /data/${fileName} && sync`)).exitCode, 0);
    await sb.snapshot();
    await Volumes.snapshot('secret', fx.conn);
    await sb.kill();
    const hits = new Set();
    // At rest: the disk pool's vault image, the volume's image and its snapshot copies included.
    for (const [f, buf] of contentsAtRest(fx.dataDir)) if (buf.includes(marker) || buf.includes(fileName)) hits.add(f);
    assert.deepEqual([...hits], [], 'neither the contents nor the name of the file are stored in plaintext');
    // The volume still reads back (the key works), through its own API.
    assert.match(await Volumes.read('secret', `/${fileName}`, fx.conn), new RegExp(`^${marker}\n`));
    await Volumes.remove('secret', fx.conn);
  });

  it('the CLI: space volume create, space create --volume, space volume cp, space volume rm', async () => {
    const home = mkdtempSync('/tmp/spvh-');
    const space = cliRunner(home, { SPACE_URL: fx.conn.apiUrl, SPACE_API_KEY: fx.conn.apiKey });
    try {
      assert.equal((await space('volume', 'create', 'clivol', '--size', '1G')).stdout, 'clivol (1 GiB)\n');
      const bad = await space('volume', 'create', 'other', '--size', '10GG');
      assert.notEqual(bad.code, 0);
      assert.match(bad.stderr, /INVALID_LIMITS/);
      execFileSync('sh', ['-c', `mkdir -p ${home}/up/sub && echo a > ${home}/up/a && echo b > ${home}/up/sub/b`]);
      assert.equal((await space('volume', 'cp', `${home}/up`, 'clivol:/up')).stdout, 'copied 2 files\n');
      const id = (await space('create', '--volume', 'clivol:/data')).stdout.trim();
      fx.track(id);
      assert.equal((await space('exec', id, '--', 'cat', '/data/up/sub/b')).stdout, 'b\n');
      assert.match((await space('volume', 'ls')).stdout, new RegExp(`clivol\\s+1 GiB\\s+${id}:/data`));
      const rm = await space('volume', 'rm', 'clivol');
      assert.notEqual(rm.code, 0);
      assert.match(rm.stderr, /VOLUME_IN_USE/);
      await space('kill', id);
      assert.equal((await space('volume', 'cp', 'clivol:/up', `${home}/down`)).stdout, 'copied 2 files\n');
      assert.equal(readFileSync(`${home}/down/sub/b`, 'utf8'), 'b\n');
      assert.equal((await space('volume', 'rm', 'clivol')).stdout, 'removed clivol\n');
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});

describe('volumes: SIGKILL of the daemon', { timeout: 15 * 60_000 }, () => {
  const h = crashableSpaced('/tmp/spkv-', { SPACE_DISKS: 'on' });
  const { dataDir, ids } = h;
  let d;
  const start = async (env = {}) => (d = await h.start(env));
  const kill = () => h.kill();
  before(async () => {
    await start();
  });
  after(async () => assert.deepEqual(await h.finish(), []));

  it('a sandbox keeps writing its volume through a daemon crash; afterwards the file is whole and the volume checks clean', async () => {
    const v = await Volumes.create('crash', { ...d.conn, sizeMb: 512 });
    const sb = await Sandbox.create({ ...d.conn, template: 'minimal', volumes: [{ volume: 'crash', path: '/data' }] });
    ids.add(sb.id);
    await sb.commands.run('i=0; while [ $i -lt 200 ]; do dd if=/dev/zero of=/data/w bs=1M count=1 seek=$i conv=notrunc 2>/dev/null; i=$((i+1)); done; echo done > /data/w.done', { background: true });
    await eventually(async () => Number((await sb.commands.run('wc -c < /data/w')).stdout) > 10 * 1048576);
    await kill();
    await start();
    const again = await Sandbox.connect(sb.id, d.conn);
    assert.equal(again.info.state, 'running');
    assert.deepEqual((await Volumes.get('crash', d.conn)).mountedBy.map((m) => m.sandboxId), [sb.id], 'the restart knows who holds it');
    await eventually(() => again.files.exists('/data/w.done'), { tries: 600 });
    assert.equal((await again.commands.run('wc -c < /data/w')).stdout.trim(), String(200 * 1048576));
    await again.kill();
    assert.equal(fsckClean(dataDir, v.id), true);
    await Volumes.remove('crash', d.conn);
  });

  it('killed while a snapshot holds the volume frozen: after the restart its writers go on, no half-made snapshot is listed or left, the volume checks clean', async () => {
    const v = await Volumes.create('frozen', { ...d.conn, sizeMb: 256 });
    const sb = await Sandbox.create({ ...d.conn, template: 'minimal', volumes: [{ volume: 'frozen', path: '/data' }] });
    ids.add(sb.id);
    await sb.files.write('/data/a', 'a');
    await kill();
    await start({ SPACE_FAULT_INJECT: 'volume-snapshot:frozen' });
    await Volumes.snapshot('frozen', d.conn).catch(() => {});
    assert.equal((await d.exited).sig, 'SIGKILL', 'the fault point was reached');
    await start();
    const again = await Sandbox.connect(sb.id, d.conn);
    // A frozen file system would block this write for good (the command's timeout would end it).
    const w = await again.commands.run('echo b > /data/b && sync && cat /data/a /data/b', { timeoutMs: 30_000 });
    assert.equal(w.stdout, 'ab\n');
    assert.deepEqual(await Volumes.snapshots('frozen', d.conn), []);
    assert.deepEqual(readdirSync(path.join(dataDir, 'volumes', v.id, 'snapshots')), [], 'no half-written copy is left');
    await again.kill();
    assert.equal(fsckClean(dataDir, v.id), true);
    assert.ok(!existsSync(path.join(dataDir, 'volumes', v.id, 'mnt', 'files')), 'a volume nobody holds is closed');
    await Volumes.remove('frozen', d.conn);
  });
});
