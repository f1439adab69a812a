#!/usr/bin/env node
// The processes of scripts/bench-egress.mjs: `upstream` (the HTTPS server on loopback) and
// `proxy` (the egress proxy as the daemon runs it: policy, secret swap, audit to SQLite, tenant
// CA). Each reports what the benchmark needs over IPC and serves until it is told to stop.
import { mkdtempSync, rmSync } from 'node:fs';
import { SecretService } from '../packages/core/dist/index.js';
import { EgressProxy, TenantCas } from '../packages/egress/dist/index.js';
import { openKeys } from './bench-lib.mjs';
import { startUpstream } from '../test/tls-server.mjs';

const role = process.argv[2];
const HOST = 'api.example.test';

if (role === 'upstream') {
  const up = await startUpstream([HOST]);
  process.on('message', async (m) => {
    if (m === 'cpu') process.send({ cpu: process.cpuUsage() });
    if (m === 'injected') process.send({ injected: up.seen.filter((s) => s.headers['x-api-key'] === 'the-real-value').length, total: up.seen.length });
    if (m === 'stop') {
      await up.close();
      process.exit(0);
    }
  });
  process.send({ httpsPort: up.httpsPort, caPem: up.caPem });
} else if (role === 'proxy') {
  const { httpsPort, caPem } = JSON.parse(process.argv[3]);
  const dir = mkdtempSync('/tmp/spbeg-');
  const { store, keys } = await openKeys(dir);
  const secrets = new SecretService({ store, keys });
  await secrets.set('bench', { name: 'API_TOKEN', value: 'the-real-value', hosts: [HOST] });
  const cas = new TenantCas({ store, keys });
  const ctx = { sandboxId: 'sbbench', tenantId: 'bench', policy: { domains: [HOST], cidrs: ['127.0.0.1/32'], ports: [httpsPort], passthrough: [] }, secrets: [{ name: 'API_TOKEN', placeholder: process.argv[4] }] };
  const proxy = new EgressProxy({ host: '127.0.0.1', port: 0, sandboxAt: () => 'sbbench', context: async () => ctx, describe: (t, n) => secrets.get(t, n).catch(() => undefined), reveal: (t, n) => secrets.reveal(t, n), cas, audit: (e) => void secrets.audit(e), upstreamCa: caPem, hosts: { [HOST]: '127.0.0.1' } });
  await proxy.listen();
  process.on('message', async (m) => {
    if (m === 'cpu') process.send({ cpu: process.cpuUsage() });
    if (m === 'stop') {
      await proxy.close();
      await store.close();
      rmSync(dir, { recursive: true, force: true });
      process.exit(0);
    }
  });
  process.send({ port: proxy.port, tenantCa: await cas.certificate('bench') });
} else {
  console.error('usage: bench-egress-parts.mjs upstream | proxy JSON PLACEHOLDER');
  process.exit(2);
}
