/**
 * The SPACE web console: sign-in, then the pages, under /console/ (the daemon serves this same
 * page at / and every /console/ path, so links and reloads work).
 */
import { render, type JSX } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { ApiError, currentSession, onSignedOut, signIn, signOut, type Session } from './api.js';
import { closeLive, live } from './live.js';
import { Link, navigate, usePath } from './ui.js';
import { SandboxesPage } from './pages/sandboxes.js';
import { SandboxPage } from './pages/sandbox.js';
import { VolumesPage } from './pages/volumes.js';
import { SecretsPage, KeysPage, TemplatesPage, NodesPage } from './pages/admin.js';

function SignIn({ onIn }: { onIn: (s: Session) => void }): JSX.Element {
  const [error, setError] = useState<string>();
  const [busy, setBusy] = useState(false);
  return (
    <main class="signin" id="main">
      <h1>SPACE console</h1>
      <form
        onSubmit={async (e) => {
          e.preventDefault();
          const input = (e.currentTarget as HTMLFormElement).elements.namedItem('key') as HTMLInputElement;
          setBusy(true);
          try {
            const s = await signIn(input.value.trim());
            input.value = '';
            onIn(s);
          } catch (err) {
            setError(err instanceof ApiError && err.status === 401 ? 'That API key is not valid (or was revoked). Check it and try again.' : (err as Error).message);
          } finally {
            setBusy(false);
          }
        }}
      >
        <label for="key">API key</label>
        <input id="key" name="key" type="password" autocomplete="off" required aria-describedby="key-help" />
        <p id="key-help" class="muted">
          The key is sent once to start a session (a cookie this page cannot read) and is not stored. <code>space up</code> wrote the first admin key to the data directory.
        </p>
        {error ? (
          <p class="error" role="alert">
            {error}
          </p>
        ) : null}
        <button type="submit" disabled={busy}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </main>
  );
}

const NAV: [string, string, boolean?][] = [
  ['/console/sandboxes', 'Sandboxes'],
  ['/console/templates', 'Templates'],
  ['/console/volumes', 'Volumes'],
  ['/console/secrets', 'Secrets'],
  ['/console/keys', 'Keys'],
  ['/console/nodes', 'Nodes', true],
];

function Shell({ session, onOut }: { session: Session; onOut: () => void }): JSX.Element {
  const path = usePath();
  const [connected, setConnected] = useState(true);
  useEffect(() => live((m) => m.type === 'status' && setConnected(m.connected)), []);
  useEffect(() => {
    if (path === '/' || path === '/console' || path === '/console/') history.replaceState(null, '', '/console/sandboxes');
  }, [path]);
  const parts = path.split('/').filter(Boolean);
  let page: JSX.Element;
  if (parts[1] === 'sandboxes' && parts[2]) page = <SandboxPage id={decodeURIComponent(parts[2])} tab={parts[3] ?? 'terminal'} />;
  else if (parts[1] === 'templates') page = <TemplatesPage session={session} />;
  else if (parts[1] === 'volumes') page = <VolumesPage />;
  else if (parts[1] === 'secrets') page = <SecretsPage />;
  else if (parts[1] === 'keys') page = <KeysPage session={session} />;
  else if (parts[1] === 'nodes') page = <NodesPage session={session} />;
  else page = <SandboxesPage session={session} />;
  return (
    <>
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header>
        <span class="brand">SPACE</span>
        <nav aria-label="Main">
          {NAV.filter(([, , admin]) => !admin || session.admin).map(([href, label]) => (
            <Link key={href} href={href} aria-current={path.startsWith(href) ? 'page' : undefined}>
              {label}
            </Link>
          ))}
        </nav>
        <span class="who">
          <span class={connected ? 'dot on' : 'dot'} role="status" aria-label={connected ? 'Live updates connected' : 'Live updates reconnecting'} title={connected ? 'live' : 'reconnecting'} />
          {session.tenantId}
          {session.admin ? ' (admin)' : ''}
        </span>
        <button
          type="button"
          onClick={async () => {
            await signOut().catch(() => {});
            onOut();
          }}
        >
          Sign out
        </button>
      </header>
      <main id="main">{page}</main>
    </>
  );
}

function App(): JSX.Element {
  const [session, setSession] = useState<Session | null>();
  useEffect(() => {
    onSignedOut(() => {
      closeLive();
      setSession(null);
    });
    currentSession().then((s) => setSession(s ?? null), () => setSession(null));
  }, []);
  if (session === undefined) return <p class="loading">Loading…</p>;
  if (session === null) {
    return (
      <SignIn
        onIn={(s) => {
          setSession(s);
          if (!location.pathname.startsWith('/console/')) navigate('/console/sandboxes');
        }}
      />
    );
  }
  return (
    <Shell
      session={session}
      onOut={() => {
        closeLive();
        setSession(null);
      }}
    />
  );
}

render(<App />, document.getElementById('app')!);
