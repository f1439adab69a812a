/**
 * Small building blocks shared by the pages: navigation (the History API under /console/),
 * links, confirmation dialogs, error boxes, formatting. Everything user-controlled is rendered
 * as text by Preact; nothing here sets HTML.
 */
import type { ComponentChildren, JSX } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { ApiError } from './api.js';

const routeListeners = new Set<() => void>();
addEventListener('popstate', () => routeListeners.forEach((l) => l()));

/** Goes to a console path (`/console/sandboxes/sb…`). */
export function navigate(path: string): void {
  history.pushState(null, '', path);
  routeListeners.forEach((l) => l());
  window.scrollTo(0, 0);
}

/** The current path, re-rendering on navigation. */
export function usePath(): string {
  const [p, setP] = useState(location.pathname);
  useEffect(() => {
    const l = () => setP(location.pathname);
    routeListeners.add(l);
    return () => void routeListeners.delete(l);
  }, []);
  return p;
}

/** A link inside the console (no page load). */
export function Link(props: { href: string; children: ComponentChildren; class?: string; 'aria-current'?: 'page' | undefined }): JSX.Element {
  return (
    <a
      href={props.href}
      class={props.class}
      aria-current={props['aria-current']}
      onClick={(e) => {
        if (e.ctrlKey || e.metaKey || e.shiftKey || e.button !== 0) return;
        e.preventDefault();
        navigate(props.href);
      }}
    >
      {props.children}
    </a>
  );
}

/** An error as the API said it: message, code and hint. */
export function ErrorBox({ error }: { error: unknown }): JSX.Element | null {
  if (!error) return null;
  const e = error instanceof ApiError ? error : new ApiError(0, 'ERROR', String((error as Error)?.message ?? error));
  return (
    <div class="error" role="alert">
      <strong>{e.message}</strong> <code>{e.code}</code>
      {e.hint ? <p>{e.hint}</p> : null}
    </div>
  );
}

/**
 * A button that runs an action, shows it running, and reports its error; with `confirm`, asks
 * first in a modal dialog.
 */
export function Action(props: { label: string; run: () => Promise<unknown>; confirm?: string; danger?: boolean; disabled?: boolean; onError?: (e: unknown) => void }): JSX.Element {
  const [busy, setBusy] = useState(false);
  const dialog = useRef<HTMLDialogElement>(null);
  const go = async () => {
    setBusy(true);
    try {
      await props.run();
    } catch (err) {
      props.onError?.(err);
    } finally {
      setBusy(false);
    }
  };
  return (
    <>
      <button type="button" class={props.danger ? 'danger' : ''} disabled={busy || props.disabled} aria-busy={busy} onClick={() => (props.confirm ? dialog.current?.showModal() : void go())}>
        {busy ? `${props.label}…` : props.label}
      </button>
      {props.confirm ? (
        <dialog ref={dialog} aria-label={`Confirm: ${props.label}`}>
          <p>{props.confirm}</p>
          <div class="row">
            <button
              type="button"
              class={props.danger ? 'danger' : ''}
              onClick={() => {
                dialog.current?.close();
                void go();
              }}
            >
              {props.label}
            </button>
            <button type="button" onClick={() => dialog.current?.close()}>
              Cancel
            </button>
          </div>
        </dialog>
      ) : null}
    </>
  );
}

/** A sandbox state as a badge. */
export function StateBadge({ state }: { state: string }): JSX.Element {
  return <span class={`badge s-${/^[a-z]+$/.test(state) ? state : 'other'}`}>{state}</span>;
}

/** 1536 → "1.5 KiB". */
export function bytes(n: number | undefined): string {
  if (n === undefined || n === null) return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024;
    i++;
  }
  return `${i ? v.toFixed(1) : v} ${u[i]}`;
}

/** An ISO time → "3 min ago". */
export function ago(iso: string | undefined): string {
  if (!iso) return '—';
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return `${Math.floor(s)} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

/** Loads data for a page: `[data, error, reload]`. */
export function useLoad<T>(load: () => Promise<T>, deps: unknown[]): [T | undefined, unknown, () => void, (t: T | undefined | ((cur: T | undefined) => T | undefined)) => void] {
  const [data, setData] = useState<T>();
  const [error, setError] = useState<unknown>();
  const [n, setN] = useState(0);
  useEffect(() => {
    let on = true;
    load().then(
      (d) => on && (setData(d), setError(undefined)),
      (e) => on && setError(e),
    );
    return () => void (on = false);
  }, [...deps, n]);
  return [data, error, () => setN((x) => x + 1), setData];
}

/**
 * A table of rows with a caption for screen readers and column headers; wide ones scroll
 * sideways inside their box, never the page.
 *
 * @example <Table caption="Processes" columns={['PID', 'Command']}>{rows}</Table>
 */
export function Table(props: { caption: string; columns: string[]; class?: string; children: ComponentChildren }): JSX.Element {
  return (
    <div class="table-wrap">
      <table class={props.class}>
        <caption class="sr-only">{props.caption}</caption>
        <thead>
          <tr>
            {props.columns.map((c) => (
              <th scope="col" key={c}>
                {c}
              </th>
            ))}
          </tr>
        </thead>
        <tbody>{props.children}</tbody>
      </table>
    </div>
  );
}

/**
 * A submitted form's fields by name; stops the browser's own submission.
 *
 * @example onSubmit={(e) => { const f = fields(e); save(f.value('name'), f.checked('on')); }}
 */
export function fields(e: Event): { value(name: string): string; checked(name: string): boolean } {
  e.preventDefault();
  const form = e.currentTarget as HTMLFormElement;
  const el = (n: string) => form.elements.namedItem(n) as HTMLInputElement;
  return { value: (n) => el(n).value.trim(), checked: (n) => el(n).checked };
}
