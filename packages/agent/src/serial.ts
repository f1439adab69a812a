/**
 * The agent's transport inside a microVM: a virtio-serial port (`/dev/vportNpM`) whose host
 * end is a unix socket of the VMM that the daemon connects to. Unlike a socket, the agent can
 * neither open nor close a connection on it: the port reads EOF while no host is connected,
 * writes block until one is, and one host connection follows another on the same file. So a
 * connection starts when the daemon writes {@link SERIAL_OPEN_MAGIC} + base64 JSON + `\n`
 * (anything before it is stale and dropped), and ends at EOF (the daemon went away) or when
 * the agent drops it (after saying `bye`, see {@link ByeEvent}).
 *
 * Reads and writes go through libuv's thread pool (a character device has no event-loop
 * handle): one read is always pending, and writes are queued so at most one waits for a host.
 */
import { EventEmitter } from 'node:events';
import { closeSync, constants, openSync, read, write } from 'node:fs';
import { SERIAL_OPEN_MAGIC, type SerialOpen } from '@space/protocol';

const MAGIC = Buffer.from(SERIAL_OPEN_MAGIC, 'latin1');
/** How long to wait before reading again while no host is connected. */
const IDLE_MS = 20;

/**
 * One host connection over the port. It has the part of `net.Socket`'s interface the agent's
 * connection uses: `data`, `close` and `error` events, `write` and `destroy`.
 */
export class SerialConnection extends EventEmitter {
  open = true;
  constructor(private readonly port: SerialPort) {
    super();
  }
  write(buf: Buffer): boolean {
    if (this.open) this.port.send(buf);
    return true;
  }
  /** Ends this connection on the agent's side; the port waits for the next open. */
  destroy(): void {
    this.port.end(this);
  }
  /** @internal */
  closed(): void {
    if (!this.open) return;
    this.open = false;
    this.emit('close');
  }
}

/**
 * The virtio-serial port the agent serves on.
 *
 * @example
 * new SerialPort('/dev/vport0p1', (conn, open) => serve(conn, open)).start();
 */
export class SerialPort {
  private fd = -1;
  private current: SerialConnection | undefined;
  /** Bytes read while waiting for an open (no connection). */
  private pending = Buffer.alloc(0);
  private readonly queue: Buffer[] = [];
  private writing = false;
  private readonly buf = Buffer.allocUnsafe(64 * 1024);

  constructor(
    private readonly path: string,
    private readonly onOpen: (conn: SerialConnection, open: SerialOpen) => void,
  ) {}

  start(): void {
    this.fd = openSync(this.path, constants.O_RDWR);
    this.readLoop();
  }

  private readLoop(): void {
    read(this.fd, this.buf, 0, this.buf.length, null, (err, n) => {
      if (err) {
        // EAGAIN/EINTR and friends: try again shortly. A lost port (ENODEV) reopens.
        if ((err as NodeJS.ErrnoException).code === 'ENODEV') this.reopen();
        setTimeout(() => this.readLoop(), IDLE_MS);
        return;
      }
      if (n === 0) {
        // No host connected (any more): the connection, if any, is over.
        this.hostGone();
        setTimeout(() => this.readLoop(), IDLE_MS);
        return;
      }
      this.received(Buffer.from(this.buf.subarray(0, n)));
      this.readLoop();
    });
  }

  private reopen(): void {
    try {
      closeSync(this.fd);
    } catch {
      // already closed
    }
    try {
      this.fd = openSync(this.path, constants.O_RDWR);
    } catch {
      // tried again on the next read
    }
  }

  private received(data: Buffer): void {
    if (this.current) {
      this.current.emit('data', data);
      return;
    }
    this.pending = Buffer.concat([this.pending, data]);
    const at = this.pending.indexOf(MAGIC);
    if (at < 0) {
      // Keep only what could be the start of a magic split across reads.
      this.pending = this.pending.subarray(Math.max(0, this.pending.length - MAGIC.length));
      return;
    }
    const nl = this.pending.indexOf(0x0a, at + MAGIC.length);
    if (nl < 0) {
      if (this.pending.length > 1 << 20) this.pending = Buffer.alloc(0);
      return;
    }
    let open: SerialOpen = {};
    try {
      open = JSON.parse(Buffer.from(this.pending.subarray(at + MAGIC.length, nl).toString('latin1'), 'base64').toString('utf8')) as SerialOpen;
    } catch {
      // A malformed open still opens: the daemon learns of the problem from the hello that follows.
    }
    const rest = this.pending.subarray(nl + 1);
    this.pending = Buffer.alloc(0);
    const conn = new SerialConnection(this);
    this.current = conn;
    this.onOpen(conn, open);
    if (rest.length) conn.emit('data', Buffer.from(rest));
  }

  private hostGone(): void {
    this.queue.length = 0;
    const c = this.current;
    this.current = undefined;
    c?.closed();
  }

  /** @internal */
  end(conn: SerialConnection): void {
    if (this.current !== conn) return;
    this.current = undefined;
    conn.closed();
  }

  /** @internal Queues bytes for the host; written in order, one write at a time. */
  send(buf: Buffer): void {
    this.queue.push(buf);
    if (!this.writing) this.flush();
  }

  private flush(): void {
    const next = this.queue[0];
    if (!next) {
      this.writing = false;
      return;
    }
    this.writing = true;
    // The port takes at most 32 KiB per write: write what it took, then the rest.
    write(this.fd, next, 0, next.length, null, (err, n) => {
      if (err) {
        // Nothing sensible to do with bytes for a host that is gone: drop them.
        this.queue.length = 0;
        this.writing = false;
        return;
      }
      if (this.queue[0] !== next) return this.flush(); // the queue was dropped meanwhile
      if (n < next.length) this.queue[0] = next.subarray(n);
      else this.queue.shift();
      this.flush();
    });
  }
}
