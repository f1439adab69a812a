/**
 * The daemon's state file and default locations, without the daemon's heavy imports, so that
 * the CLI can find a running daemon cheaply (`@space/server/state`).
 */
import { readFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';

/** The state file a running daemon writes into its data directory (`spaced.json`). */
export interface DaemonState {
  pid: number;
  url: string;
  dataDir: string;
  keyFile: string;
  startedAt: string;
  /** The E2B-compatible API, when it runs. */
  e2bUrl?: string;
  /** The ingress listener and its domain, when it runs. */
  ingressUrl?: string;
  ingressDomain?: string;
  /** Sandbox disks (`--disks`): on or off and why (what `auto` came to); with them, what the default driver's pool takes on the host's disk, bytes. */
  disks?: { mode: 'on' | 'off'; why: string; poolBytes?: number };
  /**
   * A random id of this daemon's run, also answered by `GET /v1/health`: a client tells the
   * daemon that wrote this file from whatever else may listen at its address now.
   */
  instance?: string;
}

/**
 * Default data directory for this user.
 *
 * @example
 * defaultDataDir(); // '/var/lib/space' for root, '~/.local/share/space' otherwise
 */
export function defaultDataDir(): string {
  return process.env.SPACE_DATA_DIR || (process.getuid?.() === 0 ? '/var/lib/space' : path.join(os.homedir(), '.local', 'share', 'space'));
}

/** A data directory's state file as written, whether or not its daemon still runs. */
export function readStateFile(dataDir: string): DaemonState | undefined {
  try {
    return JSON.parse(readFileSync(path.join(dataDir, 'spaced.json'), 'utf8')) as DaemonState;
  } catch {
    return undefined;
  }
}

/**
 * Whether a process runs: it exists and is not a zombie (a daemon killed while its parent
 * still lives stays a zombie until reaped, and `kill(pid, 0)` succeeds on zombies).
 */
export function processRuns(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
  try {
    // The state is the field after the parenthesised command name, which may hold spaces.
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^[ZX]/.test(stat.slice(stat.lastIndexOf(')') + 2));
  } catch {
    return true;
  }
}

/**
 * Reads a data directory's state file if its process still runs. Whether the daemon answers
 * is another question: the CLI asks it (`GET /v1/health`, comparing {@link DaemonState.instance}).
 */
export function readState(dataDir: string): DaemonState | undefined {
  const st = readStateFile(dataDir);
  return st && processRuns(st.pid) ? st : undefined;
}
