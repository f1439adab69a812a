// Credential brokering and egress control, end to end: real runsc sandboxes on their veth,
// the real proxy, a real HTTPS server on loopback with a CA of its own. The sandbox holds only
// placeholders; the server must receive the values; nothing but the proxy is reachable.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { Sandbox, Secrets } from '../packages/sdk/dist/index.js';
import { RUNTIME } from '../packages/core/dist/index.js';
import { api, cliRunner, eventually, startTestDaemon } from './helpers.mjs';
import { snapshotContents } from './statefile.mjs';
import { startUpstream } from './tls-server.mjs';

const VALUE = `sk-live-${'7f3a9c'.repeat(6)}`;
const HEADER_VALUE = `ghp_${'Q8w2Zr'.repeat(6)}`;
const NODE = `${RUNTIME.loader} --library-path ${RUNTIME.libDir} ${RUNTIME.node}`;

/** Runs a shell line in the sandbox; resolves to { exitCode, stdout, stderr }. */
const sh = (sb, cmd) => sb.commands.run(cmd, { timeoutMs: 60_000 });

describe('egress: secrets injected by the proxy, nothing else reachable', () => {
  let fx;
  let up;
  let e2bUp;
  let tmp;
  let sb;
  let opts;
  const hostListener = net.createServer((s) => s.end('host service\n'));

  before(async () => {
    up = await startUpstream(['api.example.test', 'other.example.test', 'rebind.example.test']);
    // E2B's network rules carry no ports: SPACE opens 80 and 443 for them, so this one listens there.
    e2bUp = await startUpstream(['e2b-allowed.example.test', 'e2b-other.example.test'], { address: '127.0.0.2', httpsPort: 443, httpPort: 80 });
    tmp = mkdtempSync('/tmp/spt-egress-');
    writeFileSync(path.join(tmp, 'upstream-ca.pem'), up.caPem + e2bUp.caPem);
    await new Promise((r) => hostListener.listen(0, '0.0.0.0', r));
    fx = await startTestDaemon({
      egress: { upstreamCaFile: path.join(tmp, 'upstream-ca.pem'), hosts: { 'api.example.test': '127.0.0.1', 'other.example.test': '127.0.0.1', 'rebind.example.test': '127.0.0.2', 'denied.example.test': '127.0.0.1', 'e2b-allowed.example.test': '127.0.0.2', 'e2b-other.example.test': '127.0.0.2' } },
    });
    opts = fx.conn;
    await Secrets.set('API_TOKEN', { ...opts, value: VALUE, hosts: ['api.example.test'] });
    await Secrets.set('GH_TOKEN', { ...opts, value: HEADER_VALUE, hosts: ['api.example.test'], header: 'Authorization', format: 'Bearer {value}' });
    sb = await fx.create({
      template: 'base',
      memoryMb: 512,
      secrets: ['API_TOKEN', 'GH_TOKEN'],
      egress: { domains: ['api.example.test', 'other.example.test', 'rebind.example.test', '*.wild.test'], cidrs: ['127.0.0.1/32'], ports: [up.httpsPort, up.httpPort] },
    });
  });
  after(async () => {
    hostListener.close();
    await up?.close();
    await e2bUp?.close();
    if (tmp) rmSync(tmp, { recursive: true, force: true });
    if (fx) assert.deepEqual(await fx.close(), []);
  });

  it('secrets are write-only and bad input is refused with clear codes, changing nothing', async () => {
    const listed = await Secrets.list(opts);
    assert.deepEqual(listed.map((s) => s.name), ['API_TOKEN', 'GH_TOKEN']);
    assert.ok(!JSON.stringify(listed).includes(VALUE) && !JSON.stringify(await Secrets.get('GH_TOKEN', opts)).includes(HEADER_VALUE), 'values are never returned');
    const bad = async (name, body, code) => {
      const r = await api(fx, 'PUT', `/v1/secrets/${name}`, { json: body });
      assert.equal(r.body.error?.code, code, JSON.stringify(r.body));
    };
    await bad('NO_HOSTS', { value: 'x', hosts: [] }, 'SECRET_INVALID');
    await bad('BAD_HOST', { value: 'x', hosts: ['http://x'] }, 'SECRET_INVALID');
    await bad('PATH', { value: 'x', hosts: ['a.example'] }, 'SECRET_INVALID');
    await bad('CRLF', { value: 'a\r\nX-Evil: 1', hosts: ['a.example'] }, 'SECRET_INVALID');
    await bad('FMT', { value: 'x', hosts: ['a.example'], header: 'Authorization', format: 'Bearer' }, 'SECRET_INVALID');
    assert.equal((await Secrets.list(opts)).length, 2);
    const before = (await Sandbox.list({ ...opts, limit: 1000 })).items.length;
    const r = await api(fx, 'POST', '/v1/sandboxes', { json: { template: 'base', secrets: ['NOPE'] } });
    assert.equal(r.body.error?.code, 'SECRET_NOT_FOUND');
    const p = await api(fx, 'POST', '/v1/sandboxes', { json: { template: 'base', egress: { cidrs: ['10.0.0.0/33'] } } });
    assert.equal(p.body.error?.code, 'EGRESS_POLICY_INVALID');
    const w = await api(fx, 'POST', '/v1/sandboxes', { json: { template: 'base', egress: { domains: ['*.com'] } } });
    assert.equal(w.body.error?.code, 'EGRESS_POLICY_INVALID');
    assert.equal((await Sandbox.list({ ...opts, limit: 1000 })).items.length, before, 'no sandbox was made');
  });

  it('curl, python3 and node send placeholders; the server gets the values; env and a memory snapshot hold none of them', async () => {
    const env = await sh(sb, 'env');
    const ph = sb.info.secrets.find((a) => a.name === 'API_TOKEN').placeholder;
    assert.match(env.stdout, new RegExp(`^API_TOKEN=${ph}$`, 'm'));
    assert.match(env.stdout, /^HTTPS_PROXY=http:\/\/[\d.]+:3128$/m);
    assert.ok(!env.stdout.includes(VALUE) && !env.stdout.includes(HEADER_VALUE));

    const url = `https://api.example.test:${up.httpsPort}`;
    const curl = await sh(sb, `curl -sS -f ${url}/curl -H "X-Api-Key: $API_TOKEN"`);
    assert.equal(curl.exitCode, 0, curl.stderr);
    const py = await sh(sb, `python3 -c "import os,urllib.request as u; print(u.urlopen(u.Request('${url}/python', headers={'X-Api-Key': os.environ['API_TOKEN']})).status)"`);
    assert.equal(py.stdout.trim(), '200', py.stderr);
    // Node 20 does not read HTTPS_PROXY (22.21+ does, with NODE_USE_ENV_PROXY): tunnel by hand; trust comes from NODE_EXTRA_CA_CERTS.
    const js = `const http=require('http'),https=require('https'),tls=require('tls');const p=new URL(process.env.HTTPS_PROXY);
http.request({host:p.hostname,port:p.port,method:'CONNECT',path:'api.example.test:${up.httpsPort}'}).on('connect',(res,socket)=>{
https.get({host:'api.example.test',port:${up.httpsPort},path:'/node',headers:{'x-api-key':process.env.API_TOKEN},createConnection:()=>tls.connect({socket,servername:'api.example.test'})},(r)=>{console.log(r.statusCode);r.resume();r.on('end',()=>process.exit(0))});}).end();`;
    await sb.files.write('/tmp/req.js', js);
    const node = await sh(sb, `${NODE} /tmp/req.js`);
    assert.equal(node.stdout.trim(), '200', node.stderr);

    // `GET https://…` sent to the proxy as a plain request (busybox wget does this): TLS upstream from the proxy.
    const absolute = `import socket,os
p=os.environ['HTTP_PROXY'].split('//')[1].rstrip('/').split(':')
s=socket.create_connection((p[0],int(p[1])),timeout=10)
s.sendall(('GET ${url}/absolute HTTP/1.1\\r\\nHost: api.example.test:${up.httpsPort}\\r\\nX-Api-Key: %s\\r\\nConnection: close\\r\\n\\r\\n' % os.environ['API_TOKEN']).encode())
print(s.recv(4096).split(b'\\r\\n')[0].decode())`;
    await sb.files.write('/tmp/absolute.py', absolute);
    assert.equal((await sh(sb, 'python3 /tmp/absolute.py')).stdout.trim(), 'HTTP/1.1 200 OK');

    for (const p of ['/curl', '/python', '/node', '/absolute']) {
      const got = up.seen.find((r) => r.url === p);
      assert.ok(got, `the server got ${p}`);
      assert.equal(got.headers['x-api-key'], VALUE, `${p}: the placeholder was replaced by the value`);
      assert.equal(got.headers.authorization, `Bearer ${HEADER_VALUE}`, `${p}: the header secret was set`);
    }

    // A process keeps the placeholder in memory; the snapshot must show it (so the scan works) and no value.
    await sb.commands.run('exec python3 -c "import os,time; t=os.environ[\'API_TOKEN\']*3; time.sleep(100000)"', { background: true });
    const snap = await sb.snapshot({ name: 'scan' });
    const image = await snapshotContents(fx.dataDir, snap.id);
    assert.ok(image.length > 1 << 20);
    assert.ok(image.includes(Buffer.from(ph)), 'the placeholder is in the snapshot (the scan can find strings)');
    assert.equal(image.indexOf(Buffer.from(VALUE)), -1, 'the secret value is not in the memory snapshot');
    assert.equal(image.indexOf(Buffer.from(HEADER_VALUE)), -1, 'the header secret is not in the memory snapshot');
  });

  it('a placeholder sent to another host is blocked and audited; the value is not sent', async () => {
    const n = up.seen.length;
    const r = await sh(sb, `curl -sS -o /dev/null -w '%{http_code}' https://other.example.test:${up.httpsPort}/leak -H "X-Api-Key: $API_TOKEN"`);
    assert.equal(r.stdout, '403');
    assert.equal(up.seen.length, n, 'the request never left the proxy');
    // Without a placeholder the same host is fine, and the header secret is not added there.
    const ok = await sh(sb, `curl -sS -f https://other.example.test:${up.httpsPort}/plain`);
    assert.equal(ok.exitCode, 0, ok.stderr);
    const got = up.seen.find((x) => x.url === '/plain');
    assert.equal(got.headers.authorization, undefined);
    const log = await eventually(async () => {
      const items = (await sb.egressLog({ limit: 100 })).items;
      return items.some((e) => e.path === '/plain') && items;
    });
    const denied = log.find((e) => e.host === 'other.example.test' && e.decision === 'denied');
    assert.match(denied.reason, /API_TOKEN/);
    const allowed = log.find((e) => e.path === '/curl');
    assert.deepEqual([allowed.decision, allowed.status, allowed.secrets.sort()], ['allowed', 200, ['API_TOKEN', 'GH_TOKEN']]);
    assert.ok(allowed.bytesIn > 0);
    const cli = cliRunner(tmp, { SPACE_URL: fx.url, SPACE_API_KEY: fx.key });
    const out = await cli('egress', 'log', sb.id);
    assert.equal(out.code, 0, out.stderr);
    assert.match(out.stdout, /denied .*other\.example\.test.*API_TOKEN/);
  });

  it('only the proxy is reachable: direct TCP, the daemon, another sandbox, metadata, DNS, and the proxy refuses what the policy does not allow', async () => {
    const other = await fx.create({ template: 'base' });
    await other.commands.run('exec python3 -m http.server 8000', { background: true });
    await eventually(async () => (await sh(other, 'curl -s --noproxy "*" -o /dev/null -w "%{http_code}" http://127.0.0.1:8000/')).stdout === '200');
    const addr = async (s) => {
      const route = (await sh(s, 'cat /proc/net/route')).stdout.split('\n').map((l) => l.trim().split(/\s+/)).find((f) => f[0] === 'eth0' && f[2] === '00000000');
      const net4 = Buffer.from(route[1], 'hex').reverse();
      return { self: `${net4[0]}.${net4[1]}.${net4[2]}.${net4[3] + 2}`, gateway: `${net4[0]}.${net4[1]}.${net4[2]}.${net4[3] + 1}` };
    };
    const me = await addr(sb);
    const them = await addr(other);
    const proxyHost = new URL((await sh(sb, 'echo $HTTPS_PROXY')).stdout.trim()).hostname;
    const daemonPort = Number(new URL(fx.url).port);
    const targets = [
      ['host service via gateway', me.gateway, hostListener.address().port],
      ['host service via proxy address', proxyHost, hostListener.address().port],
      ['daemon API', proxyHost, daemonPort],
      ['daemon API via gateway', me.gateway, daemonPort],
      ['another sandbox', them.self, 8000],
      ['metadata', '169.254.169.254', 80],
      ['public address', '1.1.1.1', 443],
      ['DNS over TCP', me.gateway, 53],
    ];
    const script = `import socket,json
out={}
for name,h,p in ${JSON.stringify(targets)}:
    try:
        socket.create_connection((h,p),timeout=3).close(); out[name]='connected'
    except Exception as e: out[name]=type(e).__name__
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3)
try:
    s.sendto(b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x07example\\x03com\\x00\\x00\\x01\\x00\\x01',('${me.gateway}',53)); s.recvfrom(512); out['DNS over UDP']='answered'
except Exception as e: out['DNS over UDP']=type(e).__name__
try:
    socket.getaddrinfo('example.com',443); out['resolver']='resolved'
except Exception as e: out['resolver']=type(e).__name__
print(json.dumps(out))`;
    await sb.files.write('/tmp/probe.py', script);
    const res = JSON.parse((await sh(sb, 'python3 /tmp/probe.py')).stdout);
    for (const [name, v] of Object.entries(res)) assert.ok(!['connected', 'answered', 'resolved'].includes(v), `${name}: ${v}`);
    assert.equal(Object.keys(res).length, targets.length + 2);
    // The proxy itself is reachable (the only thing that is).
    const ok = await sh(sb, `curl -sS -o /dev/null -w '%{http_code}' https://api.example.test:${up.httpsPort}/reach`);
    assert.equal(ok.stdout, '200');

    const code = async (cmd) => (await sh(sb, cmd)).stdout.trim();
    // CONNECT to a host the policy does not name; to an IP outside its CIDRs; to a disallowed port.
    assert.match(await code(`curl -sS -o /dev/null -w '%{http_code}' https://denied.example.test:${up.httpsPort}/ 2>&1`), /403/);
    assert.match(await code(`curl -sS -o /dev/null -w '%{http_code}' https://127.0.0.2:${up.httpsPort}/ 2>&1`), /403/);
    assert.match(await code('curl -sS -o /dev/null -w "%{http_code}" https://api.example.test:8443/ 2>&1'), /403/);
    // An allowed name that resolves to a private address the policy does not open (DNS rebinding).
    assert.match(await code(`curl -sS -o /dev/null -w '%{http_code}' https://rebind.example.test:${up.httpsPort}/ 2>&1`), /403/);
    // Host header differing from the TLS server name.
    assert.equal(await code(`curl -sS -o /dev/null -w '%{http_code}' https://api.example.test:${up.httpsPort}/h -H 'Host: other.example.test:${up.httpsPort}'`), '421');
    // Redirects go back to the sandbox, never followed by the proxy.
    assert.equal(await code(`curl -sS -o /dev/null -w '%{http_code}' https://api.example.test:${up.httpsPort}/redirect`), '302');
    // SNI differing from the CONNECT host, and request smuggling, by hand.
    const raw = `import socket,ssl,os
p=os.environ['HTTPS_PROXY'].split('//')[1].rstrip('/').split(':')
def connect(target):
    s=socket.create_connection((p[0],int(p[1])),timeout=10)
    s.sendall(('CONNECT %s HTTP/1.1\\r\\nHost: %s\\r\\n\\r\\n'%(target,target)).encode())
    assert s.recv(4096).startswith(b'HTTP/1.1 200'), 'tunnel refused'
    return s
try:
    c=ssl.create_default_context().wrap_socket(connect('api.example.test:${up.httpsPort}'),server_hostname='other.example.test'); print('sni:accepted')
except Exception as e: print('sni:'+type(e).__name__)
s=socket.create_connection((p[0],int(p[1])),timeout=10)
s.sendall(b'POST http://api.example.test:${up.httpPort}/smuggle HTTP/1.1\\r\\nHost: api.example.test:${up.httpPort}\\r\\nContent-Length: 4\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n0\\r\\n\\r\\nGET /smuggled HTTP/1.1\\r\\nHost: api.example.test:${up.httpPort}\\r\\n\\r\\n')
print('smuggle:'+s.recv(4096).split(b'\\r\\n')[0].decode())`;
    await sb.files.write('/tmp/raw.py', raw);
    const out = (await sh(sb, 'python3 /tmp/raw.py')).stdout;
    assert.match(out, /^sni:(SSLError|SSLZeroReturnError|SSLEOFError|ConnectionResetError)/m, out);
    assert.match(out, /^smuggle:HTTP\/1\.1 400/m, out);
    assert.ok(!up.seen.some((r) => r.url === '/smuggle' || r.url === '/smuggled' || r.url === '/h'), 'nothing reached the server');
    const log = (await sb.egressLog({ limit: 200 })).items;
    for (const re of [/denied\.example\.test is not an allowed domain/, /127\.0\.0\.2 is not in an allowed CIDR/, /Port 8443/, /private or reserved address/, /does not match the TLS server name/, /TLS server name other\.example\.test differs/, /malformed request/]) {
      assert.ok(log.some((e) => e.decision === 'denied' && re.test(e.reason ?? '')), `audited: ${re}`);
    }
  });

  it('a sandbox that just closed its connections to the proxy can be snapshotted (no TIME_WAIT is left in it)', async () => {
    // This runsc cannot checkpoint a TCP endpoint in TIME_WAIT, and a failed checkpoint kills the
    // sandbox: the proxy resets connections the sandbox closes first. Keep-alive, closed by the client.
    const script = `import socket,os
p=os.environ['HTTP_PROXY'].split('//')[1].rstrip('/').split(':')
for i in range(3):
    s=socket.create_connection((p[0],int(p[1])),timeout=10)
    s.sendall(b'GET http://api.example.test:${up.httpPort}/keepalive HTTP/1.1\\r\\nHost: api.example.test:${up.httpPort}\\r\\n\\r\\n')
    print(s.recv(65536).split(b'\\r\\n')[0].decode())
    s.close()`;
    await sb.files.write('/tmp/close.py', script);
    const r = await sh(sb, 'python3 /tmp/close.py');
    assert.equal(r.stdout.trim().split('\n').length, 3, r.stderr);
    const snap = await sb.snapshot({ name: 'after-egress' });
    assert.equal(snap.name, 'after-egress');
    assert.equal((await sh(sb, 'cat /tmp/close.py')).exitCode, 0, 'the sandbox kept its state (it was not recovered from an older snapshot)');
  });

  it('policy changes, secret rotation and detaching apply at the next request, without a restart', async () => {
    const url = `https://api.example.test:${up.httpsPort}`;
    await sb.setEgress({ domains: ['api.example.test'], cidrs: ['127.0.0.1/32'], ports: [up.httpsPort] });
    assert.match((await sh(sb, `curl -sS -o /dev/null -w '%{http_code}' https://other.example.test:${up.httpsPort}/ 2>&1`)).stdout, /403/);
    await Secrets.set('API_TOKEN', { ...opts, value: `${VALUE}-rotated`, hosts: ['api.example.test'] });
    await sh(sb, `curl -sS -f ${url}/rotated -H "X-Api-Key: $API_TOKEN"`);
    assert.equal(up.seen.find((r) => r.url === '/rotated').headers['x-api-key'], `${VALUE}-rotated`);
    await sb.detachSecret('API_TOKEN');
    await sh(sb, `curl -sS -f ${url}/detached -H "X-Api-Key: space-was-$API_TOKEN-"`);
    assert.equal(up.seen.find((r) => r.url === '/detached').headers['x-api-key'], 'space-was--', 'new processes no longer have the variable');
    // Attach it again: a new placeholder, in processes started from now on.
    await sb.attachSecrets(['API_TOKEN']);
    const again = sb.info.secrets.find((a) => a.name === 'API_TOKEN').placeholder;
    assert.equal((await sh(sb, 'echo -n $API_TOKEN')).stdout, again);
    await sh(sb, `curl -sS -f ${url}/reattached -H "X-Api-Key: $API_TOKEN"`);
    assert.equal(up.seen.find((r) => r.url === '/reattached').headers['x-api-key'], `${VALUE}-rotated`);
  });

  it('publicInternet: any host without a domain entry, yet never a private address unless a CIDR allows it; audited', async () => {
    const before = await sb.egress();
    const other = `https://other.example.test:${up.httpsPort}/public-internet`;
    try {
      // The name resolves to 127.0.0.1 here: private, so refused although every domain is open.
      await sb.setEgress({ publicInternet: true, ports: [up.httpsPort] });
      assert.equal((await sb.egress()).publicInternet, true);
      assert.match((await sh(sb, `curl -sS -o /dev/null -w '%{http_code}' ${other} 2>&1`)).stdout, /403/);
      assert.match((await sh(sb, `curl --noproxy '' -sS -o /dev/null -w '%{http_code}' https://127.0.0.1:${up.httpsPort}/ 2>&1`)).stdout, /403/, 'a private literal address too');
      const denied = (await sb.egressLog({ limit: 5 })).items.find((e) => e.host === 'other.example.test' && e.decision === 'denied');
      assert.match(denied?.reason ?? '', /private or reserved address/);
      // With that one address allowed by CIDR, the host is reached with no domain listed.
      await sb.setEgress({ publicInternet: true, cidrs: ['127.0.0.1/32'], ports: [up.httpsPort] });
      assert.equal((await sh(sb, `curl -sS -o /dev/null -w '%{http_code}' ${other}`)).stdout, '200');
      assert.ok(up.seen.some((r) => r.url === '/public-internet'));
      await sb.setEgress({ cidrs: ['127.0.0.1/32'], ports: [up.httpsPort] });
      assert.match((await sh(sb, `curl -sS -o /dev/null -w '%{http_code}' ${other} 2>&1`)).stdout, /403/, 'without publicInternet the domain must be listed');
      const bad = await api(fx, 'PUT', `/v1/sandboxes/${sb.id}/egress`, { json: { publicInternet: 'yes' } });
      assert.equal(bad.status, 400);
    } finally {
      await sb.setEgress(before);
    }
  });

  it('an E2B-created sandbox: network.allowOut reaches the listed host through the proxy; others are refused and audited', async () => {
    {
      const { Sandbox: E2bSandbox } = await import('e2b');
      const key = (await api(fx, 'POST', '/v1/keys', { json: { format: 'e2b', name: 'e2b-net' } })).body.key;
      const url = (await api(fx, 'GET', '/v1/e2b')).body.url;
      const e = await E2bSandbox.create('base', { apiKey: key, apiUrl: url, sandboxUrl: url, network: { allowOut: ['e2b-allowed.example.test', '127.0.0.2'] } });
      fx.track(e.sandboxId);
      const code = async (host) => (await e.commands.run(`curl -sS -o /dev/null -w '%{http_code}' https://${host}/e2b-net 2>&1 || true`)).stdout;
      assert.equal(await code('e2b-allowed.example.test'), '200');
      assert.ok(e2bUp.seen.some((r) => r.url === '/e2b-net'));
      assert.match(await code('e2b-other.example.test'), /403/);
      const log = (await api(fx, 'GET', `/v1/sandboxes/${e.sandboxId}/egress/log`)).body.items;
      assert.ok(log.some((x) => x.host === 'e2b-other.example.test' && x.decision === 'denied'), 'the refusal is audited');
      // updateNetwork: everything public but one denied name; the listed address range stays allowed.
      await e.updateNetwork({ allowOut: ['127.0.0.2'], denyOut: ['e2b-other.example.test'] });
      const policy = (await api(fx, 'GET', `/v1/sandboxes/${e.sandboxId}/egress`)).body;
      assert.deepEqual([policy.domains, policy.cidrs, policy.publicInternet ?? false], [[], ['127.0.0.2/32'], false], 'no internet access was given: only the listed range');
      await e.updateNetwork({ allowOut: ['0.0.0.0/0', '127.0.0.2'], denyOut: ['e2b-other.example.test'] });
      assert.equal(await code('e2b-allowed.example.test'), '200', 'all traffic allowed: a name not listed');
      assert.match(await code('e2b-other.example.test'), /403/, 'denyOut still refuses its name');
      await e.kill();
    }
  });

  it('E2B header transforms (network.rules): the proxy sets the header for its host; the value never enters the sandbox; a rule opens nothing', async () => {
    const { Sandbox: E2bSandbox } = await import('e2b');
    const key = (await api(fx, 'POST', '/v1/keys', { json: { format: 'e2b', name: 'e2b-rules' } })).body.key;
    const url = (await api(fx, 'GET', '/v1/e2b')).body.url;
    const value = 'Bearer e2b-rule-value-0123456789';
    const e = await E2bSandbox.create('base', {
      apiKey: key,
      apiUrl: url,
      sandboxUrl: url,
      network: { allowOut: ['e2b-allowed.example.test', '127.0.0.2'], rules: { 'e2b-allowed.example.test': [{ transform: { headers: { Authorization: value } } }], 'e2b-other.example.test': [{ transform: { headers: { 'X-Other': 'x' } } }] } },
    });
    fx.track(e.sandboxId);
    const get = async (host, p) => (await e.commands.run(`curl -sS -o /dev/null -w '%{http_code}' -H 'Authorization: from-inside' https://${host}${p} 2>&1 || true`)).stdout;
    assert.equal(await get('e2b-allowed.example.test', '/rule-1'), '200');
    assert.equal(e2bUp.seen.find((r) => r.url === '/rule-1').headers.authorization, value, 'the rule replaced the header the sandbox sent');
    // Not in the sandbox: not in its environment, not in any file the agent wrote.
    const inside = await e.commands.run(`env; cat /proc/1/environ 2>/dev/null; grep -rs 'e2b-rule-value' /etc /home /tmp /root 2>/dev/null; true`);
    assert.ok(!inside.stdout.includes('e2b-rule-value'), 'the value is not inside the sandbox');
    // A rule grants no access: e2b-other is not in allowOut.
    assert.match(await get('e2b-other.example.test', '/rule-2'), /403/);
    assert.ok(!e2bUp.seen.some((r) => r.url === '/rule-2'));
    const log = (await api(fx, 'GET', `/v1/sandboxes/${e.sandboxId}/egress/log`)).body.items;
    assert.ok(log.some((x) => x.host === 'e2b-allowed.example.test' && x.secrets.some((n) => n.startsWith(`RULE_${e.sandboxId}_`))), 'the injection is audited by rule name');
    // updateNetwork replaces the rules; leaving them out clears them.
    await e.updateNetwork({ allowOut: ['e2b-allowed.example.test', '127.0.0.2'] });
    assert.equal(await get('e2b-allowed.example.test', '/rule-3'), '200');
    assert.equal(e2bUp.seen.find((r) => r.url === '/rule-3').headers.authorization, 'from-inside');
    await e.updateNetwork({ allowOut: ['e2b-allowed.example.test', '127.0.0.2'], rules: { 'e2b-allowed.example.test': [{ transform: { headers: { 'X-Api-Key': 'k2' } } }] } });
    assert.equal(await get('e2b-allowed.example.test', '/rule-4'), '200');
    assert.equal(e2bUp.seen.find((r) => r.url === '/rule-4').headers['x-api-key'], 'k2');
    // A bad rule is refused before anything changes: the policy stays as it was.
    const policyBefore = (await api(fx, 'GET', `/v1/sandboxes/${e.sandboxId}/egress`)).body;
    await assert.rejects(e.updateNetwork({ allowOut: ['127.0.0.2'], rules: { 'e2b-allowed.example.test': [{ transform: { headers: { Host: 'x' } } }] } }), /not a request header the proxy may set/);
    assert.deepEqual((await api(fx, 'GET', `/v1/sandboxes/${e.sandboxId}/egress`)).body, policyBefore, 'a bad rule changes nothing');
    // The rule's sealed value is a secret of the sandbox's own, and goes with it.
    const stored = (await api(fx, 'GET', '/v1/secrets')).body.secrets.filter((s) => s.name.startsWith(`RULE_${e.sandboxId}_`));
    assert.deepEqual(stored.map((s) => [s.header, s.hosts, s.sandboxId]), [['X-Api-Key', ['e2b-allowed.example.test'], e.sandboxId]]);
    await e.kill();
    const rules = async () => (await api(fx, 'GET', '/v1/secrets')).body.secrets.filter((s) => s.name.startsWith(`RULE_${e.sandboxId}_`));
    assert.deepEqual(await rules(), []);
  });

  it('passthrough destinations are tunnelled as raw TCP: no interception, no secrets, one audit entry', async () => {
    const dest = `api.example.test:${up.httpPort}`;
    // Through CONNECT (curl -p), a plain HTTP request: refused until the policy lists it as passthrough.
    const cmd = `curl -sS -p -o /dev/null -w '%{http_code}' http://${dest}/passthrough -H "X-Api-Key: $API_TOKEN" 2>&1`;
    assert.match((await sh(sb, cmd)).stdout, /403/);
    await sb.setEgress({ domains: ['api.example.test'], cidrs: ['127.0.0.1/32'], ports: [up.httpsPort], passthrough: [dest] });
    assert.equal((await sh(sb, cmd)).stdout, '200');
    const ph = sb.info.secrets.find((a) => a.name === 'API_TOKEN').placeholder;
    assert.equal(up.seen.find((r) => r.url === '/passthrough').headers['x-api-key'], ph, 'not intercepted: the placeholder went through unchanged');
    const e = await eventually(async () => (await sb.egressLog({ limit: 20 })).items.find((x) => x.method === 'TCP' && x.port === up.httpPort));
    assert.deepEqual([e.scheme, e.decision, e.secrets], ['tcp', 'allowed', []]);
    assert.ok(e.bytesOut > 0 && e.bytesIn > 0);
  });

  it('forks and a hibernated-then-woken sandbox still reach only the proxy and still get secrets injected', async () => {
    const url = `https://api.example.test:${up.httpsPort}`;
    const [child] = await sb.fork({ count: 1 });
    fx.track(child);
    assert.deepEqual(child.info.secrets, sb.info.secrets);
    await sh(child, `curl -sS -f ${url}/from-fork -H "X-Api-Key: $API_TOKEN"`);
    assert.equal(up.seen.find((r) => r.url === '/from-fork')?.headers['x-api-key'], `${VALUE}-rotated`);
    await sb.hibernate();
    await sb.wake();
    await sh(sb, `curl -sS -f ${url}/after-wake -H "X-Api-Key: $API_TOKEN"`);
    assert.equal(up.seen.find((r) => r.url === '/after-wake')?.headers['x-api-key'], `${VALUE}-rotated`);
    for (const s of [child, sb]) {
      const r = await sh(s, `python3 -c "import socket
try:
    socket.create_connection(('1.1.1.1',443),timeout=3); print('connected')
except Exception as e: print(type(e).__name__)"`);
      assert.notEqual(r.stdout.trim(), 'connected');
    }
    assert.ok((await child.egressLog()).items.some((e) => e.path === '/from-fork'), 'the fork has its own audit log');
  });
});
