#!/usr/bin/env node
// A process of its own for bench-ingress's host-only rows: `upstream` serves N bytes at
// /bytes/N (a host process in the sandbox's place), `ingress PORT` runs the ingress listener
// (@space/ingress, as the daemon does) routing every exposed port to 127.0.0.1:PORT with the
// token "bench". Each prints its port on stdout, then serves until killed.
//   node scripts/ingress-host-relay.mjs upstream | ingress PORT
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import { IngressServer } from '../packages/ingress/dist/index.js';

const [role, arg] = process.argv.slice(2);
if (role === 'upstream') {
  const block = Buffer.alloc(1 << 20, 'abcdefgh');
  const server = http.createServer((req, res) => {
    let left = Number(req.url.split('/')[2] ?? 0);
    res.writeHead(200, { 'content-length': left });
    const more = () => {
      while (left > 0) {
        const n = Math.min(left, block.length);
        left -= n;
        if (!res.write(n === block.length ? block : block.subarray(0, n))) return void res.once('drain', more);
      }
      res.end();
    };
    more();
  });
  server.listen(0, '127.0.0.1', () => console.log(server.address().port));
} else if (role === 'ingress') {
  const tokenHash = createHash('sha256').update('bench').digest('hex');
  const ingress = new IngressServer({
    domain: '',
    secret: randomBytes(32),
    backend: { route: async (sandboxId, port) => ({ sandboxId, tenantId: 'bench', port: Number(arg), public: false, tokenHash }), connect: async () => '127.0.0.1' },
  });
  const { port } = await ingress.listen('127.0.0.1', 0);
  ingress.domain = `localhost:${port}`;
  console.log(port);
} else {
  console.error('usage: ingress-host-relay.mjs upstream | ingress PORT');
  process.exit(2);
}
