// Ingress end to end on gVisor (and once on a microVM): `python3 -m http.server` in a `base` sandbox, exposed through the
// daemon's ingress — the token, the signed link with curl's cookie jar (the CLI contract), a
// second sandbox's token refused, unexposing, and the lockdown kept: exposing a port opens no way
// out of the sandbox.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { WebSocket } from 'ws';
import { cliRunner, eventually, startTestDaemon } from './helpers.mjs';
import { startStreamsServer } from './streams-server.mjs';

/** A request to the ingress (on loopback) for `url`'s host; resolves to { status, body }. */
function get(ingressPort, url, headers = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: ingressPort, path: u.pathname + u.search, headers: { host: u.host, ...headers }, setHost: false }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

const curl = (args) => new Promise((resolve) => execFile('curl', ['-s', '--max-time', '30', ...args], (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr })));

describe('ingress to a sandbox port (gVisor)', () => {
  let fx, sb, other, ingressPort, tmp, space;

  before(async () => {
    fx = await startTestDaemon();
    ingressPort = Number(new URL(fx.daemon.state.ingressUrl).port);
    tmp = mkdtempSync('/tmp/spt-ingress-');
    space = cliRunner(tmp, { SPACE_URL: fx.url, SPACE_API_KEY: fx.key });
    [sb, other] = await Promise.all([fx.create({ template: 'base' }), fx.create({ template: 'base' })]);
    await sb.commands.run('mkdir -p /tmp/site');
    await sb.files.write('/tmp/site/index.html', 'hello from the sandbox\n');
    await sb.commands.run('cd /tmp/site && python3 -m http.server 8000', { background: true });
    await other.commands.run('cd /tmp && python3 -m http.server 8000', { background: true });
    // Both servers listen before any test starts (each test can run on its own).
    const up = (x) => eventually(async () => (await x.commands.run('python3 -c "import urllib.request as u; u.urlopen(\'http://127.0.0.1:8000/\')"').catch(() => ({ exitCode: 1 }))).exitCode === 0);
    await Promise.all([up(sb), up(other)]);
  });
  after(async () => {
    assert.deepEqual(await fx.close(), []);
    rmSync(tmp, { recursive: true, force: true });
  });

  it('a private port: the token header reaches the server; no token or another sandbox\'s token gets 401', async () => {
    const p = await sb.ports.expose(8000);
    assert.match(p.url, new RegExp(`^http://8000-${sb.id}\\.localhost:${ingressPort}/$`));
    assert.match(p.token, /^sat_/);
    // The server starts in the background: poll until it answers (502 meanwhile).
    const ok = await eventually(async () => {
      const r = await get(ingressPort, p.url, { 'x-space-access-token': p.token });
      return r.status === 200 && r;
    });
    assert.equal(ok.body, 'hello from the sandbox\n');
    const none = await get(ingressPort, p.url);
    assert.equal(none.status, 401);
    assert.equal(JSON.parse(none.body).error.code, 'INGRESS_UNAUTHENTICATED');
    const q = await other.ports.expose(8000);
    assert.equal((await get(ingressPort, p.url, { 'x-space-access-token': q.token })).status, 401, 'a token is for its own sandbox');
    // Its own token reaches it (its server started in the background too: 502 until it listens).
    assert.ok(await eventually(async () => (await get(ingressPort, q.url, { 'x-space-access-token': q.token })).status === 200));
  });

  it('space expose prints a link that curl follows with a cookie jar; the bare origin answers 401', async () => {
    const r = await space('expose', sb.id, '8000');
    assert.equal(r.code, 0, r.stderr);
    const link = r.stdout.split('\n')[0];
    assert.match(link, /\/\.space\/auth\?pass=/);
    const jar = path.join(tmp, 'jar');
    const page = await curl(['-L', '-b', jar, '-c', jar, link]);
    assert.equal(page.code, 0, page.stderr);
    assert.equal(page.stdout, 'hello from the sandbox\n');
    const again = await curl(['-b', jar, '-c', jar, `${new URL(link).origin}/index.html`]);
    assert.equal(again.stdout, 'hello from the sandbox\n', 'the cookie lets later loads in');
    const bare = await curl(['-o', '/dev/null', '-w', '%{http_code}', `${new URL(link).origin}/`]);
    assert.equal(bare.stdout, '401');
    const ls = await space('ports', sb.id);
    assert.match(ls.stdout, /^PORT\s+ACCESS/);
    assert.match(ls.stdout, /8000\s+token/);
    const token = /token:\s+(sat_\S+)/.exec(r.stdout)[1];
    assert.equal((await get(ingressPort, `${new URL(link).origin}/`, { 'x-space-access-token': token })).status, 200);
    // The audit log: the token, the refusal, the link (its pass left out), the pass, newest first.
    const log = JSON.parse((await space('ingress', 'log', sb.id, '--json')).stdout);
    // (Entries are written as requests end: a redirect and the request it leads to may end in either order.)
    const row = (e) => JSON.stringify([e.access, e.status, e.method, e.path]);
    assert.deepEqual(row(log[0]), row({ access: 'token', status: 200, method: 'GET', path: '/' }));
    assert.deepEqual(log.slice(1, 5).map(row).sort(), [
      ['refused', 401, 'GET', '/'],
      ['pass', 200, 'GET', '/index.html'],
      ['pass', 200, 'GET', '/'],
      ['pass', 302, 'GET', '/.space/auth?pass=…&next=/'],
    ].map((r) => JSON.stringify(r)).sort());
    assert.ok(log.every((e) => e.sandboxId === sb.id && e.port === 8000 && e.client === '127.0.0.1'));
    const text = await space('ingress', 'log', sb.id);
    assert.match(text.stdout, /^TIME\s+PORT\s+ACCESS\s+METHOD\s+PATH\s+STATUS/);
  });

  it('unexpose closes it at once: the same 404 as an unknown port', async () => {
    const p = await sb.ports.expose(8000);
    await sb.ports.unexpose(8000);
    const r = await get(ingressPort, p.url, { 'x-space-access-token': p.token });
    assert.equal(r.status, 404);
    assert.equal(JSON.parse(r.body).error.code, 'PORT_NOT_EXPOSED');
    await assert.rejects(sb.ports.unexpose(8000), (e) => e.code === 'PORT_NOT_EXPOSED');
    await assert.rejects(sb.ports.expose(70000), (e) => e.code === 'BAD_REQUEST' || e.code === 'INVALID_PORT');
  });

  it('exposing a port opens no way out: the sandbox still cannot connect to the host', async () => {
    await sb.ports.expose(8000, { public: true });
    let reached = false;
    const listener = net.createServer((s) => ((reached = true), s.destroy()));
    await new Promise((r) => listener.listen(0, '0.0.0.0', r));
    try {
      const port = listener.address().port;
      // The host end of the sandbox's link is its own address minus one (a /30); the sandbox
      // learns its address from a UDP socket "connected" to the proxy (no packet is sent).
      const probe = `import os, socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.connect((os.environ['HTTP_PROXY'].split('//')[1].split(':')[0], 3128))
me = u.getsockname()[0]
host = me.rsplit('.', 1)[0] + '.' + str(int(me.rsplit('.', 1)[1]) - 1)
s = socket.socket()
s.settimeout(3)
try:
    s.connect((host, ${port}))
    print('connected to', host)
except Exception as e:
    print('refused', host, type(e).__name__)
`;
      await sb.files.write('/tmp/probe.py', probe);
      const r = await sb.commands.run('python3 /tmp/probe.py');
      assert.match(r.stdout, /^refused /, r.stdout + r.stderr);
      assert.equal(reached, false, 'nothing reached the host listener');
    } finally {
      listener.close();
    }
  });
});

describe('ingress streams to a real server in a sandbox (gVisor)', () => {
  let fx, sb, p, ingressPort;
  const host = () => new URL(p.url).host;
  before(async () => {
    fx = await startTestDaemon();
    ingressPort = Number(new URL(fx.daemon.state.ingressUrl).port);
    sb = await fx.create({ template: 'base', autoResume: true });
    await startStreamsServer(sb);
    p = await sb.ports.expose(8080);
    await eventually(async () => (await get(ingressPort, p.url, { 'x-space-access-token': p.token })).status === 200);
  });
  after(async () => {
    assert.deepEqual(await fx.close(), []);
  });

  it('a WebSocket echoes 1,000 messages; without the token it is refused', async () => {
    const open = (headers) =>
      new Promise((resolve, reject) => {
        const ws = new WebSocket(`ws://127.0.0.1:${ingressPort}/ws`, { headers: { host: host(), ...headers } });
        ws.once('open', () => resolve(ws));
        ws.once('error', reject);
      });
    await assert.rejects(open({}), /401/);
    const ws = await open({ 'x-space-access-token': p.token });
    let got = 0;
    const done = new Promise((resolve, reject) =>
      ws.on('message', (m) => {
        if (m.toString() !== `m${got}`) reject(new Error(`message ${got} came back as ${m}`));
        if (++got === 1000) resolve();
      }),
    );
    for (let i = 0; i < 1000; i++) ws.send(`m${i}`);
    await done;
    ws.close();
    await new Promise((r) => ws.once('close', r));
  });

  it('an event stream arrives as it is written: the first event before the server ends it', async () => {
    await new Promise((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port: ingressPort, path: '/events', headers: { host: host(), 'x-space-access-token': p.token }, setHost: false }, (res) => {
        let text = '';
        res.on('data', (d) => {
          text += d;
          // The server ends the stream only when asked, and this asks only once the first event is here.
          if (text === 'data: first\n\n') get(ingressPort, `${p.url}release`, { 'x-space-access-token': p.token }).catch(reject);
        });
        res.on('end', () => (text === 'data: first\n\ndata: last\n\n' ? resolve() : reject(new Error(text))));
      });
      req.on('error', reject);
      req.end();
    });
  });

  it('the signed link\'s cookie lets a WebSocket in without the token', async () => {
    const link = await get(ingressPort, p.signedUrl);
    assert.equal(link.status, 302);
    const cookie = link.headers['set-cookie'][0].split(';')[0];
    const ws = new WebSocket(`ws://127.0.0.1:${ingressPort}/ws`, { headers: { host: host(), cookie } });
    await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
    ws.send('with a cookie');
    assert.equal(String(await new Promise((r) => ws.once('message', r))), 'with a cookie');
    ws.close();
    await new Promise((r) => ws.once('close', r));
  });

  it('100 MB up and back down match by SHA-256', async () => {
    const size = 100 * 1024 * 1024;
    const up = randomBytes(size);
    const sha = createHash('sha256').update(up).digest('hex');
    const send = await new Promise((resolve, reject) => {
      const req = http.request({ host: '127.0.0.1', port: ingressPort, method: 'POST', path: '/upload', headers: { host: host(), 'x-space-access-token': p.token, 'content-length': size }, setHost: false }, (res) => {
        let body = '';
        res.on('data', (d) => (body += d));
        res.on('end', () => resolve(JSON.parse(body)));
      });
      req.on('error', reject);
      req.end(up);
    });
    assert.deepEqual(send, { size, sha256: sha });
    const down = await new Promise((resolve, reject) => {
      const h = createHash('sha256');
      let n = 0;
      http
        .get({ host: '127.0.0.1', port: ingressPort, path: '/download', headers: { host: host(), 'x-space-access-token': p.token }, setHost: false }, (res) => {
          res.on('data', (d) => (h.update(d), (n += d.length)));
          res.on('end', () => resolve({ n, sha: h.digest('hex') }));
        })
        .on('error', reject);
    });
    assert.deepEqual(down, { n: size, sha });
  });

  it('a burst of 1,000 requests at the paused sandbox (autoResume) resumes it once; all are answered and the daemon stays responsive', async () => {
    await sb.pause();
    assert.equal((await sb.refresh()).state, 'paused');
    const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
    const one = () =>
      new Promise((resolve, reject) => {
        http
          .get({ agent, host: '127.0.0.1', port: ingressPort, path: '/', headers: { host: host(), 'x-space-access-token': p.token }, setHost: false }, (res) => {
            let body = '';
            res.on('data', (d) => (body += d));
            res.on('end', () => resolve(`${res.statusCode} ${body}`));
          })
          .on('error', reject);
      });
    const answers = await Promise.all(Array.from({ length: 1000 }, one));
    const counts = {};
    for (const a of answers) counts[a] = (counts[a] ?? 0) + 1;
    assert.deepEqual(counts, { '200 streams server': 1000 });
    assert.equal((await sb.events()).filter((e) => e.type === 'resumed').length, 1, 'resumed once');
    assert.equal((await sb.refresh()).state, 'running');
    assert.equal((await fx.create({ template: 'minimal' }).then((x) => x.kill().then(() => 'ok'))), 'ok', 'the daemon still creates sandboxes');
  });
});

describe('ingress to a sandbox port (microVM)', () => {
  let fx, ingressPort;
  before(async () => {
    fx = await startTestDaemon({ driver: 'microvm', microvm: { cacheDir: process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm' } });
    ingressPort = Number(new URL(fx.daemon.state.ingressUrl).port);
  });
  after(async () => {
    assert.deepEqual(await fx.close(), []);
  });

  it('the same link rules reach a server in the guest (busybox httpd), with the token only', async () => {
    const sb = await fx.create({ memoryMb: 192 });
    await sb.commands.run('mkdir -p /tmp/www && echo hello from the guest > /tmp/www/index.html');
    await sb.commands.run('busybox httpd -f -p 8000 -h /tmp/www', { background: true });
    const p = await sb.ports.expose(8000);
    const ok = await eventually(async () => {
      const r = await get(ingressPort, p.url, { 'x-space-access-token': p.token });
      return r.status === 200 && r;
    });
    assert.equal(ok.body, 'hello from the guest\n');
    assert.equal((await get(ingressPort, p.url)).status, 401);
  });
});

describe('ingress wakes a sandbox on request (autoResume)', () => {
  let fx, ingressPort;
  before(async () => {
    fx = await startTestDaemon();
    ingressPort = Number(new URL(fx.daemon.state.ingressUrl).port);
  });
  after(async () => {
    assert.deepEqual(await fx.close(), []);
  });

  it('hibernated with autoResume: 50 concurrent first requests wake it once and all get the server\'s state; without autoResume 409', async () => {
    const sb = await fx.create({ template: 'base', autoResume: true });
    // A server whose answer is state in memory: it counts the requests it served.
    await sb.files.write('/tmp/count.py', `import http.server
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global n
        n += 1
        body = f"{n}\\n".encode()
        self.send_response(200); self.send_header('content-length', str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
`);
    await sb.commands.run('python3 /tmp/count.py', { background: true });
    const p = await sb.ports.expose(8000);
    const h = { 'x-space-access-token': p.token };
    await eventually(async () => (await get(ingressPort, p.url, h)).status === 200);
    await sb.hibernate();
    assert.equal((await sb.refresh()).state, 'hibernated');
    const answers = await Promise.all(Array.from({ length: 50 }, () => get(ingressPort, p.url, h)));
    assert.deepEqual([...new Set(answers.map((a) => a.status))], [200]);
    const counts = answers.map((a) => Number(a.body)).sort((x, y) => x - y);
    assert.ok(counts[0] >= 2, `the server's memory survived (counts from ${counts[0]})`);
    assert.equal(new Set(counts).size, 50, 'one server answered all 50');
    assert.equal((await sb.events()).filter((e) => e.type === 'woken').length, 1, 'woken once');

    const plain = await fx.create({ template: 'minimal' });
    const q = await plain.ports.expose(8000);
    await plain.pause();
    const r = await get(ingressPort, q.url, { 'x-space-access-token': q.token });
    assert.equal(r.status, 409);
    assert.match(JSON.parse(r.body).error.message, /paused: `space resume/);
  });
});
