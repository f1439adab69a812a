// Bring-your-own-key encryption of everything SPACE stores: nothing of a sandbox's files or
// memory is readable on disk, tampering is refused, and a tenant's key can be revoked,
// re-enabled, rotated (also across a daemon crash) and destroyed.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { defaultWorkDir, startDaemon, templateImagesDir } from '../packages/server/dist/index.js';
import { TEMPLATES_DIR, api, contentsAtRest, eventually, filesAtRest, removeDataDir, startSpaced, startTestDaemon, stopSpaced } from './helpers.mjs';
import { inflateStatefile, unpackSnapshot } from './statefile.mjs';
import { makeOciImage } from './oci-image.mjs';
import { StatefileCodec } from '../packages/driver-gvisor/dist/index.js';

const codec = new StatefileCodec();

/**
 * Where in `hay` any 16-byte block of `needle` (at a 16-byte offset) appears, at any offset:
 * any leak of 31 or more consecutive bytes of the needle contains such a block.
 */
function findBlocks(hay, needle) {
  const blocks = new Map();
  for (let i = 0; i + 16 <= needle.length; i += 16) blocks.set(needle.readBigUInt64LE(i), i);
  for (let i = 0; i + 16 <= hay.length; i++) {
    const j = blocks.get(hay.readBigUInt64LE(i));
    if (j !== undefined && hay.subarray(i, i + 16).equals(needle.subarray(j, j + 16))) return i;
  }
  return -1;
}

const writeKey = (fx, name, bytes = randomBytes(32)) => writeFileSync(path.join(fx.dataDir, 'keys', name), bytes, { mode: 0o600 });

describe('encryption at rest, bring your own key', () => {
  let fx;
  before(async () => {
    fx = await startTestDaemon();
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('a snapshot holds neither a 1 MiB random file nor a string in a process\'s memory in readable form', async () => {
    const sb = await fx.create();
    const marker = randomBytes(1 << 20);
    await sb.files.write('/tmp/marker.bin', marker);
    const memMarker = `SPACEMARKER${randomBytes(12).toString('hex')}`;
    await sb.commands.run(`sh -c 'M=${memMarker}; while true; do sleep 1; done' >/dev/null 2>&1 &`);
    await sb.snapshot();
    const all = filesAtRest(fx.dataDir).filter((f) => !f.includes(`${path.sep}runtime${path.sep}`));
    assert.ok(all.some((f) => f.includes(`${path.sep}blobs${path.sep}`)), 'the snapshot is stored');
    for (const [f, buf] of contentsAtRest(fx.dataDir)) {
      if (f.includes(`${path.sep}runtime${path.sep}`)) continue;
      assert.equal(buf.indexOf(memMarker), -1, `the memory marker is readable in ${f}`);
      assert.equal(findBlocks(buf, marker), -1, `a block of the random file is readable in ${f}`);
    }
    // The test can fail: the marker is in the sandbox, and the rolled-back copy still has both.
    await sb.rollback((await sb.snapshots())[0].id);
    assert.equal(Buffer.compare(await sb.files.read('/tmp/marker.bin', { format: 'bytes' }).then(Buffer.from), marker), 0);
    assert.match((await sb.commands.run('ps -o args')).stdout, new RegExp(memMarker));
    await sb.kill();
  });

  it('tampering is refused with SNAPSHOT_CORRUPT: a flipped byte, a truncated object, objects or chunks swapped', async () => {
    const sb = await fx.create();
    await sb.files.write('/tmp/v', '1');
    const a = await sb.snapshot();
    await sb.files.write('/tmp/v', '2');
    const b = await sb.snapshot();
    const dir = path.join(fx.dataDir, 'blobs', 'snapshots', 'default');
    const fa = path.join(dir, a.id);
    const fb = path.join(dir, b.id);
    const [ba, bb] = [readFileSync(fa), readFileSync(fb)];
    const expectCorrupt = async (id) => {
      const r = await api(fx, 'POST', `/v1/sandboxes/${sb.id}/rollback`, { json: { snapshotId: id } });
      assert.equal(r.status, 422, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'SNAPSHOT_CORRUPT');
      assert.match(r.body.error.message, new RegExp(id));
    };
    writeFileSync(fa, bb);
    writeFileSync(fb, ba);
    await expectCorrupt(a.id);
    await expectCorrupt(b.id);
    writeFileSync(fa, ba.subarray(0, ba.length - 100));
    await expectCorrupt(a.id);
    const flipped = Buffer.from(ba);
    flipped[flipped.length >> 1] ^= 1;
    writeFileSync(fa, flipped);
    await expectCorrupt(a.id);
    writeFileSync(fa, ba);
    writeFileSync(fb, bb);
    // The same for the packs of content chunks the snapshots are stored as: each pack gets the
    // next one's bytes (packs swapped between places), then each gets one byte flipped.
    const cdir = path.join(fx.dataDir, 'blobs', 'chunks', 'default');
    const chunkFiles = readdirSync(cdir).map((f) => path.join(cdir, f));
    assert.ok(chunkFiles.length >= 2, 'snapshots are stored as packs of chunks');
    const saved = chunkFiles.map((f) => readFileSync(f));
    chunkFiles.forEach((f, i) => writeFileSync(f, saved[(i + 1) % saved.length]));
    await expectCorrupt(a.id);
    chunkFiles.forEach((f, i) => {
      const x = Buffer.from(saved[i]);
      x[x.length - 20] ^= 0x40;
      writeFileSync(f, x);
    });
    await expectCorrupt(b.id);
    chunkFiles.forEach((f, i) => writeFileSync(f, saved[i]));
    await sb.rollback(a.id);
    assert.equal(await sb.files.read('/tmp/v'), '1', 'restored intact once the bytes are back');
    await sb.kill();
  });

  it('snapshots are stored as deduplicated chunks in packs; packs nothing references are collected', async () => {
    const cdir = path.join(fx.dataDir, 'blobs', 'chunks', 'default');
    const list = () => (existsSync(cdir) ? readdirSync(cdir) : []);
    const count = () => list().length;
    const bytes = () => list().reduce((n, f) => n + statSync(path.join(cdir, f)).size, 0);
    await api(fx, 'POST', '/v1/admin/gc');
    const [before, bytesBefore] = [count(), bytes()];
    const sb = await fx.create();
    await sb.snapshot();
    const [one, first] = [count() - before, bytes() - bytesBefore];
    await sb.snapshot();
    const [two, second] = [count() - before, bytes() - bytesBefore - first];
    assert.ok(one > 0 && two > one, `${one} packs, then ${two}`);
    // runsc's image is stored decompressed (space-statefile), so the second snapshot of an idle
    // sandbox stores only what changed: ~20% of the first here (docs/benchmarks.md); compressed
    // as runsc writes it, it would store all of it again.
    assert.ok(second < first / 2, `the second snapshot added ${second} bytes, the first ${first}`);
    await sb.kill();
    const r = await api(fx, 'POST', '/v1/admin/gc');
    assert.equal(r.body.deletedChunks, two, 'the killed sandbox\'s packs are collected');
    assert.equal(count(), before);
  });

  it('runsc\'s image is stored decompressed and rebuilt bit for bit; a changed byte in the stored form is refused', async () => {
    const sb = await fx.create();
    const snap = await sb.snapshot();
    const dir = mkdtempSync('/tmp/spt-codec-');
    try {
      const meta = await unpackSnapshot(fx.dataDir, snap.id, dir);
      await sb.kill();
      // With a disk (the default on a node of its own) the snapshot names its btrfs stream, stored beside it.
      const disk = existsSync(path.join(fx.dataDir, 'disks', 'mnt', 'disks'));
      assert.deepEqual(meta.files.map((f) => [f.name, f.codec]), [['checkpoint.img', codec.name], ...(disk ? [['space-disk.json', undefined]] : [])], 'the snapshot records the codec');
      assert.deepEqual(meta.attachments?.map((a) => [a.file, a.name, a.key]), disk ? [['space-disk.json', 'gvisor-disk-btrfs-send-v2', 'disk']] : undefined, 'and the disk stream stored apart');
      const stored = meta.files.find((f) => f.name === 'checkpoint.img');
      const img = path.join(dir, 'checkpoint.img');
      const original = readFileSync(img);
      assert.equal(original.subarray(0, 8).toString('latin1'), 'gVisorSF', 'what comes back is the state file runsc wrote');
      // Encoding it again gives the stored form: larger (decompressed), and back bit for bit.
      assert.equal(await codec.encode(img, path.join(dir, 'enc')), true);
      const enc = readFileSync(path.join(dir, 'enc'));
      assert.ok(enc.length > original.length * 2, `stored ${enc.length} bytes for ${original.length} compressed`);
      assert.equal(enc.length, stored.size, 'the same stored form as the daemon\'s');
      await codec.decode(path.join(dir, 'enc'), path.join(dir, 'back'));
      assert.ok(readFileSync(path.join(dir, 'back')).equals(original));
      // One changed byte inside a decompressed block: it recompresses, but not to the original.
      const bad = Buffer.from(enc);
      bad[bad.length - 1000] ^= 0x01;
      writeFileSync(path.join(dir, 'bad'), bad);
      await assert.rejects(codec.decode(path.join(dir, 'bad'), path.join(dir, 'out')), (e) => e.code === 'SNAPSHOT_CORRUPT' && /SHA-256/.test(e.message));
      // Anything that is not a state file is stored as it is.
      writeFileSync(path.join(dir, 'other'), 'not a state file');
      assert.equal(await codec.encode(path.join(dir, 'other'), path.join(dir, 'other.enc')), false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('revoke → KEY_REVOKED, enable → works, rotate → old snapshots restore and the old key can go, destroy → unreadable for good', async () => {
    const sb = await fx.create();
    writeKey(fx, 'tenant-a.key');
    writeKey(fx, 'tenant-b.key', randomBytes(32).toString('hex'));
    const setA = await api(fx, 'POST', '/v1/encryption-keys', { json: { provider: 'local', ref: 'tenant-a.key' } });
    assert.equal(setA.status, 201, JSON.stringify(setA.body));
    await sb.files.write('/tmp/v', 'under A');
    const s1 = await sb.snapshot();

    assert.equal((await api(fx, 'POST', `/v1/encryption-keys/${setA.body.id}/revoke`)).body.state, 'revoked');
    for (const [p, body] of [[`/v1/sandboxes/${sb.id}/rollback`, { snapshotId: s1.id }], [`/v1/sandboxes/${sb.id}/fork`, { snapshotId: s1.id }], [`/v1/sandboxes/${sb.id}/snapshots`, {}]]) {
      const r = await api(fx, 'POST', p, { json: body });
      const code = r.body.error?.code ?? r.body[0]?.error?.code;
      assert.equal(code, 'KEY_REVOKED', `${p}: ${JSON.stringify(r.body)}`);
    }
    assert.equal((await api(fx, 'POST', `/v1/encryption-keys/${setA.body.id}/enable`)).body.state, 'active');
    await sb.rollback(s1.id);
    assert.equal(await sb.files.read('/tmp/v'), 'under A');

    const setB = await api(fx, 'POST', '/v1/encryption-keys', { json: { provider: 'local', ref: 'tenant-b.key' } });
    assert.equal(setB.status, 201);
    await eventually(async () => (await api(fx, 'GET', '/v1/encryption-keys')).body.keys.find((k) => k.id === setA.body.id).state === 'retired');
    assert.equal((await api(fx, 'DELETE', `/v1/encryption-keys/${setA.body.id}`)).body.state, 'destroyed');
    rmSync(path.join(fx.dataDir, 'keys', 'tenant-a.key'));
    await sb.rollback(s1.id);
    assert.equal(await sb.files.read('/tmp/v'), 'under A', 'readable under B alone');

    const refused = await api(fx, 'DELETE', `/v1/encryption-keys/${setB.body.id}`);
    assert.equal(refused.status, 400, 'the key still protecting data is not destroyed without shred');
    assert.equal((await api(fx, 'DELETE', `/v1/encryption-keys/${setB.body.id}?shred=true`)).body.state, 'destroyed');
    const gone = await api(fx, 'POST', `/v1/sandboxes/${sb.id}/rollback`, { json: { snapshotId: s1.id } });
    assert.equal(gone.body.error.code, 'KEY_DESTROYED');
    await sb.kill();
  });

  it('bad keys are refused when configured, not at the first restore', async () => {
    writeKey(fx, 'short.key', randomBytes(16));
    const cases = [
      [{ provider: 'kms-nope', ref: 'x' }, /Unknown key provider "kms-nope"/],
      [{ provider: 'local', ref: 'missing.key' }, /cannot be read \(ENOENT\)/],
      [{ provider: 'local', ref: 'short.key' }, /does not hold a 256-bit key \(16 bytes\)/],
      [{ provider: 'local', ref: '../space.db' }, /file names in/],
    ];
    for (const [body, re] of cases) {
      const r = await api(fx, 'POST', '/v1/encryption-keys', { key: fx.key, json: body });
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.error.code, 'KEY_INVALID');
      assert.match(r.body.error.message, re);
    }
    const dataDir = mkdtempSync('/tmp/spt-nokey-');
    await assert.rejects(startDaemon({ dataDir, listen: '127.0.0.1:0', templatesDir: TEMPLATES_DIR, logLevel: 'silent' }), (e) => e.code === 'KEY_INVALID' && /node\.key/.test(e.message));
    removeDataDir(dataDir);
  });
});

describe('template images at rest', () => {
  it('are kept encrypted in the data directory and in RAM only as the working copy; a restart reloads them; removing the template removes them', async () => {
    const dataDir = mkdtempSync('/tmp/spt-tpl-');
    const work = mkdtempSync('/tmp/spt-tplimg-');
    let d = await startSpaced(dataDir);
    try {
      // The start command makes a secret that exists only in the template's state: the memory of
      // the process it starts (in its arguments), in the template image's checkpoint whether or
      // not the sandbox has a disk.
      await Templates.build({ ...d.conn, name: 'secretive', image: await makeOciImage(work, { marker: 'x' }), start: { cmd: 'S=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n"); exec sh -c "while :; do sleep 1000; done" "secret-$S"', readyCmd: 'ps -o args | grep -q "secret-[0-9a-f]"' } });
      const read = async () => {
        const sb = await Sandbox.create({ ...d.conn, template: 'secretive', memoryMb: 256 });
        const secret = /secret-([0-9a-f]{32})/.exec((await sb.commands.run('ps -o args')).stdout)?.[1];
        assert.match(secret ?? '', /^[0-9a-f]{32}$/);
        assert.equal(sb.info.createTimings.source, 'snapshot', 'restored from the template image, not booted');
        await sb.kill();
        return secret;
      };
      const secret = await read();
      // The working copy (RAM) holds it: the scan below can fail.
      const ram = templateImagesDir(dataDir);
      const img = readdirSync(ram).filter((e) => e.startsWith('t-') && !e.includes('.tmp')).map((e) => path.join(ram, e, 'checkpoint.img'))[0];
      assert.ok(img && inflateStatefile(readFileSync(img)).includes(secret), `the working copy in ${ram} holds the secret`);
      for (const [f, buf] of contentsAtRest(dataDir)) {
        assert.equal(buf.indexOf(secret), -1, `the template's secret is readable in ${f}`);
      }
      // With a disk (the default on a node of its own) its stream is an object beside the image.
      const stored = readdirSync(path.join(dataDir, 'blobs', 'templates', 'default'));
      const withDisk = existsSync(path.join(dataDir, 'disks', 'mnt', 'disks'));
      assert.equal(stored.filter((n) => !n.endsWith('.disk')).length, 1, 'one stored (encrypted) template image');
      assert.deepEqual(stored.filter((n) => n.endsWith('.disk')).length, withDisk ? 1 : 0, "and, with a disk, its disk's stream beside it");
      await stopSpaced(d);
      assert.equal(existsSync(path.dirname(ram)), false, 'a stopped daemon gives the RAM back');
      d = await startSpaced(dataDir);
      assert.equal(await read(), secret, 'after a restart: the same image, reloaded from its encrypted copy');
      await Templates.remove('secretive', d.conn);
      const gc = await (await fetch(`${d.conn.apiUrl}/v1/admin/gc`, { method: 'POST', headers: { authorization: `Bearer ${d.conn.apiKey}` } })).json();
      assert.ok(gc.deletedChunks > 0, 'the image\'s packs are collected');
      assert.deepEqual(readdirSync(path.join(dataDir, 'blobs', 'templates', 'default')), [], 'the stored image is deleted with its template');
    } finally {
      await stopSpaced(d);
      removeDataDir(dataDir);
      rmSync(work, { recursive: true, force: true });
    }
  });
});

describe('chunk collection survives a daemon crash', () => {
  it('killed after deleting one unreferenced chunk, the restarted daemon finishes and every kept snapshot restores', async () => {
    const dataDir = mkdtempSync('/tmp/spt-gc-');
    let d = await startSpaced(dataDir, { SPACE_FAULT_INJECT: 'gc:after-1' });
    const keep = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    const snaps = [];
    for (const v of ['one', 'two']) {
      await keep.files.write('/tmp/v', v);
      snaps.push([v, await keep.snapshot()]);
    }
    const drop = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    await drop.snapshot();
    await drop.kill();
    const gc = await fetch(`${d.conn.apiUrl}/v1/admin/gc`, { method: 'POST', headers: { authorization: `Bearer ${d.conn.apiKey}` } }).catch(() => undefined);
    assert.ok(!gc || !gc.ok, 'the collection did not finish');
    assert.equal((await d.exited).sig, 'SIGKILL', 'the fault killed the daemon mid-collection');
    d = await startSpaced(dataDir);
    try {
      const again = await Sandbox.connect(keep.id, d.conn);
      for (const [v, s] of snaps) {
        await again.rollback(s.id);
        assert.equal(await again.files.read('/tmp/v'), v);
      }
      const r = await (await fetch(`${d.conn.apiUrl}/v1/admin/gc`, { method: 'POST', headers: { authorization: `Bearer ${d.conn.apiKey}` } })).json();
      assert.equal(r.deletedChunks, 0, 'the restart finished the collection');
      await again.kill();
    } finally {
      await stopSpaced(d);
      removeDataDir(dataDir);
    }
  });
});

describe('without disks, checkpoint images never touch the node\'s disk', () => {
  it('killed right after a checkpoint, the image is in RAM (and holds the memory), nothing under the data directory, and the restart finishes the snapshot from it', async () => {
    const dataDir = mkdtempSync('/tmp/spt-ram-');
    // Without disks (with them the work directory is on disk, in the pool's encrypted vault:
    // docs/disks.md "At rest").
    let d = await startSpaced(dataDir, { SPACE_DISKS: 'off', SPACE_FAULT_INJECT: 'snapshot:after-checkpoint' });
    try {
      const sb = await Sandbox.create({ ...d.conn, memoryMb: 256 });
      const memMarker = `SPACEMARKER${randomBytes(12).toString('hex')}`;
      await sb.commands.run(`sh -c 'M=${memMarker}; while true; do sleep 1; done' >/dev/null 2>&1 &`);
      await assert.rejects(sb.snapshot());
      assert.equal((await d.exited).sig, 'SIGKILL', 'the fault killed the daemon with a complete image not yet stored');
      const work = defaultWorkDir(dataDir);
      assert.ok(work.startsWith('/dev/shm/'), work);
      const images = readdirSync(work);
      assert.equal(images.length, 1, `one image in ${work}`);
      // The scan below can fail: the image the crash left holds the process's memory.
      assert.ok(inflateStatefile(readFileSync(path.join(work, images[0], 'checkpoint.img'))).includes(memMarker), 'the image in RAM holds the memory marker');
      for (const [f, buf] of contentsAtRest(dataDir)) {
        assert.notEqual(path.basename(f), 'checkpoint.img', `a checkpoint image on disk: ${f}`);
        if (buf.subarray(0, 8).toString('latin1') === 'gVisorSF') assert.ok(!inflateStatefile(buf).includes(memMarker), `the memory marker is readable in ${f}`);
        assert.equal(buf.indexOf(memMarker), -1, `the memory marker is readable in ${f}`);
      }
      d = await startSpaced(dataDir, { SPACE_DISKS: 'off' });
      const again = await Sandbox.connect(sb.id, d.conn);
      assert.equal((await again.snapshots()).length, 1, 'the restart stored the snapshot from the image in RAM');
      assert.match((await again.commands.run('ps -o args')).stdout, new RegExp(memMarker));
      assert.deepEqual(readdirSync(work), [], 'and let the image go');
      await again.kill();
    } finally {
      await stopSpaced(d);
      removeDataDir(dataDir);
    }
  });
});

describe('key rotation survives a daemon crash', () => {
  it('killed after re-wrapping one data key, the restarted daemon finishes and every snapshot restores', async () => {
    const dataDir = mkdtempSync('/tmp/spt-rot-');
    let d = await startSpaced(dataDir, { SPACE_FAULT_INJECT: 'rotation:after-1' });
    const sb = await Sandbox.create({ ...d.conn, memoryMb: 256 });
    const snaps = [];
    for (const v of ['one', 'two', 'three']) {
      await sb.files.write('/tmp/v', v);
      snaps.push([v, await sb.snapshot()]);
    }
    writeFileSync(path.join(dataDir, 'keys', 'rot.key'), randomBytes(32), { mode: 0o600 });
    const key = d.conn.apiKey;
    const set = await fetch(`${d.conn.apiUrl}/v1/encryption-keys`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ provider: 'local', ref: 'rot.key' }) }).catch(() => undefined);
    assert.ok(!set || set.status === 201);
    assert.equal((await d.exited).sig, 'SIGKILL', 'the fault killed the daemon mid-rotation');
    d = await startSpaced(dataDir);
    try {
      const keys = async () => (await (await fetch(`${d.conn.apiUrl}/v1/encryption-keys`, { headers: { authorization: `Bearer ${key}` } })).json()).keys;
      await eventually(async () => (await keys()).some((k) => k.ref === 'rot.key' && k.state === 'active') && !(await keys()).some((k) => k.state === 'rotating'));
      const again = await Sandbox.connect(sb.id, d.conn);
      for (const [v, s] of snaps) {
        await again.rollback(s.id);
        assert.equal(await again.files.read('/tmp/v'), v);
      }
      await again.kill();
    } finally {
      await stopSpaced(d);
      removeDataDir(dataDir);
    }
  });
});
