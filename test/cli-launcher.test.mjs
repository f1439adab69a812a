// The `space` launcher (packages/cli/bin/space): what the PATH's `space` runs. It keeps node from
// parsing NODE_EXTRA_CA_CERTS at every start and hands the CAs to the SDK for https instead; a
// daemon reached over https with a private CA must still be trusted through that variable.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import https from 'node:https';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { makePki } from './tls-server.mjs';

const LAUNCHER = new URL('../packages/cli/bin/space', import.meta.url).pathname;

function space(args, env, bin = LAUNCHER) {
  return new Promise((resolve) => {
    execFile(bin, args, { env, timeout: 60_000 }, (err, stdout, stderr) => resolve({ code: err ? (err.code ?? 1) : 0, stdout, stderr }));
  });
}

describe('the space launcher', () => {
  let dir, server, url, seen;
  before(async () => {
    dir = mkdtempSync('/tmp/space-launcher-');
    const pki = await makePki(['localhost']);
    writeFileSync(path.join(dir, 'ca.pem'), pki.caPem);
    seen = [];
    // A stand-in daemon over https: answers the list call with no sandboxes.
    server = https.createServer({ cert: pki.certPem, key: pki.keyPem }, (req, res) => {
      seen.push({ url: req.url, auth: req.headers.authorization });
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ items: [], nextCursor: null }));
    });
    await new Promise((r) => server.listen(0, '127.0.0.1', r));
    url = `https://localhost:${server.address().port}`;
  });
  after(() => {
    server?.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const baseEnv = () => {
    const env = { PATH: process.env.PATH, HOME: dir, XDG_CONFIG_HOME: dir, SPACE_URL: url, SPACE_API_KEY: 'sk_test' };
    return env;
  };

  it('trusts a private CA given in NODE_EXTRA_CA_CERTS, as node would', async () => {
    const r = await space(['ls'], { ...baseEnv(), NODE_EXTRA_CA_CERTS: path.join(dir, 'ca.pem') });
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^ID\s+STATE/);
    assert.equal(seen.at(-1).auth, 'Bearer sk_test');
  });

  it('without that CA the same call fails on the certificate (so the test can fail)', async () => {
    const r = await space(['ls'], baseEnv());
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /certificate/i);
  });

  it('an unreadable NODE_EXTRA_CA_CERTS is a CONFIG_INVALID that names it, not an unreachable daemon', async () => {
    const r = await space(['ls'], { ...baseEnv(), NODE_EXTRA_CA_CERTS: path.join(dir, 'missing.pem') });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /CONFIG_INVALID: Cannot read the extra CA certificates .*missing\.pem/);
  });

  it('runs through a symlink, as `space up` installs it on the PATH', async () => {
    const link = path.join(dir, 'space');
    symlinkSync(LAUNCHER, link);
    const r = await space(['--version'], baseEnv(), link);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stdout, /^\d+\.\d+\.\d+\n$/);
  });
});
