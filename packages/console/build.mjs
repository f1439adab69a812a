// Builds the console into dist/: one JavaScript bundle (Preact, xterm.js and the pages, minified
// by esbuild), one stylesheet (xterm's and ours), and index.html naming both by content hash.
// Nothing is fetched at run time: the daemon serves these files itself.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { build } from 'esbuild';

const here = (p) => new URL(p, import.meta.url).pathname;
const require = createRequire(import.meta.url);
rmSync(here('dist'), { recursive: true, force: true });
mkdirSync(here('dist/assets'), { recursive: true });
await build({
  entryPoints: [here('src/main.tsx')],
  bundle: true,
  minify: true,
  format: 'esm',
  target: 'es2020',
  jsx: 'automatic',
  jsxImportSource: 'preact',
  outfile: here('dist/assets/app.js'),
  legalComments: 'linked',
  logLevel: 'warning',
});
const css = readFileSync(require.resolve('@xterm/xterm/css/xterm.css'), 'utf8') + '\n' + readFileSync(here('src/app.css'), 'utf8');
writeFileSync(here('dist/assets/app.css'), css);
writeFileSync(here('dist/assets/icon.svg'), readFileSync(here('icon.svg')));
const hash = (f) => createHash('sha256').update(readFileSync(here(f))).digest('hex').slice(0, 12);
writeFileSync(here('dist/index.html'), readFileSync(here('index.html'), 'utf8').replace('__HASH_JS__', hash('dist/assets/app.js')).replace('__HASH_CSS__', hash('dist/assets/app.css')));
