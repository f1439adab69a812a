// Bundles the agent into one CommonJS file that runs on the sandbox's read-only runtime.
// node-pty stays external: its native addon is copied next to the bundle by the driver.
import { build } from 'esbuild';
import { fileURLToPath } from 'node:url';
const here = fileURLToPath(new URL('.', import.meta.url));
await build({
  entryPoints: [here + 'src/main.ts'],
  outfile: here + 'dist/agent.cjs',
  bundle: true,
  platform: 'node',
  target: 'node20',
  format: 'cjs',
  external: ['node-pty'],
  sourcemap: false,
  legalComments: 'none',
  logLevel: 'warning',
});

// The static helper for what Node cannot do (sethostname, dropping a capability before exec).
import { execFileSync } from 'node:child_process';
execFileSync('cc', ['-static', '-Os', '-s', '-Wall', '-Werror', '-o', here + 'dist/space-helper', here + 'native/helper.c'], { stdio: 'inherit' });

// The compatibility shim preloaded into gVisor sandboxes' programs (native/compat.c says why).
execFileSync('cc', ['-shared', '-fPIC', '-O2', '-s', '-nostdlib', '-fno-stack-protector', '-Wall', '-Werror', '-o', here + 'dist/libspace-compat.so', here + 'native/compat.c'], { stdio: 'inherit' });
