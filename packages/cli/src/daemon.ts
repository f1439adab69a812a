/**
 * How the CLI tells whether a daemon runs — by asking it, never by a pid alone — and puts
 * `space` on the PATH.
 */
import { existsSync, lstatSync, mkdirSync, readlinkSync, symlinkSync, unlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { ApiClient } from '@space/sdk';
import { processRuns, readStateFile, type DaemonState } from '@space/server/state';

/** What asking a data directory's daemon found. */
export type DaemonStatus =
  | { state: 'running'; st: DaemonState }
  /** Its process runs but does not answer (starting, stuck, or its address taken by another). */
  | { state: 'silent'; st: DaemonState }
  /** No state file, or its process is gone (stopped, crashed, killed). */
  | { state: 'stopped'; st?: DaemonState };

/**
 * GET /v1/health at `st.url`: whether the daemon that wrote `st` answers (its `instance` must
 * match, so another daemon on a reused port does not count).
 */
export async function answers(st: Pick<DaemonState, 'url' | 'instance'>, timeoutMs = 2000): Promise<boolean> {
  try {
    const h = await new ApiClient({ apiUrl: st.url, requestTimeoutMs: timeoutMs }).json<{ status?: string; instance?: string }>('GET', '/v1/health');
    return h.status === 'ok' && (!st.instance || h.instance === st.instance);
  } catch {
    return false;
  }
}

/** Asks the daemon of `dataDir` whether it runs. */
export async function daemonStatus(dataDir: string): Promise<DaemonStatus> {
  const st = readStateFile(dataDir);
  if (!st) return { state: 'stopped' };
  if (await answers(st)) return { state: 'running', st };
  return processRuns(st.pid) ? { state: 'silent', st } : { state: 'stopped', st };
}

/**
 * Puts a `space` command on the PATH: a symlink to the CLI's launcher in SPACE_BIN_DIR, else
 * /usr/local/bin (root) or ~/.local/bin. Leaves a `space` that is not ours alone. Returns
 * where it is, or why not.
 */
export function installOnPath(launcher: string): { path: string; installed: boolean } | { error: string } {
  const dir = process.env.SPACE_BIN_DIR || (process.getuid?.() === 0 ? '/usr/local/bin' : path.join(os.homedir(), '.local', 'bin'));
  const link = path.join(dir, 'space');
  try {
    if (existsSync(link) || isSymlink(link)) {
      if (!isSymlink(link)) return { error: `${link} exists and is not SPACE's; run SPACE as ${launcher}` };
      const target = path.resolve(dir, readlinkSync(link));
      if (target === launcher) return { path: link, installed: false };
      if (!target.endsWith(path.join('cli', 'bin', 'space')) && !target.endsWith(path.join('cli', 'dist', 'space.mjs'))) return { error: `${link} points at ${target}, not SPACE; run SPACE as ${launcher}` };
      unlinkSync(link);
    }
    mkdirSync(dir, { recursive: true });
    symlinkSync(launcher, link);
    return { path: link, installed: true };
  } catch (err) {
    return { error: `cannot install ${link}: ${(err as Error).message}` };
  }
}

function isSymlink(p: string): boolean {
  try {
    return lstatSync(p).isSymbolicLink();
  } catch {
    return false;
  }
}
