// What `--disks auto` comes to (fast lane, no runtime): on for a new data directory
// of a node on its own when the host has btrfs, loop devices and room for a pool — this
// machine's set-up installs btrfs-progs; off for nodes sharing a database (a disk does not move between nodes yet) and
// for a data directory made before (its sandboxes and images have no disk); decided once and
// kept. Real SQLite.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { parseDisksMode, resolveDisksMode } from '../packages/server/dist/daemon.js';
import { sandbox } from './store-suite.mjs';

const dir = mkdtempSync('/tmp/spdm-');
after(() => rmSync(dir, { recursive: true, force: true }));
const open = (name) => SqliteStore.open(path.join(dir, `${name}.db`));
const images = (name, files = []) => {
  const d = path.join(dir, `${name}-images`);
  mkdirSync(d, { recursive: true });
  for (const f of files) writeFileSync(path.join(d, f), '');
  return d;
};

describe('--disks auto', () => {
  it('a new data directory on this host: on, and it stays on (asked again, or after the host changed)', async () => {
    const store = open('fresh');
    const first = await resolveDisksMode('auto', { shared: false, store, imagesDir: images('fresh') });
    assert.deepEqual(first.mode, 'on', first.why);
    // The data directory now holds sandboxes with disks: it stays on whatever comes later.
    await store.insertSandbox(sandbox('sb1', 't1'));
    assert.deepEqual(await resolveDisksMode('auto', { shared: false, store, imagesDir: images('fresh', ['minimal']) }), { mode: 'on', why: 'this data directory was set up with disks on' });
    store.close();
  });

  it('a data directory from before (live sandboxes, or template images, without disks): off, and kept off', async () => {
    for (const [name, live, files] of [['live', true, []], ['imaged', false, ['minimal']]]) {
      const store = open(name);
      if (live) await store.insertSandbox(sandbox('sb1', 't1', 'hibernated'));
      const r = await resolveDisksMode('auto', { shared: false, store, imagesDir: images(name, files) });
      assert.equal(r.mode, 'off', name);
      assert.match(r.why, /made without disks: start with --disks on/);
      assert.equal(await store.getMeta('disks-auto'), 'off');
      store.close();
    }
    // Ended sandboxes do not count: nothing of theirs is restored.
    const store = open('ended');
    await store.insertSandbox(sandbox('sb1', 't1', 'killed'));
    assert.equal((await resolveDisksMode('auto', { shared: false, store, imagesDir: images('ended') })).mode, 'on');
    store.close();
  });

  it('a host without btrfs-progs: off, saying what to install', async () => {
    const store = open('no-btrfs');
    const saved = process.env.PATH;
    process.env.PATH = dir; // no mkfs.btrfs there
    try {
      const r = await resolveDisksMode('auto', { shared: false, store, imagesDir: images('no-btrfs') });
      assert.equal(r.mode, 'off');
      assert.match(r.why, /lacks btrfs-progs \(apt-get install btrfs-progs\)/);
    } finally {
      process.env.PATH = saved;
      store.close();
    }
  });

  it('a host without room for a disk pool (which takes its size on the host when made): off, saying how much it needs', async () => {
    const store = open('no-room');
    const small = path.join(dir, 'small');
    mkdirSync(small);
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64m', 'tmpfs', small]);
    try {
      const r = await resolveDisksMode('auto', { shared: false, store, imagesDir: images('no-room'), hostDir: small });
      assert.equal(r.mode, 'off');
      assert.match(r.why, /lacks room for a disk pool \(\d+ MiB free under .*small; a pool takes 5376 MiB at least\)/);
    } finally {
      execFileSync('umount', [small]);
      store.close();
    }
  });

  it('nodes sharing a database: off, saying why; on and off as asked; anything else is CONFIG_INVALID', async () => {
    const store = open('shared');
    const r = await resolveDisksMode('auto', { shared: true, store, imagesDir: images('shared') });
    assert.equal(r.mode, 'off');
    assert.match(r.why, /not tested yet: start with --disks on/);
    assert.match(r.why, /disks move with their sessions/);
    assert.equal(await store.getMeta('disks-auto'), undefined, 'nothing recorded for a cluster');
    assert.equal((await resolveDisksMode('off', { shared: false, store, imagesDir: images('shared') })).mode, 'off');
    assert.equal((await resolveDisksMode('on', { shared: true, store, imagesDir: images('shared') })).mode, 'on');
    assert.throws(() => parseDisksMode('yes'), (e) => e.code === 'CONFIG_INVALID' && /auto .*on .*off/.test(e.message));
    store.close();
  });
});
