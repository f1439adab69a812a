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
