#!/usr/bin/env node
// CLI latency: `space exec ID -- true` as a user runs it (the launcher on the PATH, and `./space`
// from the checkout), and the bundle started by node directly, against the same call through the SDK in this process, `runsc exec` of the
// sandbox's container, and node's own start — all on one sandbox, alternating, in one run.
//   node scripts/bench-cli.mjs [--iterations 21] [--write]
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { quantile, writeSection } from './bench-lib.mjs';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { removeDataDir, startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '21' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const root = path.resolve(new URL('..', import.meta.url).pathname);
const BUNDLE = path.join(root, 'packages/cli/dist/space.mjs');
const LAUNCHER = path.join(root, 'packages/cli/bin/space');
const extraCa = process.env.NODE_EXTRA_CA_CERTS;

const dataDir = mkdtempSync('/tmp/space-bench-cli-');
const spaced = await startSpaced(dataDir);
const { conn } = spaced;
const env = { ...process.env, SPACE_URL: conn.apiUrl, SPACE_API_KEY: conn.apiKey };
const sb = await Sandbox.create({ ...conn, template: 'minimal' });
const container = execFileSync('runsc', ['--root', path.join(dataDir, 'runsc'), 'list', '-quiet'], { encoding: 'utf8' }).split('\n').find((l) => l.startsWith(sb.id));

const run = (argv, runEnv = env) => () => {
  const t = process.hrtime.bigint();
  const r = spawnSync(argv[0], argv.slice(1), { env: runEnv, cwd: root, stdio: ['ignore', 'ignore', 'pipe'] });
  if (r.status !== 0) throw new Error(`${argv.join(' ')} failed: ${r.stderr}`);
  return Number(process.hrtime.bigint() - t) / 1e6;
};
const { NODE_EXTRA_CA_CERTS: _, ...envWithoutCa } = env;
const cases = [
  [`node -e 0 (node's own start${extraCa ? `, NODE_EXTRA_CA_CERTS=${extraCa}` : ''})`, run([process.execPath, '-e', '0'])],
  ...(extraCa ? [['node -e 0 without NODE_EXTRA_CA_CERTS', run([process.execPath, '-e', '0'], envWithoutCa)]] : []),
  ['runsc exec CONTAINER true', run(['runsc', '--root', path.join(dataDir, 'runsc'), 'exec', container, 'true'])],
  ['SDK commands.run in-process', async () => {
    const t = process.hrtime.bigint();
    await sb.commands.run(['true']);
    return Number(process.hrtime.bigint() - t) / 1e6;
  }],
  ['space exec ID -- true (the launcher on the PATH)', run([LAUNCHER, 'exec', sb.id, '--', 'true'])],
  ['node dist/space.mjs exec ID -- true (the bundle, no launcher)', run([process.execPath, BUNDLE, 'exec', sb.id, '--', 'true'])],
  ['./space exec ID -- true (checkout, unchanged)', run([path.join(root, 'space'), 'exec', sb.id, '--', 'true'])],
];
// Warm each once, then alternate so that drift hits every case alike.
for (const [, f] of cases) await f();
const times = cases.map(() => []);
for (let i = 0; i < N; i++) for (const [j, [, f]] of cases.entries()) times[j].push(await f());

const lines = ['| what | p50 ms | p95 ms |', '|---|---|---|', ...cases.map(([name], j) => `| ${name} | ${quantile(times[j], 50).toFixed(0)} | ${quantile(times[j], 95).toFixed(0)} |`)];
const table = lines.join('\n');
console.log(table);
await sb.kill();
await stopSpaced(spaced);
// With disks (the default) the pool stays mounted after the daemon: removeDataDir unmounts it.
removeDataDir(dataDir);
if (values.write) writeSection('cli', 'CLI latency', `Measured with \`node scripts/bench-cli.mjs --iterations ${N} --write\` (part of \`./space bench\`), one sandbox of template \`minimal\`, the ${cases.length} cases alternating.\n\n${table}`);
