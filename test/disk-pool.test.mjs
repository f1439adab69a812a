// The node's pool of sandbox disks (issue 23's first part) on a real btrfs in a loop-mounted
// image: a disk is its template's files without a copy, a limit that stops a writer with
// EDQUOT, point-in-time copies and forks that share unchanged blocks, and a pool that survives
// being unmounted (as after a reboot). The pool is kept in its vault (an ext4 image encrypted
// with fscrypt) as the daemon keeps it: what reaches the host's disk is ciphertext. Both images
// take their size on the host when made, so a host disk that fills up leaves the pool working.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, statfsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { DiskPool } from '../packages/driver-gvisor/dist/index.js';
import { fileChunks } from './helpers.mjs';

const MiB = 1024 * 1024;

/** Whether `file` holds `text` anywhere (a sparse image read by its extents). */
function holds(file, text) {
  for (const b of fileChunks(file)) if (b.includes(text)) return true;
  return false;
}

describe('disk pool (btrfs)', () => {
  let dir, pool, template;
  const key = randomBytes(32);
  const open = (k = key) => DiskPool.open({ dir: path.join(dir, 'pool'), sizeBytes: 2048 * MiB, key: k });
  /** What the pool's file system holds (its image is allocated whole on the host: btrfs counts). */
  const allocated = () => {
    const s = statfsSync(pool.mountPoint);
    return (s.blocks - s.bfree) * s.bsize;
  };
  // btrfs allocates lazily: make its numbers current before reading them.
  const settle = () => execFileSync('btrfs', ['filesystem', 'sync', pool.mountPoint]);
  /** Writes `mb` MiB of random data to `file` with dd; resolves to dd's exit status and stderr. */
  const fill = (file, mb) => {
    const r = spawnSync('dd', ['if=/dev/urandom', `of=${file}`, 'bs=1M', `count=${mb}`, 'conv=fsync'], { encoding: 'utf8' });
    return { status: r.status, stderr: r.stderr };
  };

  before(async () => {
    dir = mkdtempSync('/tmp/spt-disks-');
    template = path.join(dir, 'rootfs');
    mkdirSync(path.join(template, 'etc'), { recursive: true });
    writeFileSync(path.join(template, 'etc', 'os-release'), 'NAME=test\n');
    writeFileSync(path.join(template, 'big.bin'), Buffer.alloc(20 * MiB, 7));
    pool = await open();
    await pool.importTemplate('tpl', template);
  });
  after(async () => {
    await pool?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it('a disk has its template\'s files without a copy; a writer stops at its limit with EDQUOT and the rest goes on', async () => {
    settle();
    const before = allocated();
    const root = await pool.createDisk('sba', 'tpl', 64 * MiB);
    settle();
    assert.equal(readFileSync(path.join(root, 'etc', 'os-release'), 'utf8'), 'NAME=test\n');
    assert.ok(allocated() - before < 4 * MiB, `a new disk adds ${allocated() - before} bytes, not the template's 20 MiB`);
    const r = fill(path.join(root, 'fill.bin'), 100);
    assert.notEqual(r.status, 0);
    assert.match(r.stderr, /Disk quota exceeded/);
    const u = await pool.usage('sba');
    assert.equal(u.limitBytes, 64 * MiB);
    assert.ok(u.usedBytes <= 64 * MiB && u.usedBytes > 40 * MiB, `used ${u.usedBytes}`);
    // The writer was stopped, the disk still works: delete and write again.
    rmSync(path.join(root, 'fill.bin'));
    writeFileSync(path.join(root, 'after.txt'), 'still writable\n');
    assert.equal(readFileSync(path.join(root, 'after.txt'), 'utf8'), 'still writable\n');
    await assert.rejects(pool.createDisk('sba', 'tpl', 64 * MiB), /exists already/);
    await assert.rejects(pool.createDisk('sbb', 'no-such', 64 * MiB), (e) => e.code === 'TEMPLATE_NOT_FOUND');
    await assert.rejects(pool.createDisk('../x', 'tpl', 64 * MiB), (e) => e.code === 'BAD_REQUEST');
    await assert.rejects(pool.createDisk('sbc', 'tpl', 0), (e) => e.code === 'INVALID_LIMITS');
    assert.deepEqual((await pool.list()).disks, ['sba'], 'a refused create leaves nothing');
  });

  it('copies and forks share unchanged blocks: a fork of 100 MiB of files adds almost nothing, and they diverge', async () => {
    const root = await pool.createDisk('sbparent', 'tpl', 512 * MiB);
    assert.equal(fill(path.join(root, 'data.bin'), 100).status, 0);
    const sum = () => execFileSync('sha256sum', [path.join(root, 'data.bin')], { encoding: 'utf8' }).split(' ')[0];
    const parentSum = sum();
    settle();
    const before = allocated();
    const t0 = process.hrtime.bigint();
    await pool.copyDisk('sbparent', 'snap1');
    const forks = [await pool.diskFromCopy('snap1', 'sbfork1', 512 * MiB), await pool.diskFromCopy('snap1', 'sbfork2', 512 * MiB)];
    const ms = Number(process.hrtime.bigint() - t0) / 1e6;
    settle();
    const added = allocated() - before;
    assert.ok(added < 8 * MiB, `a copy and two forks of 100 MiB added ${(added / MiB).toFixed(1)} MiB`);
    for (const f of forks) assert.equal(execFileSync('sha256sum', [path.join(f, 'data.bin')], { encoding: 'utf8' }).split(' ')[0], parentSum);
    writeFileSync(path.join(forks[0], 'data.bin'), 'fork 1 changed it\n');
    writeFileSync(path.join(forks[1], 'only-in-fork-2'), 'x');
    assert.equal(readFileSync(path.join(forks[0], 'data.bin'), 'utf8'), 'fork 1 changed it\n');
    assert.equal(sum(), parentSum, 'the parent is unchanged');
    assert.throws(() => statSync(path.join(root, 'only-in-fork-2')));
    const u = await pool.usage('sbfork2');
    assert.ok(u.usedBytes > 100 * MiB && u.exclusiveBytes < 2 * MiB, `a fork references the data (${u.usedBytes}) but holds little of its own (${u.exclusiveBytes})`);
    // The copy is read-only: a point in time.
    assert.throws(() => writeFileSync(path.join(pool.mountPoint, 'copies', 'snap1', 'x'), 'x'), /EROFS|read-only/i);
    console.log(`# copy + 2 forks of a disk holding 100 MiB: ${ms.toFixed(0)} ms, ${(added / MiB).toFixed(2)} MiB added`);
    for (const d of ['sbparent', 'sbfork1', 'sbfork2']) await pool.removeDisk(d);
    await pool.removeCopy('snap1');
    await pool.removeCopy('snap1');
    assert.deepEqual(await pool.list(), { disks: ['sba'], copies: [] });
  });

  it('the pool survives being unmounted: opened again, its disks and templates are there, and receives a crash cut short are gone', async () => {
    // A receive of stored streams cut short by a crash: its scratch directory, a subvolume in it.
    const scratch = await pool.receiving();
    execFileSync('btrfs', ['subvolume', 'create', path.join(scratch, 'sn1')]);
    assert.deepEqual((await pool.list()).copies, [], 'not a copy');
    await pool.close();
    pool = await open();
    assert.deepEqual(readdirSync(path.join(pool.mountPoint, 'copies')), [], 'the scratch directory and what it held are gone');
    assert.deepEqual((await pool.list()).disks, ['sba']);
    assert.ok(pool.templatePath('tpl'));
    assert.equal((await pool.usage('sba')).limitBytes, 64 * MiB, 'limits are kept');
  });

  it('at rest the pool is ciphertext: a disk\'s file and its name are nowhere in the vault\'s image; the wrong key opens nothing', async () => {
    assert.equal(pool.encrypted, true);
    const vaultImage = path.join(dir, 'pool', 'vault.img');
    assert.equal(pool.imagePath, path.join(dir, 'pool', 'vault', 'files', 'pool.img'));
    assert.equal(DiskPool.scratchDir(path.join(dir, 'pool')), path.join(dir, 'pool', 'vault', 'files', 'work'));
    const marker = `vault-marker-${randomBytes(8).toString('hex')}`;
    const root = path.join(pool.mountPoint, 'disks', 'sba');
    writeFileSync(path.join(root, `${marker}-name`), `${marker}\n`.repeat(10_000));
    mkdirSync(path.join(pool.imagePath, '..', 'work'), { recursive: true });
    writeFileSync(path.join(pool.imagePath, '..', 'work', 'stream'), `${marker}\n`.repeat(10_000));
    settle();
    // The scan can see it: through the unlocked vault the pool's image holds the file as written.
    assert.equal(holds(pool.imagePath, marker), true, 'the pool image, read through the open vault, holds the marker');
    await pool.close();
    assert.ok(statSync(vaultImage).blocks * 512 > 1 * MiB, 'the vault holds the pool');
    assert.equal(holds(vaultImage, marker), false, 'no plaintext of contents or names in the vault\'s image');
    assert.equal(holds(vaultImage, 'NAME=test'), false, 'nor of the template');
    assert.equal(existsSync(path.join(dir, 'pool', 'pool.img')), false, 'no plaintext pool beside it');
    await assert.rejects(open(randomBytes(32)), (e) => e.code === 'KEY_INVALID');
    pool = await open();
    assert.equal(readFileSync(path.join(root, `${marker}-name`), 'utf8').slice(0, marker.length), marker);
  });

  it('a pool made before vaults (plaintext pool.img) is opened as it is, and says so', async () => {
    const old = path.join(dir, 'old');
    const p = await DiskPool.open({ dir: old, sizeBytes: 512 * MiB });
    assert.equal(p.encrypted, false);
    await p.close();
    assert.equal(DiskPool.scratchDir(old), undefined);
    const again = await DiskPool.open({ dir: old, sizeBytes: 512 * MiB, key });
    assert.equal(again.encrypted, false);
    assert.equal(again.imagePath, path.join(old, 'pool.img'));
    await again.close();
  });
});

// Measured before reservations (docs/disks.md, "When the host's disk fills up"): a pool whose
// sparse image sat on a host file system that filled up turned read-only — every disk in it —
// and stayed so after space was freed.
describe('disk pool: the host\'s disk fills up', () => {
  let dir, hostDir, pool;
  before(() => {
    dir = mkdtempSync('/tmp/spt-hostfull-');
    hostDir = path.join(dir, 'host');
    mkdirSync(hostDir);
    // A small file system of its own stands for the host's: 6 GiB, ext4.
    execFileSync('truncate', ['-s', '6G', path.join(dir, 'host.img')]);
    execFileSync('mkfs.ext4', ['-q', path.join(dir, 'host.img')]);
    execFileSync('mount', ['-o', 'loop', path.join(dir, 'host.img'), hostDir]);
  });
  after(async () => {
    await pool?.close();
    // (A failed assertion may leave a pool it opened mounted: everything under the host goes.)
    for (const m of ['disks/mnt', 'disks/vault', '.']) spawnSync('umount', [path.join(hostDir, m)]);
    rmSync(dir, { recursive: true, force: true });
  });

  it('a pool that does not fit is refused and leaves nothing; one that does takes its size on the host at once', async () => {
    const free = () => statfsSync(hostDir).bavail * statfsSync(hostDir).bsize;
    await assert.rejects(DiskPool.open({ dir: path.join(hostDir, 'disks'), sizeBytes: 8192 * MiB, key: randomBytes(32) }), (e) => e.code === 'CONFIG_INVALID' && /does not fit/.test(e.message) && /--disk-pool-size/.test(e.message));
    assert.deepEqual(readdirSync(path.join(hostDir, 'disks')).filter((f) => f.endsWith('.img')), [], 'no image left');
    const before = free();
    pool = await DiskPool.open({ dir: path.join(hostDir, 'disks'), sizeBytes: 1024 * MiB, key: randomBytes(32) });
    const vault = statSync(path.join(hostDir, 'disks', 'vault.img'));
    assert.ok(vault.blocks * 512 >= vault.size, 'the vault\'s image is allocated whole');
    assert.ok(before - free() >= 5 * 1024 * MiB, `the pool (1 GiB) and its room for work files (4 GiB) are taken on the host: ${((before - free()) / MiB).toFixed(0)} MiB`);
  });

  it('with the host full, the pool keeps working: a disk takes writes until the pool is full (ENOSPC), new disks are refused (CAPACITY_EXHAUSTED)', async () => {
    const tpl = path.join(dir, 'tpl');
    mkdirSync(tpl);
    await pool.importTemplate('tpl', tpl);
    const root = await pool.createDisk('sbfull', 'tpl', 2048 * MiB);
    // Everything the host has left but 8 MiB goes to another program's file.
    const s = statfsSync(hostDir);
    execFileSync('fallocate', ['--length', String(s.bavail * s.bsize - 8 * MiB), path.join(hostDir, 'filler')]);
    await assert.rejects(pool.checkHostRoom(1024 * MiB), (e) => e.code === 'CAPACITY_EXHAUSTED' && /nearly full/.test(e.message) && e.details?.resource === 'disk');
    const w = spawnSync('dd', ['if=/dev/urandom', `of=${path.join(root, 'a.bin')}`, 'bs=1M', 'count=300', 'conv=fsync'], { encoding: 'utf8' });
    assert.equal(w.status, 0, `a write into the pool with the host full: ${w.stderr}`);
    const full = spawnSync('dd', ['if=/dev/zero', `of=${path.join(root, 'b.bin')}`, 'bs=1M', 'count=2000', 'conv=fsync'], { encoding: 'utf8' });
    assert.notEqual(full.status, 0);
    assert.match(full.stderr, /No space left on device/, 'the pool itself full: ENOSPC, not an I/O error');
    rmSync(path.join(root, 'b.bin'));
    execFileSync('btrfs', ['filesystem', 'sync', pool.mountPoint]);
    writeFileSync(path.join(root, 'after.txt'), 'still writable\n');
    assert.equal(readFileSync(path.join(root, 'after.txt'), 'utf8'), 'still writable\n');
    assert.equal(execFileSync('sha256sum', [path.join(root, 'a.bin')], { encoding: 'utf8' }).length > 0, true);
    const opts = readFileSync('/proc/mounts', 'utf8').split('\n').find((l) => l.split(' ')[1] === pool.mountPoint)?.split(' ')[3] ?? '';
    assert.match(opts, /^rw\b/, `the pool is still mounted read-write: ${opts}`);
    await pool.removeDisk('sbfull');
    rmSync(path.join(hostDir, 'filler'));
  });
});
