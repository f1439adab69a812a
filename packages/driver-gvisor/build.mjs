// Builds space-statefile (native/statefile.go) next to the driver's compiled code. It must be
// built by the Go release runsc was built with (Debian 12: golang-1.19 for both), so that it
// compresses state file blocks exactly as runsc does; blocks it cannot reproduce are stored
// as they are, so another release costs deduplication, never correctness.
import { execFileSync } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
const here = fileURLToPath(new URL('.', import.meta.url));
mkdirSync(here + 'dist', { recursive: true });
try {
  execFileSync('go', ['build', '-trimpath', '-ldflags=-s -w', '-o', here + 'dist/space-statefile', '.'], {
    cwd: here + 'native',
    stdio: 'inherit',
    // Standard library only: never reach for the network or another toolchain.
    env: { ...process.env, GOTOOLCHAIN: 'local', GOPROXY: 'off', ...(process.env.HOME || process.env.GOCACHE ? {} : { GOCACHE: '/tmp/space-go-cache' }) },
  });
} catch (err) {
  console.error('driver-gvisor: building space-statefile needs Go (apt-get install golang-go):', err.message);
  process.exit(1);
}
