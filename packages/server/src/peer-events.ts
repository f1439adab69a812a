/**
 * One live stream for the whole cluster: a node serving `GET /v1/events` follows the same
 * stream on every other node that is up (asked as the client, so each node filters by the
 * client's tenant) and relays their events into its own. Each change is seen once: a node
 * emits only the writes it makes itself.
 */
import http from 'node:http';
import https from 'node:https';
import { FORWARDED_BY, type ForwardTarget } from './forward.js';

/** What following the other nodes needs. */
export interface PeerEventsOptions {
  /** This node's name (skipped in the list, and sent as the forwarding node). */
  self: string;
  /** The cluster's nodes with their state; followed while `up`. */
  nodes(): Promise<ForwardTarget[]>;
  /** The client's credentials, as it sent them (`authorization` and/or `cookie`). */
  credentials: http.OutgoingHttpHeaders;
  /** Takes one event block (`event: …\ndata: …\n\n`) from another node. */
  write(block: string): void;
  /** How often the node list is read again (nodes that came up are followed, dropped ones retried), ms. @default 5000 */
  refreshMs?: number;
}

/**
 * Follows every other node's stream until the returned function is called.
 *
 * @example
 * const stop = followPeerEvents({ self: 'a', nodes, credentials: { authorization }, write: (b) => raw.write(b) });
 * raw.on('close', stop);
 */
export function followPeerEvents(opts: PeerEventsOptions): () => void {
  const open = new Map<string, http.ClientRequest>();
  let stopped = false;
  const follow = (node: ForwardTarget) => {
    const url = new URL('/v1/events', node.url);
    const lib = url.protocol === 'https:' ? https : http;
    const req = lib.get(url, { headers: { ...opts.credentials, accept: 'text/event-stream', [FORWARDED_BY]: opts.self } });
    open.set(node.name, req);
    req.on('response', (res) => {
      if (res.statusCode !== 200) return void res.destroy();
      res.setEncoding('utf8');
      let buffered = '';
      res.on('data', (text: string) => {
        buffered += text;
        let end: number;
        while ((end = buffered.indexOf('\n\n')) >= 0) {
          const block = buffered.slice(0, end + 2);
          buffered = buffered.slice(end + 2);
          // Events only: the other node's comments (pings) and `retry:` are its own connection's.
          if (block.startsWith('event:')) opts.write(block);
        }
        // A stream that never ends a block is not an event stream.
        if (buffered.length > 4 << 20) res.destroy();
      });
      res.on('close', () => open.get(node.name) === req && open.delete(node.name));
    });
    req.on('error', () => open.get(node.name) === req && open.delete(node.name));
    req.on('close', () => open.get(node.name) === req && open.delete(node.name));
  };
  const sync = async () => {
    const nodes = await opts.nodes().catch(() => []);
    if (stopped) return;
    for (const n of nodes) if (n.name !== opts.self && n.state === 'up' && !open.has(n.name)) follow(n);
  };
  void sync();
  const timer = setInterval(() => void sync(), opts.refreshMs ?? 5000);
  return () => {
    stopped = true;
    clearInterval(timer);
    for (const req of open.values()) req.destroy();
    open.clear();
  };
}
