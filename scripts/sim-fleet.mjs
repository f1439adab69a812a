#!/usr/bin/env node
// The control plane as if it ran a fleet (issue 22's simulation). Every node is what a `spaced`
// of a cluster runs — core's SandboxService with `shared: true`, its own PostgreSQL pool and
// per-node advisory lock, its heartbeat and the cluster duties after each beat — on the fake
// (in-memory) driver, all in this process, sharing one real PostgreSQL and one blob store (a
// directory, as `--blob-store file://` on a shared mount). What is not here: HTTP (each call
// goes to the owning node's service, as the API does after forwarding) and a real runtime.
//
// Per fleet step (nodes:sandboxes, growing): the fleet is filled to that many sandboxes through
// the nodes in turn (a load balancer; a full node's create is placed as the API does), then a
// mixed load runs for a while (reads, commands, snapshots, moves = hibernate here + wake on
// another node, creates and kills), the fleet idles for a few heartbeats, and at the last step
// a node is lost (cut off like a killed process) and the time until every one of its sandboxes
// is restored elsewhere or ended `dead/node-lost` is measured. PostgreSQL's pg_stat_statements
// counts every statement (BEGIN and COMMIT included: each one a round trip).
//
// Run: node scripts/sim-fleet.mjs [--fleet 10:1000,25:5000,50:10000] [--steady 20] [--lost-after 6]
import { mkdtempSync, rmSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { FakeDriver } from '../packages/driver-fake/dist/index.js';
import { PostgresStore } from '../packages/store-postgres/dist/index.js';
import { NodeHeartbeat, clusterDuties, nodeStates, nodeViews, pickNode } from '../packages/server/dist/node.js';
import { quantile } from './bench-lib.mjs';
import { Life, fakeHarness, quiet } from '../test/fake-harness.mjs';
import { startPostgres } from '../test/postgres.mjs';

const { values } = parseArgs({
  options: {
    fleet: { type: 'string', default: '10:1000,25:5000,50:10000' },
    steady: { type: 'string', default: '20' },
    'lost-after': { type: 'string', default: '6' },
    concurrency: { type: 'string', default: '16' },
    tenants: { type: 'string', default: '100' },
    'snapshot-share': { type: 'string', default: '0.25' },
  },
});
const steps = values.fleet.split(',').map((s) => s.split(':').map(Number));
const STEADY_S = Number(values.steady);
const LOST_AFTER_MS = 1000 * Number(values['lost-after']);
const CONCURRENCY = Number(values.concurrency);
const TENANTS = Number(values.tenants);
const SNAPSHOT_SHARE = Number(values['snapshot-share']);
const maxNodes = Math.max(...steps.map(([n]) => n));
const maxSandboxes = Math.max(...steps.map(([, s]) => s));
// Room for the fleet's share and then some, so that placement happens but rarely.
const PER_NODE = Math.ceil((maxSandboxes / steps.find(([, s]) => s === maxSandboxes)[0]) * 1.5);

const dir = mkdtempSync('/tmp/spb-fleet-');
const pg = await startPostgres({ settings: ['shared_preload_libraries=pg_stat_statements', 'max_connections=600', 'shared_buffers=256MB'] });
pg.psql('CREATE EXTENSION pg_stat_statements', 'space');
const DB = "dbid = (SELECT oid FROM pg_database WHERE datname = 'space')";
const dbStats = () => {
  const [calls, rows] = pg.psql(`SELECT coalesce(sum(calls), 0), coalesce(sum(rows), 0) FROM pg_stat_statements WHERE ${DB}`, 'space').trim().split('|').map(Number);
  return { calls, rows };
};
const since = (a) => {
  const b = dbStats();
  return { calls: b.calls - a.calls, rows: b.rows - a.rows };
};

/** @type {{ name: string, store: any, svc: any, h: any, life: Life, hb: NodeHeartbeat, up: boolean }[]} */
const nodes = [];
const blobsDir = path.join(dir, 'blobs');
async function addNode() {
  const name = `n${String(nodes.length + 1).padStart(3, '0')}`;
  const store = await PostgresStore.open(pg.url, { node: name, poolSize: 4 });
  const life = new Life();
  const h = fakeHarness(path.join(dir, name), store, new FakeDriver(), { blobsDir });
  const svc = h.service({ nodeName: name, shared: true, maxSandboxes: PER_NODE, maxMemoryMb: 10_000_000, maxQueuedCreates: 10_000 }, life);
  await svc.start();
  const hb = new NodeHeartbeat(life.wrap(store), { name, url: `http://${name}.invalid:7070`, version: 'sim', drivers: ['fake'], cpus: 64, memoryMb: 262_144, maxSandboxes: PER_NODE, startedAt: new Date().toISOString(), heartbeatAt: new Date().toISOString() }, quiet, Math.max(1000, Math.floor(LOST_AFTER_MS / 3)), clusterDuties({ service: svc, store: life.wrap(store), nodeName: name, lostAfterMs: LOST_AFTER_MS, logger: quiet }));
  await hb.start();
  nodes.push({ name, store, svc, h, life, hb, up: true });
}
const byName = (name) => nodes.find((n) => n.name === name);
const up = () => nodes.filter((n) => n.up);

/** Every live sandbox: id → { tenant, node }. */
const fleet = new Map();
let rr = 0;
let placed = 0;
/** A create as a client sees it: asked of the next node in turn; a full one places it elsewhere, as the API does. */
async function create() {
  const alive = up();
  const first = alive[rr++ % alive.length];
  const tenant = `tenant-${rr % TENANTS}`;
  let sb;
  try {
    sb = await first.svc.create(tenant, {});
  } catch (err) {
    if (err.code !== 'CAPACITY_EXHAUSTED') throw err;
    const to = pickNode(await nodeViews(first.store, LOST_AFTER_MS), first.name, 'fake');
    if (!to) throw err;
    placed++;
    sb = await byName(to.name).svc.create(tenant, {});
  }
  fleet.set(sb.id, { tenant, node: sb.node });
  return sb;
}

/** Runs `fn` with `k` workers until it returns false; each call's time goes into `times`. */
async function drive(k, fn, times) {
  await Promise.all(
    Array.from({ length: k }, async () => {
      for (;;) {
        const t0 = performance.now();
        const more = await fn();
        if (more === false) return;
        times.push(performance.now() - t0);
      }
    }),
  );
}

// A node seen lost while it runs: its heartbeats came late (this process's event loop is every
// node's, so a slow call anywhere delays them all) and the others took its sandboxes.
const seenLost = new Set();
let endedByFalseLoss = 0;
const watch = setInterval(() => {
  if (!nodes.length) return;
  nodeStates(nodes[0].store, LOST_AFTER_MS).then((states) => {
    for (const n of states) if (n.state === 'lost' && byName(n.name)?.up) seenLost.add(n.name);
  }, () => {});
}, 500);
/** Runs `op` on the sandbox's owner; when another node took it meanwhile (a false loss), follows it once. */
async function onOwner(id, at, op) {
  try {
    return await op(byName(at.node));
  } catch (err) {
    // Ended by a false loss (its node was seen lost and it had no snapshot): gone from the fleet.
    if (err.code === 'SANDBOX_NOT_RUNNING' && err.details?.endReason === 'node-lost') {
      fleet.delete(id);
      endedByFalseLoss++;
      return undefined;
    }
    if (err.code !== 'SANDBOX_ON_OTHER_NODE' || !byName(err.details?.node)?.up) throw err;
    at.node = err.details.node;
    return onOwner(id, at, op);
  }
}

const fills = [];
const mixes = [];
const idles = [];
let loss;
const pick = () => {
  const ids = [...fleet.keys()];
  for (;;) {
    const id = ids[Math.floor(Math.random() * ids.length)];
    const at = fleet.get(id);
    if (at && !at.busy && byName(at.node)?.up) return [id, at];
  }
};

try {
  for (const [nodeCount, target] of steps) {
    while (nodes.length < nodeCount) await addNode();
    // 1. Fill to `target` sandboxes; a share of them snapshotted (what a node loss restores).
    const fillTimes = [];
    const before = dbStats();
    const need = target - fleet.size;
    let made = 0;
    const t0 = performance.now();
    await drive(CONCURRENCY, async () => (made++ < need ? (await create(), true) : false), fillTimes);
    const fillS = (performance.now() - t0) / 1000;
    const db = since(before);
    console.error(`fleet ${nodeCount} nodes: ${fleet.size} sandboxes, ${(need / fillS).toFixed(0)} creates/s, ${db.calls / need} statements per create`);
    fills.push({ nodes: nodeCount, sandboxes: fleet.size, creates: need, perS: need / fillS, p50: quantile(fillTimes, 50), p99: quantile(fillTimes, 99), stmts: db.calls / need, rows: db.rows / need });
    let snapshotted = 0;
    const toSnap = [...fleet.entries()].filter(([, at]) => !at.snapshotted).slice(0, Math.round(need * SNAPSHOT_SHARE));
    await drive(CONCURRENCY, async () => {
      const next = toSnap[snapshotted++];
      if (!next) return false;
      await onOwner(next[0], next[1], (n) => n.svc.snapshot(next[1].tenant, next[0]));
      next[1].snapshotted = true;
    }, []);

    // 2. A mixed load for STEADY_S seconds.
    const times = { get: [], exec: [], snapshot: [], move: [], wake: [], create: [], kill: [] };
    const mixBefore = dbStats();
    const end = Date.now() + STEADY_S * 1000;
    let ops = 0;
    await drive(CONCURRENCY, async () => {
      if (Date.now() > end) return false;
      const r = Math.random();
      const [id, at] = pick();
      let owner = byName(at.node);
      const t = performance.now();
      at.busy = true;
      try {
        if (r < 0.4) {
          await onOwner(id, at, (n) => n.svc.get(at.tenant, id));
          times.get.push(performance.now() - t);
        } else if (r < 0.7) {
          await onOwner(id, at, (n) => n.h.run(n.svc, id, 'echo hi', at.tenant));
          times.exec.push(performance.now() - t);
        } else if (r < 0.8) {
          await onOwner(id, at, (n) => n.svc.snapshot(at.tenant, id));
          at.snapshotted = true;
          times.snapshot.push(performance.now() - t);
        } else if (r < 0.9) {
          await onOwner(id, at, (n) => n.svc.get(at.tenant, id));
          if (!fleet.has(id)) return;
          owner = byName(at.node);
          const others = up().filter((n) => n !== owner);
          const to = others[Math.floor(Math.random() * others.length)];
          await owner.svc.move(at.tenant, id, to.name);
          times.move.push(performance.now() - t);
          const tw = performance.now();
          await to.svc.wake(at.tenant, id);
          times.wake.push(performance.now() - tw);
          at.node = to.name;
          at.snapshotted = true;
        } else {
          await onOwner(id, at, (n) => n.svc.kill(at.tenant, id));
          fleet.delete(id);
          times.kill.push(performance.now() - t);
          const tc = performance.now();
          await create();
          times.create.push(performance.now() - tc);
        }
      } catch (err) {
        // Ended meanwhile by a false loss (see seenLost): gone from the fleet.
        if (err.code !== 'SANDBOX_NOT_RUNNING' || err.details?.endReason !== 'node-lost') throw err;
        fleet.delete(id);
        endedByFalseLoss++;
      } finally {
        at.busy = false;
      }
      ops++;
    }, []);
    const mixDb = since(mixBefore);
    mixes.push({ nodes: nodeCount, sandboxes: fleet.size, opsPerS: ops / STEADY_S, stmtsPerOp: mixDb.calls / ops, ...Object.fromEntries(Object.entries(times).map(([k, v]) => [k, { n: v.length, p50: quantile(v, 50), p99: quantile(v, 99) }])) });

    // 3. Idle: what heartbeats and duties cost the database.
    const heartbeatMs = Math.max(1000, Math.floor(LOST_AFTER_MS / 3));
    const idleBefore = dbStats();
    const ti = performance.now();
    await new Promise((r) => setTimeout(r, 3 * heartbeatMs));
    const idle = since(idleBefore);
    const idleS = (performance.now() - ti) / 1000;
    idles.push({ nodes: nodeCount, sandboxes: fleet.size, stmtsPerS: idle.calls / idleS, perBeat: idle.calls / idleS / (nodeCount / (heartbeatMs / 1000)), rowsPerS: idle.rows / idleS });
  }

  // 4. A node lost at the largest fleet: cut off like a killed process (its calls never return).
  const victim = up()[Math.floor(up().length / 2)];
  const ownedBy = async (name) => (await nodes[0].store.sandboxesInStates(['starting', 'running', 'paused'], { node: name })).filter((s) => s.node === name);
  const onIt = (await ownedBy(victim.name)).map((s) => s.id);
  const withSnapshot = [...fleet.entries()].filter(([id, at]) => onIt.includes(id) && at.snapshotted).length;
  const lossBefore = dbStats();
  const tl = performance.now();
  victim.life.end();
  victim.up = false;
  let left = onIt.length;
  while (left > 0) {
    await new Promise((r) => setTimeout(r, 100));
    left = (await ownedBy(victim.name)).length;
    if (performance.now() - tl > 10 * LOST_AFTER_MS + 120_000) throw new Error(`${left} sandboxes of the lost node still unresolved after ${(performance.now() - tl) / 1000} s`);
  }
  const resolvedS = (performance.now() - tl) / 1000;
  let recovered = 0;
  let dead = 0;
  for (const id of onIt) {
    const sb = await nodes[0].store.getSandbox(id);
    if (sb.state === 'running' && sb.node !== victim.name) recovered++;
    else if (sb.state === 'dead' && sb.endReason === 'node-lost') dead++;
  }
  loss = { nodes: nodes.length, sandboxes: fleet.size, onIt: onIt.length, withSnapshot, lostAfterS: LOST_AFTER_MS / 1000, resolvedS, recovered, dead, stmts: since(lossBefore).calls };
  const top = pg.psql(`SELECT calls, rows, round(total_exec_time::numeric), left(regexp_replace(query, '\\s+', ' ', 'g'), 110) FROM pg_stat_statements WHERE ${DB} ORDER BY total_exec_time DESC LIMIT 8`, 'space');

  const f1 = (x) => x.toFixed(1);
  const out = [];
  out.push(`Fleet simulation: \`node scripts/sim-fleet.mjs --fleet ${values.fleet} --steady ${STEADY_S} --lost-after ${LOST_AFTER_MS / 1000} --concurrency ${CONCURRENCY}\` (fake driver, one PostgreSQL 15, ${PER_NODE} places per node, ${placed} creates placed on another node)`);
  out.push('', '| nodes | sandboxes | creates | creates/s | create p50 ms | create p99 ms | statements per create | rows returned per create |', '|---|---|---|---|---|---|---|---|');
  for (const f of fills) out.push(`| ${f.nodes} | ${f.sandboxes} | ${f.creates} | ${f.perS.toFixed(0)} | ${f1(f.p50)} | ${f1(f.p99)} | ${f1(f.stmts)} | ${f1(f.rows)} |`);
  out.push('', '| nodes | sandboxes | ops/s | statements per op | get p50/p99 | exec p50/p99 | snapshot p50/p99 | move p50/p99 | wake elsewhere p50/p99 | create p50/p99 | kill p50/p99 |', '|---|---|---|---|---|---|---|---|---|---|---|');
  const pp = (x) => (x.n ? `${f1(x.p50)} / ${f1(x.p99)}` : '-');
  for (const m of mixes) out.push(`| ${m.nodes} | ${m.sandboxes} | ${m.opsPerS.toFixed(0)} | ${f1(m.stmtsPerOp)} | ${pp(m.get)} | ${pp(m.exec)} | ${pp(m.snapshot)} | ${pp(m.move)} | ${pp(m.wake)} | ${pp(m.create)} | ${pp(m.kill)} |`);
  out.push('', '| nodes | sandboxes | idle statements/s | statements per heartbeat (with duties) | rows returned/s |', '|---|---|---|---|---|');
  for (const i of idles) out.push(`| ${i.nodes} | ${i.sandboxes} | ${f1(i.stmtsPerS)} | ${f1(i.perBeat)} | ${f1(i.rowsPerS)} |`);
  out.push('', '| node lost at | its sandboxes | with a snapshot | lost after | all resolved after | restored elsewhere | dead/node-lost | statements meanwhile |', '|---|---|---|---|---|---|---|---|');
  out.push(`| ${loss.nodes} nodes, ${loss.sandboxes} sandboxes | ${loss.onIt} | ${loss.withSnapshot} | ${loss.lostAfterS} s | ${f1(loss.resolvedS)} s | ${loss.recovered} | ${loss.dead} | ${loss.stmts} |`);
  out.push('', `Nodes seen lost while running (late heartbeats; the others took their sandboxes): ${seenLost.size ? `${[...seenLost].join(', ')}; ${endedByFalseLoss} sandboxes met ended node-lost` : 'none'}`);
  out.push('', 'Statements by total time (calls | rows | ms | query):', '```', top.trim(), '```');
  console.log(out.join('\n'));
} finally {
  clearInterval(watch);
  for (const n of nodes) {
    if (n.up) {
      await n.hb.stop();
      await n.svc.shutdown();
    }
    await n.store.close().catch(() => {});
  }
  await pg.stop();
  rmSync(dir, { recursive: true, force: true });
}
