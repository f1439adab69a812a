// A daemon as a node of its deployment (fast lane, no runtime): its record registered and
// kept fresh by heartbeats, its state derived — up, stopped when it said so, lost when silent
// too long — and the sandboxes counted per node. Real SQLite; the daemon's part is in
// test/api.test.mjs.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, describe, it } from 'node:test';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { NodeHeartbeat, checkNodeName, nodeStates, nodeViews, pickNode, pickWarmNode, placementCost, planDrain } from '../packages/server/dist/node.js';
import { quiet, until } from './fake-harness.mjs';
import { sandbox } from './store-suite.mjs';

const dir = mkdtempSync('/tmp/spn-');
after(() => rmSync(dir, { recursive: true, force: true }));

const record = (name, at) => ({ name, url: `http://${name}:7070`, version: '0.1.0', drivers: ['gvisor'], cpus: 2, memoryMb: 4096, maxSandboxes: 8, maxMemoryMb: 8192, startedAt: at, heartbeatAt: at });

describe('nodes', () => {
  it('a heartbeat keeps a node up; a stop shows stopped; silence beyond the limit shows lost; sandboxes are counted per node', async () => {
    const store = SqliteStore.open(`${dir}/a.db`);
    const t0 = new Date(Date.now() - 60_000).toISOString();
    const hb = new NodeHeartbeat(store, record('node-a', t0), quiet, 60_000);
    await hb.start();
    await store.putNode(record('node-b', t0)); // registered a minute ago, silent since
    // A record from before nodes registered their memory budget: the default (twice the host's).
    const { maxMemoryMb: _, ...old } = record('node-c', t0);
    await store.putNode({ ...old, stoppedAt: t0 });
    for (const [id, node, state] of [['s1', 'node-a', 'running'], ['s2', 'node-a', 'paused'], ['s3', 'node-a', 'killed'], ['s4', 'node-b', 'running']]) await store.insertSandbox({ ...sandbox(id, 't', state), node });
    const views = await nodeViews(store, 30_000);
    assert.deepEqual(views.map((n) => [n.name, n.state, n.sandboxes, n.memoryReservedMb, n.maxMemoryMb]), [['node-a', 'up', 2, 512, 8192], ['node-b', 'lost', 1, 256, 8192], ['node-c', 'stopped', 0, 0, 8192]]);
    assert.equal(typeof views[0].load, 'number', 'a heartbeat records the host\'s load');
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

  const view = (name, sandboxes, extra = {}) => ({ ...record(name, new Date().toISOString()), maxSandboxes: 10, maxMemoryMb: 100_000, memoryReservedMb: sandboxes * 256, load: 0, state: 'up', sandboxes, ...extra });

  it('placement: a place and the memory are needed; of the nodes that have both, the least full and busy', () => {
    const pick = (nodes, need) => pickNode(nodes, 'self', need)?.name;
    // Free places but not the memory: skipped, whatever else it has.
    const full = view('full', 0, { maxMemoryMb: 4096, memoryReservedMb: 3800 });
    assert.equal(pick([full, view('b', 5)], { memoryMb: 512 }), 'b');
    assert.equal(pick([full], { memoryMb: 256 }), 'full', 'a small one still fits');
    assert.equal(pick([full], { memoryMb: 512 }), undefined);
    assert.equal(pick([full]), undefined, 'without a size: the default memory (512 MiB)');
    // Memory fills a node before its places do: the fuller of the two fractions counts.
    assert.equal(pick([view('b', 2, { maxMemoryMb: 8192, memoryReservedMb: 6144 }), view('c', 4)], { memoryMb: 512 }), 'c');
    // Equal room: the less busy host; a saturated one weighs as half full.
    assert.equal(pick([view('b', 2, { load: 2 }), view('c', 2, { load: 0.2 })]), 'c');
    assert.equal(pick([view('b', 2, { load: 8 }), view('c', 6)]), 'c', 'busy, but room counts more');
    assert.equal(pick([view('b', 2, { load: 8 }), view('c', 8)]), 'b');
    assert.equal(placementCost(view('x', 3, { maxSandboxes: 64, memoryReservedMb: 1536, maxMemoryMb: 48000, load: 1, cpus: 2 }), 512), 4 / 64 + 0.125);
    // The driver: only nodes that run it.
    assert.equal(pick([view('b', 0), view('f', 5, { drivers: ['microvm'] })], { driver: 'microvm' }), 'f');
  });

  it('warm pools: each beat tells the pools\' ready sandboxes; a create goes to the node with most of its template ready, on its driver, up and not drained', async () => {
    const store = SqliteStore.open(`${dir}/warm.db`);
    let warm = { '/minimal': 2, 'tn1/tools': 1 };
    const hb = new NodeHeartbeat(store, record('pools', new Date().toISOString()), quiet, 60_000, { report: () => ({ warm }) });
    await hb.start();
    assert.deepEqual((await nodeStates(store, 30_000))[0].warm, { '/minimal': 2, 'tn1/tools': 1 });
    // Given away and not refilled yet: the next beat says none (not the last count kept).
    warm = {};
    await hb.setDraining(false); // beats at once
    assert.equal((await nodeStates(store, 30_000))[0].warm, undefined);
    await hb.stop();
    await store.close();

    const pick = (nodes, key = '/minimal', driver = 'gvisor') => pickWarmNode(nodes, 'self', key, driver)?.name;
    const w = (name, ready, extra = {}) => view(name, 0, { warm: { '/minimal': ready }, ...extra });
    assert.equal(pick([w('self', 3), w('b', 1), w('c', 2)]), 'c', 'the most ready; never this node');
    assert.equal(pick([w('b', 0), view('c', 0)]), undefined, 'none ready: the create restores here');
    assert.equal(pick([w('b', 1)], 'tn1/tools'), undefined, 'another template\'s pool does not count');
    assert.equal(pick([w('b', 5, { draining: true }), w('c', 5, { state: 'lost' }), w('d', 1)]), 'd', 'drained and lost nodes are passed over');
    assert.equal(pick([w('b', 5, { drivers: ['microvm', 'gvisor'] }), w('d', 1)]), 'd', 'pools restore on a node\'s default driver: it must be the same');
    assert.equal(pick([w('b', 5, { drivers: ['microvm'] })], '/minimal', 'microvm'), 'b');
  });

  it('a drain spreads its sessions by free places and memory, counting the ones it has already sent', () => {
    const nodes = [view('self', 6), view('b', 2), view('c', 4), view('d', 0, { draining: true }), view('e', 0, { state: 'lost' }), view('f', 0, { drivers: ['microvm'] })];
    const sessions = Array.from({ length: 6 }, (_, i) => ({ id: `s${i}`, driver: 'gvisor', memoryMb: 256 }));
    const plan = planDrain(nodes, 'self', sessions);
    const per = {};
    for (const to of plan.values()) per[to] = (per[to] ?? 0) + 1;
    // b has 8 free places, c 6: b takes until they are level, then they alternate.
    assert.deepEqual(per, { b: 4, c: 2 });
    assert.equal(nodes.find((n) => n.name === 'b').sandboxes, 2, 'the views passed in are not changed');
    // Past every node's room: the rest stay (undefined).
    const many = planDrain(nodes, 'self', Array.from({ length: 16 }, (_, i) => ({ id: `m${i}`, driver: 'gvisor', memoryMb: 256 })));
    assert.equal([...many.values()].filter((t) => t === undefined).length, 2);
    assert.equal(planDrain(nodes, 'self', [{ id: 'vm', driver: 'microvm', memoryMb: 256 }]).get('vm'), 'f');
    // Memory counted as sessions are sent: b has the places for three 4 GiB sessions but the memory for two.
    const big = planDrain([view('b', 0, { maxMemoryMb: 8192, memoryReservedMb: 0 })], 'self', ['x', 'y', 'z'].map((id) => ({ id, driver: 'gvisor', memoryMb: 4096 })));
    assert.deepEqual([...big.values()], ['b', 'b', undefined]);
  });

  it('node names are host-name-like', () => {
    for (const ok of ['a', 'node-1', 'n1.example.com']) assert.equal(checkNodeName(ok), ok);
    for (const bad of ['', '-a', 'a-', 'a b', 'a/b', 'x'.repeat(64)]) assert.throws(() => checkNodeName(bad), (e) => e.code === 'CONFIG_INVALID', bad);
  });
});
