#!/usr/bin/env node
// A platform fact, measured: how a gVisor sandbox's host memory, snapshot size and snapshot
// downtime grow with the number of processes that ever ran in it (docs/architecture.md, "What
// this runsc does"). One `minimal` sandbox of 512 MiB; processes started by a shell loop
// (SHELL_LOOP=0: one API command each); a snapshot at each count.
// Run: node scripts/probe-process-state.mjs [counts, default 10,150,300]
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { startDaemon } from '../packages/server/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { egressRange, makeNodeKey, TEMPLATES_DIR } from '../test/helpers.mjs';

const counts = (process.argv[2] ?? '10,150,300').split(',').map(Number);
const dir = mkdtempSync('/tmp/spb-probe-');
makeNodeKey(dir);
const d = await startDaemon({ dataDir: dir, listen: '127.0.0.1:0', templatesDir: TEMPLATES_DIR, logLevel: 'warn', egress: { range: egressRange(dir) } });
const conn = { apiUrl: d.url, apiKey: readFileSync(d.state.keyFile, 'utf8').trim() };
const sb = await Sandbox.create({ ...conn, template: 'minimal', memoryMb: 512 });
try {
  let done = 0;
  console.log('| processes run | host memory (cgroup, working set) MiB | snapshot MB | downtime ms |\n|---|---|---|---|');
  for (const n of counts) {
    if (process.env.SHELL_LOOP === '0') {
      while (done < n) {
        await sb.commands.run('true');
        done++;
      }
    } else {
      await sb.commands.run(`i=0; while [ $i -lt ${n - done} ]; do /bin/true; i=$((i+1)); done`, { timeoutMs: 600_000 });
      done = n;
    }
    const u = await sb.usage();
    const s = await sb.snapshot();
    console.log(`| ${n} | ${Math.round(u.cgroupBytes / 1048576)} | ${(s.sizeBytes / 1e6).toFixed(1)} | ${s.downtimeMs} |`);
  }
} finally {
  await Sandbox.kill(sb.id, conn).catch(() => {});
  await d.close();
  rmSync(dir, { recursive: true, force: true });
}
