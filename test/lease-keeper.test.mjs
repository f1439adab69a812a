// The lease keeper (fast lane): the process that pauses a cluster node's sandboxes when its
// daemon died or hung, before other nodes may take them over (packages/server/src/lease-keeper.ts).
// runsc is stood in for by a script keeping containers in a JSON file (the real one is driven by
// test/cluster.test.mjs: a SIGKILLed node's copy is found paused there); QEMU by QMP servers on
// unix sockets that keep each VM's run state (the driver's own pause and resume are the same
// QMP commands, driven on real QEMU by the microVM conformance suite).
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, describe, it } from 'node:test';
import { LeaseKeeper, keep } from '../packages/server/dist/lease-keeper.js';
import { until } from './fake-harness.mjs';

const dir = mkdtempSync('/tmp/spk-lease-');
after(() => rmSync(dir, { recursive: true, force: true }));

// `runsc --root R list -format=json | pause RID | resume RID` over R/c/<RID> (its status; one
// file each, as the keeper pauses them all at once); every call logged.
const runsc = path.join(dir, 'runsc');
writeFileSync(
  runsc,
  `#!/usr/bin/env node
const fs = require('fs');
const [, , , root, verb, arg] = process.argv;
fs.appendFileSync(root + '/calls', verb + ' ' + (arg ?? '') + '\\n');
if (verb === 'list') {
  const list = fs.readdirSync(root + '/c').sort().map((id) => ({ id, status: fs.readFileSync(root + '/c/' + id, 'utf8') }));
  process.stdout.write(JSON.stringify(list.length ? list : null));
} else {
  if (!fs.existsSync(root + '/c/' + arg)) process.exit(1);
  // A slow pause: it ends only once the node's lease says stopped (a starting daemon's doing).
  if (verb === 'pause' && fs.existsSync(root + '/slow-pause')) {
    while (!fs.readFileSync(root + '/../lease.json', 'utf8').includes('"stopped":true')) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
  }
  // A hung pause: it ends only when the test removes the mark.
  while (verb === 'pause' && fs.existsSync(root + '/hang')) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
  fs.writeFileSync(root + '/c/' + arg, verb === 'pause' ? 'paused' : 'running');
}
`,
);
chmodSync(runsc, 0o755);

let n = 0;

describe('lease keeper', () => {
  /** A node's files: a runsc root holding `containers`, and its lease (if given). */
  const make = (containers, lease) => {
    const d = path.join(dir, `n${++n}`);
    const root = path.join(d, 'runsc');
    mkdirSync(path.join(root, 'c'), { recursive: true });
    for (const c of containers) writeFileSync(path.join(root, 'c', c.id), c.status);
    const config = { leaseFile: path.join(d, 'lease.json'), pausedFile: path.join(d, 'lease-paused.json'), lostAfterMs: 60_000, runsc, roots: [root], everyMs: 10 };
    if (lease) writeFileSync(config.leaseFile, JSON.stringify(lease));
    return { config, root, calls: () => (existsSync(path.join(root, 'calls')) ? readFileSync(path.join(root, 'calls'), 'utf8').trim().split('\n') : []), containers: () => readdirSync(path.join(root, 'c')).sort().map((id) => ({ id, status: readFileSync(path.join(root, 'c', id), 'utf8') })) };
  };
  const box = [
    { id: 'sba-2', status: 'running' },
    { id: 'sba-1', status: 'running' }, // a stale incarnation still running
    { id: 'sbb-1', status: 'paused' }, // paused by its user: left as it is
    { id: 'sbc-3', status: 'stopped' },
  ];

  it('a lease older than two thirds of --node-lost-after: every running container is paused, and the next daemon is told which', async () => {
    const k = make(box, { beatOkAt: Date.now() - 41_000, keeper: process.pid });
    assert.deepEqual(await keep(k.config), ['sba']);
    assert.deepEqual(k.containers().map((c) => c.status), ['paused', 'paused', 'paused', 'stopped']);
    assert.deepEqual(k.calls().filter((c) => c.startsWith('pause')).sort(), ['pause sba-1', 'pause sba-2']);
    const left = JSON.parse(readFileSync(k.config.pausedFile, 'utf8'));
    assert.deepEqual(left.ids, ['sba']);
    assert.deepEqual(left.containers.map((c) => c.rid).sort(), ['sba-1', 'sba-2']);
  });

  it('a fresh lease, a clean stop or a newer keeper: it leaves without touching anything', async () => {
    const fresh = make(box, { beatOkAt: Date.now() - 39_000, keeper: process.pid });
    const watching = keep(fresh.config);
    // While the lease is fresh it only watches (41 s would be stale, 39 s is not); the daemon's
    // clean stop ends it — even with the time of that last write long past.
    writeFileSync(fresh.config.leaseFile, JSON.stringify({ beatOkAt: Date.now() - 50_000, stopped: true }));
    assert.equal(await watching, undefined);
    const replaced = make(box, { beatOkAt: Date.now() - 50_000, keeper: process.pid + 1 });
    assert.equal(await keep(replaced.config), undefined);
    for (const k of [fresh, replaced]) {
      assert.deepEqual(k.calls(), []);
      assert.ok(!existsSync(k.config.pausedFile));
    }
  });

  it('microVMs: every running VM is stopped over QMP (one its user paused is left), and the next daemon continues its own', async () => {
    const vmDir = path.join(dir, `vms${++n}`);
    const log = [];
    const servers = [];
    for (const [id, running] of [['sbv', true], ['sbw', false], ['sbx', true]]) {
      mkdirSync(path.join(vmDir, id), { recursive: true });
      const vm = { running };
      const server = net.createServer((sock) => {
        sock.write(JSON.stringify({ QMP: { version: {}, capabilities: [] } }) + '\n');
        let buf = '';
        sock.on('data', (d) => {
          buf += d;
          for (let i; (i = buf.indexOf('\n')) >= 0; buf = buf.slice(i + 1)) {
            const { execute } = JSON.parse(buf.slice(0, i));
            if (execute !== 'qmp_capabilities') log.push(`${id} ${execute}`);
            if (execute === 'stop') vm.running = false;
            if (execute === 'cont') vm.running = true;
            sock.write(JSON.stringify({ return: execute === 'query-status' ? { running: vm.running, status: vm.running ? 'running' : 'paused' } : {} }) + '\n');
          }
        });
      });
      await new Promise((r) => server.listen(path.join(vmDir, id, 'qmp.sock'), r));
      servers.push([id, server, vm]);
    }
    mkdirSync(path.join(vmDir, 'sbgone')); // a VM directory whose QEMU is gone
    const d = path.join(dir, `n${++n}`);
    mkdirSync(d);
    const config = { leaseFile: path.join(d, 'lease.json'), pausedFile: path.join(d, 'lease-paused.json'), lostAfterMs: 60_000, runsc, roots: [], vmDirs: [vmDir], everyMs: 10 };
    writeFileSync(config.leaseFile, JSON.stringify({ beatOkAt: Date.now() - 41_000, keeper: process.pid }));
    try {
      assert.deepEqual((await keep(config)).sort(), ['sbv', 'sbx']);
      assert.deepEqual(servers.map(([id, , vm]) => [id, vm.running]), [['sbv', false], ['sbw', false], ['sbx', false]]);
      assert.ok(!log.includes('sbw stop'), log.join(', '));
      // The next daemon: sbv is still its own, sbx was taken over by another node.
      const r = await LeaseKeeper.resumeOwn(config.pausedFile, runsc, async (id) => id === 'sbv');
      assert.deepEqual(r, { resumed: ['sbv'], left: ['sbx'] });
      assert.deepEqual(servers.map(([id, , vm]) => [id, vm.running]), [['sbv', true], ['sbw', false], ['sbx', false]]);
    } finally {
      for (const [, server] of servers) server.close();
    }
  });

  it('a starting daemon resumes what the keeper paused of its own running sessions and leaves those taken over', async () => {
    const k = make(box, { beatOkAt: 0, keeper: process.pid });
    writeFileSync(path.join(k.root, 'c', 'sbx-1'), 'running');
    await keep(k.config);
    const r = await LeaseKeeper.resumeOwn(k.config.pausedFile, runsc, async (id) => id === 'sba');
    assert.deepEqual(r.resumed.sort(), ['sba', 'sba']);
    assert.deepEqual(r.left, ['sbx']);
    assert.deepEqual(Object.fromEntries(k.containers().map((c) => [c.id, c.status])), { 'sba-2': 'running', 'sba-1': 'running', 'sbb-1': 'paused', 'sbc-3': 'stopped', 'sbx-1': 'paused' });
    assert.ok(!existsSync(k.config.pausedFile), 'told once');
  });

  it('as a process of its own: started by the daemon, it acts on a stale lease and exits; the daemon\'s next heartbeat learns what it paused and starts another; a clean stop ends it', async () => {
    const k = make([{ id: 'sbq-1', status: 'running' }]);
    const lease = new LeaseKeeper(k.config);
    await lease.start();
    const first = JSON.parse(readFileSync(k.config.leaseFile, 'utf8')).keeper;
    assert.ok(first > 0);
    assert.deepEqual(await lease.renewed(), [], 'nothing paused while the lease is renewed');
    // The daemon hangs: its lease goes stale (written here as if 50 s had passed).
    writeFileSync(k.config.leaseFile, JSON.stringify({ beatOkAt: Date.now() - 50_000, keeper: first }));
    await until(() => existsSync(k.config.pausedFile), 'the keeper pausing');
    await until(() => !alive(first), 'the keeper exiting');
    assert.equal(k.containers()[0].status, 'paused');
    // The daemon comes back: it is told once, and a new keeper watches.
    assert.deepEqual(await lease.renewed(), ['sbq']);
    const second = JSON.parse(readFileSync(k.config.leaseFile, 'utf8')).keeper;
    assert.ok(second !== first && alive(second));
    await lease.stop();
    await until(() => !alive(second), 'the keeper stopping');
    assert.equal(JSON.parse(readFileSync(k.config.leaseFile, 'utf8')).stopped, true);
  });

  /**
   * A node whose container `rid` runs, with a keeper (a process of its own) caught in the middle
   * of pausing it after its daemon died: its runsc pause is held by the mark `slow-pause` (until
   * the lease says stopped) or `hang` (until the mark goes).
   */
  const keeperPausing = async (rid, mark) => {
    const k = make([{ id: rid, status: 'running' }]);
    writeFileSync(path.join(k.root, mark), '');
    await new LeaseKeeper(k.config).start();
    const pid = JSON.parse(readFileSync(k.config.leaseFile, 'utf8')).keeper;
    writeFileSync(k.config.leaseFile, JSON.stringify({ beatOkAt: Date.now() - 50_000, keeper: pid })); // the daemon died
    await until(() => k.calls().includes(`pause ${rid}`), 'the keeper pausing');
    return { k, pid };
  };

  it('a daemon starting while the keeper of the one before is pausing waits for it, so what it paused is resumed', async () => {
    // The keeper pauses first and writes what it paused after: a daemon reading the record in
    // between finds none, and the container would stay paused for good.
    const { k, pid } = await keeperPausing('sbr-1', 'slow-pause');
    assert.ok(!existsSync(k.config.pausedFile), 'mid-pause: nothing recorded yet');
    // The next daemon starts: its wait ends the slow pause (the lease says stopped) and the keeper.
    assert.deepEqual(await LeaseKeeper.retirePrevious(k.config.leaseFile), { waited: 1, killed: 0 });
    assert.ok(!alive(pid));
    const r = await LeaseKeeper.resumeOwn(k.config.pausedFile, runsc, async () => true);
    assert.deepEqual(r, { resumed: ['sbr'], left: [] });
    assert.equal(k.containers()[0].status, 'running');
    assert.deepEqual(await LeaseKeeper.retirePrevious(k.config.leaseFile), { waited: 0, killed: 0 }, 'no keeper left: nothing to wait for');
  });

  it('a keeper that does not exit in time is killed; another lease\'s keepers are left alone', async () => {
    const { k, pid } = await keeperPausing('sbs-1', 'hang');
    try {
      assert.deepEqual(await LeaseKeeper.retirePrevious(`${k.config.leaseFile}.other`, 100), { waited: 0, killed: 0 });
      assert.ok(alive(pid));
      assert.deepEqual(await LeaseKeeper.retirePrevious(k.config.leaseFile, 300), { waited: 1, killed: 1 });
      await until(() => !alive(pid), 'the keeper killed');
    } finally {
      rmSync(path.join(k.root, 'hang')); // lets the hung pause end
    }
  });
});

/**
 * Whether process `pid` still runs. A keeper this test spawned that has exited stays a zombie
 * until this process reaps it, which signal 0 cannot tell from running (a loaded host showed it
 * right after retirePrevious saw the keeper go): its state in /proc says.
 */
function alive(pid) {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

