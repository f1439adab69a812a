/**
 * Ingress host names: `PORT-SANDBOXID.DOMAIN`, e.g. `8000-sb0123456789abcdefgh.localhost:7072`.
 * The domain may carry a port (`localhost:7072`): browsers and curl resolve `*.localhost` to the
 * loopback address with no DNS set-up.
 */
import { lookup } from 'node:dns/promises';

/** A sandbox id as SPACE makes them. */
const SANDBOX_ID = /^sb[a-z0-9]{18}$/;

/** Where a request is meant to go. */
export interface IngressAddress {
  port: number;
  sandboxId: string;
}

/**
 * Whether `port` is a TCP port number (1–65535).
 * @example isPort(8000) // true
 */
export function isPort(port: unknown): port is number {
  return typeof port === 'number' && Number.isInteger(port) && port >= 1 && port <= 65535;
}

/**
 * The host name of a sandbox's port under `domain`.
 * @example ingressHost(8000, 'sb0123456789abcdefgh', 'localhost:7072') // "8000-sb0123456789abcdefgh.localhost:7072"
 */
export function ingressHost(port: number, sandboxId: string, domain: string): string {
  return `${port}-${sandboxId}.${domain}`;
}

/**
 * Reads a Host header under `domain`; undefined for anything else (another domain, a malformed
 * label, a port out of range). Case-insensitive, as host names are.
 * @example parseIngressHost('8000-sb0123456789abcdefgh.localhost:7072', 'localhost:7072') // { port: 8000, sandboxId: 'sb0123456789abcdefgh' }
 */
export function parseIngressHost(host: string | undefined, domain: string): IngressAddress | undefined {
  if (!host) return undefined;
  const h = host.toLowerCase();
  const suffix = `.${domain.toLowerCase()}`;
  if (!h.endsWith(suffix)) return undefined;
  const label = h.slice(0, -suffix.length);
  const dash = label.indexOf('-');
  if (dash < 1) return undefined;
  const portText = label.slice(0, dash);
  const sandboxId = label.slice(dash + 1);
  if (!/^[0-9]{1,5}$/.test(portText) || !SANDBOX_ID.test(sandboxId)) return undefined;
  const port = Number(portText);
  return isPort(port) ? { port, sandboxId } : undefined;
}

/**
 * Whether this host's resolver gives loopback for names under `domain`, when `domain` is
 * `localhost` or under it (other domains: true, not checked). Browsers and curl resolve
 * `*.localhost` themselves; programs that ask the system (Node's `fetch`, Python) need glibc's
 * `nss-myhostname` (Debian: `libnss-myhostname`) for it. Never throws; false after `timeoutMs`.
 * @example await localNamesResolve('localhost:7072') // true with nss-myhostname
 */
export async function localNamesResolve(domain: string, timeoutMs = 3000): Promise<boolean> {
  const host = domain.replace(/:\d+$/, '').toLowerCase();
  if (host !== 'localhost' && !host.endsWith('.localhost')) return true;
  const loopback = (a: { address: string }) => a.address === '::1' || a.address.startsWith('127.');
  return Promise.race([
    lookup(`8000-probe.${host}`, { all: true }).then((as) => as.length > 0 && as.every(loopback), () => false),
    new Promise<boolean>((r) => setTimeout(r, timeoutMs, false).unref()),
  ]);
}
