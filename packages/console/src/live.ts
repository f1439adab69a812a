/**
 * The live view: one EventSource on `GET /v1/events` (the tenant's changes as they happen) that
 * every page subscribes to. EventSource reconnects by itself when the daemon restarts; pages are
 * told (`reconnected`) so they reload what they show, since changes made meanwhile were missed.
 */
import { api, ApiError } from './api.js';

/** What the stream carries. */
export type LiveMessage =
  | { type: 'sandbox'; data: Record<string, unknown> & { id: string; state: string } }
  | { type: 'event'; data: { sandboxId: string; at: string; type: string; message: string } }
  | { type: 'egress'; data: Record<string, unknown> & { sandboxId: string } }
  | { type: 'reconnected' }
  | { type: 'status'; connected: boolean };

const listeners = new Set<(m: LiveMessage) => void>();
let source: EventSource | undefined;
let wasOpen = false;

function emit(m: LiveMessage): void {
  for (const l of listeners) l(m);
}

function open(): void {
  source = new EventSource('/v1/events');
  for (const type of ['sandbox', 'event', 'egress'] as const) {
    source.addEventListener(type, (e) => emit({ type, data: JSON.parse((e as MessageEvent<string>).data) } as LiveMessage));
  }
  source.onopen = () => {
    emit({ type: 'status', connected: true });
    if (wasOpen) emit({ type: 'reconnected' });
    wasOpen = true;
  };
  source.onerror = () => {
    emit({ type: 'status', connected: false });
    // Closed for good (401, or a daemon that answered with an error): the session may have
    // ended — asking tells the app (a 401 signs out) — else try again shortly.
    if (source?.readyState === EventSource.CLOSED) {
      source = undefined;
      void api('GET', '/v1/session')
        .then(() => setTimeout(() => listeners.size && !source && open(), 2000))
        .catch((err) => !(err instanceof ApiError && err.status === 401) && setTimeout(() => listeners.size && !source && open(), 2000));
    }
  };
}

/**
 * Subscribes to the live stream; returns the unsubscribe function.
 *
 * @example useEffect(() => live((m) => m.type === 'sandbox' && update(m.data)), []);
 */
export function live(fn: (m: LiveMessage) => void): () => void {
  listeners.add(fn);
  if (!source) open();
  return () => {
    listeners.delete(fn);
  };
}

/** Closes the stream (on sign-out). */
export function closeLive(): void {
  source?.close();
  source = undefined;
  wasOpen = false;
}
