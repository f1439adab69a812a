// Stateful sessions on gVisor: pause/resume, hibernate/wake, snapshots, rollback, fork,
// rolling snapshots, refusal of states runsc cannot save, and corrupt snapshots.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { Sandbox, SpaceError } from '../packages/sdk/dist/index.js';
import { eventually, startTestDaemon } from './helpers.mjs';

const NODE = ['/.space/lib/ld-linux-x86-64.so.2', '--library-path', '/.space/lib', '/.space/node'];
/** A process that counts in memory; `kill -USR1` makes it write the count to /tmp/count. */
const COUNTER = 'i=0; trap \'echo $i > /tmp/count\' USR1; while true; do i=$((i+1)); sleep 0.05; done';

async function count(sb, pid) {
  await sb.commands.run(['rm', '-f', '/tmp/count']);
  await sb.commands.kill(pid, 'SIGUSR1');
  return Number(await eventually(async () => (await sb.files.exists('/tmp/count')) && (await sb.files.read('/tmp/count')).trim()));
}

describe('stateful sessions', () => {
  let fx;
  before(async () => {
    fx = await startTestDaemon();
  });
  after(async () => assert.deepEqual(await fx.close(), []));

  it('pause freezes (commands refused), resume continues; the in-memory counter survives', async () => {
    const sb = await fx.create();
    const h = await sb.commands.run(COUNTER, { background: true });
    await sb.files.write('/tmp/file', 'kept');
    const c1 = await count(sb, h.pid);
    await sb.pause();
    assert.equal(sb.info.state, 'paused');
    await assert.rejects(sb.commands.run('true'), (e) => e instanceof SpaceError && e.code === 'SANDBOX_INVALID_STATE');
    await assert.rejects(sb.pause(), (e) => e.code === 'SANDBOX_INVALID_STATE', 'no pause of a paused sandbox');
    await sb.resume();
    await assert.rejects(sb.resume(), (e) => e.code === 'SANDBOX_INVALID_STATE', 'no resume of a running sandbox');
    assert.ok((await count(sb, h.pid)) > c1, 'the counter kept its value and goes on');
    assert.equal(await sb.files.read('/tmp/file'), 'kept');
    await sb.kill();
  });

  it('hibernate frees the host, wake (explicit or on demand) restores memory, processes and files', async () => {
    const sb = await fx.create();
    const h = await sb.commands.run(COUNTER, { background: true });
    await sb.files.write('/tmp/file', 'before-hibernate');
    const c1 = await count(sb, h.pid);
    await sb.hibernate();
    assert.equal(sb.info.state, 'hibernated');
    const ps = JSON.parse((await import('node:child_process')).execFileSync('runsc', ['--root', path.join(fx.dataDir, 'runsc'), 'list', '--format', 'json'], { encoding: 'utf8' }) || '[]') ?? [];
    assert.ok(!ps.some((c) => c.id.startsWith(sb.id) && c.status === 'running'), 'no runtime container runs while hibernated');
    assert.equal((await sb.usage()).rssBytes, 0);
    // A file call wakes it on demand.
    assert.equal(await sb.files.read('/tmp/file'), 'before-hibernate');
    assert.equal((await sb.refresh()).state, 'running');
    const c2 = await count(sb, h.pid);
    assert.ok(c2 >= c1, `the counter resumed from ${c1}, now ${c2}`);
    await sb.hibernate();
    await sb.wake();
    assert.equal(sb.info.state, 'running');
    assert.equal((await sb.commands.run('cat /tmp/file')).stdout, 'before-hibernate');
    // Each wake says where its time went, the gVisor driver's steps included.
    const woken = (await sb.events()).filter((e) => e.type === 'woken').map((e) => e.message);
    assert.equal(woken.length, 2, JSON.stringify(woken));
    for (const m of woken) assert.match(m, /\(ms: fetch \d+, spec \d+, (disk \d+, )?network \d+, runtime \d+, (restore \d+, )?agent \d+\)$/, m);
    await sb.kill();
  });

  it('snapshots are listed with size, trigger and downtime; rollback restores the files of the chosen one', async () => {
    const sb = await fx.create();
    await sb.files.write('/tmp/v', 'one');
    const s1 = await sb.snapshot({ name: 'first' });
    await sb.files.write('/tmp/v', 'two');
    const s2 = await sb.snapshot();
    await sb.files.write('/tmp/v', 'three');
    const list = await sb.snapshots();
    assert.deepEqual(list.map((s) => s.id), [s1.id, s2.id]);
    assert.equal(list[0].name, 'first');
    assert.equal(list[0].trigger, 'manual');
    assert.ok(list[0].sizeBytes > 0 && list[0].downtimeMs > 0);
    await sb.rollback(s1.id);
    assert.equal(await sb.files.read('/tmp/v'), 'one');
    assert.equal(sb.info.fromSnapshotId, s1.id);
    await sb.rollback(s2.id);
    assert.equal(await sb.files.read('/tmp/v'), 'two');
    const s3 = await sb.snapshot();
    assert.equal(s3.parentSnapshotId, s2.id, 'lineage: the snapshot knows which one the sandbox came from');
    await assert.rejects(sb.rollback('snnotasnapshot000000'), (e) => e.code === 'SNAPSHOT_NOT_FOUND');
    const other = await fx.create();
    await assert.rejects(other.rollback(s1.id), (e) => e.code === 'SNAPSHOT_NOT_FOUND', "another sandbox's snapshot is not yours to restore");
    await other.kill();
    await sb.kill();
  });

  it('fork copies a running sandbox into N that diverge; the parent is unaffected; lineage is recorded', async () => {
    const sb = await fx.create();
    const h = await sb.commands.run(COUNTER, { background: true });
    await sb.files.write('/tmp/who', 'parent');
    const copies = await sb.fork({ count: 3 });
    for (const c of copies) fx.track(c);
    assert.equal(copies.length, 3);
    assert.equal(new Set(copies.map((c) => c.id)).size, 3);
    for (const c of copies) {
      assert.equal(c.info.parentId, sb.id);
      assert.ok(c.info.fromSnapshotId);
      assert.equal(await c.files.read('/tmp/who'), 'parent', 'the file as it was at the fork');
      assert.equal((await c.commands.run('echo $SPACE_SANDBOX_ID')).stdout, `${c.id}\n`, 'each copy knows its own id');
      assert.ok((await c.commands.list()).some((p) => p.pid === h.pid && p.running), 'the counting process is in every copy');
    }
    await copies[0].files.write('/tmp/who', 'copy0');
    await copies[1].files.write('/tmp/who', 'copy1');
    assert.equal(await copies[0].files.read('/tmp/who'), 'copy0');
    assert.equal(await copies[1].files.read('/tmp/who'), 'copy1');
    assert.equal(await copies[2].files.read('/tmp/who'), 'parent');
    assert.equal(await sb.files.read('/tmp/who'), 'parent', 'the parent did not see the copies write');
    const a = await count(copies[0], h.pid);
    await copies[1].pause();
    const b = await count(copies[0], h.pid);
    assert.ok(b > a, 'a copy counts on while another is paused: independent processes');
    await copies[1].resume();
    assert.equal((await sb.refresh()).state, 'running');
    // Fork from a named snapshot too.
    const snap = await sb.snapshot({ name: 'base' });
    await sb.files.write('/tmp/who', 'later');
    const [fromSnap] = await sb.fork({ count: 1, fromSnapshot: snap.id });
    fx.track(fromSnap);
    assert.equal(await fromSnap.files.read('/tmp/who'), 'parent');
    for (const c of [...copies, fromSnap]) await c.kill();
    await sb.kill();
  });

  it('rolling snapshots every 2 s with keep=3 leave exactly the 3 newest; rollback to the oldest restores its files', async () => {
    const sb = await fx.create();
    await sb.files.write('/tmp/gen', '0');
    await sb.setSnapshotPolicy({ intervalMs: 2000, keep: 3 });
    // Wait for 5 scheduled snapshots, changing the file after each.
    let seen = 0;
    const taken = [];
    await eventually(async () => {
      const s = (await sb.snapshots()).filter((x) => x.trigger === 'schedule');
      for (const x of s) if (!taken.includes(x.id)) {
        taken.push(x.id);
        seen++;
      }
      await sb.files.write('/tmp/gen', String(seen));
      return seen >= 5;
    }, { tries: 300, everyMs: 200 });
    // While a command stream is open, scheduled snapshots wait (they would cut the stream).
    let out = '';
    const streaming = sb.commands.run('echo begin; while [ ! -f /tmp/stop ]; do sleep 0.1; done; echo end', { onStdout: (d) => (out += d) });
    const countBefore = (await sb.snapshots()).length;
    await eventually(async () => (await sb.events()).some((e) => e.type === 'snapshot-deferred'), { tries: 100, everyMs: 100 });
    await sb.files.write('/tmp/stop', '1');
    assert.equal((await streaming).stdout, 'begin\nend\n', 'the stream was not cut');
    assert.ok((await sb.snapshots()).length <= countBefore + 1);
    await sb.setSnapshotPolicy(null);
    const kept = (await sb.snapshots()).filter((x) => x.trigger === 'schedule');
    assert.equal(kept.length, 3);
    assert.deepEqual(kept.map((x) => x.id), taken.slice(-3), 'the newest three');
    const blobs = readdirSync(path.join(fx.dataDir, 'blobs', 'snapshots', 'default'));
    for (const old of taken.slice(0, -3)) assert.ok(!blobs.some((n) => n === old || n.startsWith(`${old}.`)), `expired snapshot ${old} (and its disk's stream) is deleted from storage`);
    const oldest = kept[0];
    await sb.rollback(oldest.id);
    const content = await sb.files.read('/tmp/gen');
    assert.ok(Number(content) < 5, `rolled back to an older generation (${content})`);
    await sb.kill();
  });

  it('a TCP server in an event loop gets SNAPSHOT_UNSUPPORTED_STATE naming it, and keeps serving', async () => {
    const sb = await fx.create();
    const server = "require('http').createServer((q, s) => s.end('pong')).listen(8080, () => require('fs').writeFileSync('/tmp/up', '1'))";
    const h = await sb.commands.run([...NODE, '-e', server], { background: true });
    await eventually(() => sb.files.exists('/tmp/up'));
    const err = await sb.snapshot().then(() => undefined, (e) => e);
    assert.ok(err instanceof SpaceError, 'the snapshot was refused');
    assert.equal(err.code, 'SNAPSHOT_UNSUPPORTED_STATE');
    assert.match(err.message, new RegExp(`process ${h.pid}`));
    assert.match(err.message, /TCP listener/);
    assert.equal((await sb.refresh()).state, 'running');
    const get = "require('http').get('http://127.0.0.1:8080', (r) => { let b = ''; r.on('data', (d) => (b += d)); r.on('end', () => console.log(b)); })";
    assert.equal((await sb.commands.run([...NODE, '-e', get])).stdout, 'pong\n', 'still serving');
    assert.equal((await sb.snapshots()).length, 0, 'no partial snapshot');
    await sb.kill();
  });

  it('a snapshot with one byte flipped is refused with SNAPSHOT_CORRUPT before anything is restored', async () => {
    const sb = await fx.create();
    await sb.files.write('/tmp/v', 'good');
    const s1 = await sb.snapshot();
    await sb.files.write('/tmp/v', 'current');
    const file = path.join(fx.dataDir, 'blobs', 'snapshots', 'default', s1.id);
    const bytes = readFileSync(file);
    bytes[Math.floor(bytes.length * 0.75)] ^= 0x01;
    writeFileSync(file, bytes);
    await assert.rejects(sb.rollback(s1.id), (e) => e.code === 'SNAPSHOT_CORRUPT' && e.message.includes(s1.id));
    assert.equal(await sb.files.read('/tmp/v'), 'current', 'the sandbox was not touched');
    await assert.rejects(sb.fork({ fromSnapshot: s1.id }), (e) => e.code === 'SNAPSHOT_CORRUPT');
    await sb.kill();
  });

  it('an idle sandbox hibernates by itself and wakes on the next call; so does one whose timeout says hibernate', async () => {
    const idle = await fx.create({ idleTimeoutMs: 1500 });
    await idle.files.write('/tmp/idle', 'zzz');
    const info = await eventually(async () => {
      const i = await idle.refresh();
      return i.state === 'hibernated' ? i : undefined;
    });
    assert.equal(info.idleTimeoutMs, 1500);
    assert.ok((await idle.events()).some((e) => e.type === 'idle'));
    assert.equal(await idle.files.read('/tmp/idle'), 'zzz', 'woken on demand');
    assert.equal((await idle.refresh()).state, 'running');
    await idle.kill();

    const timed = await fx.create({ timeoutMs: 5000, onTimeout: 'hibernate' });
    await timed.files.write('/tmp/t', 'kept');
    await eventually(async () => (await timed.refresh()).state === 'hibernated');
    assert.equal(await timed.files.read('/tmp/t'), 'kept');
    await timed.kill();
    const bad = await fetch(`${fx.url}/v1/sandboxes`, { method: 'POST', headers: { authorization: `Bearer ${fx.key}`, 'content-type': 'application/json' }, body: JSON.stringify({ idleTimeoutMs: 5 }) });
    assert.equal((await bad.json()).error.code, 'INVALID_LIMITS');
  });

  it('a long session (600 processes run in 256 MiB) still hibernates and wakes: the checkpoint gets room beyond the session\'s limit', async () => {
    // This runsc keeps state for every process that ever ran, and a checkpoint's work grows with
    // it: at its limit, the checkpoint ran out of memory and killed the session.
    const sb = await fx.create({ memoryMb: 256 });
    const r = await sb.commands.run('i=0; while [ $i -lt 600 ]; do /bin/true; i=$((i+1)); done; echo $i', { timeoutMs: 300_000 });
    assert.equal(r.stdout, '600\n');
    await sb.files.write('/tmp/long', 'lived');
    await sb.hibernate();
    await sb.wake();
    assert.equal(await sb.files.read('/tmp/long'), 'lived');
    assert.equal((await sb.commands.run('echo awake')).stdout, 'awake\n');
    await sb.kill();
  });

  it('killing a sandbox deletes its snapshots', async () => {
    const sb = await fx.create();
    const s = await sb.snapshot();
    await sb.kill();
    const dir = path.join(fx.dataDir, 'blobs', 'snapshots', 'default');
    assert.ok(!readdirSync(dir).includes(s.id));
    assert.equal((await (await Sandbox.connect(sb.id, fx.conn)).snapshots()).length, 0);
  });
});
