/** Resolves user names against the sandbox's own /etc/passwd. */
import { readFileSync } from 'node:fs';

/** A resolved user. */
export interface User {
  name: string;
  uid: number;
  gid: number;
  home: string;
  /** Login shell from /etc/passwd (`/bin/sh` when none is named). */
  shell: string;
}

/** The default non-root user of every sandbox. */
export const DEFAULT_USER: User = { name: 'user', uid: 1000, gid: 1000, home: '/home/user', shell: '/bin/sh' };

let cache: { at: number; lines: string[] } | undefined;
/** /etc/passwd, re-read at most once a second (a file read through gVisor's gofer is not free). */
function passwdLines(): string[] {
  const now = Date.now();
  if (cache && now - cache.at < 1000) return cache.lines;
  let lines: string[] = [];
  try {
    lines = readFileSync('/etc/passwd', 'utf8').split('\n');
  } catch {
    // no passwd file: only root and the default user exist
  }
  cache = { at: now, lines };
  return lines;
}

/** Looks up `who` (a name or a numeric uid); undefined when it is not known. */
export function resolveUser(who: string | undefined): User | undefined {
  if (who === undefined || who === '') who = DEFAULT_USER.name;
  const lines = passwdLines();
  for (const line of lines) {
    const [name, , uid, gid, , home, shell] = line.split(':');
    if (name === undefined || uid === undefined || gid === undefined) continue;
    if (name === who || uid === who) return { name, uid: Number(uid), gid: Number(gid), home: home || '/', shell: shell?.trim() || '/bin/sh' };
  }
  if (who === 'root' || who === '0') return { name: 'root', uid: 0, gid: 0, home: '/root', shell: '/bin/sh' };
  if (who === DEFAULT_USER.name || who === String(DEFAULT_USER.uid)) return DEFAULT_USER;
  if (/^\d{1,9}$/.test(who)) return { name: who, uid: Number(who), gid: Number(who), home: '/', shell: '/bin/sh' };
  return undefined;
}
