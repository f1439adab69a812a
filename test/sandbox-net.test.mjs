// Sandbox links (@space/sandbox-net) against the real kernel: spare namespaces made ahead of the
// attaches that create one, renamed when taken, removed at teardown and after a killed daemon.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createConnection } from 'node:net';
import { after, describe, it } from 'node:test';
import { SandboxNet } from '../packages/sandbox-net/dist/index.js';

// Outside the ranges daemons and other tests pick (10.231–10.239).
const RANGE = `10.241.${process.pid % 250}.0/24`;
const ip = (...a) => execFileSync('ip', a, { encoding: 'utf8' });
const namespaces = () => ip('netns', 'list').split('\n').map((l) => l.split(' ')[0]).filter(Boolean);
const made = new Set();

describe('sandbox links: spare namespaces', () => {
  after(() => {
    for (const n of namespaces()) if (made.has(n) || n.startsWith(`space-spare-${new SandboxNet({ range: RANGE }).tag}-`)) ip('netns', 'del', n);
  });

  it('an attach that creates its namespace takes a ready spare, renamed, with its own address, route and rules; teardown deletes the spares', async () => {
    const net = new SandboxNet({ range: RANGE, spares: 2 });
    await net.init();
    const spares = () => namespaces().filter((n) => n.startsWith(`space-spare-${net.tag}-`));
    made.add('space-sbnta-00000001').add('space-sbntb-00000002');
    // The first attach has no spare to take (nothing told the network which name spares get).
    const a = await net.attach('sbnta', 'space-sbnta-00000001', 'eth0', { create: true });
    await net.spared();
    assert.equal(spares().length, 2);
    const b = await net.attach('sbntb', 'space-sbntb-00000002', 'eth0', { create: true });
    assert.equal(spares().length, 1, 'one spare taken');
    assert.ok(namespaces().includes('space-sbntb-00000002'));
    assert.notEqual(a, b);
    // The renamed namespace is the spare's: its link, address, route to the proxy and rules.
    const addr = ip('-n', 'space-sbntb-00000002', '-4', '-o', 'addr', 'show', 'dev', 'eth0');
    assert.match(addr, new RegExp(` ${b.replaceAll('.', '\\.')}/30 `));
    assert.match(ip('-n', 'space-sbntb-00000002', 'route'), new RegExp(`^${net.proxyAddress.replaceAll('.', '\\.')} via `, 'm'));
    assert.match(execFileSync('nsenter', ['--net=/run/netns/space-sbntb-00000002', 'nft', 'list', 'table', 'netdev', 'space'], { encoding: 'utf8' }), new RegExp(`ip saddr ${b.replaceAll('.', '\\.')} ip daddr ${net.proxyAddress.replaceAll('.', '\\.')}`));
    assert.equal(net.sandboxAt(b), 'sbntb');
    assert.equal(net.addressOf('sbntb'), b);
    // The host reaches a server on the sandbox's address (as the ingress does) over the link.
    const server = spawn('nsenter', ['--net=/run/netns/space-sbntb-00000002', process.execPath, '-e', `require('net').createServer((c) => c.end('hello')).listen(8080, '${b}', () => console.log('ready'))`], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      await once(server.stdout, 'data');
      const got = await new Promise((resolve, reject) => {
        const c = createConnection({ host: b, port: 8080, timeout: 5000 }, () => {});
        let data = '';
        c.on('data', (d) => (data += d)).on('end', () => resolve(data)).on('error', reject).on('timeout', () => reject(new Error('no answer')));
      });
      assert.equal(got, 'hello');
    } finally {
      server.kill();
    }
    // Deleting the namespace under its new name removes the link; detach frees the address.
    ip('netns', 'del', 'space-sbntb-00000002');
    await net.detach('space-sbntb-00000002');
    assert.equal(net.sandboxAt(b), undefined);
    await net.spared();
    assert.equal(spares().length, 2);
    // Teardown deletes the spares even while a sandbox's link is left (its host side stays).
    await net.teardown();
    assert.deepEqual(spares(), []);
    ip('netns', 'del', 'space-sbnta-00000001');
    await net.detach('space-sbnta-00000001');
    await net.teardown();
  });

  it('spares a killed daemon left are deleted at the next start; its sandboxes\' links are taken over', async () => {
    const first = new SandboxNet({ range: RANGE, spares: 2 });
    await first.init();
    made.add('space-sbntc-00000003');
    const c = await first.attach('sbntc', 'space-sbntc-00000003', 'eth0', { create: true });
    await first.spared();
    const spares = () => namespaces().filter((n) => n.startsWith(`space-spare-${first.tag}-`));
    assert.equal(spares().length, 2);
    // "Killed": no teardown. The next daemon's network starts on the same range.
    const next = new SandboxNet({ range: RANGE, spares: 2 });
    await next.init();
    assert.deepEqual(spares(), []);
    assert.equal(await next.attach('sbntc', 'space-sbntc-00000003', 'eth0'), c, 'the sandbox keeps its address');
    assert.equal(next.sandboxAt(c), 'sbntc');
    ip('netns', 'del', 'space-sbntc-00000003');
    await next.detach('space-sbntc-00000003');
    await next.teardown();
    assert.deepEqual(spares(), []);
  });

  it('spares: 0 makes none', async () => {
    const net = new SandboxNet({ range: RANGE, spares: 0 });
    await net.init();
    made.add('space-sbntd-00000004');
    await net.attach('sbntd', 'space-sbntd-00000004', 'eth0', { create: true });
    await net.spared();
    assert.deepEqual(namespaces().filter((n) => n.startsWith(`space-spare-${net.tag}-`)), []);
    ip('netns', 'del', 'space-sbntd-00000004');
    await net.detach('space-sbntd-00000004');
    await net.teardown();
  });
});
