/**
 * A push-to-pull bridge: producers push, one consumer iterates until it is closed.
 *
 * @example
 * const q = new AsyncQueue<string>();
 * q.push('a'); q.close();
 * for await (const x of q) console.log(x); // 'a'
 */
export class AsyncQueue<T> {
  private readonly items: T[] = [];
  private wake: (() => void) | undefined;
  private closed = false;

  push(item: T): void {
    if (this.closed) return;
    this.items.push(item);
    this.wake?.();
  }

  /** Ends the iteration once the queued items are consumed. */
  close(): void {
    this.closed = true;
    this.wake?.();
  }

  /** Takes what is queued now without waiting. */
  drain(): T[] {
    return this.items.splice(0);
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<T> {
    for (;;) {
      while (this.items.length) yield this.items.shift()!;
      if (this.closed) return;
      await new Promise<void>((r) => (this.wake = r));
      this.wake = undefined;
    }
  }
}

/**
 * Runs work one at a time per key, in the order it was asked for: each call starts after every
 * earlier call with the same key has settled (whether it succeeded or not).
 *
 * @example
 * const serial = new KeyedSerial();
 * await Promise.all([serial.run('vol-1', mount), serial.run('vol-1', unmount)]); // mount, then unmount
 */
export class KeyedSerial {
  private readonly tails = new Map<string, Promise<unknown>>();

  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const next = (this.tails.get(key) ?? Promise.resolve()).then(fn, fn);
    const tail = next.catch(() => {});
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }
}
