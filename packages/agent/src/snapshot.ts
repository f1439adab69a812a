/**
 * What the agent checks before a checkpoint: socket states this runsc cannot checkpoint (a
 * failed checkpoint kills the sandbox, so the daemon refuses instead).
 */
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';

/** A process whose sockets block a checkpoint. */
export interface SnapshotBlocker {
  pid: number;
  command: string;
  socket: string;
  reason: string;
}

/** TCP sockets by inode: state and remote address (from /proc/net/tcp and tcp6). */
function tcpSockets(): Map<string, { state: string; local: string; remote: string }> {
  const out = new Map<string, { state: string; local: string; remote: string }>();
  for (const f of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(f, 'utf8');
    } catch {
      continue;
    }
    for (const line of text.split('\n').slice(1)) {
      const c = line.trim().split(/\s+/);
      if (c.length < 10) continue;
      out.set(c[9]!, { local: c[1]!, remote: c[2]!, state: c[3]! });
    }
  }
  return out;
}

function hexAddr(a: string): string {
  const [ip, port] = a.split(':');
  if (!ip || !port) return a;
  if (ip.length === 8) return `${[0, 2, 4, 6].map((i) => parseInt(ip.slice(i, i + 2), 16)).reverse().join('.')}:${parseInt(port, 16)}`;
  return `[${ip}]:${parseInt(port, 16)}`;
}

const LOOPBACK = /^(0100007F|00000000000000000000000001000000|0000000000000000FFFF00000100007F):/i;

/**
 * Lists what would make `runsc checkpoint` fail in this build: a TCP socket in a process that
 * also has an epoll instance (event-loop servers such as Node.js or asyncio), and TCP
 * connections to anything but loopback. gVisor's /proc does not say which fds an epoll
 * watches, so any TCP socket next to an epoll counts.
 */
export function snapshotBlockers(): SnapshotBlocker[] {
  const tcp = tcpSockets();
  const out: SnapshotBlocker[] = [];
  for (const pid of readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
    if (Number(pid) === process.pid) continue;
    let fds: string[];
    let command = '?';
    try {
      fds = readdirSync(`/proc/${pid}/fd`);
      command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ').slice(0, 200) || readFileSync(`/proc/${pid}/comm`, 'utf8').trim();
    } catch {
      continue;
    }
    const links = fds.map((fd) => {
      try {
        return readlinkSync(`/proc/${pid}/fd/${fd}`);
      } catch {
        return '';
      }
    });
    const hasEpoll = links.includes('anon_inode:[eventpoll]');
    for (const l of links) {
      const m = /^socket:\[(\d+)\]$/.exec(l);
      const s = m ? tcp.get(m[1]!) : undefined;
      if (!s) continue;
      const desc = s.state === '0A' ? `TCP listener ${hexAddr(s.local)}` : `TCP ${hexAddr(s.local)} -> ${hexAddr(s.remote)}`;
      if (hasEpoll) out.push({ pid: Number(pid), command, socket: desc, reason: 'a TCP socket in a process with an epoll event loop cannot be checkpointed by this runsc' });
      else if (s.state === '01' && !LOOPBACK.test(s.remote)) out.push({ pid: Number(pid), command, socket: desc, reason: 'an established TCP connection to outside the sandbox cannot be checkpointed' });
    }
  }
  return out;
}

