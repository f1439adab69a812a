// The node's volume store (@space/volume-ext4) on its own: ext4 images whose files fscrypt
// encrypts. Real mounts, loop devices and fscrypt; no daemon.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, promises as fs, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { Ext4Volumes } from '../packages/volume-ext4/dist/index.js';

describe('volume store (ext4 + fscrypt)', () => {
  const dir = mkdtempSync('/tmp/spvol-');
  const host = new Ext4Volumes({ dir });
  after(async () => {
    for (const id of await host.openIds()) await host.close(id);
    rmSync(dir, { recursive: true, force: true });
  });

  it('files written while open are in the image after close, in every copy, and only as ciphertext', async () => {
    const key = randomBytes(32);
    await host.create('vol-a', 64, key);
    for (let i = 0; i < 12; i++) {
      // Open and close back to back, as sandboxes and transfers do: each close's writes must reach the image.
      const files = await host.open('vol-a', key);
      await fs.writeFile(path.join(files, `f${i}`), `PLAINTEXT-${i}-`.repeat(100));
      await host.close('vol-a');
      await host.snapshot('vol-a', `s${i}`);
    }
    assert.deepEqual(await host.openIds(), []);
    for (const f of [path.join(dir, 'vol-a', 'volume.img'), path.join(dir, 'vol-a', 'snapshots', 's11.img')]) {
      const img = readFileSync(f);
      assert.equal(img.includes('PLAINTEXT-'), false, `${f} holds ciphertext only`);
      assert.equal(img.includes('f11'), false, 'names are encrypted too');
    }
    await host.restore('vol-a', 's5');
    const files = await host.open('vol-a', key);
    assert.deepEqual((await fs.readdir(files)).sort(), ['f0', 'f1', 'f2', 'f3', 'f4', 'f5']);
    assert.equal(await fs.readFile(path.join(files, 'f5'), 'utf8'), 'PLAINTEXT-5-'.repeat(100));
    await host.close('vol-a');
  });

  it('a volume takes its whole size on the host when made; without the room, CAPACITY_EXHAUSTED and nothing is left', async () => {
    const small = mkdtempSync('/tmp/spvol-small-');
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=100m', 'tmpfs', small]);
    try {
      const h = new Ext4Volumes({ dir: path.join(small, 'volumes') });
      await assert.rejects(h.create('vol-big', 200, randomBytes(32)), (e) => e.code === 'CAPACITY_EXHAUSTED' && /no room for a volume of 200 MiB/.test(e.message));
      assert.equal(existsSync(path.join(small, 'volumes', 'vol-big')), false);
      await h.create('vol-fits', 64, randomBytes(32));
      const { blocks } = await fs.stat(path.join(small, 'volumes', 'vol-fits', 'volume.img'));
      assert.ok(blocks * 512 >= 60 * 1048576, `the image is allocated (${blocks * 512} bytes), not sparse`);
      await h.remove('vol-fits');
    } finally {
      execFileSync('umount', [small]);
      rmSync(small, { recursive: true, force: true });
    }
  });

  it('a wrong key opens nothing; a removed volume leaves nothing', async () => {
    await assert.rejects(host.open('vol-a', randomBytes(32)), (e) => e.code === 'KEY_INVALID');
    assert.deepEqual(await host.openIds(), []);
    await host.remove('vol-a');
    assert.equal(existsSync(path.join(dir, 'vol-a')), false);
  });
});
