// What every benchmark script shares: percentiles, and writing its table into
// docs/benchmarks.md between its markers.
import { readFileSync, writeFileSync } from 'node:fs';

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
