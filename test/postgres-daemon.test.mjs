// A daemon on PostgreSQL (`--database`), from outside: what it refuses at start, and what its
// users see while the database is away — 503 METADATA_UNAVAILABLE with a hint, the sandbox
// running on, a command's output still streaming — and that it carries on when it is back.
// Real runsc, a throwaway PostgreSQL (test/postgres.mjs).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { startDaemon } from '../packages/server/dist/index.js';
import { api, startTestDaemon } from './helpers.mjs';
import { startPostgres } from './postgres.mjs';

const pg = await startPostgres();
after(() => pg.stop());

describe('daemon on PostgreSQL: start-up refusals', () => {
  it('spaced refuses a password on its command line (ps shows it), naming the ways that work', () => {
    const dir = mkdtempSync('/tmp/spt-');
    try {
      const r = spawnSync(process.execPath, [new URL('../packages/server/dist/main.js', import.meta.url).pathname, '--data-dir', dir, '--listen', '127.0.0.1:0', '--database', 'postgres://space:hunter2@127.0.0.1:1/space'], { encoding: 'utf8', timeout: 30_000 });
      assert.equal(r.status, 1);
      assert.match(r.stderr, /CONFIG_INVALID: --database carries a password.*PGPASSWORD or ~\/\.pgpass.*SPACE_DATABASE/);
      assert.ok(!r.stderr.includes('hunter2'), 'the password is not echoed');
      assert.ok(!existsSync(`${dir}/spaced.json`), 'nothing started');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('an unreachable database stops the start with METADATA_UNAVAILABLE saying where, and leaves no daemon behind', async () => {
    const dir = mkdtempSync('/tmp/spt-');
    try {
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', database: `postgres://space:pw@127.0.0.1:${pg.port === 65535 ? 1 : pg.port + 1}/space` }), (e) => e.code === 'METADATA_UNAVAILABLE' && /Cannot reach PostgreSQL at 127\.0\.0\.1:\d+\/space/.test(e.message));
      assert.ok(!existsSync(`${dir}/spaced.json`));
      assert.ok(!existsSync(`${dir}/space.db`), 'no SQLite database was made instead');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('daemon on PostgreSQL: the database goes away and comes back', () => {
  let fx;
  let sb;
  before(async () => {
    fx = await startTestDaemon({ database: pg.url });
    sb = await fx.create({ template: 'minimal' });
  });
  after(async () => {
    const leaks = await fx.close();
    assert.deepEqual(leaks, []);
  });

  it('a second daemon on the same database is refused (DATABASE_IN_USE)', async () => {
    const dir = mkdtempSync('/tmp/spt-');
    try {
      await assert.rejects(startDaemon({ dataDir: dir, listen: '127.0.0.1:0', logLevel: 'silent', database: pg.url }), (e) => e.code === 'DATABASE_IN_USE');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('while it is down: 503 METADATA_UNAVAILABLE with a hint, the sandbox runs on and a streaming command keeps streaming', async () => {
    // One line per line of input would need the API; a counter that prints on its own needs nothing.
    const lines = [];
    let waiter;
    const handle = await sb.commands.start('i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done', {
      stdin: false,
      onStdout: (s) => {
        lines.push(...s.split('\n').filter(Boolean));
        waiter?.();
      },
    });
    const more = (n) => {
      const target = lines.length + n;
      return new Promise((resolve) => {
        waiter = () => lines.length >= target && resolve();
        waiter();
      });
    };
    await more(2);
    pg.halt();
    try {
      const r = await api(fx, 'GET', '/v1/sandboxes');
      assert.equal(r.status, 503);
      assert.equal(r.body.error.code, 'METADATA_UNAVAILABLE');
      assert.match(r.body.error.hint, /running sandboxes keep running/);
      const before = lines.length;
      await more(5);
      assert.ok(lines.length >= before + 5, 'output arrived while the database was down');
    } finally {
      pg.resume();
    }
    const list = await api(fx, 'GET', '/v1/sandboxes');
    assert.equal(list.status, 200, 'the daemon carries on by itself once the database is back');
    assert.deepEqual(list.body.items.map((x) => x.id), [sb.id]);
    assert.equal((await sb.commands.run('echo alive')).stdout, 'alive\n');
    await handle.kill();
  });
});
