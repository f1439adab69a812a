/**
 * The flags `spaced` takes (see main.ts for their meaning), in `node:util` parseArgs' form: one
 * list for the daemon and for whatever checks its command lines (deploy/'s manifests are
 * tested against it).
 *
 * @example
 * parseArgs({ options: DAEMON_OPTIONS, args: ['--node-name', 'n1'] }); // throws on an unknown flag
 */
export const DAEMON_OPTIONS = {
  'data-dir': { type: 'string' },
  listen: { type: 'string' },
  'templates-dir': { type: 'string' },
  'max-sandboxes': { type: 'string' },
  'max-memory': { type: 'string' },
  'max-upload-bytes': { type: 'string' },
  'log-level': { type: 'string' },
  'debian-mirror': { type: 'string' },
  pool: { type: 'string' },
  'e2b-listen': { type: 'string' },
  'e2b-internet': { type: 'string' },
  'e2b-public-traffic': { type: 'string' },
  'pkcs11-module': { type: 'string' },
  'pkcs11-token': { type: 'string' },
  'pkcs11-pin-file': { type: 'string' },
  egress: { type: 'string' },
  'sandbox-net': { type: 'string' },
  'egress-port': { type: 'string' },
  'egress-ca-file': { type: 'string' },
  'egress-host': { type: 'string', multiple: true },
  'ingress-listen': { type: 'string' },
  'ingress-domain': { type: 'string' },
  'ingress-cert': { type: 'string' },
  'ingress-key': { type: 'string' },
  'ingress-max-connections': { type: 'string' },
  driver: { type: 'string' },
  drivers: { type: 'string' },
  'microvm-accel': { type: 'string' },
  'microvm-kernel-deb': { type: 'string' },
  disks: { type: 'string' },
  'disk-pool': { type: 'string' },
  'disk-default': { type: 'string' },
  'disk-max': { type: 'string' },
  'disk-pool-size': { type: 'string' },
  volumes: { type: 'string' },
  database: { type: 'string' },
  'blob-store': { type: 'string' },
  'work-dir': { type: 'string' },
  'node-name': { type: 'string' },
  'node-lost-after': { type: 'string' },
  'advertise-url': { type: 'string' },
} as const satisfies Record<string, { type: 'string' | 'boolean'; multiple?: boolean }>;
