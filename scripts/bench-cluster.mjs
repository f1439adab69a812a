#!/usr/bin/env node
// Two nodes on one PostgreSQL and one blob store (issue 22's benchmarks), side by side in one run:
// a request through the node that does not run the sandbox (forwarded) vs the node that does; a
// command through either; a move (hibernate on one node, wake on the other) vs hibernate + wake
// on the same node. Real runsc, a throwaway PostgreSQL (test/postgres.mjs), both daemons in this
// process. Run: node scripts/bench-cluster.mjs [--iterations N] [--moves M] [--write]
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startDaemon } from '../packages/server/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { quantile, writeSection } from './bench-lib.mjs';
import { egressRange, makeNodeKey, TEMPLATES_DIR } from '../test/helpers.mjs';
import { startPostgres } from '../test/postgres.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '200' }, moves: { type: 'string', default: '5' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const MOVES = Number(values.moves);
const pg = await startPostgres();
const blobs = mkdtempSync('/tmp/spb-cluster-blobs-');
const dirs = [mkdtempSync('/tmp/spb-cluster-a-'), mkdtempSync('/tmp/spb-cluster-b-')];
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
    nodes.push(await startDaemon({ dataDir: dirs[i], listen: '127.0.0.1:0', templatesDir: TEMPLATES_DIR, logLevel: 'warn', database, blobStore: `file://${blobs}`, nodeName: name, egress: { range: egressRange(dirs[i]) } }));
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
  for (let i = 0; i < MOVES; i++) {
    stay.push(await time(async () => {
      await via.owner.hibernate();
      await via.owner.wake();
    }));
    move.push(await time(() => via.owner.move('b')));
    back.push(await time(() => via.owner.move('a')));
  }
  const med = (xs) => quantile(xs, 50);
  row(`session to another node (\`space move\`: hibernate, hand over, wake there), median of ${MOVES} ms`, med(move).toFixed(0), med(stay).toFixed(0), ratio(med(move), med(stay)));
  row(`… and back (b → a), median ms`, med(back).toFixed(0), med(stay).toFixed(0), ratio(med(back), med(stay)));

  const table = ['| what | through / to the other node | on the node that runs it | ratio |', '|---|---|---|---|', ...rows].join('\n');
  console.log(table);
  if (values.write) {
    writeSection('cluster', 'Cluster: forwarding and moves', `Measured ${new Date().toISOString().slice(0, 10)} with \`node scripts/bench-cluster.mjs --iterations ${N} --moves ${MOVES} --write\`: two nodes in one process on a throwaway PostgreSQL and one \`file://\` blob store, one \`minimal\` sandbox on node a; each request alternates between node b (which forwards it to a) and node a. The same-node baseline of a move is a hibernate followed by a wake on node a.\n\n${table}`);
  }
} finally {
  if (sb) await Sandbox.kill(sb.id, { apiUrl: nodes[0].url, apiKey: readFileSync(nodes[0].state.keyFile, 'utf8').trim() }).catch(() => {});
  for (const d of nodes.reverse()) await d.close();
  await pg.stop();
  for (const d of [...dirs, blobs]) rmSync(d, { recursive: true, force: true });
}
