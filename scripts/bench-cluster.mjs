#!/usr/bin/env node
// Nodes on one PostgreSQL and one blob store (issue 22's benchmarks), side by side in one run:
// a request through the node that does not run the sandbox (forwarded) vs the node that does; a
// command through either; a move (hibernate on one node, wake on the other) vs hibernate + wake
// on the same node; a create asked of a node that places it on another vs asked of that one;
// and a node SIGKILLed: the time until its snapshotted sessions run on the others, against
// what it cannot be faster than (--node-lost-after + a wake). Real runsc, a throwaway
// PostgreSQL (test/postgres.mjs), nodes a and b in this process, the lost node x a child.
// Run: node scripts/bench-cluster.mjs [--iterations N] [--moves M] [--creates C] [--lost S] [--write]
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startDaemon } from '../packages/server/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { quantile, writeSection } from './bench-lib.mjs';
import { Nodes } from '../packages/sdk/dist/index.js';
import { egressRange, eventually, leftovers, makeNodeKey, startSpaced, TEMPLATES_DIR } from '../test/helpers.mjs';
import { startPostgres } from '../test/postgres.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '200' }, moves: { type: 'string', default: '5' }, creates: { type: 'string', default: '20' }, lost: { type: 'string', default: '3' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const MOVES = Number(values.moves);
const CREATES = Number(values.creates);
const LOST = Number(values.lost);
const LOST_AFTER_S = 6;
const pg = await startPostgres();
const blobs = mkdtempSync('/tmp/spb-cluster-blobs-');
const dirs = [mkdtempSync('/tmp/spb-cluster-a-'), mkdtempSync('/tmp/spb-cluster-b-'), mkdtempSync('/tmp/spb-cluster-x-')];
let x;
let xEnv;
const lostIds = [];
const rows = [];
const row = (what, ours, base, ratio) => rows.push(`| ${what} | ${ours} | ${base} | ${ratio} |`);
const ms = (x) => x.toFixed(2);
const nodes = [];
let sb;

try {
  const database = pg.freshDatabase();
  makeNodeKey(dirs[0]);
  mkdirSync(path.join(dirs[1], 'keys'), { recursive: true, mode: 0o700 });
  copyFileSync(path.join(dirs[0], 'keys', 'node.key'), path.join(dirs[1], 'keys', 'node.key'));
  for (const [i, name] of ['a', 'b'].entries()) {
    nodes.push(await startDaemon({ dataDir: dirs[i], listen: '127.0.0.1:0', templatesDir: TEMPLATES_DIR, logLevel: 'warn', database, blobStore: `file://${blobs}`, nodeName: name, nodeLostAfterS: LOST_AFTER_S, egress: { range: egressRange(dirs[i]) } }));
  }
  const apiKey = readFileSync(nodes[0].state.keyFile, 'utf8').trim();
  const [owner, other] = nodes.map((d) => ({ apiUrl: d.url, apiKey }));
  sb = await Sandbox.create({ ...owner, template: 'minimal', memoryMb: 256 });
  const via = { owner: await Sandbox.connect(sb.id, owner), other: await Sandbox.connect(sb.id, other) };

  // 1. A small request (usage) and a command, alternating between the two nodes.
  const time = async (fn) => {
    const t0 = performance.now();
    await fn();
    return performance.now() - t0;
  };
  const usage = { owner: [], other: [] };
  const exec = { owner: [], other: [] };
  for (let i = 0; i < N; i++) {
    for (const k of i % 2 ? ['owner', 'other'] : ['other', 'owner']) {
      usage[k].push(await time(() => via[k].usage()));
      exec[k].push(await time(() => via[k].commands.run('true')));
    }
  }
  const ratio = (x, y) => `${(x / y).toFixed(2)}x`;
  for (const p of [50, 95]) row(`request (GET usage), p${p} ms`, ms(quantile(usage.other, p)), ms(quantile(usage.owner, p)), ratio(quantile(usage.other, p), quantile(usage.owner, p)));
  for (const p of [50, 95]) row(`command \`true\`, p${p} ms`, ms(quantile(exec.other, p)), ms(quantile(exec.owner, p)), ratio(quantile(exec.other, p), quantile(exec.owner, p)));

  // 2. A session going to the other node (move: hibernate here, wake there) vs hibernate and
  // wake on the same node, alternating; the sandbox ends each round back on node a.
  const move = [];
  const stay = [];
  const back = [];
  const wakes = [];
  for (let i = 0; i < MOVES; i++) {
    stay.push(await time(async () => {
      await via.owner.hibernate();
      wakes.push(await time(() => via.owner.wake()));
    }));
    move.push(await time(() => via.owner.move('b')));
    back.push(await time(() => via.owner.move('a')));
  }
  const med = (xs) => quantile(xs, 50);
  row(`session to another node (\`space move\`: hibernate, hand over, wake there), median of ${MOVES} ms`, med(move).toFixed(0), med(stay).toFixed(0), ratio(med(move), med(stay)));
  row(`… and back (b → a), median ms`, med(back).toFixed(0), med(stay).toFixed(0), ratio(med(back), med(stay)));

  // 3. Creates: asked of node b, drained (so it places them on a, the API forwarding the
  // create), vs asked of node a; alternating, each sandbox killed untimed.
  await Nodes.drain('b', owner);
  const create = { owner: [], other: [] };
  for (let i = 0; i < CREATES; i++) {
    for (const k of i % 2 ? ['owner', 'other'] : ['other', 'owner']) {
      let made;
      create[k].push(await time(async () => (made = await Sandbox.create({ ...(k === 'owner' ? owner : other), template: 'minimal', memoryMb: 256 }))));
      if (made.info.node !== 'a') throw new Error(`a create asked of ${k} ran on ${made.info.node}`);
      await made.kill();
    }
  }
  await Nodes.undrain('b', owner);
  for (const p of [50, 95]) row(`create \`minimal\` placed by another node (b, drained) on a, p${p} ms`, ms(quantile(create.other, p)), ms(quantile(create.owner, p)), ratio(quantile(create.other, p), quantile(create.owner, p)));

  // 4. Node x (a child process) runs LOST sessions, each snapshotted, and is SIGKILLed: the time
  // until every one runs on a or b, against the floor of --node-lost-after plus one wake.
  mkdirSync(path.join(dirs[2], 'keys'), { recursive: true, mode: 0o700 });
  copyFileSync(path.join(dirs[0], 'keys', 'node.key'), path.join(dirs[2], 'keys', 'node.key'));
  // A node joining a deployment writes no admin key of its own: the operator's is copied for its CLI.
  copyFileSync(nodes[0].state.keyFile, path.join(dirs[2], 'admin.key'));
  xEnv = { SPACE_DATABASE: database, SPACE_BLOB_STORE: `file://${blobs}`, SPACE_NODE_NAME: 'x', SPACE_NODE_LOST_AFTER: String(LOST_AFTER_S) };
  x = await startSpaced(dirs[2], xEnv);
  for (let i = 0; i < LOST; i++) {
    const s = await Sandbox.create({ ...x.conn, template: 'minimal', memoryMb: 256 });
    lostIds.push(s.id);
    await s.snapshot();
  }
  const t0 = performance.now();
  x.child.kill('SIGKILL');
  await x.exited;
  let detected;
  await eventually(async () => {
    if (!detected && (await Nodes.list(owner)).some((n) => n.name === 'x' && n.state === 'lost')) detected = performance.now() - t0;
    for (const id of lostIds) {
      const s = await Sandbox.connect(id, owner).catch(() => undefined);
      if (s?.info.state !== 'running' || s.info.node === 'x') return false;
    }
    return true;
  }, { tries: 1200, everyMs: 50 });
  const recovered = performance.now() - t0;
  const floor = LOST_AFTER_S * 1000 + med(wakes);
  row(`node SIGKILLed → its ${LOST} snapshotted sessions running on other nodes (--node-lost-after ${LOST_AFTER_S}; seen lost after ${(detected / 1000).toFixed(1)} s), ms`, recovered.toFixed(0), `${floor.toFixed(0)} (lost-after + a wake)`, ratio(recovered, floor));

  const table = ['| what | through / to the other node | on the node that runs it | ratio |', '|---|---|---|---|', ...rows].join('\n');
  console.log(table);
  if (values.write) {
    writeSection('cluster', 'Cluster: forwarding and moves', `Measured ${new Date().toISOString().slice(0, 10)} with \`node scripts/bench-cluster.mjs --iterations ${N} --moves ${MOVES} --creates ${CREATES} --lost ${LOST} --write\`: nodes a and b in one process on a throwaway PostgreSQL and one \`file://\` blob store, one \`minimal\` sandbox on node a; each request alternates between node b (which forwards it to a) and node a. The same-node baseline of a move is a hibernate followed by a wake on node a. Creates alternate between drained node b (which places them on a) and node a. The lost node x is a \`spaced\` child process, SIGKILLed once its sessions are snapshotted; its baseline is the least a recovery can take: the silence before a node counts as lost, plus a wake.\n\n${table}`);
  }
} finally {
  const conn0 = { apiUrl: nodes[0].url, apiKey: readFileSync(nodes[0].state.keyFile, 'utf8').trim() };
  for (const id of lostIds) await Sandbox.kill(id, conn0).catch(() => {});
  if (x) {
    // Node x started again removes what its runtime still held of the sessions taken over.
    if (x.child.exitCode === null && x.child.signalCode === null) x.child.kill('SIGKILL');
    await x.exited;
    x = await startSpaced(dirs[2], xEnv).catch(() => undefined);
    await eventually(() => leftovers(dirs[2], lostIds).length === 0).catch(() => console.error('left on x:', leftovers(dirs[2], lostIds)));
    x?.child.kill('SIGTERM');
    await x?.exited;
  }
  if (sb) await Sandbox.kill(sb.id, { apiUrl: nodes[0].url, apiKey: readFileSync(nodes[0].state.keyFile, 'utf8').trim() }).catch(() => {});
  for (const d of nodes.reverse()) await d.close();
  await pg.stop();
  for (const d of [...dirs, blobs]) rmSync(d, { recursive: true, force: true });
}
