// A free TCP port on loopback, for servers a test starts (PostgreSQL, Swift).
import { readFileSync } from 'node:fs';
import { createServer } from 'node:net';

/** @example const port = await freePort(); */
export function freePort() {
  return new Promise((resolve, reject) => {
    const s = createServer().listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
    s.on('error', reject);
  });
}

/**
 * A free TCP port below the kernel's ephemeral range, for a server a test stops and starts
 * again on the same port: a port from {@link freePort} is in that range, so while the server is
 * down an outgoing connection or another `listen(0)` of the suite may take it (seen in CI:
 * EADDRINUSE on the restart). Below the range only an explicit bind takes a port.
 * `span` ports in a row are free (a daemon on P also listens on P+1 and P+2).
 * @example const port = await stablePort(3); // … listen, stop, listen on `port` again
 */
export async function stablePort(span = 1) {
  const [low] = readFileSync('/proc/sys/net/ipv4/ip_local_port_range', 'utf8').trim().split(/\s+/).map(Number);
  const from = Math.min(20_000, low - 2_000);
  for (let i = 0; i < 50; i++) {
    const port = from + Math.floor(Math.random() * (low - from - span));
    let free = true;
    for (let p = port; free && p < port + span; p++) {
      free = await new Promise((resolve) => {
        const s = createServer().once('error', () => resolve(false)).listen(p, '127.0.0.1', () => s.close(() => resolve(true)));
      });
    }
    if (free) return port;
  }
  throw new Error(`no free port between ${from} and ${low}`);
}
