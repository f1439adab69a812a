#!/usr/bin/env node
// A platform fact, measured: where a command round trip's milliseconds go (issue 17's "command
// round trip ≤ 3 ms above the in-sandbox spawn of `true`"; docs/benchmarks.md, "Where a command's
// milliseconds go"). One idle `minimal` sandbox, files in memory, N of each, alternating:
// - through the API (SDK `commands.run`): `true` as a shell line (what the benchmark runs),
//   `/bin/true` as argv (no shell), and in the background (the answer comes at its start, not
//   its end);
// - inside the sandbox, one Node process timing spawns of its own, from the bare one the
//   benchmark's baseline times (`spawnSync('/bin/true')`) step by step to what the agent does
//   for a command (an async spawn, detached, stdout and stderr piped, as uid 1000, of
//   `/bin/sh -c true`);
// - the daemon's HTTP round trip (`/v1/health`) and an agent round trip (`files.stat`).
// Run: node scripts/probe-exec-path.mjs [--iterations 30]
import { mkdtempSync, rmSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { quantile, untilHostQuiet } from './bench-lib.mjs';
import { Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { AGENT_ARGV } from '../packages/driver-gvisor/dist/index.js';
import { startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '30' } } });
const N = Number(values.iterations);
const p50 = (xs) => quantile(xs, 50);
const ms = async (fn) => {
  const t = process.hrtime.bigint();
  await fn();
  return Number(process.hrtime.bigint() - t) / 1e6;
};

// Run inside as root (the agent's own user), so that the uid switch the agent makes is possible.
const INSIDE = `
const { spawn, spawnSync } = require('child_process');
const now = () => Number(process.hrtime.bigint()) / 1e6;
const run = (file, args, opts) => new Promise((resolve, reject) => {
  const c = spawn(file, args, opts);
  let open = 2;
  const done = () => { if (--open === 0) resolve(); };
  c.on('error', reject);
  c.stdout.on('close', done);
  c.on('exit', done);
  c.stderr.resume();
});
const pipes = { stdio: ['ignore', 'pipe', 'pipe'] };
const steps = {
  'spawnSync /bin/true (the benchmark\\'s baseline)': async () => spawnSync('/bin/true'),
  'async spawn /bin/true, piped': () => run('/bin/true', [], pipes),
  '… detached': () => run('/bin/true', [], { ...pipes, detached: true }),
  '… as uid 1000': () => run('/bin/true', [], { ...pipes, detached: true, uid: 1000, gid: 1000 }),
  '… /bin/sh -c true instead (the agent, for a shell line)': () => run('/bin/sh', ['-c', 'true'], { ...pipes, detached: true, uid: 1000, gid: 1000 }),
};
(async () => {
  const out = Object.fromEntries(Object.keys(steps).map((k) => [k, []]));
  for (let i = 0; i < ${N}; i++) for (const [k, f] of Object.entries(steps)) { const t = now(); await f(); out[k].push(now() - t); }
  console.log(JSON.stringify(out));
})();
`;

const dir = mkdtempSync('/tmp/spb-execpath-');
const d = await startSpaced(dir, { SPACE_DISKS: 'off' });
try {
  await Templates.prepare('minimal', d.conn);
  if (!(await untilHostQuiet())) console.warn('probe: the host stayed busy for 2 minutes; measuring anyway (expect noise)');
  const sb = await Sandbox.create({ ...d.conn, template: 'minimal', memoryMb: 256 });
  try {
    await sb.files.write('/tmp/x', 'x');
    const api = {
      'API: `true` as a shell line (the benchmark)': [],
      'API: `/bin/true` as argv': [],
      'API: `/bin/true` in the background (answered at its start)': [],
      'API: files.stat (agent round trip)': [],
      'HTTP: /v1/health (no agent)': [],
    };
    const calls = [
      () => sb.commands.run('true'),
      () => sb.commands.run(['/bin/true']),
      () => sb.commands.run(['/bin/true'], { background: true }),
      () => sb.files.stat('/tmp/x'),
      () => fetch(`${d.conn.apiUrl}/v1/health`).then((r) => r.text()),
    ];
    for (let i = 0; i < 5; i++) for (const c of calls) await c();
    for (let i = 0; i < N; i++) {
      let k = 0;
      for (const name of Object.keys(api)) api[name].push(await ms(calls[k++]));
    }
    const inside = JSON.parse((await sb.commands.run([...AGENT_ARGV.slice(3, -1), '-e', INSIDE], { user: 'root', timeoutMs: 300_000 })).stdout);
    console.log(`\n${N} of each, alternating; p50 and p90 in ms\n`);
    console.log('| step | p50 | p90 |\n|---|---:|---:|');
    for (const [k, xs] of [...Object.entries(api), ...Object.entries(inside)]) console.log(`| ${k} | ${p50(xs).toFixed(2)} | ${quantile(xs, 90).toFixed(2)} |`);
  } finally {
    await sb.kill();
  }
} finally {
  await stopSpaced(d);
  rmSync(dir, { recursive: true, force: true });
}
