// Root inside a sandbox (sudo in `base`) can stop or replace the agent, so the daemon must take
// every byte on the agent's socket as hostile. Here a root process freezes the real agent,
// connects to the daemon in its place and sends garbage, an oversized length, malformed JSON,
// frames for streams that were never opened, a flood, and malformed replies to real requests.
// The daemon stays up, another sandbox is unaffected throughout, the victim's calls fail with
// coded errors, and once the real agent is let go the victim works again.
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { after, before, describe, it } from 'node:test';
import { isErrorCode } from '../packages/core/dist/index.js';
import { api, startTestDaemon } from './helpers.mjs';

const HOSTILE = String.raw`
import json, os, signal, socket, struct, time
SID = os.environ['SPACE_SANDBOX_ID']
SOCK = '/run/space/agent.sock'
agent = next(int(p) for p in os.listdir('/proc') if p.isdigit() and p != '1' and b'agent.cjs' in open('/proc/%s/cmdline' % p, 'rb').read())
os.kill(agent, signal.SIGSTOP)

def frame(kind, stream, payload):
    return struct.pack('>IBI', 5 + len(payload), kind, stream) + payload

def hello():
    return frame(7, 0, json.dumps({'event': 'hello', 'version': 1, 'sandboxId': SID, 'startedAt': 0}).encode())

def attack(data, linger=0.5):
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCK)
    try:
        s.sendall(data)
        time.sleep(linger)
    except OSError:
        pass
    s.close()

try:
    attack(os.urandom(4096))                                   # not frames at all
    attack(struct.pack('>IBI', 0x7fffffff, 3, 1) + b'x' * 64)  # a length far beyond the limit
    attack(hello() + frame(7, 0, b'{not json'))                # malformed JSON
    attack(hello() + frame(2, 12345, b'{}') + frame(3, 777, b'\x01data') + frame(4, 99, b'\xff\xff\xff\xff') + frame(9, 1, b'?'))
    s = socket.socket(socket.AF_UNIX)                           # a flood of 32 MiB of events
    s.connect(SOCK)
    try:
        s.sendall(hello())
        noise = frame(7, 0, json.dumps({'event': 'noise', 'pad': 'x' * 60000}).encode())
        for _ in range(32 * 1024 * 1024 // len(noise)):
            s.sendall(noise)
    except OSError:
        pass
    s.close()
    # Answer real requests with malformed replies, until 10 requests or 60 s.
    s = socket.socket(socket.AF_UNIX)
    s.connect(SOCK)
    s.sendall(hello())
    buf, answered, t0 = b'', 0, time.time()
    s.settimeout(1)
    while answered < 10 and time.time() - t0 < 60:
        try:
            d = s.recv(65536)
        except socket.timeout:
            continue
        if not d:
            s = socket.socket(socket.AF_UNIX); s.connect(SOCK); s.sendall(hello()); s.settimeout(1); buf = b''
            continue
        buf += d
        while len(buf) >= 9:
            n, kind, stream = struct.unpack('>IBI', buf[:9])
            if len(buf) < 4 + n:
                break
            buf = buf[4 + n:]
            if kind == 1:
                s.sendall(frame(2, stream, b'{"pid": "not a number", ' + b'\xff' * 8))
                answered += 1
    s.close()
finally:
    os.kill(agent, signal.SIGCONT)
    open('/tmp/hostile-done', 'w').close()
`;

describe('a hostile process in place of the agent', () => {
  let fx;
  before(async () => {
    fx = await startTestDaemon();
  });
  after(async () => {
    const leaks = await fx?.close();
    assert.deepEqual(leaks ?? [], []);
  });

  it('cannot take the daemon down or touch another sandbox; the victim fails with codes, then recovers', async () => {
    const victim = await fx.create({ template: 'base' });
    const bystander = await fx.create({ template: 'minimal' });
    await victim.files.write('/tmp/hostile.py', HOSTILE);
    await victim.commands.run(['python3', '/tmp/hostile.py'], { user: 'root', background: true });
    const codes = new Set();
    let recovered = false;
    for (let i = 0; i < 200 && !recovered; i++) {
      try {
        const r = await victim.commands.run(['cat', '/tmp/hostile-done'], { timeoutMs: 10_000 });
        recovered = r.exitCode === 0;
      } catch (err) {
        assert.ok(isErrorCode(err.code), `a registered error code, got ${err.code}: ${err.message}`);
        codes.add(err.code);
      }
      assert.equal((await bystander.commands.run('echo ok')).stdout, 'ok\n', 'the other sandbox answers throughout');
      await sleep(100);
    }
    assert.ok(recovered, 'the victim works again once the real agent is back');
    assert.ok(codes.has('AGENT_PROTOCOL_ERROR') || codes.has('AGENT_DISCONNECTED') || codes.has('AGENT_UNAVAILABLE'), `calls failed with agent errors while it was replaced: ${[...codes]}`);
    const health = await api(fx, 'GET', '/v1/sandboxes');
    assert.equal(health.status, 200);
    assert.equal((await victim.refresh()).state, 'running');
    assert.equal((await victim.commands.run('echo back')).stdout, 'back\n');
  });
});
