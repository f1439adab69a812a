#!/usr/bin/env node
// SPACE benchmarks: each measurement runs side by side with its baseline in the same process,
// prints a table, and (with --write) records it in docs/benchmarks.md.
//   ./space bench [--iterations 30] [--write]
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Readable } from 'node:stream';
import { parseArgs } from 'node:util';
import { quantile, templateRootfs, untilHostQuiet, writeSection } from './bench-lib.mjs';
import { Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { TEMPLATES_DIR, startSpaced, stopSpaced } from '../test/helpers.mjs';
import { AGENT_ARGV } from '../packages/driver-gvisor/dist/index.js';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '30' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);

const q = quantile;
const fmt = (ms) => (ms < 10 ? ms.toFixed(2) : ms.toFixed(1));
async function time(fn) {
  const t = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t) / 1e6;
}
async function series(n, fn) {
  const out = [];
  for (let i = 0; i < n; i++) out.push(await time(() => fn(i)));
  return out;
}

const rows = [];
/** [what, MB/s, baseline, baseline MB/s]: throughput rows (higher is better). */
const rates = [];
/** `compare(p50, baseP50)` words the comparison, e.g. "1.7x faster" or "+1.6 ms". */
function row(name, xs, baseName, base, target, compare) {
  const r = { name, p50: q(xs, 50), p95: q(xs, 95), baseName, baseP50: base ? q(base, 50) : undefined, target };
  r.vs = base && compare ? compare(r.p50, r.baseP50) : '—';
  rows.push(r);
  return r;
}
const faster = (a, b) => `${(b / a).toFixed(2)}x faster`;
const slower = (a, b) => `${(a / b).toFixed(2)}x the baseline`;
const plus = (a, b) => `+${(a - b).toFixed(2)} ms`;

// The daemon runs as its own process, as in production; this process is only the client.
const dataDir = mkdtempSync('/tmp/spbench-');
// Files in memory (`--disks off`): the baseline is bare runsc with its root in memory; disks
// against memory are measured by bench-disks.mjs.
const spaced = await startSpaced(dataDir, { SPACE_DISKS: 'off' });
const daemon = { url: spaced.conn.apiUrl, close: () => stopSpaced(spaced) };
const conn = spaced.conn;
const runsc = (...a) => execFileSync('runsc', ['--root', path.join(dataDir, 'runsc'), ...a], { stdio: ['ignore', 'pipe', 'pipe'] });

try {
  // The daemon takes the template snapshot of `minimal` after it starts and fills its warm
  // pool: measure once it has, and the host is quiet again.
  await Templates.prepare('minimal', conn);
  if (!(await untilHostQuiet())) console.warn('bench: the host stayed busy for 2 minutes; measuring anyway (expect noise)');
  const sb = await Sandbox.create({ ...conn, memoryMb: 256 });
  await sb.files.write('/tmp/x', 'x');
  // warm up
  for (let i = 0; i < 5; i++) {
    await sb.files.stat('/tmp/x');
    await sb.commands.run('true');
  }

  // 1. Agent round trip without a new process, vs an HTTP round trip that does not touch the agent.
  const health = await series(N, () => fetch(`${daemon.url}/v1/health`).then((r) => r.text()));
  const stat = await series(N, () => sb.files.stat('/tmp/x'));
  row('agent round trip (file stat via API)', stat, 'HTTP round trip, no agent (/v1/health)', health, 'p50 ≤ 3 ms', plus);

  // 2. Command round trip via the API vs `runsc exec`, and the cost of a spawn inside gVisor.
  const viaApi = await series(N, () => sb.commands.run('true'));
  const viaExec = await series(N, () => runsc('exec', sb.id, '/bin/true'));
  row('command round trip `true` via API', viaApi, '`runsc exec` of the same sandbox', viaExec, '≥ 2.5x faster than runsc exec', faster);
  const probe = `const {spawnSync}=require('child_process');const t=[];for(let i=0;i<${N};i++){const s=process.hrtime.bigint();spawnSync('/bin/true');t.push(Number(process.hrtime.bigint()-s)/1e6)}console.log(JSON.stringify(t))`;
  const inside = JSON.parse((await sb.commands.run([...AGENT_ARGV.slice(3, -1), '-e', probe])).stdout);
  row('command round trip `true` via API, again', viaApi, 'spawn of `true` inside the sandbox (no API)', inside, 'API adds ≤ 3 ms over the spawn', plus);

  // 3. Files through the API vs the same bytes written and read by a process inside the
  //    sandbox (its own file system's speed: the agent's Node, 1 MiB calls, timed inside),
  //    100 MB each way, alternating.
  const MB = 100;
  const big = await Sandbox.create({ ...conn, memoryMb: 512 });
  const chunk = Buffer.alloc(1 << 20, 'a');
  const local = `const fs=require('fs');const b=Buffer.alloc(1<<20,'a');const s=()=>Number(process.hrtime.bigint())/1e9;let t=s();const fd=fs.openSync('/tmp/local','w');for(let i=0;i<${MB};i++)fs.writeSync(fd,b);fs.closeSync(fd);const w=${MB}/(s()-t);t=s();const r=fs.openSync('/tmp/local','r');while(fs.readSync(r,b)>0);fs.closeSync(r);console.log(JSON.stringify({w,r:${MB}/(s()-t)}))`;
  const xfer = { up: [], down: [], localWrite: [], localRead: [] };
  for (let i = 0; i < 5; i++) {
    let t = process.hrtime.bigint();
    await big.files.write('/tmp/api', Readable.from((function* () { for (let k = 0; k < MB; k++) yield chunk; })()));
    xfer.up.push(MB / (Number(process.hrtime.bigint() - t) / 1e9));
    t = process.hrtime.bigint();
    let n = 0;
    for await (const c of await big.files.read('/tmp/api', { format: 'stream' })) n += c.length;
    if (n !== MB << 20) throw new Error(`read ${n} bytes of ${MB << 20}`);
    xfer.down.push(MB / (Number(process.hrtime.bigint() - t) / 1e9));
    const { w, r } = JSON.parse((await big.commands.run([...AGENT_ARGV.slice(3, -1), '-e', local])).stdout);
    xfer.localWrite.push(w);
    xfer.localRead.push(r);
    await big.commands.run('rm -f /tmp/api /tmp/local');
  }
  await big.kill();
  const mbs = (xs) => q(xs, 50);
  rates.push(['file upload, 100 MB (SDK `files.write`), MB/s (median of 5)', mbs(xfer.up), 'a process in the sandbox writing 100 MB to /tmp', mbs(xfer.localWrite)]);
  rates.push(['file download, 100 MB (SDK `files.read`, a stream), MB/s (median of 5)', mbs(xfer.down), 'a process in the sandbox reading it', mbs(xfer.localRead)]);

  // 4. Create-to-first-command vs bare runsc run + runsc exec of the same rootfs. Creates
  // restore the template snapshot of `minimal` (taken at start-up, awaited above).
  const created = [];
  const ours = await series(N, async () => {
    const s = await Sandbox.create({ ...conn, memoryMb: 256 });
    await s.commands.run('true');
    created.push(s);
  });
  for (const s of created) await s.kill();
  const bareDir = mkdtempSync('/tmp/spbare-');
  const rootfs = templateRootfs(TEMPLATES_DIR, 'minimal');
  // Same-length ids: runsc takes a unique prefix as an id, so `bare1` would be ambiguous beside `bare10`.
  const bareId = (i) => `bare${String(i).padStart(4, '0')}`;
  const bare = await series(N, async (i) => {
    const b = path.join(bareDir, `b${i}`);
    mkdirSync(b);
    writeFileSync(path.join(b, 'config.json'), JSON.stringify({
      ociVersion: '1.0.0',
      process: { user: { uid: 0, gid: 0 }, args: ['/bin/sleep', '1000'], env: ['PATH=/bin:/usr/bin'], cwd: '/' },
      root: { path: rootfs, readonly: false },
      hostname: 'bare',
      mounts: [{ destination: '/proc', type: 'proc', source: 'proc' }],
      linux: { namespaces: [{ type: 'pid' }, { type: 'network' }, { type: 'ipc' }, { type: 'uts' }, { type: 'mount' }], resources: { memory: { limit: 256 * 1048576 } } },
    }));
    spawnSync('runsc', ['--root', path.join(bareDir, 'state'), '--network=none', '--overlay2=root:memory', 'run', '--detach', '--bundle', b, bareId(i)], { stdio: 'ignore' });
    spawnSync('runsc', ['--root', path.join(bareDir, 'state'), 'exec', bareId(i), '/bin/true'], { stdio: 'ignore' });
  });
  for (let i = 0; i < N; i++) spawnSync('runsc', ['--root', path.join(bareDir, 'state'), 'delete', '--force', bareId(i)], { stdio: 'ignore' });
  rmSync(bareDir, { recursive: true, force: true });
  row('create-to-first-command, restored from the template snapshot (SDK)', ours, 'bare `runsc run` + `runsc exec` (busybox sleep as init)', bare, '≤ 1.2x the bare figure', slower);

  // 5. Idle sandbox memory.
  const idle = await Sandbox.create({ ...conn, memoryMb: 256 });
  await new Promise((r) => setTimeout(r, 2000));
  const u = await idle.usage();
  await idle.kill();
  await sb.kill();

  const lines = [
    `| measurement | p50 ms | p95 ms | baseline (same run) | baseline p50 ms | vs baseline | target |`,
    `|---|---|---|---|---|---|---|`,
    ...rows.map((r) => `| ${r.name} | ${fmt(r.p50)} | ${fmt(r.p95)} | ${r.baseName ?? '—'} | ${r.baseP50 !== undefined ? fmt(r.baseP50) : '—'} | ${r.vs} | ${r.target} |`),
    ...rates.map(([name, v, baseName, b]) => `| ${name} | ${v.toFixed(0)} | | ${baseName} | ${b.toFixed(0)} | ${(v / b).toFixed(2)}x | measured |`),
    `| idle sandbox memory | RSS of its host processes: ${(u.rssBytes / 1048576).toFixed(1)} MiB; cgroup charge: ${(u.cgroupBytes / 1048576).toFixed(1)} MiB | | | | | measured |`,
  ];
  const table = lines.join('\n');
  console.log(table);
  if (values.write) {
    writeSection('core', 'Core: agent, commands, creation, idle memory (issue 2)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores (${os.cpus()[0].model.trim()}), runsc ${execFileSync('runsc', ['--version'], { encoding: 'utf8' }).split('\n')[0].replace('runsc version ', '')}, ptrace platform, ${N} iterations each, with \`./space bench --write\`.\n\n${table}`);
  }
} finally {
  await daemon.close();
  rmSync(dataDir, { recursive: true, force: true });
}
