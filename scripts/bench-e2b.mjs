#!/usr/bin/env node
// The E2B-compatible API's overhead: `Sandbox.create()` + `commands.run('true')` through the
// published e2b SDK vs SPACE's own SDK, alternating in one run on the same template (`base`,
// E2B's default), each sandbox killed untimed afterwards. Target: ≤ 1.2x.
//   node scripts/bench-e2b.mjs [--iterations 30] [--write]
import { mkdtempSync } from 'node:fs';
import os from 'node:os';
import { parseArgs } from 'node:util';
import { quantile, writeSection } from './bench-lib.mjs';
import { Sandbox as E2bSandbox } from 'e2b';
import { ApiClient, Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { removeDataDir, startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '30' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const q = quantile;
const fmt = (ms) => ms.toFixed(0);

const dataDir = mkdtempSync('/tmp/spbe-');
const spaced = await startSpaced(dataDir);
const { conn } = spaced;
try {
  const api = new ApiClient(conn);
  const url = (await api.json('GET', '/v1/e2b')).url;
  const key = (await api.json('POST', '/v1/keys', { json: { format: 'e2b' } })).key;
  const e2bOpts = { apiKey: key, apiUrl: url, sandboxUrl: url };
  await Templates.prepare('base', conn);
  const ours = [];
  const theirs = [];
  for (let i = 0; i < N; i++) {
    let t = performance.now();
    const a = await Sandbox.create({ ...conn, template: 'base' });
    await a.commands.run('true');
    ours.push(performance.now() - t);
    await a.kill();
    t = performance.now();
    const b = await E2bSandbox.create('base', e2bOpts);
    await b.commands.run('true');
    theirs.push(performance.now() - t);
    await b.kill();
  }
  const table = [
    '| measurement | p50 ms | p95 ms | baseline (same run) | baseline p50 ms | ratio | target |',
    '|---|---|---|---|---|---|---|',
    `| \`Sandbox.create()\` + \`commands.run('true')\` through the \`e2b\` SDK 2.51 | ${fmt(q(theirs, 50))} | ${fmt(q(theirs, 95))} | the same through SPACE's SDK | ${fmt(q(ours, 50))} | ${(q(theirs, 50) / q(ours, 50)).toFixed(2)}x | ≤ 1.2x |`,
  ].join('\n');
  console.log(table);
  if (values.write) {
    writeSection('e2b', 'E2B-compatible API (issue 8)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores, ${N} iterations each, alternating, with \`node scripts/bench-e2b.mjs --write\` (part of \`./space bench\`). Both restore the \`base\` template's snapshot (no warm pool).\n\n${table}`);
  }
} finally {
  await stopSpaced(spaced);
  // With disks (the default) the pool stays mounted after the daemon: removeDataDir unmounts it.
  removeDataDir(dataDir);
}
