/** A sandbox incarnation's network namespace, made in as few host processes as possible. */
import { run } from './exec.js';
import type { SandboxNetwork } from './ports/driver.js';

/**
 * Creates network namespace `netns` with its loopback up and, given `link`, the sandbox's link
 * into it; resolves to the sandbox's address (undefined without a link). With a network the
 * whole set-up is one helper process: every process the daemon starts costs it 6–9 ms (a fork
 * of a ~200 MB process), and the set-up took five of them one after another (docs/benchmarks.md,
 * issue 17's profile).
 *
 * @example
 * const address = await createNetns('space-sb1-abcd1234', { network, id: 'sb1', ifname: 'eth0' }); // "10.231.0.6"
 * await createNetns('space-sb2-abcd1234'); // no link: loopback only
 */
export async function createNetns(netns: string, link?: { network: SandboxNetwork; id: string; ifname: string }): Promise<string | undefined> {
  if (link) return link.network.attach(link.id, netns, link.ifname, { create: true });
  await run('sh', ['-c', 'ip netns add "$1" && ip -n "$1" link set lo up', 'space-netns', netns], 10_000);
  return undefined;
}
