/**
 * The HTTP client under the SDK: configuration, timeouts, and typed errors rebuilt from the
 * daemon's stable error codes.
 */
import { SpaceError, isErrorCode, type ErrorBody } from '@space/api';
import { send, type HttpResponse, type RequestBody } from './http.js';

export { HttpResponse, type RequestBody } from './http.js';

/** How to reach the daemon. Every field falls back to the environment. */
export interface ConnectionOpts {
  /** Daemon URL. @default process.env.SPACE_URL ?? "http://127.0.0.1:7070" */
  apiUrl?: string;
  /** API key. @default process.env.SPACE_API_KEY */
  apiKey?: string;
  /** Timeout of each non-streaming request, ms. @default 60000 */
  requestTimeoutMs?: number;
  /** Aborts the call. */
  signal?: AbortSignal;
}

/**
 * An error from SPACE, rebuilt from the daemon's `{ error: { code, message, hint } }`.
 * Match on `err.code` (stable), e.g. `SANDBOX_NOT_FOUND`, `CAPACITY_EXHAUSTED`.
 *
 * @example
 * try { await Sandbox.connect('sbnope') } catch (e) { if (e instanceof SpaceError && e.code === 'SANDBOX_NOT_FOUND') ... }
 */
export { SpaceError };

/** Builds the error for a failed response. */
export async function errorFromResponse(res: HttpResponse): Promise<SpaceError> {
  let body: Partial<ErrorBody> | undefined;
  try {
    body = (await res.json()) as Partial<ErrorBody>;
  } catch {
    body = undefined;
  }
  const e = body?.error;
  const code = isErrorCode(e?.code) ? e.code : res.status === 401 ? 'UNAUTHENTICATED' : res.status === 404 ? 'SANDBOX_NOT_FOUND' : 'INTERNAL';
  return new SpaceError(code, e?.message ?? `HTTP ${res.status} ${res.statusText}`, { ...(e?.details ? { details: e.details } : {}) });
}

/** Resolved connection settings. */
export class ApiClient {
  readonly url: string;
  private readonly key: string | undefined;
  readonly timeoutMs: number;

  constructor(opts: ConnectionOpts = {}) {
    this.url = (opts.apiUrl ?? process.env.SPACE_URL ?? 'http://127.0.0.1:7070').replace(/\/+$/, '');
    this.key = opts.apiKey ?? process.env.SPACE_API_KEY;
    this.timeoutMs = opts.requestTimeoutMs ?? 60_000;
  }

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...(this.key ? { authorization: `Bearer ${this.key}` } : {}), ...extra };
  }

  /** A raw request; rejects with a {@link SpaceError} unless the status is 2xx. `timeoutMs: 0` = no timeout. */
  async request(method: string, path: string, opts: { json?: unknown; body?: RequestBody; contentType?: string; headers?: Record<string, string>; signal?: AbortSignal; timeoutMs?: number; query?: Record<string, string | number | boolean | string[] | undefined> } = {}): Promise<HttpResponse> {
    const u = new URL(this.url + path);
    for (const [k, v] of Object.entries(opts.query ?? {})) {
      if (v === undefined) continue;
      for (const x of Array.isArray(v) ? v : [v]) u.searchParams.append(k, String(x));
    }
    const timeout = opts.timeoutMs ?? this.timeoutMs;
    const signals = [opts.signal, timeout > 0 ? AbortSignal.timeout(timeout) : undefined].filter((s): s is AbortSignal => !!s);
    const signal = signals.length > 1 ? AbortSignal.any(signals) : signals[0];
    let res: HttpResponse;
    try {
      res = await send(u, {
        method,
        headers: this.headers({ ...opts.headers, ...(opts.json !== undefined ? { 'content-type': 'application/json' } : opts.contentType ? { 'content-type': opts.contentType } : {}) }),
        ...(opts.json !== undefined ? { body: JSON.stringify(opts.json) } : opts.body !== undefined ? { body: opts.body } : {}),
        ...(signal ? { signal } : {}),
      });
    } catch (err) {
      if ((err as Error).name === 'TimeoutError') throw new SpaceError('TIMEOUT', `${method} ${path} timed out after ${timeout} ms`, { cause: err });
      if ((err as Error).name === 'AbortError' || err instanceof SpaceError) throw err;
      throw new SpaceError('DAEMON_UNREACHABLE', `Cannot reach the SPACE daemon at ${this.url}: ${(err as Error).message}. Is it running (\`space up\`)?`, { cause: err });
    }
    if (!res.ok) throw await errorFromResponse(res);
    return res;
  }

  /** A JSON request. */
  async json<T>(method: string, path: string, opts: Parameters<ApiClient['request']>[2] = {}): Promise<T> {
    const res = await this.request(method, path, opts);
    return (await res.json()) as T;
  }
}

/** Splits a streamed NDJSON body into parsed events. */
export async function* ndjson(res: HttpResponse): AsyncGenerator<Record<string, unknown>> {
  const decoder = new TextDecoder();
  let buf = '';
  for await (const chunk of res.body as AsyncIterable<Uint8Array>) {
    buf += decoder.decode(chunk, { stream: true });
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = buf.slice(0, i);
      buf = buf.slice(i + 1);
      if (line.trim()) yield JSON.parse(line) as Record<string, unknown>;
    }
  }
  if (buf.trim()) yield JSON.parse(buf) as Record<string, unknown>;
}
