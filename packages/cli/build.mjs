// Bundles the CLI into one file (dist/space.mjs), so that a command loads one module instead of
// some hundreds: `space exec ID -- true` is bounded by node's own start. What only a few
// commands need (the daemon, the drivers for `doctor`, the MCP server) stays outside the bundle
// and is imported when such a command runs.
import { build } from 'esbuild';
import { chmodSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
const here = fileURLToPath(new URL('.', import.meta.url));
await build({
  entryPoints: [here + 'src/main.ts'],
  outfile: here + 'dist/space.mjs',
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'esm',
  external: ['@space/server', '@space/driver-gvisor', '@space/driver-microvm', '@space/volume-ext4', '@space/mcp', '@space/core', 'better-sqlite3', 'node-pty', 'tar'],
  banner: { js: "import { createRequire as __spaceRequire } from 'node:module'; const require = __spaceRequire(import.meta.url);" },
  sourcemap: false,
  legalComments: 'none',
  logLevel: 'warning',
  metafile: true,
}).then((r) => {
  chmodSync(here + 'dist/space.mjs', 0o755);
  if (process.env.SPACE_BUNDLE_REPORT) console.log(Object.entries(r.metafile.inputs).map(([f, i]) => `${i.bytes}\t${f}`).sort((a, b) => parseInt(b) - parseInt(a)).slice(0, 15).join('\n'));
});
