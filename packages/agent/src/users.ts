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

const cache = new Map<string, { at: number; lines: string[] }>();
/** A file's lines, re-read at most once a second (a file read through gVisor's gofer is not free). */
function linesOf(file: '/etc/passwd' | '/etc/group'): string[] {
  const now = Date.now();
  const c = cache.get(file);
  if (c && now - c.at < 1000) return c.lines;
  let lines: string[] = [];
  try {
    lines = readFileSync(file, 'utf8').split('\n');
  } catch {
    // no such file: only root and the default user exist
  }
  cache.set(file, { at: now, lines });
  return lines;
}
const passwdLines = () => linesOf('/etc/passwd');

/** The name of uid `uid` (or gid, with `group`), from /etc/passwd or /etc/group; else the number. */
export function idName(id: number, group = false): string {
  for (const line of linesOf(group ? '/etc/group' : '/etc/passwd')) {
    const [name, , n] = line.split(':');
    if (name && n === String(id)) return name;
  }
  return String(id);
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
