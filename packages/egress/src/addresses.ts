/**
 * Which addresses the proxy may connect to. The proxy resolves names itself and checks every
 * address it is about to use (not the name), so DNS rebinding cannot reach a private address.
 */
import { promises as dns } from 'node:dns';
import net from 'node:net';
import { SpaceError, cidrList } from '@space/core';

/** Loopback, private, link-local, shared, documentation, multicast and reserved ranges. */
const SPECIAL = [
  '0.0.0.0/8', '10.0.0.0/8', '100.64.0.0/10', '127.0.0.0/8', '169.254.0.0/16', '172.16.0.0/12', '192.0.0.0/24', '192.0.2.0/24',
  '192.168.0.0/16', '198.18.0.0/15', '198.51.100.0/24', '203.0.113.0/24', '224.0.0.0/4', '240.0.0.0/4',
  '::/128', '::1/128', '64:ff9b::/96', '100::/64', '2001:db8::/32', 'fc00::/7', 'fe80::/10', 'ff00::/8',
];
/** Cloud metadata services: never reachable, whatever the policy says. */
export const METADATA_ADDRESSES = ['169.254.169.254/32', '169.254.170.2/32', '100.100.100.200/32', 'fd00:ec2::254/128'];

const special = cidrList(SPECIAL);

/** The BlockList family of an address. */
export function family(ip: string): 'ipv4' | 'ipv6' {
  return net.isIPv4(ip) ? 'ipv4' : 'ipv6';
}

/** An IPv4-mapped IPv6 address as IPv4, anything else unchanged. */
export function unmap(ip: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  return m ? m[1]! : ip;
}

/** True when `ip` is not a public unicast address. */
export function isSpecial(ip: string): boolean {
  const a = unmap(ip);
  return special.check(a, family(a));
}

/**
 * Resolves names for the proxy: the static map first (operators' split horizon, tests), then
 * the host's resolver.
 */
export class Resolver {
  constructor(private readonly hosts: Record<string, string> = {}) {
    for (const [name, ip] of Object.entries(hosts)) if (!net.isIP(ip)) throw new SpaceError('BAD_REQUEST', `Egress host ${name}=${ip}: ${JSON.stringify(ip)} is not an IP address`);
  }

  /** Every address of `host` (an IP literal is its own address). */
  async lookup(host: string): Promise<string[]> {
    if (net.isIP(host)) return [unmap(host)];
    const fixed = this.hosts[host];
    if (fixed) return [fixed];
    try {
      const r = await dns.lookup(host, { all: true, verbatim: true });
      return r.map((x) => unmap(x.address));
    } catch (err) {
      throw new SpaceError('EGRESS_DENIED', `Cannot resolve ${host}: ${(err as NodeJS.ErrnoException).code ?? String(err)}`, { cause: err });
    }
  }
}

/** The address rules of one request: what the policy opens, what stays closed. */
export class AddressRules {
  private readonly never: net.BlockList;

  constructor(never: string[]) {
    this.never = cidrList([...METADATA_ADDRESSES, ...never]);
  }

  /**
   * Why `ip` may not be used (undefined when it may): always-closed ranges, then special
   * ranges that the policy's `allowed` ranges do not open.
   */
  refusal(ip: string, allowed: net.BlockList): string | undefined {
    const a = unmap(ip);
    if (this.never.check(a, family(a))) return `${a} is never reachable from a sandbox (metadata service, sandbox network)`;
    if (isSpecial(a) && !allowed.check(a, family(a))) return `${a} is a private or reserved address; allow it with a CIDR in the egress policy`;
    return undefined;
  }
}
