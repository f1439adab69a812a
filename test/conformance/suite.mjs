// The driver conformance suite: every isolation driver runs these same tests through the
// public SDK against a real daemon. A driver may skip a test only with a reason:
//   conformance({ name: 'microvm', daemonOpts: {...}, skip: [{ test: 'pty', reason: '...' }] })
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { Readable } from 'node:stream';
import { Sandbox, SpaceError } from '../../packages/sdk/dist/index.js';
import { eventually, readAll, startTestDaemon } from '../helpers.mjs';

/**
 * @param {{ name: string, label?: string, daemonOpts?: object, skip?: { test: string, reason: string }[] }} driver
 */
export function conformance(driver) {
  const skips = new Map((driver.skip ?? []).map((s) => [s.test, s.reason]));
  const test = (name, fn) => it(name, skips.has(name) ? { skip: `${driver.name}: ${skips.get(name)}` } : {}, fn);

  describe(`driver conformance: ${driver.label ?? driver.name}`, () => {
    let fx;
    let sb;
    before(async () => {
      fx = await startTestDaemon(driver.daemonOpts);
      sb = await fx.create({ memoryMb: 512, env: { GREETING: 'hello' }, metadata: { suite: 'conformance' } });
    });
    after(async () => {
      const leaks = await fx.close();
      assert.deepEqual(leaks, [], 'every runsc container, netns, cgroup and mount is gone after the suite');
    });

    test('create gives a running sandbox whose hostname is its id, with a non-root default user', async () => {
      assert.equal(sb.info.state, 'running');
      assert.equal(sb.info.driver, driver.name);
      const r = await sb.commands.run('hostname; id -u; id -g; echo $HOME');
      assert.equal(r.stdout, `${sb.id}\n1000\n1000\n/home/user\n`);
      const root = await sb.commands.run('id -u', { user: 'root' });
      assert.equal(root.stdout, '0\n');
    });

    test('exec reports exit codes, separates stdout from stderr, and honours argv, env and cwd', async () => {
      const r = await sb.commands.run('echo out; echo err >&2; exit 7');
      assert.deepEqual([r.exitCode, r.stdout, r.stderr], [7, 'out\n', 'err\n']);
      const a = await sb.commands.run(['/bin/echo', 'a b', '$NOT_EXPANDED']);
      assert.equal(a.stdout, 'a b $NOT_EXPANDED\n');
      const e = await sb.commands.run('echo $GREETING $EXTRA; pwd', { env: { EXTRA: 'world' }, cwd: '/tmp' });
      assert.equal(e.stdout, 'hello world\n/tmp\n');
      await assert.rejects(sb.commands.run(['/no/such/program']), (err) => err instanceof SpaceError && err.code === 'COMMAND_FAILED_TO_START');
    });

    test('output streams while the process runs', async () => {
      // The process prints, then waits for a file that the test creates only after seeing the print.
      const seen = [];
      let released = false;
      const done = sb.commands.run('echo first; while [ ! -f /tmp/release ]; do sleep 0.05; done; echo second', {
        onStdout: (d) => {
          seen.push(d);
          if (!released && seen.join('').includes('first')) {
            released = true;
            void sb.files.write('/tmp/release', 'go');
          }
        },
      });
      const r = await done;
      assert.equal(r.stdout, 'first\nsecond\n');
      assert.ok(seen.length >= 2, 'the first line arrived before the process finished');
    });

    test('stdin reaches the process and EOF ends it', async () => {
      const h = await sb.commands.start(['cat'], { stdin: true });
      await h.sendStdin('line one\n');
      await h.sendStdin(Buffer.from([0, 1, 2, 255]));
      await h.closeStdin();
      const r = await h.wait();
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout.slice(0, 9), 'line one\n');
    });

    test('pty: a terminal of the requested size that can be resized', async () => {
      let out = '';
      const t = await sb.pty.create({ cols: 80, rows: 24, cmd: ['/bin/sh'], onData: (d) => (out += Buffer.from(d).toString()) });
      await t.sendInput('stty size\n');
      await eventually(() => out.includes('24 80'));
      await t.resize(100, 30);
      await t.sendInput('stty size; tty; exit 3\n');
      const r = await t.wait();
      assert.equal(r.exitCode, 3);
      assert.match(out, /30 100/);
      assert.match(out, /\/dev\/pts\/\d+/);
    });

    test('background processes outlive the request, are listed, re-attached and killed', async () => {
      const h = await sb.commands.run('echo started; touch /tmp/bg-ready; exec sleep 1000', { background: true, tag: 'sleeper' });
      assert.ok(h.pid > 0);
      // "started" is in the pipe before the file exists; nobody is attached while it is written.
      await eventually(() => sb.files.exists('/tmp/bg-ready'));
      const ps = await sb.commands.list();
      const me = ps.find((p) => p.pid === h.pid);
      assert.ok(me?.running && me.background && me.tag === 'sleeper');
      const attached = await sb.commands.connect(h.pid);
      const waiting = attached.wait();
      await h.kill('SIGKILL');
      const r = await waiting;
      assert.equal(r.signal, 'SIGKILL');
      assert.match(r.stdout, /started/, 'output produced while detached is replayed on attach');
      assert.equal((await sb.commands.list()).find((p) => p.pid === h.pid)?.running, false);
    });

    test('timeoutMs kills a command', async () => {
      const r = await sb.commands.run('sleep 1000', { timeoutMs: 1000 });
      assert.equal(r.timedOut, true);
      assert.equal(r.signal, 'SIGKILL');
    });

    test('files: write, read, stat, list, mkdir -p, rename, remove, exists', async () => {
      await sb.files.makeDir('/tmp/d/e/f');
      await sb.files.write('/tmp/d/e/f/a.txt', 'héllo');
      assert.equal(await sb.files.read('/tmp/d/e/f/a.txt'), 'héllo');
      const st = await sb.files.stat('/tmp/d/e/f/a.txt');
      assert.deepEqual([st.type, st.size], ['file', 6]);
      const owner = await sb.commands.run('stat -c %u /tmp/d/e/f/a.txt /tmp/d/e');
      assert.equal(owner.stdout, '1000\n1000\n', 'new files and directories belong to the default user');
      const ls = await sb.files.list('/tmp/d', { depth: 3 });
      assert.deepEqual(ls.map((e) => e.path), ['/tmp/d/e', '/tmp/d/e/f', '/tmp/d/e/f/a.txt']);
      await sb.files.rename('/tmp/d/e/f/a.txt', '/tmp/d/b.txt');
      assert.equal(await sb.files.exists('/tmp/d/e/f/a.txt'), false);
      assert.equal(await sb.files.read('/tmp/d/b.txt'), 'héllo');
      await assert.rejects(sb.files.remove('/tmp/d'), (e) => e.code === 'DIRECTORY_NOT_EMPTY');
      await sb.files.remove('/tmp/d', { recursive: true });
      assert.equal(await sb.files.exists('/tmp/d'), false);
      await assert.rejects(sb.files.read('/nope'), (e) => e.code === 'FILE_NOT_FOUND');
      const bin = randomBytes(70_000);
      await sb.files.write('bin.dat', bin);
      assert.deepEqual(Buffer.from(await sb.files.read('/home/user/bin.dat', { format: 'bytes' })), bin, 'relative paths are under the home directory; bytes survive');
    });

    test('file metadata is stored with the file (extended attributes) and follows a rename', async () => {
      await sb.files.write('/tmp/md.txt', 'x', { metadata: { Step: '3', 'run.id': 'r-1' } });
      await sb.files.write('/home/user/md.txt', 'x', { metadata: { k: 'v' } });
      assert.deepEqual((await sb.files.stat('/tmp/md.txt', { metadata: true })).metadata, { step: '3', 'run.id': 'r-1' });
      assert.equal((await sb.files.stat('/tmp/md.txt')).metadata, undefined, 'read only when asked');
      await sb.files.rename('/tmp/md.txt', '/tmp/md2.txt');
      const ls = await sb.files.list('/tmp', { metadata: true });
      assert.deepEqual(ls.find((e) => e.name === 'md2.txt')?.metadata, { step: '3', 'run.id': 'r-1' });
      assert.deepEqual((await sb.files.stat('md.txt', { metadata: true })).metadata, { k: 'v' }, 'in the home directory too');
      await assert.rejects(sb.files.write('/tmp/bad.txt', 'x', { metadata: { k: 'é' } }), (e) => e.code === 'BAD_REQUEST' || /header|ByteString|character/i.test(e.message));
      assert.equal(await sb.files.exists('/tmp/bad.txt'), false, 'a refused write writes nothing');
    });

    test('a 100 MB file round-trips intact (verified by hash), streamed both ways', async () => {
      const size = 100 * 1024 * 1024;
      const hash = createHash('sha256');
      const chunk = randomBytes(1024 * 1024);
      async function* gen() {
        for (let i = 0; i < size / chunk.length; i++) {
          const c = Buffer.from(chunk);
          c.writeUInt32BE(i, 0);
          hash.update(c);
          yield c;
        }
      }
      const w = await sb.files.write('/tmp/big.bin', Readable.from(gen()));
      assert.equal(w.size, size);
      const inside = await sb.commands.run('sha256sum /tmp/big.bin');
      const expected = hash.digest('hex');
      assert.equal(inside.stdout.split(' ')[0], expected);
      const back = createHash('sha256');
      let n = 0;
      for await (const c of await sb.files.read('/tmp/big.bin', { format: 'stream' })) {
        back.update(c);
        n += c.length;
      }
      assert.equal(n, size);
      assert.equal(back.digest('hex'), expected);
      await sb.files.remove('/tmp/big.bin');
    });

    test('a file read while a process rewrites it is whole or cut, never hung; procfs files are read whole', async () => {
      // A busy loop truncates and rewrites the file: each read must end (not wait for bytes
      // its Content-Length promised) with one whole value or the empty file. The file exists
      // before the loop starts (its first rewrite may come after the first read: ENOENT, seen on
      // the microVM driver in CI).
      await sb.files.write('/tmp/churn', '1234567890\n');
      const loop = await sb.commands.run('while :; do echo 1234567890 > /tmp/churn; done', { background: true });
      try {
        for (let i = 0; i < 150; i++) {
          const text = await sb.files.read('/tmp/churn', { signal: AbortSignal.timeout(15_000) });
          assert.ok(text === '' || text === '1234567890\n', `read ${i}: ${JSON.stringify(text)}`);
        }
      } finally {
        await loop.kill();
      }
      const meminfo = await sb.files.read('/proc/meminfo');
      assert.match(meminfo, /^MemTotal:.*\n[^]*MemFree:/, 'a procfs file (stat size 0) is read whole, not as empty');
      // A long file truncated while it is read: the download is cut, not ended as if whole.
      await sb.commands.run('head -c 67108864 /dev/zero > /tmp/shrinks');
      const body = await sb.files.read('/tmp/shrinks', { format: 'stream', signal: AbortSignal.timeout(60_000) });
      const it = body[Symbol.asyncIterator]();
      await it.next();
      await sb.commands.run(': > /tmp/shrinks');
      await assert.rejects(async () => {
        for (let r = await it.next(); !r.done; r = await it.next());
      }, 'a download whose file shrank below its length fails');
      await sb.files.remove('/tmp/shrinks');
    });

    test('backpressure: a process whose output is not read is paused, not buffered', async () => {
      // Writes 64 KiB blocks forever, counting them in a file; we read nothing until it stalls.
      const res = await fetch(`${fx.url}/v1/sandboxes/${sb.id}/commands`, {
        method: 'POST',
        headers: { authorization: `Bearer ${fx.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ cmd: 'i=0; while true; do head -c 65536 /dev/zero; i=$((i+1)); echo $i > /tmp/blocks; done' }),
      });
      const reader = res.body.getReader();
      await reader.read(); // the start event
      let last = -1;
      let stable = 0;
      await eventually(async () => {
        const r = await sb.commands.run('cat /tmp/blocks 2>/dev/null || echo 0');
        const n = Number(r.stdout.trim());
        stable = n === last ? stable + 1 : 0;
        last = n;
        return stable >= 5;
      }, { tries: 600, everyMs: 200 });
      const bytes = last * 65536;
      assert.ok(bytes < 16 * 1024 * 1024, `producer stalled after ${bytes} bytes (bounded by flow-control windows and socket buffers)`);
      // Reading again lets it continue.
      // (the freed window lets it write more blocks; the file shows it once the next block is done)
      for (let i = 0; i < 200; i++) await reader.read();
      const resumed = await eventually(async () => Number((await sb.commands.run('cat /tmp/blocks')).stdout.trim()) > last, { tries: 50, everyMs: 100 }).catch(() => false);
      assert.ok(resumed, 'the producer resumes once the client reads');
      await reader.cancel();
      await eventually(async () => !(await sb.commands.list()).some((p) => p.running && p.argv.join(' ').includes('/tmp/blocks')));
    });

    test('a fork bomb is contained and the sandbox stays alive', async () => {
      const fb = await fx.create({ memoryMb: 256 });
      const r = await fb.commands.run('bomb() { bomb | bomb & }; bomb; sleep 2; echo survived', { timeoutMs: 120_000 });
      assert.match(r.stderr + r.stdout, /can't fork|Resource temporarily unavailable|survived/);
      await fb.commands.run('kill -9 -1', { user: 'user' }).catch(() => {});
      assert.equal((await fb.commands.run('echo alive', { user: 'root' })).stdout, 'alive\n');
      assert.equal((await fb.refresh()).state, 'running');
      await fb.kill();
    });

    test('exceeding the memory limit ends the sandbox as dead with reason oom', async () => {
      const hog = await fx.create({ memoryMb: 128 });
      await hog.commands.run('head -c 400000000 /dev/zero | tail > /dev/null', { timeoutMs: 120_000 }).catch(() => {});
      const info = await eventually(async () => {
        const i = await hog.refresh();
        return i.state === 'dead' ? i : undefined;
      });
      assert.equal(info.endReason, 'oom');
      assert.match(info.endDetail, /memory limit of 128 MiB/);
      await assert.rejects(hog.commands.run('true'), (e) => e.code === 'SANDBOX_NOT_RUNNING');
    });

    test('two sandboxes see neither each other\'s processes nor files', async () => {
      const other = await fx.create();
      await sb.files.write('/tmp/secret-of-a', 'a');
      const h = await sb.commands.run('exec sleep 777', { background: true });
      const ps = await other.commands.run('ps -o args', { user: 'root' });
      assert.doesNotMatch(ps.stdout, /sleep 777/);
      assert.equal(await other.files.exists('/tmp/secret-of-a'), false);
      assert.notEqual((await other.commands.run('hostname')).stdout, (await sb.commands.run('hostname')).stdout);
      await h.kill();
      await other.kill();
    });

    test('a sandbox reaches nothing but its egress proxy: not the daemon, not the host, not metadata, not DNS', async () => {
      const port = new URL(fx.url).port;
      const ifaces = (await sb.commands.run('cat /proc/net/dev')).stdout.split('\n').slice(2).map((l) => l.split(':')[0].trim()).filter(Boolean);
      const proxy = (await sb.commands.run('echo -n $HTTPS_PROXY')).stdout;
      // With egress, one link (eth0) whose only destination is the proxy; without, loopback only.
      assert.deepEqual(ifaces.sort(), proxy ? ['eth0', 'lo'] : ['lo']);
      const p = proxy ? new URL(proxy) : undefined;
      // Try TCP connections with the node runtime every sandbox has at /.space; print each outcome.
      const targets = [['127.0.0.1', Number(port)], ['10.0.2.2', 80], ['169.254.169.254', 80], ['8.8.8.8', 53], ...(p ? [[p.hostname, Number(port)], [p.hostname, 22], [p.hostname, Number(p.port)]] : [])];
      const probe = `for (const [h, p] of ${JSON.stringify(targets)}) {
        await new Promise((r) => { const s = require('net').connect({ host: h, port: p, timeout: 3000 });
          s.on('connect', () => { console.log(h, p, 'CONNECTED'); s.destroy(); r(); });
          s.on('timeout', () => { console.log(h, p, 'TIMEOUT'); s.destroy(); r(); });
          s.on('error', (e) => { console.log(h, p, e.code); r(); }); }); }`;
      const r = await sb.commands.run(['/.space/lib/ld-linux-x86-64.so.2', '--library-path', '/.space/lib', '/.space/node', '-e', `(async () => { ${probe} })()`]);
      assert.equal(r.exitCode, 0, r.stderr);
      const lines = r.stdout.trim().split('\n');
      assert.equal(lines.length, targets.length, r.stdout);
      // The last line is the proxy, the one thing that must answer (so the probe can tell).
      for (const l of p ? lines.slice(0, -1) : lines) assert.doesNotMatch(l, /CONNECTED/, `no connection may succeed: ${l}`);
      if (p) assert.match(lines.at(-1), /CONNECTED/, `the egress proxy answers: ${lines.at(-1)}`);
    });

    test('kill ends the sandbox; commands on it fail with SANDBOX_NOT_RUNNING', async () => {
      const k = await fx.create();
      await k.kill();
      assert.equal(k.info.state, 'killed');
      assert.equal(k.info.endReason, 'killed');
      await assert.rejects(k.commands.run('true'), (e) => e instanceof SpaceError && e.code === 'SANDBOX_NOT_RUNNING');
      await assert.rejects(Sandbox.kill(k.id, fx.conn), (e) => e.code === 'SANDBOX_NOT_RUNNING');
    });
  });
}
