#!/usr/bin/env node
// Fails when any module of packages/*/src imports itself through others — type-only imports
// included: a cycle of types is still a knot a reader must untie. Uses dpdm (TypeScript's own
// parser). Run: npm run check:cycles; test/import-cycles.test.mjs runs it in the fast lane.
import { parseCircular, parseDependencyTree } from 'dpdm';
import { fileURLToPath } from 'node:url';

/**
 * The import cycles among the files `globs` match, each as the list of files around it.
 * @example await importCycles(['packages/*\/src/**\/*.ts'], repoRoot) // [] when in order
 */
export async function importCycles(globs, cwd) {
  const tree = await parseDependencyTree(globs, { cwd, context: cwd, transform: false, skipDynamicImports: false, include: /\.(ts|mts|js|mjs)$/, exclude: /node_modules|\/dist\//, onProgress: () => {} });
  return parseCircular(tree, false);
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const cycles = await importCycles(['packages/*/src/**/*.ts'], root);
  if (cycles.length === 0) console.log('no import cycles');
  else {
    console.error(`${cycles.length} import cycle(s):\n${cycles.map((c) => `  ${[...c, c[0]].join(' -> ')}`).join('\n')}`);
    process.exit(1);
  }
}
