// A free TCP port on loopback, for servers a test starts (PostgreSQL, Swift).
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
