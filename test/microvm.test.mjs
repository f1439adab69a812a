// The microVM driver beyond the conformance suite: full-machine snapshots hold what gVisor
// refuses (a TCP server with an open client connection) through snapshot, hibernate/wake and
// fork; the guest clock and RNG after a restore; disks (grown at a template restore); a VMM
// crash; bad configuration; a cluster node's lease keeper stopping its VMs when the daemon is
// SIGKILLed.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { startDaemon } from '../packages/server/dist/index.js';
import { Sandbox, Templates, Volumes } from '../packages/sdk/dist/index.js';
import { MicrovmDriver, qmp } from '../packages/driver-microvm/dist/index.js';
import { AgentChannel } from '../packages/core/dist/index.js';
import { templateRootfs } from '../scripts/bench-lib.mjs';
import { TEMPLATES_DIR, eventually, leftovers, startSpaced, startTestDaemon } from './helpers.mjs';
import { startPostgres } from './postgres.mjs';

const CACHE = process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm';
const NODE = ['/.space/lib/ld-linux-x86-64.so.2', '--library-path', '/.space/lib', '/.space/node'];

/**
 * A TCP echo server on 127.0.0.1:7000, and a client that holds ONE connection open: each
 * time /tmp/ask appears it sends a line and writes the echo to /tmp/answer. Both in one node
 * process, so the open connection lives in the guest kernel only.
 */
const SERVER_AND_CLIENT = `
const net = require('net'), fs = require('fs');
net.createServer((s) => s.on('data', (d) => s.write('echo:' + d))).listen(7000, '127.0.0.1', () => {
  const c = net.connect(7000, '127.0.0.1');
  c.on('data', (d) => fs.writeFileSync('/tmp/answer', String(d)));
  setInterval(() => { if (fs.existsSync('/tmp/ask')) { const q = fs.readFileSync('/tmp/ask', 'utf8'); fs.rmSync('/tmp/ask'); c.write(q); } }, 50);
  fs.writeFileSync('/tmp/ready', 'yes');
});`;

/** Asks the held-open connection once; resolves to the echo. */
async function ask(sb, q) {
  // Written aside and renamed: the server polls for the file and must never read it half-written.
  await sb.commands.run(`rm -f /tmp/answer; echo -n ${q} > /tmp/ask.tmp && mv /tmp/ask.tmp /tmp/ask`);
  return eventually(async () => (await sb.files.exists('/tmp/answer')) && (await sb.files.read('/tmp/answer')), { tries: 400, everyMs: 150 });
}

/** A new connection to the server (busybox nc); resolves to the echo. */
async function fresh(sb, q) {
  return (await sb.commands.run(`echo ${q} | nc -w 2 127.0.0.1 7000`)).stdout.trim();
}

describe('microvm driver: full-machine snapshots', () => {
  let fx;
  before(async () => {
    fx = await startTestDaemon({ driver: 'microvm', microvm: { cacheDir: CACHE } });
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('a TCP server with an open client connection snapshots, hibernates, wakes and forks, and still serves', async () => {
    const sb = await fx.create({ memoryMb: 256 });
    await sb.commands.run([...NODE, '-e', SERVER_AND_CLIENT], { background: true });
    // Node's first start in a fresh guest is slow under emulation (seconds; more on a loaded host).
    await eventually(() => sb.files.exists('/tmp/ready'), { tries: 600, everyMs: 250 });
    assert.equal(await ask(sb, 'one'), 'echo:one');
    const established = (await sb.commands.run('cat /proc/net/tcp')).stdout.split('\n').filter((l) => / 01 /.test(l.slice(30, 40)));
    assert.ok(established.length >= 2, 'both ends of the connection are ESTABLISHED in the guest');

    // gVisor refuses this state with SNAPSHOT_UNSUPPORTED_STATE; a VM snapshot takes it.
    const snap = await sb.snapshot({ name: 'with-connection' });
    assert.ok(snap.sizeBytes > 0);
    assert.equal(await ask(sb, 'two'), 'echo:two', 'the same connection works after the snapshot');

    await sb.hibernate();
    assert.equal(sb.info.state, 'hibernated');
    assert.equal((await sb.usage()).rssBytes, 0, 'no VMM runs while hibernated');
    await sb.wake();
    assert.equal(await ask(sb, 'three'), 'echo:three', 'the connection held open across hibernate/wake');
    assert.equal(await fresh(sb, 'new'), 'echo:new', 'and the server takes new connections');
    // The guest clock is the host's after a restore, not the snapshot's.
    const guestNow = Number((await sb.commands.run('date +%s')).stdout.trim());
    assert.ok(Math.abs(guestNow - Date.now() / 1000) < 5, `guest clock ${guestNow} is within 5 s of the host's`);

    const copies = await sb.fork({ count: 2 });
    for (const c of copies) fx.track(c);
    for (const [i, c] of copies.entries()) {
      assert.equal(await ask(c, `copy${i}`), `echo:copy${i}`, 'each copy has its own copy of the open connection');
      assert.equal(await fresh(c, `n${i}`), `echo:n${i}`);
      assert.equal((await c.commands.run('hostname')).stdout.trim(), c.id);
    }
    // The parent was restored (from its template, then from its snapshots), so it ran on a
    // private mapping of an image's RAM; its fork image still has a RAM file of its own (the
    // loader), which both copies map copy-on-write: they share the pages neither has changed.
    const rams = copies.map((c) => JSON.parse(readFileSync(path.join(fx.dataDir, 'microvm', 'boxes', c.id, 'ram.json'), 'utf8')));
    assert.deepEqual(rams.map((r) => r.shared), [false, false]);
    assert.equal(rams[0].path, rams[1].path, 'both copies map the one RAM file of the fork image');
    const smaps = copies.map((c) => readFileSync(`/proc/${readFileSync(path.join(fx.dataDir, 'microvm', 'boxes', c.id, 'qemu.pid'), 'utf8').trim()}/smaps_rollup`, 'utf8'));
    const kb = (re) => smaps.reduce((a, t) => a + Number(re.exec(t)[1]), 0);
    assert.ok(kb(/^Pss:\s+(\d+) kB/m) < 0.8 * kb(/^Rss:\s+(\d+) kB/m), `the copies share pages: PSS ${kb(/^Pss:\s+(\d+) kB/m)} kB, RSS ${kb(/^Rss:\s+(\d+) kB/m)} kB`);
    assert.deepEqual(readdirSync(path.join(fx.dataDir, 'microvm', 'boxes')).filter((d) => d.endsWith('.load')), [], 'no loader left');
    // Each restore reseeds the guest kernel's pool: copies of one machine draw different numbers.
    const rand = await Promise.all(copies.map(async (c) => (await c.commands.run('head -c 16 /dev/urandom | od -An -tx1')).stdout));
    assert.notEqual(rand[0], rand[1]);
    assert.equal(await ask(sb, 'parent'), 'echo:parent', 'the parent is unaffected');

    await sb.rollback(snap.id);
    assert.equal(await ask(sb, 'after-rollback'), 'echo:after-rollback', 'the connection as it was in the snapshot');
    for (const c of copies) await c.kill();
    await sb.kill();
  });

  it('with a disk (the default on a node of its own): files are not in guest memory, a full disk is ENOSPC, and the disk follows snapshots, hibernate and forks', async () => {
    const sb = await fx.create({ memoryMb: 256, diskMb: 1024 });
    const sh = async (c) => (await sb.commands.run(c)).stdout.trim();
    assert.match(await sh('df -m / | tail -1'), /^overlay\s+9\d\d\s/, 'the root is the 1 GiB disk');
    // 300 MB: beyond the 128 MiB an in-memory root of a 256 MiB guest may hold.
    await sh('dd if=/dev/zero of=/tmp/big bs=1M count=300 2>/dev/null && sync');
    assert.equal(await sh('stat -c %s /tmp/big'), String(300 * 1048576));
    const disk = readdirSync(path.join(fx.dataDir, 'disks', 'mnt', 'disks')).filter((d) => d.startsWith(`${sb.id}-`));
    assert.equal(disk.length, 1, 'one disk in the pool for the running incarnation');
    assert.ok(statSync(path.join(fx.dataDir, 'disks', 'mnt', 'disks', disk[0], 'disk.ext4')).blocks * 512 >= 300 * 1048576, 'the bytes are in the disk image on the host');
    const full = await sb.commands.run('dd if=/dev/zero of=/tmp/fill bs=1M count=1000 2>&1; echo rc=$?');
    assert.match(full.stdout, /No space left on device/);
    assert.equal(await sh('echo alive'), 'alive', 'the sandbox answers with its disk full');
    await sh('rm /tmp/fill; echo one > /tmp/mark');

    const snap = await sb.snapshot();
    await sh('echo two > /tmp/mark; rm /tmp/big');
    await sb.hibernate();
    await sb.wake();
    assert.equal(await sh('cat /tmp/mark; ls /tmp/big 2>&1 | grep -c "No such"'), 'two\n1', 'hibernate/wake keeps the disk as it was');
    await sb.rollback(snap.id);
    assert.equal(await sh('cat /tmp/mark; stat -c %s /tmp/big'), `one\n${300 * 1048576}`, 'rollback brings the snapshot\'s files back');

    const copies = await sb.fork({ count: 2 });
    for (const c of copies) fx.track(c);
    for (const [i, c] of copies.entries()) await c.commands.run(`echo copy${i} > /tmp/mark`);
    assert.deepEqual(await Promise.all(copies.map(async (c) => (await c.commands.run('cat /tmp/mark; stat -c %s /tmp/big')).stdout.trim())), [`copy0\n${300 * 1048576}`, `copy1\n${300 * 1048576}`], 'forks diverge, each with the parent\'s files');
    assert.equal(await sh('cat /tmp/mark'), 'one', 'the parent is unchanged');
    for (const c of copies) await c.kill();
    await sb.kill();
    assert.deepEqual(readdirSync(path.join(fx.dataDir, 'disks', 'mnt', 'disks')).filter((d) => [sb.id, ...copies.map((c) => c.id)].some((id) => d.startsWith(`${id}-`))), [], 'no disk left of killed sandboxes');
  });

  it('a create asking for a larger disk than the template image\'s restores the image and grows the disk; a smaller one boots', async () => {
    // The image is taken in the background after the first create of the template.
    await eventually(async () => !!(await Templates.get('minimal', fx.conn)).image, { tries: 600, everyMs: 250 });
    const sb = await fx.create({ memoryMb: 256, diskMb: 8192 });
    assert.equal(sb.info.createTimings.source, 'snapshot', 'restored from the template image (made with a 5 GiB disk), not booted');
    const sh = async (c) => (await sb.commands.run(c)).stdout.trim();
    const dfMb = async (s = sb) => Number(/^overlay\s+(\d+)\s/.exec((await s.commands.run('df -m / | tail -1')).stdout)[1]);
    assert.ok((await dfMb()) > 7900, `the file system fills the 8 GiB device: ${await dfMb()} MiB`);
    assert.equal((await sb.usage()).diskLimitBytes, 8192 * 1048576);
    // 6 GB allocated: more than the image's disk could hold, and no data written (fallocate).
    assert.equal(await sh('fallocate -l 6000M /tmp/huge && stat -c %s /tmp/huge'), String(6000 * 1048576));
    await sb.hibernate();
    await sb.wake();
    assert.ok((await dfMb()) > 7900, 'the grown disk is what its snapshot carries');
    const [copy] = await sb.fork({ count: 1 });
    fx.track(copy);
    assert.ok((await dfMb(copy)) > 7900, 'and what a fork gets');
    assert.equal((await copy.commands.run('stat -c %s /tmp/huge')).stdout.trim(), String(6000 * 1048576));
    await copy.kill();
    await sb.kill();
    // A file system mounted in a running machine cannot shrink: the template boots instead.
    const small = await fx.create({ memoryMb: 256, diskMb: 1024 });
    assert.equal(small.info.createTimings.source, 'boot');
    assert.ok((await dfMb(small)) < 1024);
    await small.kill();
  });

  it('the VMM runs as its own unprivileged user under a seccomp filter; pause freezes the machine and resume continues it', async () => {
    const sb = await fx.create({ memoryMb: 192 });
    const pid = Number(readFileSync(path.join(fx.dataDir, 'microvm', 'boxes', sb.id, 'qemu.pid'), 'utf8'));
    const status = readFileSync(`/proc/${pid}/status`, 'utf8');
    const uid = Number(/^Uid:\s+(\d+)\s+(\d+)\s+(\d+)/m.exec(status)[1]);
    assert.notEqual(uid, 0, 'QEMU dropped root');
    assert.equal(Number(/^Uid:\s+\d+\s+(\d+)\s+(\d+)/m.exec(status)[2]), uid, 'saved uid dropped too');
    assert.match(status, /^CapEff:\s+0+$/m, 'no capabilities left');
    assert.match(status, /^Seccomp:\s+2$/m, 'seccomp filter mode');
    await sb.files.write('/tmp/x', 'kept');
    await sb.pause();
    assert.equal(sb.info.state, 'paused');
    await sb.resume();
    assert.equal(await sb.files.read('/tmp/x'), 'kept');
    await sb.kill();
  });

  it('creates restore the template snapshot, and a warm pool hands out ready VMs that take their identity', async () => {
    const s = await fx.create({ memoryMb: 256 });
    assert.equal(s.info.createTimings.source, 'snapshot');
    await Templates.setPool('minimal', 1, fx.conn);
    await eventually(async () => (await Templates.get('minimal', fx.conn)).pool.ready === 1, { tries: 600, everyMs: 250 });
    const p = await fx.create({ memoryMb: 512, env: { WHO: 'pooled' } });
    assert.equal(p.info.createTimings.source, 'pool');
    assert.equal((await p.commands.run('echo $WHO $SPACE_SANDBOX_ID; hostname')).stdout, `pooled ${p.id}\n${p.id}\n`);
    await Templates.setPool('minimal', 0, fx.conn);
    await s.kill();
    await p.kill();
  });

  it('a VMM that dies mid-run: the sandbox comes back from its last snapshot, or ends dead if it has none', async () => {
    const sb = await fx.create({ memoryMb: 192 });
    await sb.files.write('/tmp/v', 'snapshotted');
    await sb.snapshot();
    await sb.files.write('/tmp/v', 'lost');
    const pidFile = path.join(fx.dataDir, 'microvm', 'boxes', sb.id, 'qemu.pid');
    process.kill(Number(readFileSync(pidFile, 'utf8')), 'SIGKILL');
    const back = await eventually(async () => {
      const ev = await sb.events();
      return ev.some((e) => e.type === 'recovered') && (await sb.refresh()).state === 'running';
    });
    assert.ok(back);
    assert.equal(await sb.files.read('/tmp/v'), 'snapshotted');

    const bare = await fx.create({ memoryMb: 192 });
    process.kill(Number(readFileSync(path.join(fx.dataDir, 'microvm', 'boxes', bare.id, 'qemu.pid'), 'utf8')), 'SIGKILL');
    const info = await eventually(async () => {
      const i = await bare.refresh();
      return i.state === 'dead' ? i : undefined;
    });
    assert.equal(info.endReason, 'crashed');
    assert.match(info.endDetail, /VM stopped/);
    await sb.kill();
  });
});

describe('microvm driver: the RAM of a restored VM\'s checkpoint', () => {
  it('a loader that fails leaves the whole stream in the image, and the VM restores from it', async () => {
    const dir = mkdtempSync('/tmp/spt-vmram-');
    const driver = new MicrovmDriver({ dataDir: dir, cacheDir: CACHE, failRamLoader: true });
    const hellos = new Map();
    const channels = new Map();
    driver.bind({
      agentConnected(id, stream) {
        const ch = new AgentChannel(stream);
        ch.once('event', (ev) => {
          if (ev.event !== 'hello') return;
          channels.set(id, ch);
          hellos.get(id)?.();
        });
      },
    });
    const hello = (id) => new Promise((r) => hellos.set(id, r));
    const id = 'sbvmram';
    const spec = { id, template: 'minimal', rootfs: templateRootfs(TEMPLATES_DIR, 'minimal'), cpu: 1, memoryMb: 192, env: {} };
    const checkpoint = async (img) => {
      const ch = channels.get(id);
      await driver.detachAgent(id);
      const closed = new Promise((r) => ch.once('close', r));
      await ch.unary({ op: 'quiesce' }, 10_000);
      await closed;
      await driver.checkpoint(id, img);
      await driver.retire(id);
      return Object.fromEntries(readdirSync(img).map((f) => [f, statSync(path.join(img, f)).size]));
    };
    try {
      await driver.init();
      let h = hello(id);
      await driver.create(spec);
      await h;
      const booted = await checkpoint(path.join(dir, 'i1'));
      assert.ok(booted.ram > 0 && booted.memory < 4 << 20, `a booted VM's image: its RAM file and a small stream (${JSON.stringify(booted)})`);
      h = hello(id);
      await driver.restore(spec, path.join(dir, 'i1'));
      await h;
      await channels.get(id).unary({ op: 'mkdir', path: '/tmp/made-before' }, 10_000);
      const restored = await checkpoint(path.join(dir, 'i2'));
      assert.equal(restored.ram, undefined, 'no RAM file when the loader failed');
      assert.ok(restored.memory > 16 << 20, `the stream carries the RAM (${restored.memory} bytes)`);
      h = hello(id);
      await driver.restore(spec, path.join(dir, 'i2'));
      await h;
      assert.equal((await channels.get(id).unary({ op: 'stat', path: '/tmp/made-before' }, 10_000)).entry.type, 'dir', 'the guest as it was saved');
      assert.deepEqual(readdirSync(path.join(dir, 'microvm', 'boxes')).filter((d) => d.endsWith('.load')), [], 'no loader left');
      assert.deepEqual(readdirSync('/dev/shm').filter((f) => f.includes('.load-')), [], 'no loader RAM left');
    } finally {
      await driver.destroy(id);
      await driver.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('microvm driver on a cluster node: the lease keeper', () => {
  it('the daemon SIGKILLed: its keeper stops the VM over QMP before another node may take it over; the daemon back continues it', async () => {
    const pg = await startPostgres();
    const dir = mkdtempSync('/tmp/spt-vmkeep-');
    const env = { SPACE_DATABASE: pg.freshDatabase(), SPACE_BLOB_STORE: `file://${dir}/blobs`, SPACE_NODE_NAME: 'v', SPACE_NODE_LOST_AFTER: '6', SPACE_DRIVER: 'microvm', SPACE_MICROVM_CACHE_DIR: CACHE };
    let d = await startSpaced(dir, env);
    let id;
    let passed = false;
    try {
      const sb = await Sandbox.create({ ...d.conn, template: 'minimal', memoryMb: 256 });
      id = sb.id;
      await sb.files.write('/tmp/kept', 'through the stop');
      const status = async () => (await qmp(path.join(dir, 'microvm', 'boxes', id, 'qmp.sock'), [{ execute: 'query-status' }]))[0];
      assert.equal((await status()).running, true);
      d.child.kill('SIGKILL');
      await d.exited;
      // Two thirds of --node-lost-after (4 s) after the last heartbeat: stopped (a bounded wait).
      await eventually(async () => (await status()).running === false, { tries: 300, everyMs: 100 });
      d = await startSpaced(dir, env);
      assert.equal((await status()).running, true, 'the node back continues its own VM');
      const again = await Sandbox.connect(id, d.conn);
      assert.equal(again.info.state, 'running');
      assert.equal(await again.files.read('/tmp/kept'), 'through the stop');
      await again.kill();
      passed = true;
    } finally {
      const alive = d.child.exitCode === null && d.child.signalCode === null;
      // Failed midway: its VM is ended here, so the failure itself is what the test reports.
      if (!passed && alive && id) await Sandbox.kill(id, d.conn).catch(() => {});
      if (alive) d.child.kill('SIGTERM');
      await d.exited;
      await pg.stop();
      const left = id ? leftovers(dir, [id]) : [];
      if (!passed) for (const l of left) if (/^VMM process (\d+)/.test(l)) process.kill(Number(/^VMM process (\d+)/.exec(l)[1]), 'SIGKILL');
      rmSync(dir, { recursive: true, force: true });
      if (passed) assert.deepEqual(left, []);
      else if (left.length) console.log(`# left behind by the failure (VMM processes killed): ${left.join(', ')}`);
    }
  });
});

describe('one daemon, two drivers: each sandbox chooses at creation', () => {
  let fx;
  before(async () => {
    // Files in memory on both drivers (the volume refusals below are those of a daemon without disks).
    fx = await startTestDaemon({ driver: 'gvisor', drivers: ['gvisor', 'microvm'], microvm: { cacheDir: CACHE }, disks: { mode: 'off' } });
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('driver: "microvm" gets a guest kernel, the default gets gVisor; snapshots and forks stay on their driver', async () => {
    const version = await (await fetch(`${fx.url}/v1/version`)).json();
    assert.deepEqual(version.drivers, ['gvisor', 'microvm']);
    const [g, m] = await Promise.all([fx.create({ memoryMb: 192 }), fx.create({ memoryMb: 192, driver: 'microvm' })]);
    assert.equal(g.info.driver, 'gvisor');
    assert.equal(m.info.driver, 'microvm');
    // gVisor reports its own kernel version; the VM runs Debian's.
    assert.doesNotMatch((await g.commands.run('uname -r')).stdout, /amd64/);
    assert.match((await m.commands.run('uname -r')).stdout, /amd64/);
    await m.files.write('/tmp/who', 'vm');
    const [copy] = await m.fork({ count: 1 });
    fx.track(copy);
    assert.equal(copy.info.driver, 'microvm');
    assert.equal(await copy.files.read('/tmp/who'), 'vm');
    assert.match((await copy.commands.run('uname -r')).stdout, /amd64/);
    await m.hibernate();
    await m.wake();
    assert.equal(await m.files.read('/tmp/who'), 'vm');
    await assert.rejects(fx.create({ driver: 'firecracker' }), (e) => e.code === 'DRIVER_NOT_ENABLED' && e.status === 400 && /--drivers/.test(e.message));
    // Volumes mount into gVisor sandboxes with disks only: the microVM driver takes no host
    // directories yet, and without a disk the mount point would be made in the template's shared files.
    await Volumes.create('vmvol', { ...fx.conn, sizeMb: 64 });
    await assert.rejects(fx.create({ driver: 'microvm', volumes: [{ volume: 'vmvol', path: '/data' }] }), (e) => e.code === 'VOLUMES_UNAVAILABLE' && /gVisor/.test(e.message));
    await assert.rejects(fx.create({ volumes: [{ volume: 'vmvol', path: '/data' }] }), (e) => e.code === 'VOLUMES_UNAVAILABLE' && /--disks on/.test(e.message));
    assert.deepEqual((await Volumes.get('vmvol', fx.conn)).mountedBy, [], 'nothing holds it');
    await Volumes.remove('vmvol', fx.conn);
    for (const sb of [g, m, copy]) await sb.kill();
  });
});

describe('microvm driver: configuration errors stop the daemon at start', () => {
  it('a kernel package that is not there', async () => {
    const dataDir = (await import('node:fs')).mkdtempSync('/tmp/spt-');
    (await import('./helpers.mjs')).makeNodeKey(dataDir);
    await assert.rejects(
      startDaemon({ dataDir, listen: '127.0.0.1:0', logLevel: 'silent', egress: { mode: 'off' }, driver: 'microvm', microvm: { cacheDir: path.join(dataDir, 'cache'), kernelDeb: '/nonexistent/linux-image.deb' } }),
      (e) => e.code === 'DRIVER_UNAVAILABLE' && /linux-image\.deb/.test(e.message),
    );
    (await import('node:fs')).rmSync(dataDir, { recursive: true, force: true });
  });

  it('KVM asked for where no guest runs under it (no /dev/kvm, or one that runs no guest: nested KVM without VMX)', async (t) => {
    // The driver probes only where /dev/kvm exists (and keeps the answer); without it, no probe file.
    const probeFile = path.join(CACHE, 'kvm-probe.json');
    if (existsSync(probeFile) && JSON.parse(readFileSync(probeFile, 'utf8')).ok) return t.skip('this host runs guests under KVM');
    const dataDir = (await import('node:fs')).mkdtempSync('/tmp/spt-');
    (await import('./helpers.mjs')).makeNodeKey(dataDir);
    await assert.rejects(
      startDaemon({ dataDir, listen: '127.0.0.1:0', logLevel: 'silent', egress: { mode: 'off' }, driver: 'microvm', microvm: { cacheDir: CACHE, accel: 'kvm' } }),
      (e) => e.code === 'DRIVER_UNAVAILABLE' && /--microvm-accel kvm, but/.test(e.message),
    );
    (await import('node:fs')).rmSync(dataDir, { recursive: true, force: true });
  });
});
