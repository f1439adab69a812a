#!/usr/bin/env node
// The ingress against direct connections, side by side in one run: request latency, download
// throughput and WebSocket round trips through the ingress vs from the host straight to the
// sandbox's address; and the first request to a hibernated sandbox (autoResume) vs a plain wake.
//   node scripts/bench-ingress.mjs [--iterations 200] [--wakes 3] [--write]
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createHash } from 'node:crypto';
import http from 'node:http';
import { mkdtempSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { WebSocket } from 'ws';
import { quantile, writeSection } from './bench-lib.mjs';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { eventually, removeDataDir, startSpaced, stopSpaced } from '../test/helpers.mjs';
import { startStreamsServer, streamsServerProgram } from '../test/streams-server.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '200' }, wakes: { type: 'string', default: '3' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const WAKES = Number(values.wakes);
const MB = 100;
// Single 100 MB downloads range 40–400 MB/s here, direct or not (the sandbox's leg stalls with
// the host mostly idle: docs/ingress.md, "Throughput"): 9 alternating rounds each, medians.
const ROUNDS = 9;

const dataDir = mkdtempSync('/tmp/space-bench-ingress-');
const spaced = await startSpaced(dataDir);
const state = JSON.parse(readFileSync(path.join(dataDir, 'spaced.json'), 'utf8'));
const ingressPort = Number(new URL(state.ingressUrl).port);
const ms = (t) => Number(process.hrtime.bigint() - t) / 1e6;

try {
  const sb = await Sandbox.create({ ...spaced.conn, template: 'base' });
  await startStreamsServer(sb);
  // Wake on request needs a server this runsc can checkpoint: Python's (a Node server's epoll
  // listener cannot be, docs/architecture.md), in a sandbox of its own.
  const sleeper = await Sandbox.create({ ...spaced.conn, template: 'base', autoResume: true });
  await sleeper.commands.run('mkdir -p /tmp/site && echo hello > /tmp/site/index.html && cd /tmp/site && python3 -m http.server 8000', { background: true });
  const q = await sleeper.ports.expose(8000);
  const toSleeper = { host: '127.0.0.1', port: ingressPort, headers: { host: new URL(q.url).host, 'x-space-access-token': q.token } };
  const p = await sb.ports.expose(8080);
  const viaIngress = { host: '127.0.0.1', port: ingressPort, headers: { host: new URL(p.url).host, 'x-space-access-token': p.token } };
  // The sandbox's own address, as it sees it (the host can reach it; the ingress connects to it).
  const me = await sb.commands.run(`python3 -c "import os, socket; u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.connect((os.environ['HTTP_PROXY'].split('//')[1].split(':')[0], 3128)); print(u.getsockname()[0])"`);
  const direct = { host: me.stdout.trim(), port: 8080, headers: {} };

  /** GET `path` with `to`'s address and headers; resolves to { status, bytes, sha }. */
  const get = (to, pathname, agent) =>
    new Promise((resolve, reject) => {
      http
        .get({ agent, host: to.host, port: to.port, path: pathname, headers: to.headers, setHost: to === direct }, (res) => {
          const h = createHash('sha256');
          let bytes = 0;
          res.on('data', (d) => ((bytes += d.length), h.update(d)));
          res.on('end', () => resolve({ status: res.statusCode, bytes, sha: h.digest('hex') }));
        })
        .on('error', reject);
    });
  await eventually(async () => (await get(viaIngress, '/').catch(() => ({}))).status === 200);
  await eventually(async () => (await get(toSleeper, '/').catch(() => ({}))).status === 200);

  // 1. First request to a hibernated sandbox vs a plain wake (the ingress leaves no connection
  //    open inside, which a hibernation could not take).
  const wakeCases = [
    ['first request through the ingress to a hibernated sandbox (autoResume) → 200', async () => {
      await sleeper.hibernate();
      const t = process.hrtime.bigint();
      const r = await get(toSleeper, '/');
      if (r.status !== 200) throw new Error(`the woken sandbox answered ${r.status}`);
      return ms(t);
    }],
    ['space wake (API) of a hibernated sandbox, then the same request', async () => {
      await sleeper.hibernate();
      const t = process.hrtime.bigint();
      await sleeper.wake();
      const r = await get(toSleeper, '/');
      if (r.status !== 200) throw new Error(`the woken sandbox answered ${r.status}`);
      return ms(t);
    }],
  ];
  const wakeTimes = wakeCases.map(() => []);
  for (let i = 0; i < WAKES; i++) for (const [j, [, f]] of wakeCases.entries()) wakeTimes[j].push(await f());

  // 2. Latency of a small request, alternating, each side with a keep-alive client.
  const agents = { ingress: new http.Agent({ keepAlive: true, maxSockets: 1 }), direct: new http.Agent({ keepAlive: true, maxSockets: 1 }) };
  const lat = { ingress: [], direct: [] };
  for (let i = 0; i < N + 10; i++) {
    for (const side of ['ingress', 'direct']) {
      const t = process.hrtime.bigint();
      const r = await get(side === 'ingress' ? viaIngress : direct, '/', agents[side]);
      if (r.status !== 200) throw new Error(`${side}: ${r.status}`);
      if (i >= 10) lat[side].push(ms(t));
    }
  }

  // 3. Download throughput, 100 MB, alternating. The daemon's CPU (all its threads, user and
  //    system) while it relays is the steadier measure of what the ingress itself costs.
  const daemonCpuMs = () => {
    const f = readFileSync(`/proc/${spaced.child.pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return ((Number(f[11]) + Number(f[12])) * 1000) / 100; // utime, stime in clock ticks (100/s)
  };
  const relayCpu = [];
  const tput = { ingress: [], direct: [] };
  for (let i = 0; i < ROUNDS; i++) {
    for (const side of ['ingress', 'direct']) {
      const c = daemonCpuMs();
      const t = process.hrtime.bigint();
      const r = await get(side === 'ingress' ? viaIngress : direct, `/bytes/${MB * 1024 * 1024}`, agents[side]);
      if (side === 'ingress') relayCpu.push((daemonCpuMs() - c) / MB);
      if (r.bytes !== MB * 1024 * 1024) throw new Error(`${side}: ${r.bytes} bytes`);
      tput[side].push((MB * 1000) / ms(t));
    }
  }

  // 3b. The same with curl as the client (it resolves *.localhost to loopback itself).
  const curl = (url, headers = []) => Number(execFileSync('curl', ['-s', '-f', '-o', '/dev/null', '-w', '%{speed_download}', ...headers, url], { encoding: 'utf8' })) / 1e6;
  const tputCurl = { ingress: [], direct: [] };
  for (let i = 0; i < ROUNDS; i++) {
    const c = daemonCpuMs();
    tputCurl.ingress.push(curl(`${p.url}bytes/${MB * 1024 * 1024}`, ['-H', `x-space-access-token: ${p.token}`]));
    relayCpu.push((daemonCpuMs() - c) / MB);
    tputCurl.direct.push(curl(`http://${direct.host}:8080/bytes/${MB * 1024 * 1024}`));
  }

  // 3c. The ingress's own relay, no sandbox: the same download from a host process, through the
  //     ingress (a process of its own, as in the daemon) and straight. Where this ratio is high
  //     and the sandbox's is not, the sandbox's leg and the host's 2 cores are what limit it.
  const child = async (args, env = {}) => {
    const p = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'], env: { ...process.env, ...env } });
    const [line] = await once(p.stdout, 'data');
    return { p, port: Number(String(line).trim()) };
  };
  const upstream = await child(['-e', await streamsServerProgram()], { STREAMS_PORT: '0', STREAMS_HOST: '127.0.0.1' });
  const relay = await child([new URL('./ingress-host-relay.mjs', import.meta.url).pathname, String(upstream.port)]);
  const hostOnly = { ingress: [], direct: [] };
  const hostAgents = { ingress: new http.Agent({ keepAlive: true, maxSockets: 1 }), direct: new http.Agent({ keepAlive: true, maxSockets: 1 }) };
  const hostTo = { ingress: { host: '127.0.0.1', port: relay.port, headers: { host: `8080-sb0123456789abcdefgh.localhost:${relay.port}`, 'x-space-access-token': 'bench' } }, direct: { host: '127.0.0.1', port: upstream.port, headers: { host: `127.0.0.1:${upstream.port}` } } };
  try {
    for (let i = 0; i < ROUNDS; i++) {
      for (const side of ['ingress', 'direct']) {
        const t = process.hrtime.bigint();
        const r = await get(hostTo[side], `/bytes/${MB * 1024 * 1024}`, hostAgents[side]);
        if (r.bytes !== MB * 1024 * 1024) throw new Error(`host-only ${side}: ${r.status}, ${r.bytes} bytes`);
        hostOnly[side].push((MB * 1000) / ms(t));
      }
    }
  } finally {
    for (const a of Object.values(hostAgents)) a.destroy();
    upstream.p.kill();
    relay.p.kill();
  }

  // 4. WebSocket round trips: one message out, its echo back, N times on one connection each.
  const open = (url, headers) =>
    new Promise((resolve, reject) => {
      const ws = new WebSocket(url, { headers });
      ws.once('open', () => resolve(ws));
      ws.once('error', reject);
    });
  const sockets = {
    ingress: await open(`ws://127.0.0.1:${ingressPort}/ws`, viaIngress.headers),
    direct: await open(`ws://${direct.host}:8080/ws`, {}),
  };
  const rtt = { ingress: [], direct: [] };
  for (let i = 0; i < N + 10; i++) {
    for (const side of ['ingress', 'direct']) {
      const ws = sockets[side];
      const t = process.hrtime.bigint();
      ws.send(`m${i}`);
      await new Promise((r) => ws.once('message', r));
      if (i >= 10) rtt[side].push(ms(t));
    }
  }
  for (const ws of Object.values(sockets)) ws.close();
  for (const a of Object.values(agents)) a.destroy();

  const f = (x, d = 2) => x.toFixed(d);
  const med = (xs) => quantile(xs, 50);
  const lines = [
    '| what | through the ingress | direct to the sandbox | ratio |',
    '|---|---|---|---|',
    `| small request, p50 ms | ${f(med(lat.ingress))} | ${f(med(lat.direct))} | ${f(med(lat.ingress) / med(lat.direct))}x |`,
    `| small request, p95 ms | ${f(quantile(lat.ingress, 95))} | ${f(quantile(lat.direct, 95))} | ${f(quantile(lat.ingress, 95) / quantile(lat.direct, 95))}x |`,
    `| ${MB} MB download with node's http client, MB/s (median of ${ROUNDS}) | ${f(med(tput.ingress), 0)} | ${f(med(tput.direct), 0)} | ${f(med(tput.ingress) / med(tput.direct))}x |`,
    `| ${MB} MB download, node's client, from a host process instead of the sandbox (the ingress's own relay), MB/s (median of ${ROUNDS}) | ${f(med(hostOnly.ingress), 0)} | ${f(med(hostOnly.direct), 0)} | ${f(med(hostOnly.ingress) / med(hostOnly.direct))}x |`,
    `| ${MB} MB download with curl, MB/s (median of ${ROUNDS}) | ${f(med(tputCurl.ingress), 0)} | ${f(med(tputCurl.direct), 0)} | ${f(med(tputCurl.ingress) / med(tputCurl.direct))}x |`,
    `| ${MB} MB download, node's client and curl: slowest–fastest single download, MB/s | ${f(Math.min(...tput.ingress, ...tputCurl.ingress), 0)}–${f(Math.max(...tput.ingress, ...tputCurl.ingress), 0)} | ${f(Math.min(...tput.direct, ...tputCurl.direct), 0)}–${f(Math.max(...tput.direct, ...tputCurl.direct), 0)} |  |`,
    `| the daemon's CPU per MB relayed (all threads, user + system; median of ${relayCpu.length} downloads), ms | ${f(med(relayCpu))} |  |  |`,
    `| WebSocket round trip, p50 ms | ${f(med(rtt.ingress))} | ${f(med(rtt.direct))} | ${f(med(rtt.ingress) / med(rtt.direct))}x |`,
    `| WebSocket round trip, p95 ms | ${f(quantile(rtt.ingress, 95))} | ${f(quantile(rtt.direct, 95))} | ${f(quantile(rtt.ingress, 95) / quantile(rtt.direct, 95))}x |`,
    '',
    '| hibernated sandbox (template base, `python3 -m http.server` inside) | median ms | runs |',
    '|---|---|---|',
    ...wakeCases.map(([name], j) => `| ${name} | ${f(med(wakeTimes[j]), 0)} | ${wakeTimes[j].map((x) => f(x, 0)).join(', ')} |`),
  ];
  const table = lines.join('\n');
  console.log(table);
  if (values.write) writeSection('ingress', 'Ingress', `Measured with \`node scripts/bench-ingress.mjs --iterations ${N} --wakes ${WAKES} --write\` (part of \`./space bench\`): one \`base\` sandbox running a Node server (test/streams-server.mjs) on port 8080, exposed privately, and for the wakes a second one running \`python3 -m http.server\` with \`autoResume\`; each measurement alternates the ingress (\`PORT-ID.localhost:PORT\`, with the token) and a direct connection from the host to the sandbox's address. Node's clients keep their connection alive, curl opens one per download; the ingress opens one connection to the sandbox per request and ends it with a reset (docs/ingress.md). The daemon's CPU per MB relayed is read from /proc (all its threads, user and system); single downloads swing from ~40 to ~400 MB/s on either path with the host mostly idle in the slow ones, so the slowest and fastest are printed beside the medians (docs/ingress.md, \"Throughput\").\n\n${table}`);
} finally {
  await stopSpaced(spaced);
  // With disks (the default) the pool stays mounted after the daemon: removeDataDir unmounts it.
  removeDataDir(dataDir);
}
