/** Where the CLI finds its daemon: flags, SPACE_URL / SPACE_API_KEY, or the file `space up` wrote. */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { ConnectionOpts } from '@space/sdk';

/** Contents of ~/.config/space/config.json. */
export interface CliConfig {
  url: string;
  keyFile: string;
  dataDir: string;
}

/** Path of the CLI config file. */
export function configPath(): string {
  return path.join(process.env.XDG_CONFIG_HOME || path.join(os.homedir(), '.config'), 'space', 'config.json');
}

export function readConfig(): CliConfig | undefined {
  try {
    return JSON.parse(readFileSync(configPath(), 'utf8')) as CliConfig;
  } catch {
    return undefined;
  }
}

export function writeConfig(c: CliConfig): void {
  mkdirSync(path.dirname(configPath()), { recursive: true, mode: 0o700 });
  writeFileSync(configPath(), JSON.stringify(c, null, 2) + '\n', { mode: 0o600 });
}

/** Connection settings for the SDK. */
export function connection(): ConnectionOpts {
  const c = readConfig();
  const apiUrl = process.env.SPACE_URL ?? c?.url;
  let apiKey = process.env.SPACE_API_KEY;
  if (!apiKey && c?.keyFile && existsSync(c.keyFile)) apiKey = readFileSync(c.keyFile, 'utf8').trim();
  return { ...(apiUrl ? { apiUrl } : {}), ...(apiKey ? { apiKey } : {}) };
}

/**
 * Parses a duration: `500ms`, `30s`, `10m`, `2h`, `1d`, or plain milliseconds.
 *
 * @example
 * parseDuration('30m'); // 1800000
 */
export function parseDuration(s: string): number {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h|d)?$/.exec(s.trim());
  if (!m) throw new Error(`invalid duration ${JSON.stringify(s)}: use e.g. 500ms, 30s, 10m, 2h`);
  const mult = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 }[(m[2] ?? 'ms') as 'ms'];
  return Math.round(Number(m[1]) * mult);
}

/** Parses repeated `K=V` options into a map. */
export function parsePairs(list: string[] | undefined, what: string): Record<string, string> | undefined {
  if (!list?.length) return undefined;
  const out: Record<string, string> = {};
  for (const p of list) {
    const i = p.indexOf('=');
    if (i < 1) throw new Error(`invalid ${what} ${JSON.stringify(p)}: use KEY=VALUE`);
    out[p.slice(0, i)] = p.slice(i + 1);
  }
  return out;
}

/** E2B-shaped keys the CLI made, by daemon URL (~/.config/space/e2b-keys.json, 0600). */
export function e2bKeys(): { get(url: string): string | undefined; set(url: string, key: string): void } {
  const file = path.join(path.dirname(configPath()), 'e2b-keys.json');
  const read = (): Record<string, string> => {
    try {
      return JSON.parse(readFileSync(file, 'utf8')) as Record<string, string>;
    } catch {
      return {};
    }
  };
  return {
    get: (url) => read()[url],
    set: (url, key) => {
      mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
      writeFileSync(file, JSON.stringify({ ...read(), [url]: key }, null, 2) + '\n', { mode: 0o600 });
    },
  };
}
