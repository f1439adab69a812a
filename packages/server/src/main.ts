#!/usr/bin/env node
/**
 * `spaced` — the SPACE daemon, in the foreground. Logs JSON lines to stdout; SIGTERM/SIGINT
 * stop it gracefully (sandboxes keep running and are re-adopted on the next start).
 *
 * Usage: spaced [--data-dir DIR] [--listen HOST:PORT] [--templates-dir DIR] [--max-sandboxes N] [--max-memory SIZE] [--pool minimal=2] [--e2b-listen HOST:PORT|off] [--e2b-internet allow|deny] [--e2b-public-traffic allow|deny]
 *        [--pkcs11-module LIB --pkcs11-token LABEL --pkcs11-pin-file FILE]
 *        [--egress on|off] [--sandbox-net CIDR] [--egress-port N] [--egress-ca-file PEM] [--egress-host NAME=IP ...]
 *        [--ingress-listen HOST:PORT|off] [--ingress-domain DOMAIN] [--ingress-cert PEM --ingress-key PEM]
 *        [--ingress-max-connections N]
 *        [--driver gvisor|microvm] [--drivers gvisor,microvm] [--microvm-accel auto|kvm|tcg] [--microvm-kernel-deb FILE]
 *        [--disks auto|on|off] [--disk-pool DIR] [--disk-default 5G] [--disk-max 64G] [--disk-pool-size 32G] [--volumes auto|on|off]
 *        [--database postgres://USER@HOST:PORT/DB] [--blob-store file:///PATH|s3://BUCKET?endpoint=URL] [--work-dir DIR]
 *        [--node-name NAME] [--node-lost-after SECONDS] [--advertise-url http://HOST:PORT]
 */
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { setFlagsFromString } from 'node:v8';
import { parseSizeMb } from '@space/api';
import { checkDatabaseUrl, parseAccel, parseCount, parseVolumesMode, parseDisksMode, parseDriver, parseDrivers, parseE2bInternet, parseE2bPublicTraffic, parsePools, startDaemon } from './daemon.js';
import { parseEgressHosts } from './networking.js';
import { DAEMON_OPTIONS } from './flags.js';

// The daemon relays bulk bytes (ingress, egress, snapshot streams) through short-lived Buffers
// that V8 counts against its heap's global limit until a scavenge frees them. With V8's own
// growing factor for a heap that allocates little JavaScript (~1.1x), that limit sits a few MiB
// above the live heap, so a 100 MB download through the ingress ran ~23 full mark-compacts on
// five threads and the daemon spent twice the CPU of the same relay in a small process.
// Doubling the heap at each full GC instead: 1 full GC per 400 MB, half the CPU
// (docs/ingress.md, "Throughput").
setFlagsFromString('--heap-growing-percent=100');

const { values } = parseArgs({ options: DAEMON_OPTIONS });

try {
  if (values.egress && values.egress !== 'on' && values.egress !== 'off') throw Object.assign(new Error('--egress must be on or off'), { code: 'BAD_REQUEST' });
  const egress = {
    ...(values.egress ? { mode: values.egress as 'on' | 'off' } : {}),
    ...(values['sandbox-net'] ? { range: values['sandbox-net'] } : {}),
    ...(values['egress-port'] ? { port: Number(values['egress-port']) } : {}),
    ...(values['egress-ca-file'] ? { upstreamCaFile: values['egress-ca-file'] } : {}),
    ...(values['egress-host'] ? { hosts: parseEgressHosts(values['egress-host'].join(',')) } : {}),
  };
  const ingress = {
    ...(values['ingress-listen'] ? { listen: values['ingress-listen'] } : {}),
    ...(values['ingress-domain'] ? { domain: values['ingress-domain'] } : {}),
    ...(values['ingress-cert'] ? { certFile: values['ingress-cert'] } : {}),
    ...(values['ingress-key'] ? { keyFile: values['ingress-key'] } : {}),
    ...(values['ingress-max-connections'] ? { maxConnectionsPerSandbox: parseCount(values['ingress-max-connections'], '--ingress-max-connections') } : {}),
  };
  const disks = {
    ...(values.disks ? { mode: parseDisksMode(values.disks) } : {}),
    ...(values['disk-pool'] ? { dir: values['disk-pool'] } : {}),
    ...(values['disk-default'] ? { defaultMb: parseSizeMb(values['disk-default'], '--disk-default') } : {}),
    ...(values['disk-max'] ? { maxMb: parseSizeMb(values['disk-max'], '--disk-max') } : {}),
    ...(values['disk-pool-size'] ? { poolMb: parseSizeMb(values['disk-pool-size'], '--disk-pool-size') } : {}),
  };
  const d = await startDaemon({
    egress,
    ingress,
    disks,
    ...(values.volumes ? { volumes: parseVolumesMode(values.volumes) } : {}),
    ...(values.database ? { database: checkDatabaseUrl(values.database, true) } : {}),
    ...(values['blob-store'] ? { blobStore: values['blob-store'] } : {}),
    ...(values['work-dir'] ? { workDir: values['work-dir'] } : {}),
    ...(values['node-name'] ? { nodeName: values['node-name'] } : {}),
    ...(values['node-lost-after'] ? { nodeLostAfterS: Number(values['node-lost-after']) } : {}),
    ...(values['advertise-url'] ? { advertiseUrl: values['advertise-url'] } : {}),
    ...(values.driver ? { driver: parseDriver(values.driver) } : {}),
    ...(values.drivers ? { drivers: parseDrivers(values.drivers) } : {}),
    ...(values['microvm-accel'] || values['microvm-kernel-deb'] ? { microvm: { ...(values['microvm-accel'] ? { accel: parseAccel(values['microvm-accel']) } : {}), ...(values['microvm-kernel-deb'] ? { kernelDeb: values['microvm-kernel-deb'] } : {}) } } : {}),
    ...(values['data-dir'] ? { dataDir: values['data-dir'] } : {}),
    ...(values.listen ? { listen: values.listen } : {}),
    ...(values['templates-dir'] ? { templatesDir: values['templates-dir'] } : {}),
    ...(values['max-sandboxes'] ? { maxSandboxes: parseCount(values['max-sandboxes'], '--max-sandboxes') } : {}),
    ...(values['max-memory'] ? { maxMemoryMb: parseSizeMb(values['max-memory'], '--max-memory') } : {}),
    ...(values['max-upload-bytes'] ? { maxUploadBytes: Number(values['max-upload-bytes']) } : {}),
    ...(values['log-level'] ? { logLevel: values['log-level'] } : {}),
    ...(values['debian-mirror'] ? { debianMirror: values['debian-mirror'] } : {}),
    ...(values.pool ? { pools: parsePools(values.pool) } : {}),
    ...(values['e2b-listen'] ? { e2bListen: values['e2b-listen'] } : {}),
    ...(values['e2b-internet'] ? { e2bInternet: parseE2bInternet(values['e2b-internet']) } : {}),
    ...(values['e2b-public-traffic'] ? { e2bPublicTraffic: parseE2bPublicTraffic(values['e2b-public-traffic']) } : {}),
    ...(values['pkcs11-module'] ? { pkcs11: { module: values['pkcs11-module'], tokenLabel: values['pkcs11-token'] ?? '', pin: values['pkcs11-pin-file'] ? readFileSync(values['pkcs11-pin-file'], 'utf8').trim() : (process.env.SPACE_PKCS11_PIN ?? '') } } : {}),
  });
  const stop = () => void d.close().then(() => process.exit(0), () => process.exit(1));
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
} catch (err) {
  const e = err as { code?: string; message?: string };
  process.stderr.write(`spaced: ${e.code ?? 'ERROR'}: ${e.message ?? String(err)}\n`);
  process.exit(1);
}
