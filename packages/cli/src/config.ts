/** Where the CLI finds its daemon: SPACE_URL / SPACE_API_KEY, or a context of the file `space up` wrote. */
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import type { ConnectionOpts } from '@space/sdk';

/** How the CLI reaches one daemon: a named context in ~/.config/space/config.json. */
export interface CliContext {
  url: string;
  keyFile: string;
  dataDir: string;
}

/**
 * Contents of ~/.config/space/config.json: named contexts and the one commands use unless
 * `--context NAME` or SPACE_CONTEXT says otherwise.
 *
 * @example
 * { "current": "default", "contexts": { "default": { "url": "http://127.0.0.1:7070", "keyFile": "/var/lib/space/admin.key", "dataDir": "/var/lib/space" } } }
 */
export interface CliConfig {
  current?: string;
  contexts: Record<string, CliContext>;
}

/** What a context may be called (it is typed on command lines). */
const CONTEXT_NAME = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$/;

/** Path of the CLI config file. */
export function configPath(): string {
  return path.join(process.env.XDG_CONFIG_HOME || path.join(os.homedir(), '.config'), 'space', 'config.json');
}

/** The config file; one written before contexts (a bare url/keyFile/dataDir) reads as context `default`. */
export function readConfig(): CliConfig {
  let raw: Partial<CliConfig> & Partial<CliContext>;
  try {
    raw = JSON.parse(readFileSync(configPath(), 'utf8')) as typeof raw;
  } catch {
    return { contexts: {} };
  }
  if (raw.contexts) return { contexts: raw.contexts, ...(raw.current ? { current: raw.current } : {}) };
  if (raw.url && raw.keyFile && raw.dataDir) return { current: 'default', contexts: { default: { url: raw.url, keyFile: raw.keyFile, dataDir: raw.dataDir } } };
  return { contexts: {} };
}

export function writeConfig(c: CliConfig): void {
  mkdirSync(path.dirname(configPath()), { recursive: true, mode: 0o700 });
  const tmp = `${configPath()}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(c, null, 2) + '\n', { mode: 0o600 });
  renameSync(tmp, configPath());
}

/**
 * Checks a context name; throws with how to name one.
 * @example checkContextName('staging') // 'staging'
 */
export function checkContextName(name: string): string {
  if (!CONTEXT_NAME.test(name)) throw new Error(`invalid context name ${JSON.stringify(name)}: use letters, digits, '.', '_' and '-' (up to 63), starting with a letter or digit`);
  return name;
}

/**
 * The context commands use: `--context` (passed on as SPACE_CONTEXT), else the config's
 * current one. Undefined when there is none yet; an unknown name is an error.
 */
export function selectedContext(): { name: string; ctx: CliContext } | undefined {
  const c = readConfig();
  const name = process.env.SPACE_CONTEXT || c.current;
  if (!name) return undefined;
  const ctx = c.contexts[name];
  if (!ctx) {
    const known = Object.keys(c.contexts);
    throw new Error(`no context ${JSON.stringify(name)}${known.length ? ` (known: ${known.join(', ')})` : ''}: \`space up --context ${name}\` makes it, \`space context ls\` lists them`);
  }
  return { name, ctx };
}

/**
 * The command that starts a context's daemon again.
 * @example upCommand('two', ctx) // 'space up --data-dir /srv/space2 --context two'
 */
export function upCommand(name: string, ctx: CliContext): string {
  return name === 'default' ? 'space up' : `space up --data-dir ${ctx.dataDir} --context ${name}`;
}

/** Connection settings for the SDK: SPACE_URL / SPACE_API_KEY, else the selected context. */
export function connection(): ConnectionOpts {
  const ctx = process.env.SPACE_URL && process.env.SPACE_API_KEY ? undefined : selectedContext()?.ctx;
  const apiUrl = process.env.SPACE_URL ?? ctx?.url;
  let apiKey = process.env.SPACE_API_KEY;
  if (!apiKey && ctx?.keyFile && existsSync(ctx.keyFile)) apiKey = readFileSync(ctx.keyFile, 'utf8').trim();
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
