// The `base` template (Debian bookworm made by mmdebstrap) through the CLI: built once with
// progress shown, cached, and python3, bash, git and curl run inside.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { TEMPLATES_DIR, cliRunner, leftovers, removeDataDir } from './helpers.mjs';

const home = mkdtempSync('/tmp/spb-home-');
const dataDir = mkdtempSync('/tmp/spb-');
const space = cliRunner(home);

describe('base template', () => {
  let id;
  before(async () => {
    const up = await space('up', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR);
    assert.equal(up.code, 0, up.stderr);
  });
  after(async () => {
    if (id) await space('kill', id);
    await space('down', '--data-dir', dataDir);
    assert.deepEqual(leftovers(dataDir, id ? [id] : []), []);
    assert.deepEqual(removeDataDir(dataDir), []);
    rmSync(home, { recursive: true, force: true });
  });

  it('builds (or finds cached) with progress, then reports ready', async () => {
    const b = await space('template', 'build', 'base');
    assert.equal(b.code, 0, b.stderr);
    assert.match(b.stdout, /base ready/);
    const ls = await space('template', 'ls', '--json');
    assert.equal(JSON.parse(ls.stdout).find((t) => t.name === 'base').state, 'ready');
  });

  it('python3, bash, git and curl run inside; the default user exists', async () => {
    const c = await space('create', '--template', 'base', '--memory', '512');
    assert.equal(c.code, 0, c.stderr);
    id = c.stdout.trim();
    const py = await space('exec', id, '--', 'python3', '-c', 'import sys, hashlib; print(sys.version_info[0], hashlib.sha256(b"x").hexdigest()[:8])');
    assert.equal(py.code, 0, py.stderr);
    assert.equal(py.stdout, '3 2d711642\n');
    const tools = await space('exec', id, '--', 'bash', '-c', 'echo $BASH_VERSION; git --version; curl --version | head -1; id -un; echo $HOME');
    assert.equal(tools.code, 0, tools.stderr);
    assert.match(tools.stdout, /^5\.\d/);
    assert.match(tools.stdout, /git version 2\./);
    assert.match(tools.stdout, /curl 7\./);
    assert.match(tools.stdout, /\nuser\n\/home\/user\n$/);
  });
});
