// What every benchmark script shares: percentiles, and writing its table into
// docs/benchmarks.md between its markers.
import { randomBytes } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { KeyService, LocalKeyProvider } from '../packages/core/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';

/** The p-th percentile of `xs` (nearest rank). */
export const quantile = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];

/**
 * Replaces the block `<!-- name:start --> … <!-- name:end -->` of docs/benchmarks.md with
 * `body`; if the file has no such block yet, adds it under `## heading` before "Reading the numbers".
 */
export function writeSection(name, heading, body) {
  const file = new URL('../docs/benchmarks.md', import.meta.url);
  const doc = readFileSync(file, 'utf8');
  const block = `<!-- ${name}:start -->\n${body}\n<!-- ${name}:end -->`;
  const re = new RegExp(`<!-- ${name}:start -->[\\s\\S]*<!-- ${name}:end -->`);
  writeFileSync(file, re.test(doc) ? doc.replace(re, () => block) : doc.replace('### Reading the numbers', `## ${heading}\n\n${block}\n\n### Reading the numbers`));
}

/** A metadata store and a started KeyService in `dir`, under a fresh node key (what the daemon has). */
export async function openKeys(dir) {
  mkdirSync(path.join(dir, 'keys'), { recursive: true });
  writeFileSync(path.join(dir, 'keys', 'node.key'), randomBytes(32));
  const store = SqliteStore.open(path.join(dir, 'space.db'));
  const logger = { info() {}, warn() {}, error() {}, debug() {} };
  const keys = new KeyService({ store, providers: [new LocalKeyProvider(path.join(dir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger });
  await keys.start();
  return { store, keys };
}
