/**
 * Host side of the agent protocol over any byte stream a driver provides. Multiplexes calls
 * (streams), applies credit-based flow control in both directions, and treats every byte the
 * agent sends as hostile: malformed frames, unknown streams and credit overruns drop the
 * connection; replies are size-bounded by the frame codec.
 */
import { EventEmitter } from 'node:events';
import type { Duplex } from 'node:stream';
import {
  Channel,
  FrameKind,
  FrameReader,
  INITIAL_WINDOW,
  MAX_DATA_CHUNK,
  ProtocolError,
  creditPayload,
  encodeData,
  encodeFrame,
  encodeJson,
  parseJson,
  type AgentRequest,
  type Frame,
} from '@space/protocol';
import { SpaceError, isErrorCode } from '../errors.js';

/** A chunk of stream output. */
export interface OutputChunk {
  channel: Channel;
  data: Buffer;
}

type Json = Record<string, unknown>;

function wireError(v: unknown, fallback: string): SpaceError {
  const e = (typeof v === 'object' && v !== null ? v : {}) as Json;
  const code = isErrorCode(e.code) ? e.code : 'AGENT_PROTOCOL_ERROR';
  const msg = typeof e.message === 'string' ? e.message.slice(0, 2000) : fallback;
  return new SpaceError(code, msg);
}

class Deferred<T> {
  promise: Promise<T>;
  resolve!: (v: T) => void;
  reject!: (e: unknown) => void;
  settled = false;
  constructor() {
    this.promise = new Promise<T>((res, rej) => {
      this.resolve = (v) => { this.settled = true; res(v); };
      this.reject = (e) => { this.settled = true; rej(e); };
    });
    this.promise.catch(() => {});
  }
}

/**
 * One multiplexed call to the agent.
 *
 * @example
 * const call = channel.call({ op: 'exec', argv: ['echo', 'hi'] });
 * const { pid } = await call.reply;
 * for await (const { channel, data } of call.output()) process.stdout.write(data);
 * const { exitCode } = await call.done;
 */
export class AgentCall {
  /** The reply header (rejects with the agent's error). */
  readonly reply: Promise<Json>;
  /** The End payload (rejects when the call fails or the agent disconnects). */
  readonly done: Promise<Json>;
  private readonly replyD = new Deferred<Json>();
  private readonly doneD = new Deferred<Json>();
  private queue: OutputChunk[] = [];
  private wake: (() => void) | undefined;
  private ended = false;
  private failure: unknown;
  /** Bytes we may still receive (we granted them). */
  private recvWindow = INITIAL_WINDOW;
  /** Bytes consumed but not yet re-granted. */
  private consumed = 0;
  /** Bytes we may still send. */
  private sendCredit = INITIAL_WINDOW;
  private creditWaiters: (() => void)[] = [];

  constructor(private readonly ch: AgentChannel, readonly id: number) {
    this.reply = this.replyD.promise;
    this.done = this.doneD.promise;
  }

  /** Output chunks in order; consuming them returns credit to the agent (backpressure). */
  async *output(): AsyncGenerator<OutputChunk> {
    for (;;) {
      const next = this.queue.shift();
      if (next) {
        this.consumed += next.data.length;
        if (this.consumed >= INITIAL_WINDOW / 4) {
          this.recvWindow += this.consumed;
          this.ch.send(encodeFrame(FrameKind.Credit, this.id, creditPayload(this.consumed)));
          this.consumed = 0;
        }
        yield next;
        continue;
      }
      if (this.failure) throw this.failure;
      if (this.ended) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }

  /** Sends bytes on `channel`, waiting for the agent's credit. */
  async write(channel: Channel, data: Buffer): Promise<void> {
    for (let off = 0; off < data.length; ) {
      if (this.failure) throw this.failure;
      if (this.sendCredit <= 0) {
        await new Promise<void>((r) => this.creditWaiters.push(r));
        continue;
      }
      const n = Math.min(MAX_DATA_CHUNK, this.sendCredit, data.length - off);
      this.sendCredit -= n;
      await this.ch.sendAsync(encodeData(this.id, channel, data.subarray(off, off + n)));
      off += n;
    }
  }

  /** Ends our half of the stream (e.g. end of upload, EOF on stdin). */
  end(payload: Json = {}): void {
    this.ch.send(encodeJson(FrameKind.End, this.id, payload));
  }

  /** Asks the agent to abandon the call (a background process keeps running). */
  cancel(reason = 'cancelled'): void {
    if (this.doneD.settled) return;
    this.ch.send(encodeJson(FrameKind.Cancel, this.id, { reason }));
  }

  /** @internal */
  handle(f: Frame): void {
    switch (f.kind) {
      case FrameKind.Reply: {
        const p = parseJson(f.payload);
        if (p.error) this.fail(wireError(p.error, 'agent refused the call'));
        else this.replyD.resolve(p);
        return;
      }
      case FrameKind.Data: {
        if (f.payload.length < 1) throw new ProtocolError('empty DATA frame');
        const data = f.payload.subarray(1);
        if (data.length > this.recvWindow) throw new ProtocolError(`agent overran flow-control window on stream ${this.id}`);
        this.recvWindow -= data.length;
        const channel = f.payload.readUInt8(0) as Channel;
        if (!(channel in Channel)) throw new ProtocolError(`unknown channel ${channel}`);
        this.queue.push({ channel, data });
        this.wake?.();
        return;
      }
      case FrameKind.Credit: {
        if (f.payload.length !== 4) throw new ProtocolError('bad CREDIT frame');
        this.sendCredit += f.payload.readUInt32BE(0);
        if (this.sendCredit > 64 * INITIAL_WINDOW) throw new ProtocolError('agent granted absurd credit');
        for (const w of this.creditWaiters.splice(0)) w();
        return;
      }
      case FrameKind.End: {
        const p = parseJson(f.payload);
        // A call that fails before it replied rejects its reply too (e.g. watching a path that is not there).
        if (p.error) this.fail(wireError(p.error, 'call failed in the agent'));
        else {
          if (!this.replyD.settled) this.replyD.resolve({});
          this.ended = true;
          this.doneD.resolve(p);
          this.wake?.();
          this.ch.forget(this.id);
        }
        return;
      }
      default:
        throw new ProtocolError(`unexpected frame kind ${f.kind} on stream ${this.id}`);
    }
  }

  /** @internal */
  fail(err: unknown): void {
    if (this.failure) return;
    this.failure = err;
    this.replyD.reject(err);
    this.doneD.reject(err);
    this.wake?.();
    for (const w of this.creditWaiters.splice(0)) w();
    this.ch.forget(this.id);
  }
}

/** Events of an {@link AgentChannel}. */
export interface AgentChannelEvents {
  event: [Json];
  close: [Error | undefined];
}

/**
 * A connection to one sandbox's agent.
 *
 * @example
 * const ch = new AgentChannel(socket);
 * ch.on('event', (e) => console.log(e.event));
 * const pong = await ch.unary({ op: 'ping' }, 5000);
 */
export class AgentChannel extends EventEmitter<AgentChannelEvents> {
  private readonly calls = new Map<number, AgentCall>();
  private nextId = 1;
  private closedWith: Error | undefined;
  closed = false;

  constructor(private readonly stream: Duplex) {
    super();
    const reader = new FrameReader((f) => this.dispatch(f));
    stream.on('data', (chunk: Buffer) => {
      try {
        reader.push(chunk);
      } catch (err) {
        this.destroy(err instanceof Error ? err : new Error(String(err)));
      }
    });
    stream.on('error', (err) => this.destroy(err));
    stream.on('close', () => this.destroy());
  }

  /** Calls still open (e.g. command streams a client is reading). */
  get openCalls(): number {
    return this.calls.size;
  }

  /** Opens a call. */
  call(req: AgentRequest): AgentCall {
    if (this.closed) {
      const c = new AgentCall(this, 0);
      c.fail(new SpaceError('AGENT_UNAVAILABLE', 'The sandbox agent is not connected', { cause: this.closedWith }));
      return c;
    }
    const id = this.nextId;
    this.nextId += 2;
    const c = new AgentCall(this, id);
    this.calls.set(id, c);
    this.send(encodeJson(FrameKind.Request, id, req));
    return c;
  }

  /** A call with no stream body: resolves with the End payload (or the reply), within `timeoutMs`. */
  async unary(req: AgentRequest, timeoutMs = 30_000): Promise<Json> {
    const c = this.call(req);
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, rej) => {
      timer = setTimeout(() => {
        c.cancel('timeout');
        rej(new SpaceError('TIMEOUT', `Agent did not answer ${req.op} within ${timeoutMs} ms`));
      }, timeoutMs);
    });
    try {
      const [reply, done] = await Promise.race([Promise.all([c.reply, c.done]), timeout]);
      return { ...reply, ...done };
    } finally {
      clearTimeout(timer);
    }
  }

  /** @internal */
  send(buf: Buffer): void {
    if (!this.closed) this.stream.write(buf);
  }

  /** @internal Writes and waits for the socket to drain when its buffer is full. */
  async sendAsync(buf: Buffer): Promise<void> {
    if (this.closed) throw new SpaceError('AGENT_DISCONNECTED');
    if (!this.stream.write(buf)) {
      await new Promise<void>((res) => {
        const done = () => { this.stream.off('drain', done); this.stream.off('close', done); res(); };
        this.stream.on('drain', done);
        this.stream.on('close', done);
      });
    }
  }

  /** @internal */
  forget(id: number): void {
    this.calls.delete(id);
  }

  private dispatch(f: Frame): void {
    if (f.kind === FrameKind.Event) {
      const ev = parseJson(f.payload);
      // The agent is leaving on purpose over a transport it cannot close itself (microVM serial port).
      if (ev.event === 'bye') return this.destroy();
      this.emit('event', ev);
      return;
    }
    const c = this.calls.get(f.stream);
    if (!c) {
      // Late frames for calls we gave up on are harmless; anything else is a protocol breach.
      if (f.stream % 2 === 1 && f.stream < this.nextId) return;
      throw new ProtocolError(`frame for unknown stream ${f.stream}`);
    }
    c.handle(f);
  }

  /** Closes the connection; every open call fails with `AGENT_DISCONNECTED`. */
  destroy(err?: Error): void {
    if (this.closed) return;
    this.closed = true;
    this.closedWith = err;
    const e = new SpaceError(
      err instanceof ProtocolError ? 'AGENT_PROTOCOL_ERROR' : 'AGENT_DISCONNECTED',
      err instanceof ProtocolError ? `Sandbox agent broke the protocol: ${err.message}` : 'The sandbox agent disconnected during the operation',
      { cause: err },
    );
    for (const c of [...this.calls.values()]) c.fail(e);
    this.calls.clear();
    this.stream.destroy();
    this.emit('close', err);
  }
}
