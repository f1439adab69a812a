// A real S3-compatible server for the tests: OpenStack Swift from Debian (account, container,
// object and proxy servers, one-replica rings) with its s3api middleware and tempauth, all in
// a temporary directory, on free loopback ports. Swift reads /etc/swift/swift.conf whatever
// its configuration says, so the servers run in a private mount namespace where a bind mount
// puts this directory's configuration there: the host's /etc/swift is neither read nor changed.
// Why Swift and not Ceph's radosgw: docs/architecture.md ("Object storage for tests").
import { execFileSync, spawn } from 'node:child_process';
import { chownSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { freePort } from './free-port.mjs';
import { startPostgres } from './postgres.mjs';
import path from 'node:path';

/** Runs a program to its end without blocking the event loop; rejects with its stderr. */
function run(cmd, args) {
  return new Promise((resolve, reject) => {
    const p = spawn(cmd, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    p.stderr.on('data', (d) => (err += d));
    p.on('error', reject);
    p.on('exit', (code) => (code === 0 ? resolve() : reject(new Error(`${cmd} failed (${code}): ${err}`))));
  });
}

/** Whether Swift's servers are installed (Debian's swift-proxy, swift-object, …). */
export function swiftInstalled() {
  return ['swift-proxy-server', 'swift-object-server', 'swift-container-server', 'swift-account-server'].every((b) => existsSync(`/usr/bin/${b}`));
}

const server = (name, port, dir) => `[DEFAULT]
devices = ${dir}/srv
mount_check = false
bind_ip = 127.0.0.1
bind_port = ${port}
workers = 0
user = swift
swift_dir = ${dir}/etc
log_level = WARNING
[pipeline:main]
pipeline = ${name}-server
[app:${name}-server]
use = egg:swift#${name}
`;

const proxy = (port, dir) => `[DEFAULT]
bind_ip = 127.0.0.1
bind_port = ${port}
workers = 0
user = swift
swift_dir = ${dir}/etc
log_level = WARNING
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache s3api tempauth copy slo dlo proxy-logging proxy-server
[app:proxy-server]
use = egg:swift#proxy
allow_account_management = true
account_autocreate = true
[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:healthcheck]
use = egg:swift#healthcheck
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:1
[filter:s3api]
use = egg:swift#s3api
location = us-east-1
[filter:tempauth]
use = egg:swift#tempauth
user_space_test = secretkey .admin
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
[filter:dlo]
use = egg:swift#dlo
`;

/**
 * PostgreSQL (test/postgres.mjs) and the S3 server, started side by side; when one fails to
 * start, the other is stopped before the error is thrown (nothing is left running).
 *
 * @example const [pg, s3] = await startPostgresAndS3();
 */
export async function startPostgresAndS3() {
  const [pg, s3] = await Promise.allSettled([startPostgres(), startS3()]);
  if (pg.status === 'fulfilled' && s3.status === 'fulfilled') return [pg.value, s3.value];
  await Promise.all([pg, s3].map((r) => (r.status === 'fulfilled' ? r.value.stop() : undefined)));
  throw [pg, s3].find((r) => r.status === 'rejected').reason;
}

/**
 * Starts Swift with S3 on loopback; `bucket` is made. Returns the endpoint, credentials (the
 * S3 access key is tempauth's `account:user`), a `url` for `--blob-store`, and controls.
 * @example const s3 = await startS3(); … await s3.stop();
 */
export async function startS3({ bucket = 'space-test' } = {}) {
  if (!swiftInstalled()) throw new Error('OpenStack Swift is not installed: run ./space (the set-up installs Debian\'s swift-proxy, swift-object, swift-container, swift-account)');
  const dir = mkdtempSync('/tmp/spt-s3-');
  mkdirSync(`${dir}/etc`);
  mkdirSync(`${dir}/srv/d1`, { recursive: true });
  const [proxyPort, accountPort, containerPort, objectPort] = await Promise.all([freePort(), freePort(), freePort(), freePort()]);
  writeFileSync(`${dir}/etc/swift.conf`, '[swift-hash]\nswift_hash_path_suffix = space-test\nswift_hash_path_prefix = space-test\n[storage-policy:0]\nname = Policy-0\ndefault = yes\n');
  const rings = [['account', accountPort], ['container', containerPort], ['object', objectPort]];
  for (const [name, port] of rings) writeFileSync(`${dir}/etc/${name}-server.conf`, server(name, port, dir));
  // One-replica rings of one device each, made in one Python process with Swift's own
  // RingBuilder (swift-ring-builder would start Python nine times: ~9 s here).
  const build = rings.map(([name, port]) => `b = RingBuilder(6, 1, 0); b.add_dev({'region': 1, 'zone': 1, 'ip': '127.0.0.1', 'port': ${port}, 'device': 'd1', 'weight': 1}); b.rebalance(); b.get_ring().save('${dir}/etc/${name}.ring.gz')`);
  await run('/usr/bin/python3', ['-c', ['from swift.common.ring import RingBuilder', ...build].join('\n')]);
  writeFileSync(`${dir}/etc/proxy-server.conf`, proxy(proxyPort, dir));
  const uid = Number(execFileSync('id', ['-u', 'swift'], { encoding: 'utf8' }));
  const gid = Number(execFileSync('id', ['-g', 'swift'], { encoding: 'utf8' }));
  for (const p of [dir, `${dir}/srv`, `${dir}/srv/d1`]) chownSync(p, uid, gid);
  const script = [
    `mount --bind ${dir}/etc /etc/swift`,
    ...['account', 'container', 'object'].map((n) => `swift-${n}-server ${dir}/etc/${n}-server.conf >> ${dir}/${n}.log 2>&1 &`),
    `swift-proxy-server ${dir}/etc/proxy-server.conf >> ${dir}/proxy.log 2>&1 &`,
    'wait',
  ].join('\n');
  // A slave mount namespace (the bind of /etc/swift stays in it): a private one would hold a
  // copy of every mount of the host, a test daemon's disk pool among them, while Swift runs.
  const child = spawn('unshare', ['--mount', '--propagation', 'slave', 'bash', '-c', script], { detached: true, stdio: 'ignore' });
  child.unref();
  const endpoint = `http://127.0.0.1:${proxyPort}`;
  const stop = async () => {
    // Swift's servers make sessions of their own: kill them by their configuration's directory.
    try {
      execFileSync('pkill', ['-KILL', '-f', `python3 /usr/bin/swift-[a-z]+-server ${dir}/etc/`]);
    } catch {
      // none left
    }
    try {
      process.kill(child.pid, 'SIGKILL');
    } catch {
      // gone already
    }
    rmSync(dir, { recursive: true, force: true });
  };
  // Python's imports take a few seconds: wait for the proxy, then for the bucket (which also
  // needs the account and container servers).
  const { S3Client, CreateBucketCommand } = await import('@aws-sdk/client-s3');
  const credentials = { accessKeyId: 'space:test', secretAccessKey: 'secretkey' };
  const client = new S3Client({ region: 'us-east-1', endpoint, forcePathStyle: true, credentials, maxAttempts: 1 });
  // Up to 2 minutes: on a CI host busy with sandboxes in the other lane, Swift's servers took
  // longer than 30 s once (the proxy answering "Please reduce your request rate" meanwhile).
  let last;
  for (const until = Date.now() + 120_000; Date.now() < until; ) {
    try {
      await client.send(new CreateBucketCommand({ Bucket: bucket }));
      last = undefined;
      break;
    } catch (err) {
      last = err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  client.destroy();
  if (last) {
    await stop();
    throw new Error(`Swift did not come up in 120 s: ${last.message} (logs were in ${dir})`);
  }
  return {
    endpoint,
    bucket,
    credentials,
    /** The `--blob-store` URL (credentials go in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY). */
    url: `s3://${bucket}?endpoint=${endpoint}`,
    /** Environment a daemon needs to use it. */
    env: { AWS_ACCESS_KEY_ID: credentials.accessKeyId, AWS_SECRET_ACCESS_KEY: credentials.secretAccessKey },
    /** Stops the proxy only: the object store is unreachable until resumeProxy(). */
    haltProxy() {
      // (not the shell that started it, whose command line names it too: it holds the namespace)
      execFileSync('pkill', ['-KILL', '-f', `python3 /usr/bin/swift-proxy-server ${dir}/etc/`]);
    },
    /** Starts the proxy again, in the servers' mount namespace, and waits until it answers. */
    async resumeProxy() {
      spawn('nsenter', ['-t', String(child.pid), '-m', 'bash', '-c', `exec swift-proxy-server ${dir}/etc/proxy-server.conf >> ${dir}/proxy.log 2>&1`], { detached: true, stdio: 'ignore' }).unref();
      for (let i = 0; i < 300; i++) {
        if ((await fetch(`${endpoint}/healthcheck`).catch(() => undefined))?.ok) return;
        await new Promise((r) => setTimeout(r, 100));
      }
      throw new Error('the Swift proxy did not come back in 30 s');
    },
    stop,
    dir,
  };
}
