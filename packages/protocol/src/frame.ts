/**
 * Frame codec for the daemon ⇄ agent control channel.
 *
 * Wire layout of one frame (big-endian):
 *
 * ```
 * u32 length   bytes that follow this field (1 + 4 + payload)
 * u8  kind     one of {@link FrameKind}
 * u32 stream   stream id; 0 is the connection itself
 * ...payload   JSON (UTF-8) or raw bytes, depending on kind
 * ```
 *
 * The reader enforces {@link MAX_FRAME_BYTES} before buffering a frame, so a hostile peer
 * cannot make the other side allocate without bound.
 */

/** Kinds of frames. JSON kinds carry a UTF-8 JSON object; DATA carries a channel byte + bytes. */
export enum FrameKind {
  /** Open a stream: JSON `{ op, ...args }`. */
  Request = 1,
  /** The stream's reply header: JSON (e.g. `{ pid }`), or `{ error }`. */
  Reply = 2,
  /** Bytes on a stream: first payload byte is the {@link Channel}, the rest is data. */
  Data = 3,
  /** Flow-control credit: payload is a u32 count of bytes the sender may additionally send. */
  Credit = 4,
  /** End of the sender's half of a stream: JSON (e.g. `{ exitCode }` or `{ error }`). */
  End = 5,
  /** Ask the peer to abandon a stream: JSON `{ reason }`. */
  Cancel = 6,
  /** Stream-less notification: JSON `{ event, ... }` (hello, process exit, ...). */
  Event = 7,
}

/** Channels of a DATA frame. */
export enum Channel {
  Stdout = 1,
  Stderr = 2,
  Stdin = 3,
  /** File contents (upload or download). */
  File = 4,
  /** PTY output (stdout and stderr combined by the terminal). */
  Pty = 5,
}

/** Largest frame either side accepts (header + payload). */
export const MAX_FRAME_BYTES = 1024 * 1024;
/** Largest data payload a sender puts in one DATA frame. */
export const MAX_DATA_CHUNK = 64 * 1024;
/** Credit a receiver grants when a stream opens; sender must not exceed granted credit. */
export const INITIAL_WINDOW = 256 * 1024;
/** Bytes of the frame header after the length field. */
const HEADER = 5;

/** One decoded frame. */
export interface Frame {
  kind: FrameKind;
  stream: number;
  payload: Buffer;
}

/** Error raised for a frame that breaks the protocol; the connection must be dropped. */
export class ProtocolError extends Error {
  override readonly name = 'ProtocolError';
  readonly code = 'AGENT_PROTOCOL_ERROR';
}

/**
 * Encodes one frame.
 *
 * @example
 * socket.write(encodeFrame(FrameKind.Credit, 3, creditPayload(65536)));
 */
export function encodeFrame(kind: FrameKind, stream: number, payload: Buffer | Uint8Array = Buffer.alloc(0)): Buffer {
  const len = HEADER + payload.length;
  if (len + 4 > MAX_FRAME_BYTES) throw new ProtocolError(`frame of ${len} bytes exceeds ${MAX_FRAME_BYTES}`);
  const buf = Buffer.allocUnsafe(4 + len);
  buf.writeUInt32BE(len, 0);
  buf.writeUInt8(kind, 4);
  buf.writeUInt32BE(stream >>> 0, 5);
  buf.set(payload, 9);
  return buf;
}

/** Encodes a JSON frame. */
export function encodeJson(kind: FrameKind, stream: number, value: unknown): Buffer {
  return encodeFrame(kind, stream, Buffer.from(JSON.stringify(value), 'utf8'));
}

/** Encodes a DATA frame on `channel`. */
export function encodeData(stream: number, channel: Channel, data: Uint8Array): Buffer {
  const payload = Buffer.allocUnsafe(1 + data.length);
  payload.writeUInt8(channel, 0);
  payload.set(data, 1);
  return encodeFrame(FrameKind.Data, stream, payload);
}

/** Encodes a CREDIT payload. */
export function creditPayload(bytes: number): Buffer {
  const b = Buffer.allocUnsafe(4);
  b.writeUInt32BE(bytes >>> 0, 0);
  return b;
}

/**
 * Parses a JSON payload from an untrusted peer: must be a plain object.
 *
 * @throws ProtocolError when the payload is not a JSON object.
 */
export function parseJson(payload: Buffer): Record<string, unknown> {
  let v: unknown;
  try {
    v = JSON.parse(payload.toString('utf8'));
  } catch (cause) {
    throw new ProtocolError('frame payload is not valid JSON', { cause });
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) throw new ProtocolError('frame payload is not a JSON object');
  return v as Record<string, unknown>;
}

/**
 * Incremental frame decoder. Feed it socket chunks; it calls `onFrame` for each complete frame.
 *
 * @example
 * const reader = new FrameReader((f) => handle(f));
 * socket.on('data', (chunk) => reader.push(chunk));
 */
export class FrameReader {
  private chunks: Buffer[] = [];
  private buffered = 0;

  constructor(
    private readonly onFrame: (frame: Frame) => void,
    private readonly maxFrame = MAX_FRAME_BYTES,
  ) {}

  /** Adds bytes. Throws {@link ProtocolError} on a malformed or oversized frame. */
  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    while (this.buffered >= 4) {
      const head = this.peek(4);
      const len = head.readUInt32BE(0);
      if (len < HEADER || len + 4 > this.maxFrame) throw new ProtocolError(`invalid frame length ${len}`);
      if (this.buffered < 4 + len) return;
      const whole = this.take(4 + len);
      const kind = whole.readUInt8(4);
      if (!(kind in FrameKind) || kind < FrameKind.Request || kind > FrameKind.Event) throw new ProtocolError(`unknown frame kind ${kind}`);
      this.onFrame({ kind, stream: whole.readUInt32BE(5), payload: whole.subarray(9) });
    }
  }

  private peek(n: number): Buffer {
    if (this.chunks[0]!.length >= n) return this.chunks[0]!;
    this.chunks = [Buffer.concat(this.chunks)];
    return this.chunks[0]!;
  }

  private take(n: number): Buffer {
    const all = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
    const out = all.subarray(0, n);
    const rest = all.subarray(n);
    this.chunks = rest.length ? [rest] : [];
    this.buffered = rest.length;
    return out;
  }
}
