#!/usr/bin/env node
// Fails when any module of packages/*/src imports itself through others — type-only imports
// included: a cycle of types is still a knot a reader must untie — or when an import inside
// core points the wrong way between its folders (CORE_LAYERS). Uses dpdm (TypeScript's own
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

/**
 * Core's folders in the order imports may point: a file imports only from its own folder or a
 * folder earlier in this list ('.' is core's top level: the facade and the index, which may
 * import anything; the bottom modules are the top-level files named in BOTTOM).
 */
export const CORE_LAYERS = ['bottom', 'ports', 'security', 'volumes', 'storage', 'templates', 'agent', 'sandboxes', '.'];
const BOTTOM = new Set(['async-queue', 'errors', 'exec', 'ids', 'laps', 'logger', 'model', 'records', 'validate']);
const CORE = 'packages/core/src/';

function coreLayer(file) {
  const rest = file.slice(CORE.length);
  const slash = rest.indexOf('/');
  if (slash >= 0) return rest.slice(0, slash);
  return BOTTOM.has(rest.replace(/\.ts$/, '')) ? 'bottom' : '.';
}

/**
 * Imports inside core that point the wrong way (to a later folder in {@link CORE_LAYERS}, or
 * sideways between two folders), as "from -> to" lines.
 * @example await layerViolations(['packages/core/src/**\/*.ts'], repoRoot) // [] when in order
 */
export async function layerViolations(globs, cwd) {
  const tree = await parseDependencyTree(globs, { cwd, context: cwd, transform: false, skipDynamicImports: false, include: /\.(ts|mts|js|mjs)$/, exclude: /node_modules|\/dist\//, onProgress: () => {} });
  const out = [];
  for (const [file, deps] of Object.entries(tree)) {
    if (!file.startsWith(CORE) || !deps) continue;
    const from = coreLayer(file);
    for (const dep of deps) {
      if (!dep.id?.startsWith(CORE)) continue;
      const to = coreLayer(dep.id);
      if (from === to || from === '.') continue;
      const [i, j] = [CORE_LAYERS.indexOf(from), CORE_LAYERS.indexOf(to)];
      if (j >= i || (to === 'templates' && from === 'agent')) out.push(`${file} -> ${dep.id}`);
    }
  }
  return out;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const root = fileURLToPath(new URL('..', import.meta.url));
  const cycles = await importCycles(['packages/*/src/**/*.ts'], root);
  const wrongWay = await layerViolations([`${CORE}**/*.ts`], root);
  if (cycles.length === 0) console.log('no import cycles');
  else console.error(`${cycles.length} import cycle(s):\n${cycles.map((c) => `  ${[...c, c[0]].join(' -> ')}`).join('\n')}`);
  if (wrongWay.length === 0) console.log(`core imports point one way: ${CORE_LAYERS.join(' <- ')}`);
  else console.error(`${wrongWay.length} core import(s) pointing the wrong way (order: ${CORE_LAYERS.join(', ')}):\n${wrongWay.map((l) => `  ${l}`).join('\n')}`);
  if (cycles.length || wrongWay.length) process.exit(1);
}
