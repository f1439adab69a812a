// A daemon as a node of its deployment (fast lane, no runtime): its record registered and
// kept fresh by heartbeats, its state derived — up, stopped when it said so, lost when silent
// too long — and the sandboxes counted per node. Real SQLite; the daemon's part is in
// test/api.test.mjs.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { NodeHeartbeat, checkNodeName, nodeViews, planDrain } from '../packages/server/dist/node.js';
import { quiet, until } from './fake-harness.mjs';
import { sandbox } from './store-suite.mjs';

const dir = mkdtempSync('/tmp/spn-');
after(() => rmSync(dir, { recursive: true, force: true }));

const record = (name, at) => ({ name, url: `http://${name}:7070`, version: '0.1.0', drivers: ['gvisor'], cpus: 2, memoryMb: 4096, maxSandboxes: 8, startedAt: at, heartbeatAt: at });

describe('nodes', () => {
  it('a heartbeat keeps a node up; a stop shows stopped; silence beyond the limit shows lost; sandboxes are counted per node', async () => {
    const store = SqliteStore.open(`${dir}/a.db`);
    const t0 = new Date(Date.now() - 60_000).toISOString();
    const hb = new NodeHeartbeat(store, record('node-a', t0), quiet, 60_000);
    await hb.start();
    await store.putNode(record('node-b', t0)); // registered a minute ago, silent since
    await store.putNode({ ...record('node-c', t0), stoppedAt: t0 });
    for (const [id, node, state] of [['s1', 'node-a', 'running'], ['s2', 'node-a', 'paused'], ['s3', 'node-a', 'killed'], ['s4', 'node-b', 'running']]) await store.insertSandbox({ ...sandbox(id, 't', state), node });
    const views = await nodeViews(store, 30_000);
    assert.deepEqual(views.map((n) => [n.name, n.state, n.sandboxes]), [['node-a', 'up', 2], ['node-b', 'lost', 1], ['node-c', 'stopped', 0]]);
    assert.ok(Date.parse(views[0].heartbeatAt) > Date.parse(t0), 'start() beat at once');
    await hb.stop();
    assert.equal((await nodeViews(store, 30_000))[0].state, 'stopped');
    await hb.start();
    assert.equal((await nodeViews(store, 30_000))[0].state, 'up', 'a restart is up again');
    await hb.stop();
    await store.close();
  });

  it('duties that take long never delay the heartbeats (a busy node must not look lost), and never run twice at once', async () => {
    const store = SqliteStore.open(`${dir}/busy.db`);
    let open;
    const gate = new Promise((r) => (open = r));
    let dutyRuns = 0;
    let afterBeats = 0;
    const hb = new NodeHeartbeat(store, record('busy', new Date().toISOString()), quiet, 10, {
      afterBeat: async (ok) => void (ok && afterBeats++),
      duties: async () => {
        dutyRuns++;
        await gate; // restoring a lost node's sandboxes, say
      },
    });
    await hb.start();
    const beatAt = async () => (await store.listNodes()).find((n) => n.name === 'busy').heartbeatAt;
    const seen = new Set([await beatAt()]);
    // Beats go on while the first duties are held: three newer heartbeats (bounded wait).
    await until(async () => (seen.add(await beatAt()), seen.size >= 4), 'heartbeats while duties run');
    assert.equal(dutyRuns, 1, 'the held duties are not started again beside themselves');
    assert.ok(afterBeats >= 3, 'afterBeat ran with every beat');
    open();
    await until(() => dutyRuns >= 2, 'duties again once the first run ended');
    await hb.stop();
    await store.close();
  });

  it('a drain spreads its sessions by free places, counting the ones it has already sent', () => {
    const view = (name, sandboxes, extra = {}) => ({ ...record(name, new Date().toISOString()), maxSandboxes: 10, state: 'up', sandboxes, ...extra });
    const nodes = [view('self', 6), view('b', 2), view('c', 4), view('d', 0, { draining: true }), view('e', 0, { state: 'lost' }), view('f', 0, { drivers: ['microvm'] })];
    const sessions = Array.from({ length: 6 }, (_, i) => ({ id: `s${i}`, driver: 'gvisor' }));
    const plan = planDrain(nodes, 'self', sessions);
    const per = {};
    for (const to of plan.values()) per[to] = (per[to] ?? 0) + 1;
    // b has 8 free places, c 6: b takes until they are level, then they alternate.
    assert.deepEqual(per, { b: 4, c: 2 });
    assert.equal(nodes.find((n) => n.name === 'b').sandboxes, 2, 'the views passed in are not changed');
    // Past every node's room: the rest stay (undefined).
    const many = planDrain(nodes, 'self', Array.from({ length: 16 }, (_, i) => ({ id: `m${i}`, driver: 'gvisor' })));
    assert.equal([...many.values()].filter((t) => t === undefined).length, 2);
    assert.equal(planDrain(nodes, 'self', [{ id: 'vm', driver: 'microvm' }]).get('vm'), 'f');
  });

  it('node names are host-name-like', () => {
    for (const ok of ['a', 'node-1', 'n1.example.com']) assert.equal(checkNodeName(ok), ok);
    for (const bad of ['', '-a', 'a-', 'a b', 'a/b', 'x'.repeat(64)]) assert.throws(() => checkNodeName(bad), (e) => e.code === 'CONFIG_INVALID', bad);
  });
});
