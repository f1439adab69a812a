#!/usr/bin/env node
// A fact measured: what sandbox disks cost in a cluster (docs/disks.md, "In a cluster"). Two
// daemons on this host (nodes a and b, `--disks on`), one PostgreSQL (test/postgres.mjs) and a
// `file://` blob store: a sandbox of TEMPLATE on a (its first create boots; a takes the image in
// the background), one file written, three snapshots timed (the first stores the template's files
// for the tenant; the later ones copy them), then moved to b and back, timed.
// Run: node scripts/probe-cluster-disks.mjs [--template base]
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { startDaemon } from '../packages/server/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { egressRange, makeNodeKey, removeDataDir, TEMPLATES_DIR } from '../test/helpers.mjs';
import { startPostgres } from '../test/postgres.mjs';

const { values: o } = parseArgs({ options: { template: { type: 'string', default: 'base' } } });
const pg = await startPostgres();
const db = pg.freshDatabase();
const blobs = mkdtempSync('/tmp/spb-blobs-');
const dirs = { a: mkdtempSync('/tmp/spb-'), b: mkdtempSync('/tmp/spb-') };
makeNodeKey(dirs.b);
mkdirSync(path.join(dirs.a, 'keys'), { recursive: true, mode: 0o700 });
copyFileSync(path.join(dirs.b, 'keys', 'node.key'), path.join(dirs.a, 'keys', 'node.key'));
const d = {};
const ms = (t0) => Math.round(performance.now() - t0);
try {
  for (const n of ['a', 'b']) d[n] = await startDaemon({ dataDir: dirs[n], listen: '127.0.0.1:0', templatesDir: TEMPLATES_DIR, logLevel: 'warn', database: db, blobStore: `file://${blobs}`, nodeName: n, pools: { minimal: 0, base: 0 }, disks: { mode: 'on' }, egress: { range: egressRange(dirs[n]) } });
  const conn = { apiUrl: d.a.url, apiKey: readFileSync(d.a.state.keyFile, 'utf8').trim() };
  let t0 = performance.now();
  const sb = await Sandbox.create({ ...conn, template: o.template, memoryMb: 512, timeoutMs: 3600_000 });
  console.log(`create of ${o.template} on a: ${ms(t0)} ms (${sb.info.createTimings?.source})`);
  await sb.files.write('/root/x.txt', 'x');
  for (let i = 1; i <= 3; i++) {
    t0 = performance.now();
    const s = await sb.snapshot();
    const said = (await sb.events()).find((e) => e.type === 'snapshot' && e.message.includes(`snapshot ${s.id} `))?.message ?? '';
    console.log(`snapshot ${i} on a: ${ms(t0)} ms (${/ms: [^)]*/.exec(said)?.[0]})`);
  }
  for (const to of ['b', 'a']) {
    t0 = performance.now();
    await sb.move(to);
    console.log(`move to ${to}: ${ms(t0)} ms; its file there: ${(await sb.files.read('/root/x.txt')) === 'x'}`);
  }
  await sb.kill();
} finally {
  for (const n of ['a', 'b']) await d[n]?.close().catch((e) => console.log(e));
  for (const n of ['a', 'b']) {
    const left = removeDataDir(dirs[n]);
    if (left.length) console.log(`left behind on ${n}:`, left);
  }
  rmSync(blobs, { recursive: true, force: true });
  await pg.stop();
}
