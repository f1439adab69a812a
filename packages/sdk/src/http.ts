/**
 * The SDK's HTTP transport: node:http(s) with keep-alive, not fetch. A CLI command is one or two
 * requests; fetch costs ~80 ms to load and ~150 ms more at exit on this machine (undici's
 * WebAssembly parser is still being optimised in the background when the process ends),
 * node:http a few ms (docs/benchmarks.md, "CLI latency").
 */
import http from 'node:http';
import type https from 'node:https';
import { Readable } from 'node:stream';
import { SpaceError } from '@space/api';

/** What a request may send: bytes, text, or a stream of bytes (web or Node). */
export type RequestBody = string | Uint8Array | ArrayBuffer | NodeJS.ReadableStream | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

/** A response: the status, headers, and the body as a Node stream or read whole. */
export class HttpResponse {
  constructor(private readonly res: http.IncomingMessage) {}

  /** The status code. */
  get status(): number {
    return this.res.statusCode ?? 0;
  }

  /** Whether the status is 2xx. */
  get ok(): boolean {
    return this.status >= 200 && this.status < 300;
  }

  /** The status text, e.g. `Not Found`. */
  get statusText(): string {
    return this.res.statusMessage ?? '';
  }

  /** The body as it arrives. */
  get body(): Readable {
    return this.res;
  }

  /** A header's value (names are case-insensitive). */
  header(name: string): string | undefined {
    const v = this.res.headers[name.toLowerCase()];
    return Array.isArray(v) ? v.join(', ') : v;
  }

  /** The whole body. */
  async bytes(): Promise<Buffer> {
    const chunks: Buffer[] = [];
    for await (const c of this.res) chunks.push(c as Buffer);
    return Buffer.concat(chunks);
  }

  /** The whole body as UTF-8 text. */
  async text(): Promise<string> {
    return (await this.bytes()).toString('utf8');
  }

  /** The whole body parsed as JSON. */
  async json<T = unknown>(): Promise<T> {
    return JSON.parse(await this.text()) as T;
  }
}

/**
 * Idle connections are dropped after this long, well before the daemon closes them (Fastify's
 * keep-alive timeout is 72 s): a request sent on a connection the server is closing at that very
 * moment fails with "socket hang up".
 */
const IDLE_SOCKET_MS = 30_000;
const httpAgent = new http.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS });
/**
 * node:https and its agent, loaded on the first https URL (TLS costs every start otherwise).
 * `SPACE_EXTRA_CA_CERTS` (a PEM file) adds CAs to Node's own, as NODE_EXTRA_CA_CERTS would:
 * the `space` launcher moves that variable there so that node does not parse it at every
 * start (packages/cli/bin/space).
 */
let secureTransport: Promise<{ https: typeof https; agent: https.Agent }> | undefined;
const loadHttps = () =>
  (secureTransport ??= Promise.all([import('node:https'), import('node:tls'), import('node:fs')]).then(([m, tls, fs]) => {
    const extra = process.env.SPACE_EXTRA_CA_CERTS;
    let ca: string[] | undefined;
    try {
      ca = extra ? [...tls.rootCertificates, fs.readFileSync(extra, 'utf8')] : undefined;
    } catch (cause) {
      secureTransport = undefined; // fixed files are read again on the next call
      throw new SpaceError('CONFIG_INVALID', `Cannot read the extra CA certificates ${extra} (NODE_EXTRA_CA_CERTS): ${(cause as Error).message}. Point NODE_EXTRA_CA_CERTS at a readable PEM file, or unset it.`, { cause });
    }
    return { https: m.default, agent: new m.default.Agent({ keepAlive: true, timeout: IDLE_SOCKET_MS, ...(ca ? { ca } : {}) }) };
  }));

function bodyStream(body: Exclude<RequestBody, string | Uint8Array | ArrayBuffer>): Readable {
  if (body instanceof Readable) return body;
  if (typeof (body as ReadableStream<Uint8Array>).getReader === 'function') return Readable.fromWeb(body as import('node:stream/web').ReadableStream<Uint8Array>);
  return Readable.from(body as AsyncIterable<Uint8Array>);
}

/**
 * Sends one request; resolves when the response's headers are in. `signal` aborts it at any
 * point, the body's download included: the stream then fails with the signal's reason.
 *
 * A request that fails with ECONNRESET on a reused keep-alive connection before any answer is
 * sent once more on a new one (the server had closed the idle connection and never saw it; what
 * Node's documentation advises), when its body can be sent again (none, or bytes).
 * @example const res = await send(new URL('http://127.0.0.1:7070/v1/health'), { method: 'GET' });
 */
export async function send(url: URL, opts: { method: string; headers?: Record<string, string>; body?: RequestBody; signal?: AbortSignal }): Promise<HttpResponse> {
  const secure = url.protocol === 'https:' ? await loadHttps() : undefined;
  const headers: Record<string, string> = { ...opts.headers };
  let bytes: Buffer | undefined;
  if (typeof opts.body === 'string') bytes = Buffer.from(opts.body);
  else if (opts.body instanceof ArrayBuffer) bytes = Buffer.from(opts.body);
  else if (opts.body instanceof Uint8Array) bytes = Buffer.from(opts.body.buffer, opts.body.byteOffset, opts.body.byteLength);
  if (bytes) headers['content-length'] = String(bytes.length);
  const replayable = bytes !== undefined || opts.body === undefined;
  try {
    return await sendOnce(url, opts, headers, bytes, secure);
  } catch (err) {
    if (!replayable || !(err as { reusedSocket?: boolean }).reusedSocket || (err as NodeJS.ErrnoException).code !== 'ECONNRESET') throw err;
    return sendOnce(url, opts, headers, bytes, secure);
  }
}

function sendOnce(url: URL, opts: { method: string; body?: RequestBody; signal?: AbortSignal }, headers: Record<string, string>, bytes: Buffer | undefined, secure: { https: typeof https; agent: https.Agent } | undefined): Promise<HttpResponse> {
  const { signal } = opts;
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const req = secure ? secure.https.request(url, { method: opts.method, headers, agent: secure.agent }) : http.request(url, { method: opts.method, headers, agent: httpAgent });
    let res: http.IncomingMessage | undefined;
    const abort = () => {
      req.destroy(signal!.reason);
      res?.destroy(signal!.reason);
    };
    signal?.addEventListener('abort', abort, { once: true });
    const done = () => signal?.removeEventListener('abort', abort);
    req.on('response', (r) => {
      res = r;
      r.on('close', done);
      resolve(new HttpResponse(r));
    });
    req.on('error', (err) => {
      done();
      // Whether it went out on a kept-alive connection, for send()'s one retry.
      if (!res) Object.assign(err, { reusedSocket: req.reusedSocket });
      reject(err);
    });
    if (bytes || opts.body === undefined) req.end(bytes);
    else {
      const src = bodyStream(opts.body as Exclude<RequestBody, string | Uint8Array | ArrayBuffer>);
      src.on('error', (err) => req.destroy(err));
      src.pipe(req);
    }
  });
}
