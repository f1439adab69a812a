// The ingress listener (@space/ingress) against real servers on loopback: host routing, tokens,
// signed links and their cookie, what the sandbox never sees, streams, large bodies, WebSockets,
// limits and the same 404 for everything unknown. The backend here is a table; the daemon's
// (exposures, wake on request, the sandbox's address) is tested with real sandboxes.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { after, before, describe, it } from 'node:test';
import { WebSocket, WebSocketServer } from 'ws';
import { IngressServer, hashToken, localNamesResolve, makePass } from '../packages/ingress/dist/index.js';

const DOMAIN = 'localhost:7072';
const A = 'sbaaaaaaaaaaaaaaaaaa';
const B = 'sbbbbbbbbbbbbbbbbbbb';
const secret = randomBytes(32);

/** A request to the ingress at `port` with Host `host`; resolves to { status, headers, body }. */
function request(port, { host, path = '/', method = 'GET', headers = {}, body } = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, path, method, headers: { host, ...headers }, setHost: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end(body);
  });
}
const json = (r) => JSON.parse(r.body.toString());

describe('ingress listener', () => {
  let upstream, wss, ingress, port, upPort, seen, logs, tokenA, tokenB, sse;
  const routes = new Map();
  const host = (id, p = upPort) => `${p}-${id}.${DOMAIN}`;

  before(async () => {
    seen = [];
    logs = [];
    // The "sandbox": echoes what it got, serves bytes and an event stream, hashes uploads.
    upstream = http.createServer((req, res) => {
      seen.push({ url: req.url, headers: req.headers });
      if (req.url === '/events') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: first\n\n');
        sse = () => res.end('data: last\n\n');
        return;
      }
      const m = /^\/bytes\/(\d+)$/.exec(req.url);
      if (m) {
        let left = Number(m[1]);
        res.writeHead(200, { 'content-length': left });
        const chunk = Buffer.alloc(64 * 1024, 9);
        const pump = () => {
          while (left > 0) {
            const n = Math.min(left, chunk.length);
            left -= n;
            if (!res.write(n === chunk.length ? chunk : chunk.subarray(0, n))) return res.once('drain', pump);
          }
          res.end();
        };
        return pump();
      }
      const h = createHash('sha256');
      let size = 0;
      req.on('data', (c) => (h.update(c), (size += c.length)));
      req.on('end', () => res.end(JSON.stringify({ method: req.method, url: req.url, headers: req.headers, size, sha256: h.digest('hex') })));
    });
    wss = new WebSocketServer({ server: upstream });
    wss.on('connection', (ws) => ws.on('message', (m, binary) => ws.send(m, { binary })));
    await new Promise((r) => upstream.listen(0, '127.0.0.1', r));
    upPort = upstream.address().port;
    // Tokens as core issues them (sandboxes/ports.ts); the ingress only compares their hashes.
    [tokenA, tokenB] = [0, 1].map(() => `sat_${randomBytes(32).toString('base64url')}`);
    routes.set(`${A}:${upPort}`, { sandboxId: A, tenantId: 't1', port: upPort, public: false, tokenHash: hashToken(tokenA) });
    routes.set(`${B}:${upPort}`, { sandboxId: B, tenantId: 't1', port: upPort, public: true, tokenHash: hashToken(tokenB) });
    ingress = new IngressServer({
      domain: DOMAIN,
      secret,
      headersTimeoutMs: 2000,
      backend: { route: async (id, p) => routes.get(`${id}:${p}`), connect: async () => '127.0.0.1', log: (e) => logs.push(e) },
    });
    ({ port } = await ingress.listen('127.0.0.1', 0));
  });
  after(async () => {
    await ingress.close();
    wss.close();
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  });

  it('a public port answers anyone; the Host is kept and X-Forwarded-* are added', async () => {
    const r = await request(port, { host: host(B), path: '/hello?x=1' });
    assert.equal(r.status, 200);
    const got = json(r);
    assert.equal(got.url, '/hello?x=1');
    assert.equal(got.headers.host, host(B));
    assert.equal(got.headers['x-forwarded-for'], '127.0.0.1');
    assert.equal(got.headers['x-forwarded-proto'], 'http');
    // The ingress is the edge: what a client claims in forwarding headers is replaced, not passed on.
    const spoof = json(await request(port, { host: host(B), headers: { 'x-forwarded-for': '10.9.9.9', 'x-forwarded-host': 'evil.example', 'x-forwarded-proto': 'https', forwarded: 'for=10.9.9.9', 'x-real-ip': '10.9.9.9' } }));
    assert.deepEqual([spoof.headers['x-forwarded-for'], spoof.headers['x-forwarded-host'], spoof.headers['x-forwarded-proto'], spoof.headers.forwarded, spoof.headers['x-real-ip']], ['127.0.0.1', host(B), 'http', undefined, undefined]);
  });

  it('with the default domain (localhost:PORT) a program reaches the URL as given: *.localhost resolves through the system (the set-up installs nss-myhostname)', async () => {
    // What an agent does with `getHost(port)`: Node's fetch, which asks glibc, not its own resolver.
    const local = new IngressServer({ domain: '', secret, backend: { route: async (id, p) => routes.get(`${id}:${p}`), connect: async () => '127.0.0.1' } });
    const { port: p } = await local.listen('127.0.0.1', 0);
    local.domain = `localhost:${p}`;
    try {
      assert.equal(await localNamesResolve(local.domain), true, 'install libnss-myhostname (./space does): glibc does not resolve *.localhost without it');
      const r = await fetch(`http://${upPort}-${B}.localhost:${p}/hi`);
      assert.equal(r.status, 200);
      assert.equal((await r.json()).headers.host, `${upPort}-${B}.localhost:${p}`);
    } finally {
      await local.close();
    }
    assert.equal(await localNamesResolve('example.invalid'), true, 'a domain outside localhost is not checked');
  });

  it('a private port: no token 401, a wrong token 401, another sandbox\'s token 401, its own 200 — and the sandbox never sees it', async () => {
    const none = await request(port, { host: host(A) });
    assert.equal(none.status, 401);
    assert.equal(json(none).error.code, 'INGRESS_UNAUTHENTICATED');
    assert.equal((await request(port, { host: host(A), headers: { 'x-space-access-token': 'sat_nope' } })).status, 401);
    assert.equal((await request(port, { host: host(A), headers: { 'x-space-access-token': tokenB } })).status, 401);
    const ok = await request(port, { host: host(A), headers: { 'x-space-access-token': tokenA } });
    assert.equal(ok.status, 200);
    assert.equal(json(ok).headers['x-space-access-token'], undefined);
    const e2b = await request(port, { host: host(A), headers: { 'e2b-traffic-access-token': tokenA } });
    assert.equal(e2b.status, 200, 'E2B\'s header name works too');
    assert.equal(json(e2b).headers['e2b-traffic-access-token'], undefined);
  });

  it('a signed link sets an HttpOnly cookie for the host and redirects; the cookie lets a browser in and is not forwarded', async () => {
    const route = routes.get(`${A}:${upPort}`);
    const pass = makePass(secret, route, Math.floor(Date.now() / 1000) + 600);
    const link = await request(port, { host: host(A), path: `/.space/auth?pass=${pass}&next=/app/page` });
    assert.equal(link.status, 302);
    assert.equal(link.headers.location, '/app/page');
    const cookie = link.headers['set-cookie'][0];
    assert.match(cookie, /^space_ingress=\d+\.[\w-]+; Max-Age=\d+; Path=\/; HttpOnly; SameSite=Lax$/);
    const jar = `theme=dark; ${cookie.split(';')[0]}`;
    const page = await request(port, { host: host(A), path: '/app/page', headers: { cookie: jar } });
    assert.equal(page.status, 200);
    assert.equal(json(page).headers.cookie, 'theme=dark', 'the pass is stripped, other cookies pass');
    // The same pass on another sandbox's host, an open redirect, an expired pass, a pass after the token changed.
    assert.equal((await request(port, { host: host(A), path: '/', headers: { cookie: `space_ingress=${makePass(secret, routes.get(`${B}:${upPort}`), Math.floor(Date.now() / 1000) + 600)}` } })).status, 401);
    assert.equal((await request(port, { host: host(A), path: `/.space/auth?pass=${pass}&next=//evil.example/` })).headers.location, '/');
    assert.equal((await request(port, { host: host(A), path: `/.space/auth?pass=${makePass(secret, route, Math.floor(Date.now() / 1000) - 1)}` })).status, 401);
    const rotated = { ...route, tokenHash: hashToken('sat_new') };
    routes.set(`${A}:${upPort}`, rotated);
    try {
      assert.equal((await request(port, { host: host(A), headers: { cookie: jar } })).status, 401, 'a new token ends old passes');
    } finally {
      routes.set(`${A}:${upPort}`, route);
    }
  });

  it('unknown hosts, sandboxes and ports get the same 404; absolute URLs and duplicate Hosts are refused', async () => {
    const bodies = [];
    for (const h of ['example.com', `${upPort}-sbcccccccccccccccccc.${DOMAIN}`, `1-${A}.${DOMAIN}`, `99999-${A}.${DOMAIN}`, `${upPort}-${A}.other.example`]) {
      const r = await request(port, { host: h });
      assert.equal(r.status, 404, h);
      bodies.push(r.body.toString());
    }
    assert.equal(new Set(bodies).size, 1, 'no existence oracle');
    assert.equal((await request(port, { host: host(B), path: `http://127.0.0.1:${upPort}/` })).status, 400);
    const dup = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => s.write(`GET / HTTP/1.1\r\nHost: ${host(B)}\r\nHost: ${host(A)}\r\n\r\n`));
      s.once('data', (d) => (resolve(d.toString().split(' ')[1]), s.destroy()));
    });
    assert.equal(dup, '400');
  });

  it('nothing listening inside answers 502 with a page for browsers', async () => {
    const closed = await new Promise((r) => {
      const s = net.createServer().listen(0, '127.0.0.1', () => {
        const p = s.address().port;
        s.close(() => r(p));
      });
    });
    routes.set(`${B}:${closed}`, { sandboxId: B, tenantId: 't1', port: closed, public: true, tokenHash: hashToken('x') });
    const r = await request(port, { host: host(B, closed), headers: { accept: 'text/html' } });
    assert.equal(r.status, 502);
    assert.match(r.body.toString(), /INGRESS_UPSTREAM_FAILED/);
    assert.match(r.headers['content-type'], /text\/html/);
  });

  it('an event stream arrives as it is written (the first event before the server ends it)', async () => {
    await new Promise((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port, path: '/events', headers: { host: host(B) }, setHost: false }, (res) => {
        let text = '';
        res.on('data', (d) => {
          text += d;
          if (text === 'data: first\n\n') sse(); // the server ends only once the first event is here
        });
        res.on('end', () => (text === 'data: first\n\ndata: last\n\n' ? resolve() : reject(new Error(text))));
      });
      req.on('error', reject);
      req.end();
    });
  });

  it('large bodies both ways match byte for byte', async () => {
    const up = randomBytes(32 * 1024 * 1024);
    const r = await request(port, { host: host(B), method: 'POST', path: '/upload', body: up, headers: { 'content-type': 'application/octet-stream' } });
    assert.equal(json(r).size, up.length);
    assert.equal(json(r).sha256, createHash('sha256').update(up).digest('hex'));
    const down = await request(port, { host: host(B), path: `/bytes/${64 * 1024 * 1024}` });
    assert.equal(down.body.length, 64 * 1024 * 1024);
  });

  it('a WebSocket echoes 1,000 messages through it; a private one needs the token', async () => {
    await assert.rejects(
      new Promise((resolve, reject) => {
        const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`, { headers: { host: host(A) } });
        ws.on('open', resolve);
        ws.on('error', reject);
      }),
      /401/,
    );
    const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`, { headers: { host: host(A), 'x-space-access-token': tokenA } });
    await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
    let got = 0;
    const done = new Promise((r) => ws.on('message', (m) => (assert.equal(m.toString(), `m${got}`), ++got === 1000 && r())));
    for (let i = 0; i < 1000; i++) ws.send(`m${i}`);
    await done;
    ws.close();
    await new Promise((r) => ws.once('close', r));
  });

  it('oversized headers get 431; every request that reached a port is in the audit log', async () => {
    const big = await new Promise((resolve) => {
      const s = net.connect(port, '127.0.0.1', () => s.write(`GET / HTTP/1.1\r\nHost: ${host(B)}\r\nX-Big: ${'a'.repeat(20_000)}\r\n\r\n`));
      s.once('data', (d) => (resolve(d.toString().split(' ')[1]), s.destroy()));
    });
    assert.equal(big, '431');
    const entry = logs.find((l) => l.path === '/hello?x=1');
    assert.ok(entry, JSON.stringify(logs.slice(0, 3)));
    assert.equal(entry.access, 'public');
    assert.equal(entry.status, 200);
    // Bytes in count the request line and headers: a GET without a body is not 0.
    assert.ok(entry.bytesIn >= `GET /hello?x=1 HTTP/1.1\r\nhost: ${host(B)}\r\n\r\n`.length && entry.bytesOut > 0, JSON.stringify(entry));
    const upload = logs.find((l) => l.method === 'POST' && l.path === '/upload');
    assert.ok(upload.bytesIn > 32 * 1024 * 1024, 'an upload counts its body');
    assert.ok(logs.some((l) => l.sandboxId === A && l.access === 'token'));
    assert.ok(logs.some((l) => l.sandboxId === A && l.access === 'refused' && l.status === 401), 'refusals of an exposed port are logged');
    assert.ok(!logs.some((l) => l.sandboxId === 'sbcccccccccccccccccc'), 'unknown hosts are not');
    assert.ok(logs.some((l) => l.websocket && l.status === 101));
  });
});

describe('ingress listener: connections per sandbox', () => {
  let upstream, wss, ingress, port, upPort;
  const held = [];
  const routes = new Map();
  const host = (id) => `${upPort}-${id}.${DOMAIN}`;
  /** Resolves once the "sandbox" holds `n` requests open. */
  const holding = async (n) => {
    while (held.length < n) await new Promise((r) => setImmediate(r));
  };

  before(async () => {
    // The "sandbox": /hold answers only when the test lets it; anything else at once.
    upstream = http.createServer((req, res) => {
      if (req.url === '/hold') held.push(res);
      else res.end('ok');
    });
    wss = new WebSocketServer({ server: upstream });
    wss.on('connection', (ws) => ws.on('message', (m) => ws.send(m)));
    await new Promise((r) => upstream.listen(0, '127.0.0.1', r));
    upPort = upstream.address().port;
    for (const id of [A, B]) routes.set(`${id}:${upPort}`, { sandboxId: id, tenantId: 't1', port: upPort, public: true, tokenHash: hashToken('unused') });
    ingress = new IngressServer({ domain: DOMAIN, secret, maxConnectionsPerSandbox: 2, maxQueuedPerSandbox: 1, backend: { route: async (id, p) => routes.get(`${id}:${p}`), connect: async () => '127.0.0.1' } });
    ({ port } = await ingress.listen('127.0.0.1', 0));
  });
  after(async () => {
    for (const r of held) r.end();
    await ingress.close();
    wss.close();
    upstream.closeAllConnections();
    await new Promise((r) => upstream.close(r));
  });

  it('beyond the cap a request waits its turn, beyond the queue it gets 503 INGRESS_BUSY with Retry-After; other sandboxes are not held up', async () => {
    const first = [request(port, { host: host(A), path: '/hold' }), request(port, { host: host(A), path: '/hold' })];
    await holding(2);
    const waiting = request(port, { host: host(A), path: '/after' });
    while (ingress.slots.usage(A).waiting < 1) await new Promise((r) => setImmediate(r));
    const busy = await request(port, { host: host(A), path: '/more' });
    assert.equal(busy.status, 503);
    assert.equal(busy.headers['retry-after'], '1');
    assert.equal(json(busy).error.code, 'INGRESS_BUSY');
    // A WebSocket to the full sandbox is refused alike; another sandbox answers meanwhile.
    const ws = new WebSocket(`ws://127.0.0.1:${port}/`, { headers: { host: host(A) } });
    const wsStatus = await new Promise((resolve) => ws.on('unexpected-response', (_, res) => resolve(res.statusCode)).on('open', () => resolve(101)).on('error', () => {}));
    assert.equal(wsStatus, 503);
    assert.equal((await request(port, { host: host(B), path: '/' })).status, 200);
    assert.deepEqual(ingress.slots.usage(A), { active: 2, waiting: 1 });
    // One answer frees a connection: the waiting request goes through on it.
    held.shift().end('held');
    assert.equal((await first[0]).status, 200);
    assert.equal((await waiting).status, 200);
    held.shift().end('held');
    assert.equal((await first[1]).status, 200);
    assert.deepEqual(ingress.slots.usage(A), { active: 0, waiting: 0 });
  });

  it('a WebSocket holds a connection while open; a client that leaves while waiting gives its turn up', async () => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/`, { headers: { host: host(A) } });
    await new Promise((r, j) => ws.on('open', r).on('error', j));
    const one = request(port, { host: host(A), path: '/hold' });
    await holding(1);
    assert.deepEqual(ingress.slots.usage(A), { active: 2, waiting: 0 });
    // A client that gives up while queued.
    const gone = http.request({ host: '127.0.0.1', port, path: '/x', headers: { host: host(A) }, setHost: false });
    gone.on('error', () => {});
    gone.end();
    while (ingress.slots.usage(A).waiting < 1) await new Promise((r) => setImmediate(r));
    gone.destroy();
    while (ingress.slots.usage(A).waiting > 0) await new Promise((r) => setTimeout(r, 10));
    ws.close();
    await new Promise((r) => ws.on('close', r));
    while (ingress.slots.usage(A).active > 1) await new Promise((r) => setTimeout(r, 10));
    assert.equal((await request(port, { host: host(A), path: '/' })).status, 200);
    held.shift().end('held');
    assert.equal((await one).status, 200);
    assert.deepEqual(ingress.slots.usage(A), { active: 0, waiting: 0 });
  });

  it('a request that waits past the queue time gets 503 INGRESS_BUSY; bad limits are refused', async () => {
    const short = new IngressServer({ domain: DOMAIN, secret, maxConnectionsPerSandbox: 1, queueTimeoutMs: 50, backend: { route: async (id, p) => routes.get(`${id}:${p}`), connect: async () => '127.0.0.1' } });
    const { port: p2 } = await short.listen('127.0.0.1', 0);
    try {
      const one = request(p2, { host: host(A), path: '/hold' });
      await holding(1);
      const late = await request(p2, { host: host(A), path: '/' });
      assert.equal(late.status, 503);
      assert.equal(json(late).error.code, 'INGRESS_BUSY');
      assert.match(json(late).error.message, /50 ms/);
      held.shift().end('held');
      assert.equal((await one).status, 200);
    } finally {
      await short.close();
    }
    for (const bad of [0, -1, 1.5, Number.NaN]) assert.throws(() => new IngressServer({ domain: DOMAIN, secret, maxConnectionsPerSandbox: bad, backend: {} }), { code: 'CONFIG_INVALID' });
  });
});
