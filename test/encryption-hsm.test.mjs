// Tenant keys that never leave an HSM: SoftHSM2, started and initialised by the test itself
// (its own config, token directory, token and AES-256 key), through the PKCS#11 provider.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { TEMPLATES_DIR, api, makeNodeKey, startTestDaemon } from './helpers.mjs';

const MODULE = '/usr/lib/softhsm/libsofthsm2.so';
const SPACED = new URL('../packages/server/dist/main.js', import.meta.url).pathname;

describe('encryption keys in an HSM (PKCS#11, SoftHSM2)', () => {
  let fx;
  let hsm;
  before(async () => {
    hsm = mkdtempSync('/tmp/spt-hsm-');
    writeFileSync(path.join(hsm, 'softhsm2.conf'), `directories.tokendir = ${hsm}\nobjectstore.backend = file\nlog.level = ERROR\n`);
    process.env.SOFTHSM2_CONF = path.join(hsm, 'softhsm2.conf');
    execFileSync('softhsm2-util', ['--init-token', '--free', '--label', 'space-test', '--pin', '1234', '--so-pin', '5678'], { stdio: 'ignore' });
    // softhsm2-util reads the key file as a C string: 32 bytes without NUL or newline.
    writeFileSync(path.join(hsm, 'k.bin'), randomBytes(48).toString('base64').slice(0, 32));
    execFileSync('softhsm2-util', ['--import', path.join(hsm, 'k.bin'), '--aes', '--token', 'space-test', '--label', 'tenant-hsm', '--id', '01', '--pin', '1234'], { stdio: 'ignore' });
    rmSync(path.join(hsm, 'k.bin'));
    fx = await startTestDaemon({ pkcs11: { module: MODULE, tokenLabel: 'space-test', pin: '1234' } });
  });
  after(async () => {
    assert.deepEqual(await fx.close(), []);
    rmSync(hsm, { recursive: true, force: true });
  });

  it('snapshots under an HSM key restore; revoked → KEY_REVOKED; enabled → restore again', async () => {
    const set = await api(fx, 'POST', '/v1/encryption-keys', { json: { provider: 'pkcs11', ref: 'tenant-hsm' } });
    assert.equal(set.status, 201, JSON.stringify(set.body));
    assert.match(set.body.description, /PKCS#11 token space-test/);
    const sb = await fx.create();
    await sb.files.write('/tmp/v', 'hsm');
    const s = await sb.snapshot();
    await sb.files.write('/tmp/v', 'changed');
    await sb.rollback(s.id);
    assert.equal(await sb.files.read('/tmp/v'), 'hsm');
    await api(fx, 'POST', `/v1/encryption-keys/${set.body.id}/revoke`);
    const r = await api(fx, 'POST', `/v1/sandboxes/${sb.id}/rollback`, { json: { snapshotId: s.id } });
    assert.equal(r.body.error.code, 'KEY_REVOKED');
    await api(fx, 'POST', `/v1/encryption-keys/${set.body.id}/enable`);
    await sb.rollback(s.id);
    assert.equal(await sb.files.read('/tmp/v'), 'hsm');
    await sb.kill();
  });

  it('a label the token does not have is refused when set; a wrong PIN stops the daemon at start', async () => {
    const r = await api(fx, 'POST', '/v1/encryption-keys', { json: { provider: 'pkcs11', ref: 'no-such-key' } });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.code, 'KEY_INVALID');
    assert.match(r.body.error.message, /No secret key labelled "no-such-key"/);
    // In its own process, as an operator starts it (PKCS#11 login state is per process).
    const dataDir = mkdtempSync('/tmp/spt-pin-');
    makeNodeKey(dataDir);
    writeFileSync(path.join(dataDir, 'pin'), '0000\n');
    const spaced = (token) => spawnSync(process.execPath, [SPACED, '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--templates-dir', TEMPLATES_DIR, '--pkcs11-module', MODULE, '--pkcs11-token', token, '--pkcs11-pin-file', path.join(dataDir, 'pin')], { encoding: 'utf8', timeout: 60_000 });
    const wrongPin = spaced('space-test');
    assert.equal(wrongPin.status, 1);
    assert.match(wrongPin.stderr, /KEY_INVALID: Logging in to PKCS#11 token space-test failed \(wrong PIN\?\)/);
    const noToken = spaced('no-token');
    assert.equal(noToken.status, 1);
    assert.match(noToken.stderr, /KEY_INVALID: No PKCS#11 token labelled "no-token"/);
    rmSync(dataDir, { recursive: true, force: true });
  });
});
