/**
 * @space/sandbox-net — the network of every sandbox: one veth link into its network namespace
 * whose only reachable destination is the egress proxy.
 *
 * Layout, for a range such as 10.231.0.0/16: the proxy listens on the range's first address
 * (10.231.0.1, added to the host's loopback interface: not every kernel has dummy links), and link `i` is the /30 at `4·i`: the host end
 * (`sx<tag>i<i>`) has `.1`, the sandbox end (`eth0` inside) `.2` with one route, to the proxy via
 * the host end. The proxy address is the same for every sandbox, so `HTTP_PROXY` stays right
 * across restores and forks, while each incarnation has an address of its own, which is how the
 * proxy knows who is asking.
 *
 * Enforcement: gVisor sends its frames through an AF_PACKET socket, so only an nftables
 * `netdev` egress hook on the sandbox end sees them; it drops everything but ARP, TCP from
 * the sandbox's address to the proxy's port, and TCP to the host end that is not a bare SYN
 * (answers on connections the host opened: the ingress). A host `inet` table drops whatever
 * else arrives on the host ends — it lets in only new connections to the proxy and packets of
 * connections the host opened (conntrack) — and any forwarding to or from them, in case a
 * sandbox-side rule is missing.
 */
import { createHash } from 'node:crypto';
import net from 'node:net';
import { SpaceError, parseCidr, run, tryRun, type SandboxNetwork } from '@space/core';

/** Options of {@link SandboxNet}. */
export interface SandboxNetOptions {
  /** IPv4 range of sandbox links, /16 to /24, not used by anything else on the host. @default "10.231.0.0/16" */
  range?: string;
  /** TCP port of the egress proxy. @default 3128 */
  proxyPort?: number;
  /**
   * Links kept ready, each in a namespace of its own, for the next attaches that create one (a
   * wake, fork or restore takes one instead of waiting ~25 ms for its set-up). 0 makes each
   * on demand. @default 2
   */
  spares?: number;
}

/**
 * A link's set-up, run by `sh -c` with: netns, host interface, "1" to create the namespace,
 * the host side's `ip -b` lines, the sandbox side's, and the sandbox side's nft rules.
 */
const LINK_SCRIPT = [
  'set -e',
  'if [ -n "$3" ]; then ip netns add "$1"; fi',
  'printf %s "$4" | ip -b -',
  '{ echo 1 > "/proc/sys/net/ipv6/conf/$2/disable_ipv6"; } 2>/dev/null || true',
  'printf %s "$6" | nsenter --net="/run/netns/$1" nft -f - &',
  'printf %s "$5" | ip -n "$1" -b -',
  'wait $!',
].join('\n');

/**
 * Gives a spare link's namespace its sandbox's name, run by `sh -c` with: the spare's name,
 * the new one. A named namespace is a bind mount of its nsfs file under /run/netns: a second
 * mount of it under the new name, then the old one's removed (`ip netns del` of a name only
 * unmounts it; the namespace lives on through the other).
 */
const RENAME_SCRIPT = 'set -e; : > "/run/netns/$2"; mount --bind "/run/netns/$1" "/run/netns/$2"; ip netns del "$1"';

/** How long after the latest attach that made or took a namespace the spares are made up again, ms. */
const REFILL_DELAY_MS = 500;

/** The default range of sandbox links. */
export const DEFAULT_SANDBOX_RANGE = '10.231.0.0/16';

/** Ranges a daemon picks from, in order, when it is given none: the first one no other daemon holds. */
export const DEFAULT_SANDBOX_RANGES = Array.from({ length: 9 }, (_, i) => `10.${231 + i}.0.0/16`);

const toInt = (a: string) => a.split('.').reduce((n, o) => n * 256 + Number(o), 0);
const toIp = (n: number) => [24, 16, 8, 0].map((s) => (n >>> s) & 255).join('.');

interface Link {
  index: number;
  sandboxId?: string;
  address: string;
}

/**
 * Sandbox links on this host.
 *
 * @example
 * const sandboxNet = new SandboxNet({ range: '10.231.0.0/16', proxyPort: 3128 });
 * await sandboxNet.init();
 * const address = await sandboxNet.attach('sb123', 'space-sb123-abcd1234', 'eth0'); // "10.231.0.6"
 * sandboxNet.sandboxAt(address); // "sb123"
 */
export class SandboxNet implements SandboxNetwork {
  /** Where the egress proxy listens (inside the range). */
  readonly proxyAddress: string;
  readonly proxyPort: number;
  /** Short tag of the range, in every host name this instance creates. */
  readonly tag: string;
  private readonly base: number;
  private readonly slots: number;
  private readonly links = new Map<string, Link>();
  private readonly byAddress = new Map<string, string>();
  /** Sandbox id → the address of its newest link. */
  private readonly byId = new Map<string, string>();
  private readonly used = new Set<number>();
  /** Links found at start-up (a restarted daemon), by netns name. */
  private readonly found = new Map<string, number>();
  /** Links ready for the next attaches that create their namespace (see {@link SandboxNetOptions.spares}). */
  private readonly spares: { index: number; ifname: string }[] = [];
  private readonly spareTarget: number;
  /** The sandbox-side name spares are made with: that of the latest attach that created its namespace. */
  private spareIf?: string;
  private filling?: Promise<void>;
  private refillTimer?: NodeJS.Timeout;
  private closed = false;
  private next = 1;

  constructor(opts: SandboxNetOptions = {}) {
    const range = opts.range ?? DEFAULT_SANDBOX_RANGE;
    const c = parseCidr(range);
    if (!c || c.family !== 'ipv4' || c.prefix < 16 || c.prefix > 24 || (toInt(c.address) & (2 ** (32 - c.prefix) - 1)) !== 0) {
      throw new SpaceError('BAD_REQUEST', `Invalid sandbox network ${JSON.stringify(range)}: give an IPv4 range from /16 to /24 that starts on its boundary, e.g. 10.231.0.0/16`);
    }
    this.base = toInt(c.address);
    this.slots = 2 ** (32 - c.prefix) / 4;
    this.proxyAddress = toIp(this.base + 1);
    this.proxyPort = opts.proxyPort ?? 3128;
    if (!Number.isInteger(this.proxyPort) || this.proxyPort < 1 || this.proxyPort > 65535) throw new SpaceError('BAD_REQUEST', `Invalid egress proxy port ${String(opts.proxyPort)}: give a port from 1 to 65535`);
    this.tag = createHash('sha256').update(`${c.address}/${c.prefix}`).digest('hex').slice(0, 4);
    this.spareTarget = opts.spares ?? 2;
  }

  /** Names of spare links' namespaces: `space-spare-<tag>-<index>` (never a sandbox's: theirs start `space-sb`). */
  private spareName(index: number): string {
    return `space-spare-${this.tag}-${index}`;
  }

  private get table(): string {
    return `space_${this.tag}`;
  }
  private hostIf(index: number): string {
    return `sx${this.tag}i${index}`;
  }
  private addresses(index: number): { host: string; sandbox: string } {
    const n = this.base + index * 4;
    return { host: toIp(n + 1), sandbox: toIp(n + 2) };
  }

  /**
   * Sets up the host side (the proxy's address on the loopback interface, the host table) and takes
   * over the links of sandboxes that outlived a daemon restart. Idempotent.
   */
  async init(): Promise<void> {
    await this.checkOverlap();
    await run('ip', ['addr', 'replace', `${this.proxyAddress}/32`, 'dev', 'lo']);
    const pattern = `sx${this.tag}i*`;
    await run('nft', ['-f', '-'], 10_000, [
      `table inet ${this.table}`,
      `delete table inet ${this.table}`,
      `table inet ${this.table} {`,
      '  chain input {',
      '    type filter hook input priority filter - 10; policy accept;',
      `    iifname "${pattern}" ip daddr ${this.proxyAddress} tcp dport ${this.proxyPort} accept`,
      // Answers on connections the host opened (the ingress reaching a sandbox's port).
      `    iifname "${pattern}" meta l4proto tcp ct state established accept`,
      `    iifname "${pattern}" counter drop`,
      '  }',
      '  chain forward {',
      '    type filter hook forward priority filter - 10; policy accept;',
      `    iifname "${pattern}" counter drop`,
      `    oifname "${pattern}" counter drop`,
      '  }',
      '}',
      '',
    ].join('\n'));
    // Links of sandboxes still running from before a restart: their netns names tell whose.
    const [links, spaces] = await Promise.all([run('ip', ['-j', 'link', 'show', 'type', 'veth'], 10_000), run('ip', ['-j', 'netns', 'list'], 10_000)]);
    const nsById = new Map<number, string>();
    const spare = `space-spare-${this.tag}-`;
    for (const ns of JSON.parse(spaces.stdout || '[]') as { name: string; id?: number }[]) {
      // Spares an earlier daemon left (it was killed): made anew on demand.
      if (ns.name.startsWith(spare)) await tryRun('ip', ['netns', 'del', ns.name], 5_000);
      else if (ns.id !== undefined) nsById.set(ns.id, ns.name);
    }
    const re = new RegExp(`^sx${this.tag}i(\\d+)$`);
    for (const l of JSON.parse(links.stdout || '[]') as { ifname: string; link_netnsid?: number }[]) {
      const m = re.exec(l.ifname);
      if (!m) continue;
      const index = Number(m[1]);
      const ns = l.link_netnsid !== undefined ? nsById.get(l.link_netnsid) : undefined;
      if (ns) {
        this.found.set(ns, index);
      } else {
        // A spare's, or one whose namespace is gone: its address is free once the pair is.
        await tryRun('ip', ['link', 'del', l.ifname], 5_000);
        if (!(await tryRun('ip', ['link', 'show', 'dev', l.ifname], 5_000))) continue;
      }
      this.used.add(index);
    }
  }

  /**
   * True when this range's proxy address is already on the host (another daemon uses the
   * range, or one that stopped with sandboxes left running).
   */
  async taken(): Promise<boolean> {
    const lo = JSON.parse((await run('ip', ['-j', '-4', 'addr', 'show', 'dev', 'lo'], 5_000)).stdout || '[]') as { addr_info?: { local: string }[] }[];
    return lo.some((l) => (l.addr_info ?? []).some((a) => a.local === this.proxyAddress));
  }

  /**
   * The first of `ranges` that is free on this host: no other daemon's proxy address, no host
   * route overlapping it.
   */
  static async pickFree(ranges: string[], proxyPort?: number): Promise<string> {
    for (const r of ranges) {
      const n = new SandboxNet({ range: r, ...(proxyPort ? { proxyPort } : {}) });
      if (await n.taken()) continue;
      if (await n.checkOverlap().then(() => true, () => false)) return r;
    }
    throw new SpaceError('EGRESS_UNAVAILABLE', `None of the sandbox networks ${ranges.join(', ')} is free on this host: pass one with --sandbox-net`);
  }

  /** Refuses a range that a route of the host already covers (it would shadow or be shadowed). */
  async checkOverlap(): Promise<void> {
    const routes = JSON.parse((await run('ip', ['-j', '-4', 'route', 'show', 'table', 'all'], 10_000)).stdout || '[]') as { dst: string; dev?: string; type?: string }[];
    const mine = new RegExp(`^sx${this.tag}i`);
    const size = this.slots * 4;
    for (const r of routes) {
      if (!r.dst || r.dst === 'default' || (r.dev && mine.test(r.dev)) || (r.type && r.type !== 'unicast') || r.dst === this.proxyAddress) continue;
      const c = parseCidr(r.dst);
      if (!c || c.family !== 'ipv4') continue;
      const start = toInt(c.address);
      const end = start + 2 ** (32 - c.prefix);
      if (start < this.base + size && this.base < end) {
        throw new SpaceError('EGRESS_UNAVAILABLE', `The sandbox network ${toIp(this.base)}/${32 - Math.log2(size)} overlaps the host route ${r.dst}${r.dev ? ` on ${r.dev}` : ''}: pass another range with --sandbox-net`);
      }
    }
  }

  async attach(id: string, netns: string, ifname: string, opts: { create?: boolean } = {}): Promise<string> {
    const known = this.links.get(netns);
    if (known) return known.address;
    const adopted = this.found.get(netns);
    if (adopted !== undefined) {
      this.found.delete(netns);
      // (Again, in case a daemon of an older SPACE wrote them: the rules are part of the link.)
      await run('nsenter', [`--net=/run/netns/${netns}`, 'nft', '-f', '-'], 10_000, this.sandboxRules(ifname, this.addresses(adopted)));
      return this.register(netns, id, adopted);
    }
    if (opts.create) {
      this.spareIf = ifname;
      const spare = this.takeSpare(ifname);
      this.refillSoon();
      if (spare !== undefined) {
        const renamed = await tryRun('sh', ['-c', RENAME_SCRIPT, 'space-netns', this.spareName(spare), netns], 10_000);
        if (renamed) return this.register(netns, id, spare);
        // Made below instead (the new name too, in case the rename got halfway).
        await this.dropSpare(spare);
        await tryRun('ip', ['netns', 'del', netns], 5_000);
      }
    }
    return this.register(netns, id, await this.makeLink(netns, ifname, !!opts.create));
  }

  /** Makes a link's pair into `netns` (made first with `create`), with the sandbox side's rules; returns its index. */
  private async makeLink(netns: string, ifname: string, create: boolean, index = this.allocate()): Promise<number> {
    const hostIf = this.hostIf(index);
    const a = this.addresses(index);
    try {
      // One helper process for the whole set-up (each process the daemon starts costs it
      // 6–9 ms): the namespace when asked, the pair with the host end up, then the sandbox end
      // and its rules side by side. The host end has no IPv6 (it would give the sandbox a
      // link-local path to the host): turned off before the sandbox end is up, so before the
      // pair has a carrier and the kernel would give it an address.
      await run('sh', ['-c', LINK_SCRIPT, 'space-link', netns, hostIf, create ? '1' : '',
        [`link add ${hostIf} type veth peer name ${ifname} netns ${netns}`, `addr add ${a.host}/30 dev ${hostIf}`, `link set ${hostIf} up`, ''].join('\n'),
        ['link set lo up', `addr add ${a.sandbox}/30 dev ${ifname}`, `link set ${ifname} up`, `route add ${this.proxyAddress}/32 via ${a.host} dev ${ifname}`, ''].join('\n'),
        this.sandboxRules(ifname, a)], 10_000);
    } catch (err) {
      await tryRun('ip', ['link', 'del', hostIf], 5_000);
      if (create) await tryRun('ip', ['netns', 'del', netns], 5_000);
      this.used.delete(index);
      throw err;
    }
    return index;
  }

  /** The index of a spare link made for `ifname`, taken out of the spares. */
  private takeSpare(ifname: string): number | undefined {
    const i = this.spares.findIndex((s) => s.ifname === ifname);
    return i < 0 ? undefined : this.spares.splice(i, 1)[0]!.index;
  }

  /** Deletes spare link `index` (its namespace, and with it the pair). */
  private async dropSpare(index: number): Promise<void> {
    await tryRun('ip', ['netns', 'del', this.spareName(index)], 5_000);
    await tryRun('ip', ['link', 'del', this.hostIf(index)], 5_000);
    this.used.delete(index);
  }

  /**
   * Resolves once the spares are made up (now, not after the delay a taken spare waits for);
   * for tests and benchmarks that need a known state.
   *
   * @example
   * await sandboxNet.attach('sb1', 'space-sb1-abcd1234', 'eth0', { create: true });
   * await sandboxNet.spared(); // `ip netns list` shows two space-spare-<tag>-<i>
   */
  async spared(): Promise<void> {
    clearTimeout(this.refillTimer);
    this.refillTimer = undefined;
    await this.filling;
    this.refill();
    await this.filling;
  }

  /**
   * Refills the spares once no namespace was asked for in a while: not while the sandboxes that
   * took them start (a fork into ten attaches ten at once; their runtimes would share the CPU
   * with the set-up).
   */
  private refillSoon(): void {
    if (this.closed) return;
    clearTimeout(this.refillTimer);
    this.refillTimer = setTimeout(() => {
      this.refillTimer = undefined;
      this.refill();
    }, REFILL_DELAY_MS);
    this.refillTimer.unref();
  }

  /**
   * Makes spare links, one at a time in the background, until {@link SandboxNetOptions.spares}
   * are ready. A failure leaves fewer spares (attaches make their links themselves).
   */
  private refill(): void {
    const ifname = this.spareIf;
    if (this.filling || this.closed || !ifname || this.spares.length >= this.spareTarget) return;
    this.filling = (async () => {
      while (!this.closed && this.spares.length < this.spareTarget && ifname === this.spareIf) {
        try {
          const index = this.allocate();
          await this.makeLink(this.spareName(index), ifname, true, index);
          if (this.closed) await this.dropSpare(index);
          else this.spares.push({ index, ifname });
        } catch {
          return;
        }
      }
    })().finally(() => {
      this.filling = undefined;
    });
  }

  /**
   * The sandbox side's rules, as an nft script run inside its namespace (replaced whole, so
   * idempotent): ARP, new connections to the egress proxy, and answers to connections the host
   * opened (the ingress): any packet to the host end but a bare SYN, so nothing inside can open a
   * connection to the host this way. The host's table lets in only packets of connections the
   * host opened (conntrack), see {@link init}.
   */
  private sandboxRules(ifname: string, a: { host: string; sandbox: string }): string {
    return [
      'table netdev space',
      'delete table netdev space',
      'table netdev space {',
      '  chain egress {',
      `    type filter hook egress device "${ifname}" priority 0; policy drop;`,
      `    arp saddr ip ${a.sandbox} accept`,
      `    ip saddr ${a.sandbox} ip daddr ${this.proxyAddress} tcp dport ${this.proxyPort} accept`,
      `    ip saddr ${a.sandbox} ip daddr ${a.host} tcp flags & (syn | ack) != syn accept`,
      '  }',
      '}',
      '',
    ].join('\n');
  }

  /** The address of sandbox `id`'s newest link (where the ingress connects), if it has one. */
  addressOf(id: string): string | undefined {
    return this.byId.get(id);
  }

  private register(netns: string, id: string, index: number): string {
    const address = this.addresses(index).sandbox;
    this.links.set(netns, { index, sandboxId: id, address });
    this.byAddress.set(address, id);
    this.byId.set(id, address);
    return address;
  }

  private allocate(): number {
    for (let tries = 0; tries < this.slots; tries++) {
      const i = this.next;
      this.next = this.next + 1 >= this.slots ? 1 : this.next + 1;
      if (!this.used.has(i)) {
        this.used.add(i);
        return i;
      }
    }
    throw new SpaceError('CAPACITY_EXHAUSTED', `Every address of the sandbox network is in use (${this.slots - 1} links): give the daemon a larger --sandbox-net range`);
  }

  async detach(netns: string): Promise<void> {
    const l = this.links.get(netns);
    const index = l?.index ?? this.found.get(netns);
    if (index === undefined) return;
    // Deleting the netns removed the pair once the sandbox let go of it; make sure.
    await tryRun('ip', ['link', 'del', this.hostIf(index)], 5_000);
    this.links.delete(netns);
    this.found.delete(netns);
    if (l && this.byAddress.get(l.address) === l.sandboxId) this.byAddress.delete(l.address);
    if (l?.sandboxId && this.byId.get(l.sandboxId) === l.address) this.byId.delete(l.sandboxId);
    this.used.delete(index);
  }

  /** The sandbox whose link has `address` (how the proxy knows who connects). */
  sandboxAt(address: string): string | undefined {
    return this.byAddress.get(net.isIPv6(address) && address.startsWith('::ffff:') ? address.slice(7) : address);
  }

  /** Number of links in use. */
  get size(): number {
    return this.links.size + this.found.size;
  }

  /** Deletes the spare links, then removes the host side when no sandbox link is left (daemon stop). */
  async teardown(): Promise<void> {
    this.closed = true;
    clearTimeout(this.refillTimer);
    await this.filling;
    for (const s of this.spares.splice(0)) await this.dropSpare(s.index);
    if (this.size > 0) return;
    await tryRun('nft', ['delete', 'table', 'inet', this.table], 5_000);
    await tryRun('ip', ['addr', 'del', `${this.proxyAddress}/32`, 'dev', 'lo'], 5_000);
  }
}
