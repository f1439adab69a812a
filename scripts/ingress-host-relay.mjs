#!/usr/bin/env node
// The ingress in a process of its own for bench-ingress's host-only row: the ingress listener
// (@space/ingress, as the daemon runs it) routing every exposed port to 127.0.0.1:PORT (a host
// process in the sandbox's place) with the token "bench". Prints its port, serves until killed.
//   node scripts/ingress-host-relay.mjs PORT
import { createHash, randomBytes } from 'node:crypto';
import { IngressServer } from '../packages/ingress/dist/index.js';

const upstream = Number(process.argv[2]);
if (!Number.isInteger(upstream) || upstream < 1 || upstream > 65535) {
  console.error('usage: ingress-host-relay.mjs PORT (the host server to relay to)');
  process.exit(2);
}
const tokenHash = createHash('sha256').update('bench').digest('hex');
const ingress = new IngressServer({
  domain: '',
  secret: randomBytes(32),
  backend: { route: async (sandboxId) => ({ sandboxId, tenantId: 'bench', port: upstream, public: false, tokenHash }), connect: async () => '127.0.0.1' },
});
const { port } = await ingress.listen('127.0.0.1', 0);
ingress.domain = `localhost:${port}`;
console.log(port);
