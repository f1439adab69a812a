#!/usr/bin/env node
// Sandbox disks (--disks on) and volumes against the baselines beside them, in one run: dd of
// 1 GiB inside a sandbox, to its disk and to a volume, vs on the host's file system; a snapshot and a fork of a sandbox holding 1 GiB vs an
// empty one (time, bytes stored, bytes added to the pool, and the longest command run during it); creates from the template image and
// from a warm pool with a disk vs with today's in-memory root (a second daemon, --disks off); on the
// microVM driver (a third daemon), dd of 1 GiB to a VM's disk vs the host, and creates from the
// template image asking for a larger disk than the image's (grown at restore) vs the image's size.
// Each driver's rows are a section of docs/benchmarks.md of their own (`--only gvisor|microvm`).
//   node scripts/bench-disks.mjs [--creates 21] [--microvm-creates 5] [--only gvisor|microvm] [--write]
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { quantile, writeSection } from './bench-lib.mjs';
import { Sandbox, Volumes } from '../packages/sdk/dist/index.js';
import { closeDiskPool, eventually, startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { creates: { type: 'string' }, 'microvm-creates': { type: 'string' }, iterations: { type: 'string' }, only: { type: 'string' }, write: { type: 'boolean', default: false } } });
// `./space bench --iterations N` passes its flags to every script: here they count the creates.
const CREATES = Number(values.creates ?? values.iterations ?? 21);
const VM_CREATES = Number(values['microvm-creates'] ?? values.iterations ?? 5);
if (values.only !== undefined && !['gvisor', 'microvm'].includes(values.only)) throw new Error(`--only takes gvisor or microvm, not ${values.only}`);
const GVISOR = values.only !== 'microvm';
const MICROVM = values.only !== 'gvisor';
const MiB = 1048576;
const ms = (t) => Math.round(performance.now() - t);

const diskDir = mkdtempSync('/tmp/space-bench-disks-');
const memDir = mkdtempSync('/tmp/space-bench-mem-');
const vmDir = mkdtempSync('/tmp/space-bench-vm-');
let microvm;
// Both keep a warm pool of `minimal` (512 MiB sandboxes); a create of another size restores the image.
const withDisks = GVISOR ? await startSpaced(diskDir, { SPACE_DISKS: 'on', SPACE_POOLS: 'minimal=2' }) : undefined;
const inMemory = GVISOR ? await startSpaced(memDir, { SPACE_DISKS: 'off', SPACE_POOLS: 'minimal=2' }) : undefined;
const mnt = path.join(diskDir, 'disks', 'mnt');
/** Bytes the pool's file system holds (data and metadata), once written out. */
const poolUsed = () => {
  execFileSync('btrfs', ['filesystem', 'sync', mnt]);
  return Number(/^\s*Used:\s+(\d+)/m.exec(execFileSync('btrfs', ['filesystem', 'usage', '-b', mnt], { encoding: 'utf8' }))[1]);
};
const dropCaches = () => execFileSync('sh', ['-c', 'sync; echo 3 > /proc/sys/vm/drop_caches']);
const p50 = (a) => quantile(a, 50);
const mbps = (bytes, msTaken) => Math.round(bytes / MiB / (msTaken / 1000));
const rows = [];
const vmRows = [];

try {
  if (GVISOR) {
    // 1. Sequential write and read of 1 GiB: inside a sandbox (its disk, and a volume) vs on the host (the data directory's file system).
    await Volumes.create('bench', { ...withDisks.conn, sizeMb: 2048 });
    const sb = await Sandbox.create({ ...withDisks.conn, template: 'minimal', diskMb: 4096 });
    // Its own sandbox: one that writes a volume cannot be forked (section 2 forks `sb`).
    const vsb = await Sandbox.create({ ...withDisks.conn, template: 'minimal', diskMb: 4096, volumes: [{ volume: 'bench', path: '/vol' }] });
    const hostFile = path.join(diskDir, 'host-dd');
    const io = { sandbox: {}, host: {}, volume: {} };
    for (let round = 0; round < 2; round++) {
      let t = performance.now();
      await sb.commands.run('dd if=/dev/zero of=/tmp/dd bs=1M count=1024 conv=fsync 2>/dev/null');
      io.sandbox.write = Math.max(io.sandbox.write ?? 0, mbps(1024 * MiB, ms(t)));
      t = performance.now();
      await vsb.commands.run('dd if=/dev/zero of=/vol/dd bs=1M count=1024 conv=fsync 2>/dev/null');
      io.volume.write = Math.max(io.volume.write ?? 0, mbps(1024 * MiB, ms(t)));
      t = performance.now();
      execFileSync('dd', ['if=/dev/zero', `of=${hostFile}`, 'bs=1M', 'count=1024', 'conv=fsync'], { stdio: 'ignore' });
      io.host.write = Math.max(io.host.write ?? 0, mbps(1024 * MiB, ms(t)));
      dropCaches();
      t = performance.now();
      await sb.commands.run('dd if=/tmp/dd of=/dev/null bs=1M 2>/dev/null');
      io.sandbox.read = Math.max(io.sandbox.read ?? 0, mbps(1024 * MiB, ms(t)));
      dropCaches();
      t = performance.now();
      await vsb.commands.run('dd if=/vol/dd of=/dev/null bs=1M 2>/dev/null');
      io.volume.read = Math.max(io.volume.read ?? 0, mbps(1024 * MiB, ms(t)));
      dropCaches();
      t = performance.now();
      execFileSync('dd', [`if=${hostFile}`, 'of=/dev/null', 'bs=1M'], { stdio: 'ignore' });
      io.host.read = Math.max(io.host.read ?? 0, mbps(1024 * MiB, ms(t)));
    }
    rmSync(hostFile, { force: true });
    rows.push(['sequential write, 1 GiB (dd, fsync), MB/s (best of 2)', io.sandbox.write, io.host.write, `${(io.sandbox.write / io.host.write).toFixed(2)}x`]);
    rows.push(['sequential read, 1 GiB (dd, caches dropped), MB/s (best of 2)', io.sandbox.read, io.host.read, `${(io.sandbox.read / io.host.read).toFixed(2)}x`]);
    rows.push(['volume (ext4 + fscrypt): sequential write, 1 GiB, MB/s (best of 2)', io.volume.write, io.host.write, `${(io.volume.write / io.host.write).toFixed(2)}x`]);
    rows.push(['volume: sequential read, 1 GiB, MB/s (best of 2)', io.volume.read, io.host.read, `${(io.volume.read / io.host.read).toFixed(2)}x`]);
    await vsb.kill();
    // A volume's own snapshot with 1 GiB written (a copy of its image on the node).
    let tv = performance.now();
    await Volumes.snapshot('bench', withDisks.conn);
    rows.push(['volume snapshot with 1 GiB written, ms', ms(tv), '', '']);
    await Volumes.remove('bench', withDisks.conn);

    // 2. Snapshot and fork of a sandbox holding 1 GiB vs an empty one.
    const empty = await Sandbox.create({ ...withDisks.conn, template: 'minimal', diskMb: 4096 });
    const measure = async (s) => {
      let t = performance.now();
      // Commands run one after another while the snapshot is taken and stored: the longest waited out its downtime.
      let snapping = true;
      let longestExec = 0;
      const execs = (async () => {
        while (snapping) {
          const te = performance.now();
          await s.commands.run('true');
          longestExec = Math.max(longestExec, ms(te));
        }
      })();
      const snap = await s.snapshot().finally(() => (snapping = false));
      const snapMs = ms(t);
      await execs;
      const before = poolUsed();
      t = performance.now();
      const [copy] = await s.fork({ count: 1 });
      const forkMs = ms(t);
      const added = poolUsed() - before;
      await copy.kill();
      // Nothing written since the fork's snapshot: the disk's stored stream is copied, and the
      // change since (none: a few hundred bytes) added to it, not sent again.
      t = performance.now();
      await s.snapshot();
      const againMs = ms(t);
      // 1 MiB written since: that change is sent, not the GiB again.
      const w = await s.commands.run('head -c 1048576 /dev/urandom > /tmp/small && sync');
      if (w.exitCode !== 0) throw new Error(`writing 1 MiB failed: ${w.stderr}`);
      t = performance.now();
      await s.snapshot();
      const changedMs = ms(t);
      t = performance.now();
      await s.hibernate();
      const hibernateMs = ms(t);
      await s.wake();
      // (Each says where its time went, and whether the disk's stream was copied: for the log.)
      for (const e of (await s.events()).filter((x) => x.type === 'snapshot').slice(-4)) console.error(e.message);
      return { snapMs, stored: snap.sizeBytes, forkMs, added, longestExec, downtime: snap.downtimeMs, againMs, changedMs, hibernateMs };
    };
    const full = await measure(sb);
    const none = await measure(empty);
    const mib = (b) => (b / MiB).toFixed(1);
    rows.push(['snapshot, ms (1 GiB written vs empty disk)', full.snapMs, none.snapMs, `${(full.snapMs / none.snapMs).toFixed(2)}x`]);
    rows.push(['snapshot, MiB in it (image and disk stream, before deduplication)', mib(full.stored), mib(none.stored), '']);
    rows.push(["snapshot's downtime, ms", full.downtime, none.downtime, `${(full.downtime / none.downtime).toFixed(2)}x`]);
    rows.push(['longest `true` run during the snapshot, ms (calls wait out the downtime only)', full.longestExec, none.longestExec, `${(full.longestExec / none.longestExec).toFixed(2)}x`]);
    rows.push(['fork ×1, ms (1 GiB written vs empty disk)', full.forkMs, none.forkMs, `${(full.forkMs / none.forkMs).toFixed(2)}x`]);
    rows.push(['fork ×1, MiB added to the pool', mib(full.added), mib(none.added), '']);
    rows.push(['snapshot again, nothing written since, ms', full.againMs, none.againMs, `${(full.againMs / none.againMs).toFixed(2)}x`]);
    rows.push(['snapshot after 1 MiB written, ms', full.changedMs, none.changedMs, `${(full.changedMs / none.changedMs).toFixed(2)}x`]);
    rows.push(['hibernate, nothing written since, ms', full.hibernateMs, none.hibernateMs, `${(full.hibernateMs / none.hibernateMs).toFixed(2)}x`]);
    await sb.kill();
    await empty.kill();

    // 3. Creates: a template image restore (384 MiB: not the pool's size) with a disk vs today's in-memory root, alternating.
    const times = { disk: [], memory: [] };
    for (const [, d] of [['disk', withDisks], ['memory', inMemory]]) await (await Sandbox.create({ ...d.conn, template: 'minimal', memoryMb: 384 })).kill(); // template images taken
    for (let i = 0; i < CREATES; i++) {
      for (const [name, d] of [['disk', withDisks], ['memory', inMemory]]) {
        const x = await Sandbox.create({ ...d.conn, template: 'minimal', memoryMb: 384 });
        times[name].push(x.info.createTimings.totalMs);
        await x.kill();
      }
    }
    rows.push([`create from the template image, p50 ms (${CREATES} each, alternating)`, p50(times.disk), p50(times.memory), `${(p50(times.disk) / p50(times.memory)).toFixed(2)}x`]);

    // 4. Creates from the warm pool (512 MiB), each once the pool is full again, alternating; the source is checked.
    const pooled = { disk: [], memory: [] };
    const poolFull = (d) => eventually(async () => (await (await fetch(`${d.conn.apiUrl}/v1/templates/minimal`, { headers: { authorization: `Bearer ${d.conn.apiKey}` } })).json()).pool?.ready >= 2, { tries: 600 });
    for (let i = 0; i < CREATES; i++) {
      for (const [name, d] of [['disk', withDisks], ['memory', inMemory]]) {
        await poolFull(d);
        const x = await Sandbox.create({ ...d.conn, template: 'minimal' });
        if (x.info.createTimings.source !== 'pool') throw new Error(`a create on the ${name} daemon did not come from the pool: ${JSON.stringify(x.info.createTimings)}`);
        pooled[name].push(x.info.createTimings.totalMs);
        await x.kill();
      }
    }
    rows.push([`create from the warm pool, p50 ms (${CREATES} each, alternating)`, p50(pooled.disk), p50(pooled.memory), `${(p50(pooled.disk) / p50(pooled.memory)).toFixed(2)}x`]);
  }

  // 5. The microVM driver (its disk: an ext4 image file in its own pool, a virtio disk of the VM).
  if (MICROVM) {
    microvm = await startSpaced(vmDir, { SPACE_DISKS: 'on', SPACE_DRIVER: 'microvm', SPACE_MICROVM_CACHE_DIR: process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm' });
    const vm = await Sandbox.create({ ...microvm.conn, template: 'minimal', memoryMb: 256, diskMb: 4096 });
    const vmHostFile = path.join(vmDir, 'host-dd');
    const vio = { vm: 0, host: 0 };
    for (let round = 0; round < 2; round++) {
      let t = performance.now();
      await vm.commands.run('dd if=/dev/zero of=/tmp/dd bs=1M count=1024 conv=fsync 2>/dev/null; rm /tmp/dd');
      vio.vm = Math.max(vio.vm, mbps(1024 * MiB, ms(t)));
      t = performance.now();
      execFileSync('dd', ['if=/dev/zero', `of=${vmHostFile}`, 'bs=1M', 'count=1024', 'conv=fsync'], { stdio: 'ignore' });
      vio.host = Math.max(vio.host, mbps(1024 * MiB, ms(t)));
      rmSync(vmHostFile, { force: true });
    }
    await vm.kill();
    vmRows.push(['microVM: sequential write, 1 GiB (dd, fsync), MB/s (best of 2; baseline the host)', vio.vm, vio.host, `${(vio.vm / vio.host).toFixed(2)}x`]);
    // The template image is taken after the first create; creates of the image's size (5 GiB, the
    // default) and of 8 GiB (the image restored, then its disk grown) alternate.
    await eventually(async () => !!(await (await fetch(`${microvm.conn.apiUrl}/v1/templates/minimal`, { headers: { authorization: `Bearer ${microvm.conn.apiKey}` } })).json()).image, { tries: 1200 });
    const vmTimes = { grown: [], same: [] };
    for (let i = 0; i < VM_CREATES; i++) {
      for (const [name, diskMb] of [['grown', 8192], ['same', undefined]]) {
        const x = await Sandbox.create({ ...microvm.conn, template: 'minimal', memoryMb: 256, ...(diskMb ? { diskMb } : {}) });
        if (x.info.createTimings.source !== 'snapshot') throw new Error(`a microVM create did not restore the template image: ${JSON.stringify(x.info.createTimings)}`);
        vmTimes[name].push(x.info.createTimings.totalMs);
        await x.kill();
      }
    }
    vmRows.push([`microVM: create from the template image asking for 8 GiB (image: 5 GiB; grown at restore) vs the image's size, p50 ms (${VM_CREATES} each, alternating)`, p50(vmTimes.grown), p50(vmTimes.same), `${(p50(vmTimes.grown) / p50(vmTimes.same)).toFixed(2)}x`]);
  }
} finally {
  if (withDisks) await stopSpaced(withDisks);
  if (inMemory) await stopSpaced(inMemory);
  if (microvm) await stopSpaced(microvm);
  await eventually(() => closeDiskPool(diskDir) && true).catch(() => {});
  await eventually(() => closeDiskPool(vmDir) && true).catch(() => {});
  rmSync(diskDir, { recursive: true, force: true });
  rmSync(memDir, { recursive: true, force: true });
  rmSync(vmDir, { recursive: true, force: true });
}

const asTable = (rs) => ['| what | with a disk | baseline | ratio |', '|---|---|---|---|', ...rs.map((r) => `| ${r.join(' | ')} |`)].join('\n');
const table = asTable(rows);
const vmTable = asTable(vmRows);
if (GVISOR) console.log(table);
if (MICROVM) console.log(vmTable);
if (values.write && GVISOR) {
  writeSection(
    'disks',
    'Disks',
    `Measured with \`node scripts/bench-disks.mjs --creates ${CREATES} --only gvisor --write\` (part of \`./space bench\`): a daemon with \`--disks on\` and, beside it, one without (files in memory). The baseline of the dd rows (to the sandbox's disk, and to a volume) is the same dd on the host's file system under the data directory; of the snapshot, fork and hibernate rows, the same operation on a sandbox whose disk holds nothing written (its 1 GiB is stored for the first time by the snapshot, read back through the pool's encrypted vault with the caches dropped by the dd rows; each later snapshot, the hibernate's included, stores a copy of the previous one's stream and the change since: none, then 1 MiB); of the create rows, the daemon keeping files in memory. Both daemons keep a warm pool of \`minimal\` (\`SPACE_POOLS=minimal=2\`, 512 MiB sandboxes): the image-restore creates ask for 384 MiB (not the pool's size), the pool creates for 512 MiB once the pool is full again; timed by the daemon (\`createTimings.totalMs\`).\n\n${table}`,
  );
}
if (values.write && MICROVM) writeSection('disks-microvm', 'Disks on the microVM driver', `Measured with \`node scripts/bench-disks.mjs --microvm-creates ${VM_CREATES} --only microvm --write\` (part of \`./space bench\`): a daemon (\`SPACE_DRIVER=microvm\`, disks on, QEMU \`microvm\` machines, under KVM where the host has it): dd of 1 GiB to a 256 MiB VM's disk vs the same dd on the host, and creates from the template image (made with the 5 GiB default disk) asking for 8 GiB — the image restored, then QEMU grows the device and the agent the file system — against creates of the image's own size.\n\n${vmTable}`);
