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

/** Reads a data directory's state file if its daemon is alive. */
export function readState(dataDir: string): DaemonState | undefined {
  try {
    const st = JSON.parse(readFileSync(path.join(dataDir, 'spaced.json'), 'utf8')) as DaemonState;
    process.kill(st.pid, 0);
    return st;
  } catch {
    return undefined;
  }
}
