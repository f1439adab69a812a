/**
 * Agent side of a multiplexed stream: credit-limited sending (so a slow client slows the
 * process) and credit granting for what the daemon sends us.
 */
import { EventEmitter } from 'node:events';
import type { ErrorCode } from '@space/api';
import { Channel, FrameKind, INITIAL_WINDOW, MAX_DATA_CHUNK, creditPayload, encodeData, encodeFrame, encodeJson } from '@space/protocol';

/** Where frames go: the current connection. */
export interface FrameSink {
  write(buf: Buffer): void;
  readonly alive: boolean;
}

/**
 * One stream opened by the daemon.
 * Emits `drain` when queued output has been sent, `data` (channel, buf) for incoming DATA,
 * `end` (json) and `cancel` (reason) when the daemon ends or abandons it, `close` after either.
 */
export class Stream extends EventEmitter {
  private credit = INITIAL_WINDOW;
  private queue: { channel: Channel; data: Buffer }[] = [];
  closed = false;

  constructor(private readonly sink: FrameSink, readonly id: number) {
    super();
  }

  /** Sends the reply header. */
  reply(v: object): void {
    if (!this.closed) this.sink.write(encodeJson(FrameKind.Reply, this.id, v));
  }

  /** Queues output; returns false when the caller should pause its source until `drain`. */
  send(channel: Channel, data: Buffer): boolean {
    if (this.closed) return true;
    for (let off = 0; off < data.length; off += MAX_DATA_CHUNK) this.queue.push({ channel, data: data.subarray(off, off + MAX_DATA_CHUNK) });
    this.flush();
    return this.queue.length === 0;
  }

  /** True when output is waiting for credit. */
  get blocked(): boolean {
    return this.queue.length > 0;
  }

  /** Ends the stream with a final payload (after all queued output). */
  end(v: object): void {
    if (this.closed) return;
    if (this.queue.length) {
      this.once('drain', () => this.end(v));
      return;
    }
    this.sink.write(encodeJson(FrameKind.End, this.id, v));
    this.close();
  }

  /** Fails the stream. */
  fail(code: ErrorCode, message: string): void {
    if (this.closed) return;
    const payload = { error: { code, message } };
    this.sink.write(encodeJson(FrameKind.End, this.id, payload));
    this.close();
  }

  /** Grants the daemon more room to send us (after we consumed `n` bytes). */
  grant(n: number): void {
    if (!this.closed && n > 0) this.sink.write(encodeFrame(FrameKind.Credit, this.id, creditPayload(n)));
  }

  /** Called for CREDIT frames. */
  addCredit(n: number): void {
    this.credit += n;
    this.flush();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.queue = [];
    this.emit('close');
  }

  private flush(): void {
    while (this.queue.length && this.credit > 0 && this.sink.alive) {
      const head = this.queue[0]!;
      if (head.data.length <= this.credit) {
        this.queue.shift();
        this.credit -= head.data.length;
        this.sink.write(encodeData(this.id, head.channel, head.data));
      } else {
        const part = head.data.subarray(0, this.credit);
        head.data = head.data.subarray(this.credit);
        this.credit = 0;
        this.sink.write(encodeData(this.id, head.channel, part));
      }
    }
    if (this.queue.length === 0) this.emit('drain');
  }
}
