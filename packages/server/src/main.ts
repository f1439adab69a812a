#!/usr/bin/env node
/**
 * `spaced` — the SPACE daemon, in the foreground. Logs JSON lines to stdout; SIGTERM/SIGINT
 * stop it gracefully (sandboxes keep running and are re-adopted on the next start).
 *
 * Usage: spaced [--data-dir DIR] [--listen HOST:PORT] [--templates-dir DIR] [--max-sandboxes N] [--pool minimal=2] [--e2b-listen HOST:PORT|off]
 *        [--pkcs11-module LIB --pkcs11-token LABEL --pkcs11-pin-file FILE]
 */
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { parsePools, startDaemon } from './daemon.js';

const { values } = parseArgs({
  options: {
    'data-dir': { type: 'string' },
    listen: { type: 'string' },
    'templates-dir': { type: 'string' },
    'max-sandboxes': { type: 'string' },
    'max-upload-bytes': { type: 'string' },
    'log-level': { type: 'string' },
    'debian-mirror': { type: 'string' },
    pool: { type: 'string' },
    'e2b-listen': { type: 'string' },
    'pkcs11-module': { type: 'string' },
    'pkcs11-token': { type: 'string' },
    'pkcs11-pin-file': { type: 'string' },
  },
});

try {
  const d = await startDaemon({
    ...(values['data-dir'] ? { dataDir: values['data-dir'] } : {}),
    ...(values.listen ? { listen: values.listen } : {}),
    ...(values['templates-dir'] ? { templatesDir: values['templates-dir'] } : {}),
    ...(values['max-sandboxes'] ? { maxSandboxes: Number(values['max-sandboxes']) } : {}),
    ...(values['max-upload-bytes'] ? { maxUploadBytes: Number(values['max-upload-bytes']) } : {}),
    ...(values['log-level'] ? { logLevel: values['log-level'] } : {}),
    ...(values['debian-mirror'] ? { debianMirror: values['debian-mirror'] } : {}),
    ...(values.pool ? { pools: parsePools(values.pool) } : {}),
    ...(values['e2b-listen'] ? { e2bListen: values['e2b-listen'] } : {}),
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
