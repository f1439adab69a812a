/** A live terminal: xterm.js on the API's terminal WebSocket (the login shell in a PTY). */
import type { JSX } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';

/** The terminal tab. Resizes follow the element; copy and paste are the browser's (select, Ctrl+Shift+C/V). */
export function TerminalView({ id, running }: { id: string; running: boolean }): JSX.Element {
  const box = useRef<HTMLDivElement>(null);
  const [status, setStatus] = useState('connecting…');
  const [attempt, setAttempt] = useState(0);
  useEffect(() => {
    if (!running || !box.current) return;
    const term = new Terminal({ convertEol: false, cursorBlink: true, fontFamily: 'ui-monospace, monospace', fontSize: 14, screenReaderMode: false, theme: { background: '#111418' } });
    const fit = new FitAddon();
    term.loadAddon(fit);
    term.open(box.current);
    fit.fit();
    const scheme = location.protocol === 'https:' ? 'wss' : 'ws';
    const ws = new WebSocket(`${scheme}://${location.host}/v1/sandboxes/${encodeURIComponent(id)}/terminal?cols=${term.cols}&rows=${term.rows}`);
    ws.binaryType = 'arraybuffer';
    const enc = new TextEncoder();
    ws.onopen = () => setStatus('connected');
    ws.onmessage = (e: MessageEvent<ArrayBuffer | string>) => {
      if (typeof e.data !== 'string') return term.write(new Uint8Array(e.data));
      const m = JSON.parse(e.data) as { type: string; exitCode?: number; message?: string };
      if (m.type === 'start') term.focus();
      if (m.type === 'exit') setStatus(`the shell exited (${m.exitCode ?? 'signal'})`);
      if (m.type === 'error') setStatus(`error: ${m.message ?? ''}`);
    };
    ws.onclose = (e) => setStatus((s) => (s === 'connected' || s === 'connecting…' ? `disconnected${e.reason ? ` (${e.reason})` : ''}` : s));
    const input = term.onData((d) => ws.readyState === WebSocket.OPEN && ws.send(enc.encode(d)));
    const resized = term.onResize(({ cols, rows }) => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: 'resize', cols, rows })));
    const observer = new ResizeObserver(() => fit.fit());
    observer.observe(box.current);
    return () => {
      observer.disconnect();
      input.dispose();
      resized.dispose();
      ws.close();
      term.dispose();
    };
  }, [id, running, attempt]);
  if (!running) return <p class="muted">The terminal needs a running sandbox: resume or wake it first.</p>;
  return (
    <div>
      <div class="row">
        <span role="status" class="muted">
          Terminal: {status}
        </span>
        {status !== 'connected' && status !== 'connecting…' ? (
          <button type="button" onClick={() => (setStatus('connecting…'), setAttempt((n) => n + 1))}>
            Reconnect
          </button>
        ) : null}
      </div>
      <div class="term-box" ref={box} aria-label="Terminal" />
    </div>
  );
}
