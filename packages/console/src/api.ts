/**
 * The console's client of SPACE's public HTTP API: same-origin requests carrying the session
 * cookie (set by sign-in; HttpOnly, so this code never sees it) and, on requests that change
 * anything, the session's CSRF token. The API key is sent once, to sign in, and never kept.
 */

/** An API error: its stable code, message and hint, as the API answered. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly hint?: string,
  ) {
    super(message);
  }
}

/** The signed-in session (GET /v1/session). */
export interface Session {
  tenantId: string;
  keyId: string;
  admin: boolean;
  csrfToken: string;
  expiresAt: string;
}

let csrf = '';

/** The API's error body (`{ error: { code, message, hint } }`) of a failed answer as an {@link ApiError}; `fallback` when it has none. */
function failure(status: number, body: string, fallback: string): ApiError {
  let e: { code?: string; message?: string; hint?: string } = {};
  try {
    e = (JSON.parse(body) as { error?: typeof e }).error ?? {};
  } catch {
    // not JSON
  }
  return new ApiError(status, e.code ?? 'ERROR', e.message ?? fallback, e.hint);
}
const signedOut = new Set<() => void>();

/** Calls `fn` when a request finds the session ended (401): the app shows the sign-in page. */
export function onSignedOut(fn: () => void): void {
  signedOut.add(fn);
}

/** The headers of a request that changes state. */
export function csrfHeaders(): Record<string, string> {
  return { 'x-csrf-token': csrf };
}

/**
 * One API request; resolves to its JSON answer (undefined for 204), rejects with {@link ApiError}.
 *
 * @example const { items } = await api<{ items: Sandbox[] }>('GET', '/v1/sandboxes');
 */
export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = method === 'GET' ? {} : csrfHeaders();
  if (body !== undefined) headers['content-type'] = 'application/json';
  let r: Response;
  try {
    r = await fetch(path, { method, headers, credentials: 'same-origin', ...(body !== undefined ? { body: JSON.stringify(body) } : {}) });
  } catch (err) {
    throw new ApiError(0, 'NETWORK', `The daemon did not answer (${(err as Error).message}): is it running?`);
  }
  if (r.status === 204) return undefined as T;
  const text = await r.text();
  if (!r.ok) {
    if (r.status === 401 && path !== '/v1/session') for (const fn of signedOut) fn();
    throw failure(r.status, text, `${r.status} ${r.statusText}`);
  }
  return (text ? JSON.parse(text) : undefined) as T;
}

/** Signs in with an API key (kept nowhere); the session's CSRF token is kept in memory. */
export async function signIn(apiKey: string): Promise<Session> {
  const s = await api<Session>('POST', '/v1/session', { apiKey });
  csrf = s.csrfToken;
  return s;
}

/** The current session, or undefined when signed out. */
export async function currentSession(): Promise<Session | undefined> {
  try {
    const s = await api<Session>('GET', '/v1/session');
    csrf = s.csrfToken;
    return s;
  } catch (err) {
    if (err instanceof ApiError && err.status === 401) return undefined;
    throw err;
  }
}

/** Signs out (clears the cookie). */
export async function signOut(): Promise<void> {
  await api('DELETE', '/v1/session');
  csrf = '';
}

/**
 * Sends a file as a request's body with progress (fetch cannot report upload progress;
 * XMLHttpRequest can), resolving to the parsed answer.
 *
 * @example await sendFile('PUT', `/v1/sandboxes/${id}/files/content?path=%2Ftmp%2Fa.txt`, file, (f) => console.log(f));
 */
export function sendFile<T = unknown>(method: 'PUT' | 'POST', url: string, file: Blob, progress: (fraction: number) => void): Promise<T> {
  return new Promise((resolve, reject) => {
    const x = new XMLHttpRequest();
    x.open(method, url);
    x.setRequestHeader('content-type', 'application/octet-stream');
    x.setRequestHeader('x-csrf-token', csrf);
    x.upload.onprogress = (e) => e.lengthComputable && progress(e.loaded / e.total);
    x.onload = () => {
      if (x.status < 300) return resolve((x.responseText ? JSON.parse(x.responseText) : undefined) as T);
      if (x.status === 401) for (const fn of signedOut) fn();
      reject(failure(x.status, x.responseText, `upload failed: ${x.status}`));
    };
    x.onerror = () => reject(new ApiError(0, 'NETWORK', 'The upload did not reach the daemon'));
    x.send(file);
  });
}

/**
 * Uploads a file into a sandbox with progress.
 *
 * @example await upload(id, '/tmp/a.txt', file, (f) => console.log(f));
 */
export async function upload(sandboxId: string, path: string, file: Blob, progress: (fraction: number) => void): Promise<void> {
  await sendFile('PUT', `/v1/sandboxes/${encodeURIComponent(sandboxId)}/files/content?path=${encodeURIComponent(path)}`, file, progress);
}

/**
 * A request whose answer streams NDJSON (template builds, drains): `onLine` gets each line as it
 * arrives; resolves to the `done` line's result, rejects with the `error` line.
 *
 * @example await stream('POST', '/v1/templates', { name, packages }, (l) => l.type === 'progress' && show(l.percent));
 */
export async function stream<T = unknown>(method: string, path: string, body: unknown, onLine: (line: { type: string; [k: string]: unknown }) => void): Promise<T> {
  const r = await fetch(path, { method, credentials: 'same-origin', headers: { ...csrfHeaders(), 'content-type': 'application/json', accept: 'application/x-ndjson' }, body: JSON.stringify(body) });
  if (!r.ok || !r.body) {
    if (r.status === 401) for (const fn of signedOut) fn();
    throw failure(r.status, await r.text().catch(() => ''), `${r.status} ${r.statusText}`);
  }
  const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buf += value;
    let i: number;
    while ((i = buf.indexOf('\n')) >= 0) {
      const line = JSON.parse(buf.slice(0, i)) as { type: string; result?: unknown; code?: string; message?: string; hint?: string };
      buf = buf.slice(i + 1);
      onLine(line);
      if (line.type === 'done') return line.result as T;
      if (line.type === 'error') throw new ApiError(400, line.code ?? 'ERROR', line.message ?? 'failed', line.hint);
    }
    if (done) throw new ApiError(0, 'NETWORK', 'The stream ended before the operation did');
  }
}
