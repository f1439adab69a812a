#!/usr/bin/env node
// What the `base` template costs to build and store, against the package set it had before it
// gained what agents reach for (bash, coreutils, python3, git, curl, ca-certificates, procps),
// both built side by side in this run by the same builder (mmdebstrap, minbase, bookworm).
//   node scripts/bench-base-template.mjs [--write]
// Needs the network to Debian's mirror (as `./space up` does the first time).
import { mkdtempSync, rmSync } from 'node:fs';
import { RootfsStore } from '../packages/templates/dist/index.js';
import { writeSection } from './bench-lib.mjs';

const PREVIOUS = ['bash', 'coreutils', 'python3', 'git', 'curl', 'ca-certificates', 'procps'];
const write = process.argv.includes('--write');
const dir = mkdtempSync('/tmp/space-bench-base-');
const store = new RootfsStore(dir);

/** Builds one root file system; its wall time and size on disk. */
async function build(key, source) {
  const t0 = performance.now();
  const r = await store.build(key, source);
  return { s: (performance.now() - t0) / 1000, mib: r.sizeBytes / 1048576 };
}

try {
  const before = await build('previous', { type: 'debian', packages: PREVIOUS });
  const now = await build(store.builtinKey('base'), { type: 'builtin', name: 'base' });
  const rows = [
    ['build time (s)', now.s.toFixed(1), before.s.toFixed(1), `${(now.s / before.s).toFixed(2)}x`],
    ['root file system (MiB)', now.mib.toFixed(0), before.mib.toFixed(0), `${(now.mib / before.mib).toFixed(2)}x`],
  ];
  const table = [
    `Measured ${new Date().toISOString().slice(0, 10)} on 2 cores with \`node scripts/bench-base-template.mjs --write\`: the \`base\` template's root file system built by mmdebstrap from the Debian mirror, against the package set \`base\` had before (${PREVIOUS.join(', ')}), in the same run. Download time is included; the template snapshot taken on first use (~1 s) is not.`,
    '',
    '| measurement | base now | base before (same run) | ratio |',
    '|---|---:|---:|---:|',
    ...rows.map((r) => `| ${r.join(' | ')} |`),
  ].join('\n');
  console.log(table);
  if (write) writeSection('base-template', 'The base template', table);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
