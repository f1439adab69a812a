#!/usr/bin/env node
// The egress proxy's cost, side by side in one run: HTTPS requests to a loopback server
// directly from the host, and through the proxy (CONNECT, TLS terminated with the tenant's CA,
// policy check, secret swap, audit, a new verified TLS connection upstream).
//   node scripts/bench-egress.mjs [--requests 500] [--rounds 3] [--mb 100] [--write]
// SPACE_BENCH_PROF=1 writes a CPU profile of the proxy process to /tmp/prof.
import { fork } from 'node:child_process';
import { once } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import os from 'node:os';
import tls from 'node:tls';
import { parseArgs } from 'node:util';
import { quantile, writeSection } from './bench-lib.mjs';

// --iterations (what `./space bench` passes to every benchmark) sets the rounds.
const { values } = parseArgs({ options: { requests: { type: 'string', default: '500' }, rounds: { type: 'string', default: '3' }, iterations: { type: 'string' }, mb: { type: 'string', default: '100' }, write: { type: 'boolean', default: false } } });
const N = Number(values.requests);
const ROUNDS = Number(values.iterations ?? values.rounds);
const BYTES = Number(values.mb) * 1048576;
const HOST = 'api.example.test';
const PARTS = new URL('./bench-egress-parts.mjs', import.meta.url).pathname;

/** Starts one part in its own process (as in production: the server elsewhere, the proxy in the daemon). */
async function part(...args) {
  const child = fork(PARTS, args, { stdio: ['ignore', 'inherit', 'inherit', 'ipc'], execArgv: process.env.SPACE_BENCH_PROF && args[0] === 'proxy' ? ['--cpu-prof', '--cpu-prof-dir=/tmp/prof'] : [] });
  const [msg] = await once(child, 'message');
  return { child, ...msg };
}

const placeholder = 'space_ph_0123456789abcdef0123456789abcdef';
const up = await part('upstream');
const proxy = await part('proxy', JSON.stringify({ httpsPort: up.httpsPort, caPem: up.caPem }), placeholder);
try {
  const tenantCa = proxy.tenantCa;
  const upPort = up.httpsPort;
  /** An agent whose connections are CONNECT tunnels through the proxy (what a sandbox's client does). */
  class TunnelAgent extends https.Agent {
    createConnection(o, cb) {
      const req = http.request({ host: '127.0.0.1', port: proxy.port, method: 'CONNECT', path: `${o.host}:${o.port}`, headers: { host: `${o.host}:${o.port}` } });
      req.once('connect', (res, socket) => (res.statusCode === 200 ? cb(null, tls.connect({ socket, servername: o.servername ?? o.host, ca: tenantCa })) : cb(new Error(`CONNECT ${res.statusCode}`))));
      req.once('error', cb);
      req.end();
    }
  }
  const direct = { agent: new https.Agent({ keepAlive: true, maxSockets: 1, ca: up.caPem, lookup: (_h, o, cb) => (o?.all ? cb(null, [{ address: '127.0.0.1', family: 4 }]) : cb(null, '127.0.0.1', 4)) }), ca: up.caPem };
  const proxied = { agent: new TunnelAgent({ keepAlive: true, maxSockets: 1 }) };
  const fresh = {
    direct: () => ({ agent: new https.Agent({ keepAlive: false, ca: up.caPem, lookup: direct.agent.options.lookup }) }),
    proxied: () => ({ agent: new TunnelAgent({ keepAlive: false }) }),
  };

  const get = (via, p) =>
    new Promise((resolve, reject) => {
      const t0 = performance.now();
      const req = https.get({ host: HOST, port: upPort, path: p, headers: { 'x-api-key': placeholder }, ...via }, (res) => {
        let n = 0;
        res.on('data', (d) => (n += d.length));
        res.on('end', () => (res.statusCode === 200 ? resolve({ ms: performance.now() - t0, bytes: n }) : reject(new Error(`HTTP ${res.statusCode}`))));
      });
      req.once('error', reject);
    });

  const lat = { direct: [], proxied: [], directNew: [], proxiedNew: [] };
  const tput = { direct: [], proxied: [] };
  /** CPU time of each process so far, ms. */
  const cpuOf = async () => {
    const out = { client: (process.cpuUsage().user + process.cpuUsage().system) / 1000 };
    for (const [w, p] of [['upstream', up], ['proxy', proxy]]) {
      p.child.send('cpu');
      const [{ cpu: c }] = await once(p.child, 'message');
      out[w] = (c.user + c.system) / 1000;
    }
    return out;
  };
  const cpu = { direct: { client: [], upstream: [], proxy: [] }, proxied: { client: [], upstream: [], proxy: [] } };
  for (let r = 0; r < ROUNDS; r++) {
    for (let i = 0; i < N; i++) {
      // Interleaved, so both see the same machine.
      lat.direct.push((await get(direct, '/small')).ms);
      lat.proxied.push((await get(proxied, '/small')).ms);
    }
    for (let i = 0; i < Math.max(20, N / 10); i++) {
      lat.directNew.push((await get(fresh.direct(), '/small')).ms);
      lat.proxiedNew.push((await get(fresh.proxied(), '/small')).ms);
    }
    for (const [k, via] of [['direct', direct], ['proxied', proxied]]) {
      const before = await cpuOf();
      const { ms, bytes } = await get(via, `/bytes/${BYTES}`);
      const after = await cpuOf();
      if (bytes !== BYTES) throw new Error(`${k}: got ${bytes} of ${BYTES} bytes`);
      tput[k].push(bytes / 1048576 / (ms / 1000));
      for (const w of ['client', 'upstream', 'proxy']) cpu[k][w].push((after[w] - before[w]) / ms);
    }
  }
  up.child.send('injected');
  const [{ injected }] = await once(up.child, 'message');
  if (injected < ROUNDS * N) throw new Error(`the proxy swapped the placeholder in only ${injected} requests`);

  const p50 = (xs) => quantile(xs, 50);
  const p95 = (xs) => quantile(xs, 95);
  const med = (xs) => quantile(xs, 50);
  const f = (x, d = 2) => x.toFixed(d);
  const rows = [
    ['HTTPS GET, keep-alive: p50 / p95 ms', `${f(p50(lat.direct))} / ${f(p95(lat.direct))}`, `${f(p50(lat.proxied))} / ${f(p95(lat.proxied))}`, `+${f(p50(lat.proxied) - p50(lat.direct))} ms`, '≤ +2 ms p50', p50(lat.proxied) - p50(lat.direct) <= 2 ? '✓' : '✗'],
    ['HTTPS GET, new connection each: p50 / p95 ms', `${f(p50(lat.directNew))} / ${f(p95(lat.directNew))}`, `${f(p50(lat.proxiedNew))} / ${f(p95(lat.proxiedNew))}`, `+${f(p50(lat.proxiedNew) - p50(lat.directNew))} ms`, '-', ''],
    [`${values.mb} MB download: MB/s (median of ${ROUNDS})`, f(med(tput.direct), 0), f(med(tput.proxied), 0), `${f(med(tput.proxied) / med(tput.direct))}x`, '≥ 0.8x', med(tput.proxied) / med(tput.direct) >= 0.8 ? '✓' : '✗'],
  ];
  const busy = (k) => ['client', 'upstream', 'proxy'].map((w) => `${w} ${f(med(cpu[k][w]) * 100, 0)}%`).join(', ');
  rows.push([`${values.mb} MB download: CPU busy (of one core)`, busy('direct'), busy('proxied'), '', '', '']);
  const table = ['| measure | direct | through the proxy | difference | target | |', '|---|---|---|---|---|---|', ...rows.map((r) => `| ${r.join(' | ')} |`)].join('\n');
  const body = `Command: \`node scripts/bench-egress.mjs --requests ${N} --rounds ${ROUNDS} --mb ${values.mb}${values.write ? ' --write' : ''}\` (${os.cpus().length} cores, ${new Date().toISOString().slice(0, 10)}).
From the host to an HTTPS server on loopback (its own process), directly and through the egress proxy (its own process, as in the daemon), interleaved in one run.
Through the proxy every request is checked against a policy, has a secret placeholder swapped for its value (verified at the server: ${injected} requests), is audited to SQLite, and goes upstream over a verified TLS connection; the client's TLS ends at the proxy with a certificate from the tenant's CA.

${table}`;
  console.log(body);
  if (values.write) writeSection('egress', 'Egress proxy', body);
} finally {
  for (const p of [proxy, up]) {
    p.child.send('stop');
    await once(p.child, 'exit');
  }
}
