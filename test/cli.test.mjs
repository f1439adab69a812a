// The CLI end to end, as a new user would run it: up, create, exec, cp, ls, inspect, keys,
// kill, down — through the real binary, its config file and a background daemon.
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { after, before, describe, it } from 'node:test';
import { TEMPLATES_DIR, cliRunner, leftovers, removeDataDir } from './helpers.mjs';

const home = mkdtempSync('/tmp/spc-home-');
const dataDir = mkdtempSync('/tmp/spc-');
const space = cliRunner(home);

describe('space CLI', () => {
  const ids = [];
  before(async () => {
    const up = await space('up', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR);
    assert.equal(up.code, 0, up.stderr);
    assert.match(up.stdout, /url:\s+http:\/\/127\.0\.0\.1:\d+/);
    assert.match(up.stdout, new RegExp(`API key:\\s+${dataDir}/admin.key`));
    assert.match(up.stdout, /^  disks:\s+on \(a new data directory on a host with btrfs and loop devices\); the pool takes 12\.0 GiB of the host's disk: --disk-pool-size$/m, 'a new data directory gets disks, says why, and what its pool takes (8 GiB for the tests, and 4 GiB of room for work files)');
  });
  after(async () => {
    for (const id of ids) await space('kill', id);
    const down = await space('down', '--data-dir', dataDir);
    assert.equal(down.code, 0, down.stderr);
    assert.deepEqual(leftovers(dataDir, ids), []);
    assert.deepEqual(removeDataDir(dataDir), []);
    rmSync(home, { recursive: true, force: true });
  });

  it('template build --dir with a start command shows progress; ls, inspect timings, pool, rm', async () => {
    const root = mkdtempSync('/tmp/spc-rootfs-');
    mkdirSync(`${root}/bin`);
    copyFileSync('/bin/busybox', `${root}/bin/busybox`);
    for (const a of ['sh', 'cat', 'sleep', 'test', 'echo']) symlinkSync('busybox', `${root}/bin/${a}`);
    writeFileSync(`${root}/greeting`, 'hi from a directory\n');
    const b = await space('template', 'build', 'fromdir', '--dir', root, '--start', 'echo up > /tmp/up; sleep 1000', '--ready', 'test -f /tmp/up', '-e', 'GREETING=hello');
    rmSync(root, { recursive: true, force: true });
    assert.equal(b.code, 0, b.stderr);
    assert.equal(b.stdout, 'fromdir ready\n');
    assert.match(b.stderr, /building fromdir \[#*\.*\]\s+\d+% taking the template snapshot/, 'progress bar with the current step');
    const ls = await space('template', 'ls');
    assert.match(ls.stdout, /^fromdir\s+ready\s+rootfs image\s+\d+\.\dM\s+0\/0\s+echo up/m);
    const c = await space('create', '--template', 'fromdir');
    assert.equal(c.code, 0, c.stderr);
    const id = c.stdout.trim();
    ids.push(id);
    assert.equal((await space('exec', id, '--', 'sh', '-c', 'cat /greeting /tmp/up; echo $GREETING')).stdout, 'hi from a directory\nup\nhello\n');
    assert.match((await space('inspect', id)).stdout, /^created\s+\d+ ms from snapshot \(queue \d+ \+ restore \d+ \+ agent \d+ \+ identity \d+ ms\)$/m);
    const rmBusy = await space('template', 'rm', 'fromdir');
    assert.equal(rmBusy.code, 1);
    assert.match(rmBusy.stderr, /TEMPLATE_IN_USE/);
    assert.equal((await space('template', 'pool', 'fromdir', '1')).code, 0);
    assert.equal((await space('kill', id)).code, 0);
    assert.equal((await space('template', 'pool', 'fromdir', '0')).code, 0);
    const rm = await space('template', 'rm', 'fromdir');
    assert.equal(rm.code, 0, rm.stderr);
  });

  it('the first key is readable only by its owner', () => {
    assert.equal(statSync(`${dataDir}/admin.key`).mode & 0o077, 0);
  });

  it('up puts `space` on the PATH; is idempotent; a second daemon gets a context of its own and does not take the CLI over', async () => {
    const again = await space('up', '--data-dir', dataDir);
    assert.equal(again.code, 0);
    assert.match(again.stdout, /context:\s+spc-\S+ \(current\)/);
    const link = `${home}/bin/space`;
    assert.match(again.stdout, new RegExp(`command:\\s+${link}`));
    const version = await new Promise((r) => execFile(link, ['--version'], (err, stdout) => r(err ? err.message : stdout)));
    assert.match(version, /^\d+\.\d+\.\d+\n$/, 'the installed command runs');

    const other = mkdtempSync('/tmp/spc2-');
    const up2 = await space('up', '--data-dir', other, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR, '--context', 'second');
    assert.equal(up2.code, 0, up2.stderr);
    assert.match(up2.stdout, /context:\s+second \(not current: use it with `space --context second …`/);
    const url2 = /url:\s+(\S+)/.exec(up2.stdout)[1];
    assert.notEqual(url2, /url:\s+(\S+)/.exec(again.stdout)[1]);
    const ctx = await space('context', 'ls');
    assert.match(ctx.stdout, /^\*\s+spc-\S+\s+http:\S+\s+\S+\s+running$/m, 'the first daemon is still current');
    assert.match(ctx.stdout, new RegExp(`^\\s+second\\s+${url2}\\s+${other}\\s+running$`, 'm'));
    // A sandbox made through --context lives on the second daemon only.
    const made = await space('--context', 'second', 'create');
    assert.equal(made.code, 0, made.stderr);
    const sid = made.stdout.trim();
    assert.match((await space('--context', 'second', 'ls')).stdout, new RegExp(sid));
    assert.doesNotMatch((await space('ls')).stdout, new RegExp(sid));
    assert.equal((await space('--context', 'second', 'kill', sid)).code, 0);
    assert.match((await space('--context', 'nope', 'ls')).stderr, /no context "nope" \(known: .*second/);
    // Stopping the second daemon leaves the CLI on the first; stopping the current one says so.
    const down2 = await space('down', '--data-dir', other);
    assert.equal(down2.code, 0);
    assert.doesNotMatch(down2.stdout, /current context/);
    assert.equal((await space('ls')).code, 0, 'the default configuration still reaches the first daemon');
    assert.equal((await space('context', 'use', 'second')).code, 0);
    const unreachable = await space('ls');
    assert.match(unreachable.stderr, /DAEMON_UNREACHABLE[\s\S]*context "second"[\s\S]*space up --data-dir/);
    assert.equal((await space('context', 'use', /context:\s+(\S+)/.exec(again.stdout)[1])).code, 0);
    assert.equal((await space('context', 'rm', 'second')).code, 0);
    removeDataDir(other);
  });

  it('up asks the daemon, not its pid: after a SIGKILL it starts a new one', async () => {
    const dir = mkdtempSync('/tmp/spc3-');
    const up = await space('up', '--data-dir', dir, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR, '--context', 'crash');
    assert.equal(up.code, 0, up.stderr);
    const pid = Number(/pid:\s+(\d+)/.exec(up.stdout)[1]);
    process.kill(pid, 'SIGKILL');
    // Until reaped it may be a zombie that kill(pid, 0) still finds: up must not be fooled.
    const again = await space('up', '--data-dir', dir, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR, '--context', 'crash');
    assert.equal(again.code, 0, again.stderr);
    assert.match(again.stderr, new RegExp(`spaced \\(pid ${pid}\\) is gone without stopping`));
    const pid2 = Number(/pid:\s+(\d+)/.exec(again.stdout)[1]);
    assert.notEqual(pid2, pid);
    assert.equal((await space('--context', 'crash', 'ls')).code, 0, 'the new daemon answers');
    assert.equal((await space('down', '--data-dir', dir)).code, 0);
    assert.equal((await space('context', 'rm', 'crash')).code, 0);
    removeDataDir(dir);
  });

  it('create, exec (exit code passes through), cp both ways, ls, inspect, kill', async () => {
    const c = await space('create', '--memory', '256', '--label', 'who=cli', '--env', 'FOO=bar', '--timeout', '10m');
    assert.equal(c.code, 0, c.stderr);
    const id = c.stdout.trim();
    ids.push(id);
    assert.match(id, /^sb[a-z0-9]{18}$/);

    const e = await space('exec', id, '--', 'sh', '-c', 'echo $FOO; echo oops >&2; exit 42');
    assert.deepEqual([e.code, e.stdout, e.stderr], [42, 'bar\n', 'oops\n']);
    const cwd = await space('exec', id, '--cwd', '/tmp', '--env', 'X=1', '--', 'sh -c "pwd; echo $X"');
    assert.equal(cwd.stdout, '/tmp\n1\n');

    const local = `${home}/in.txt`;
    writeFileSync(local, 'payload\n');
    assert.equal((await space('cp', local, `${id}:/tmp/in.txt`)).code, 0);
    assert.equal((await space('exec', id, '--', 'cat', '/tmp/in.txt')).stdout, 'payload\n');
    assert.equal((await space('cp', `${id}:/tmp/in.txt`, `${home}/out.txt`)).code, 0);
    assert.equal(readFileSync(`${home}/out.txt`, 'utf8'), 'payload\n');

    // A terminal that reports no size (`script` with none above it) gets 80x24, as ssh gives it
    // (the API refuses 0), and the shell's exit code passes through.
    const term = await space.inTerminal('echo size=$(stty size)\nexit 7\n', 'shell', id);
    assert.equal(term.code, 7, term.output);
    assert.match(term.output, /size=24 80/);

    const ls = await space('ls');
    assert.match(ls.stdout, new RegExp(`${id}\\s+running\\s+minimal`));
    const lsj = JSON.parse((await space('ls', '--json', '--label', 'who=cli')).stdout);
    assert.deepEqual(lsj.map((s) => s.id), [id]);
    const info = JSON.parse((await space('inspect', id, '--json')).stdout);
    assert.equal(info.metadata.who, 'cli');
    assert.ok(info.usage.rssBytes > 0);

    assert.match((await space('kill', id)).stdout, /killed/);
    const after = await space('exec', id, '--', 'true');
    assert.equal(after.code, 1);
    assert.match(after.stderr, /SANDBOX_NOT_RUNNING/);
  });

  it('sessions from the CLI: pause, resume, snapshot, snapshots, fork, rollback, hibernate, wake, snapshot-policy, events', async () => {
    const id = (await space('create', '--memory', '256')).stdout.trim();
    ids.push(id);
    const ok = async (...args) => {
      const r = await space(...args);
      assert.equal(r.code, 0, `space ${args.join(' ')}: ${r.stderr}`);
      return r.stdout;
    };
    assert.match(await ok('pause', id), /paused/);
    assert.match(await ok('resume', id), /running/);
    await ok('exec', id, '--', 'sh', '-c', 'echo one > /tmp/v');
    const snap = (await ok('snapshot', id, '--name', 'first')).trim();
    assert.match(snap, /^sn[a-z0-9]{18}$/);
    await ok('exec', id, '--', 'sh', '-c', 'echo two > /tmp/v');
    const list = JSON.parse(await ok('snapshots', id, '--json'));
    assert.deepEqual(list.map((s) => [s.id, s.name]), [[snap, 'first']]);
    assert.match(await ok('snapshots', id), new RegExp(`${snap}.*manual.*first`));
    const forks = (await ok('fork', id, '-n', '2')).trim().split('\n');
    assert.equal(forks.length, 2);
    ids.push(...forks);
    for (const f of forks) assert.equal(await ok('exec', f, '--', 'cat', '/tmp/v'), 'two\n');
    const fromSnap = (await ok('fork', id, '--from', snap)).trim();
    ids.push(fromSnap);
    assert.equal(await ok('exec', fromSnap, '--', 'cat', '/tmp/v'), 'one\n');
    await ok('rollback', id, snap);
    assert.equal(await ok('exec', id, '--', 'cat', '/tmp/v'), 'one\n');
    assert.match(await ok('hibernate', id), /hibernated/);
    assert.match(await ok('wake', id), /running/);
    assert.match(await ok('snapshot-policy', id, '--every', '10m', '--keep', '6'), /every 600000 ms, keep 6/);
    assert.match(await ok('snapshot-policy', id, '--off'), /no rolling snapshots/);
    assert.match(await ok('events', id), /hibernated to snapshot/);
    // Deleting snapshots: one the sandbox has goes; a wrong id is refused and changes nothing.
    const extra = (await ok('snapshot', id)).trim();
    const bad = await space('snapshot-rm', id, 'snnotasnapshot0000000');
    assert.equal(bad.code, 1);
    assert.match(bad.stderr, /SNAPSHOT_NOT_FOUND/);
    assert.equal(await ok('snapshot-rm', id, snap, extra), `${snap} deleted\n${extra} deleted\n`);
    assert.ok(!JSON.parse(await ok('snapshots', id, '--json')).some((s) => [snap, extra].includes(s.id)));
    for (const f of [...forks, fromSnap]) await ok('kill', f);
  });

  it('keys create, ls, revoke; a tenant key sees only its own sandboxes', async () => {
    const k = await space('keys', 'create', '--tenant', 'acme', '--name', 'acme-ci', '--json');
    assert.equal(k.code, 0, k.stderr);
    const { key, record } = JSON.parse(k.stdout);
    const ls = await space('keys', 'ls');
    assert.doesNotMatch(ls.stdout, /acme-ci/, 'the admin of "default" lists its own tenant\'s keys');
    const asAcme = await cliRunner(home, { SPACE_API_KEY: key })('ls');
    assert.equal(asAcme.code, 0, asAcme.stderr);
    assert.equal(asAcme.stdout.trim().split('\n').length, 1, 'only the header: acme has no sandboxes');
    const rv = await cliRunner(home, { SPACE_API_KEY: key })('keys', 'revoke', record.id);
    assert.equal(rv.code, 0, rv.stderr);
    const denied = await cliRunner(home, { SPACE_API_KEY: key })('ls');
    assert.equal(denied.code, 1);
    assert.match(denied.stderr, /UNAUTHENTICATED/);
  });

  it('errors name a stable code and a hint', async () => {
    const r = await space('inspect', 'sbnosuchsandbox00000');
    assert.equal(r.code, 1);
    assert.match(r.stderr, /SANDBOX_NOT_FOUND/);
    assert.match(r.stderr, /hint: /);
    const bad = await space('create', '--memory', '1');
    assert.match(bad.stderr, /INVALID_LIMITS/);
    const ids = async () => (await space('ls')).stdout.split('\n').slice(1).map((l) => l.split(' ')[0]).filter(Boolean).sort();
    const before = await ids();
    const badSize = await space('create', '--disk', '10GG');
    assert.equal(badSize.code, 1);
    assert.match(badSize.stderr, /INVALID_LIMITS.*--disk/);
    const tooBig = await space('create', '--disk', '100T');
    assert.match(tooBig.stderr, /INVALID_LIMITS/);
    assert.deepEqual(await ids(), before, 'neither made a sandbox');
  });

  it('space up gives sandboxes disks (the default on a node of its own): --disk sizes one, inspect shows it', async () => {
    const c = await space('create', '--disk', '2G');
    assert.equal(c.code, 0, c.stderr);
    const id = c.stdout.trim();
    ids.push(id);
    assert.match((await space('inspect', id)).stdout, /^disk used\s+\d+ MiB of 2048 MiB$/m);
    assert.equal((await space('kill', id)).code, 0);
  });

  it('doctor reports which drivers can run here', async () => {
    const d = await space('doctor', '--json');
    const r = JSON.parse(d.stdout);
    const g = r.drivers.find((x) => x.driver === 'gvisor');
    assert.equal(g.available, true);
    assert.ok(g.checks.find((c) => c.name === 'runsc').ok);
    // ./space installs QEMU, so the microVM driver runs here too, under emulation (doctor says why).
    const m = r.drivers.find((x) => x.driver === 'microvm');
    assert.equal(m.available, true, JSON.stringify(m.checks));
    assert.match(m.checks.find((c) => c.name === 'acceleration').detail, /^(kvm|tcg): /);
  });
});

