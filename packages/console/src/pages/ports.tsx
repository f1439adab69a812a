/** A sandbox's ports exposed through the ingress: expose (private or public, for a while), open, close. */
import type { JSX } from 'preact';
import { useState } from 'preact/hooks';
import type { ExposedPort } from '@space/api';
import { api } from '../api.js';
import { Action, ErrorBox, Table, fields, useLoad } from '../ui.js';

/** How long an exposure lasts, as the form offers it (seconds; 0: while the sandbox lives). */
const TTLS: [number, string][] = [
  [0, 'while it lives'],
  [3600, '1 hour'],
  [86_400, '1 day'],
  [604_800, '7 days'],
];

/** A link only for web addresses (an ingress URL is one; anything else is shown as text). */
const linkOf = (p: ExposedPort) => {
  const href = p.signedUrl ?? p.url;
  return /^https?:\/\//.test(href) ? (
    <a href={href} rel="noopener noreferrer" target="_blank">
      {p.url}
    </a>
  ) : (
    <code>{p.url}</code>
  );
};

/**
 * The Ports tab: the exposed ports with their links (a private port's link signs the browser in
 * for that host), a form to expose one and a button to close each.
 */
export function PortsView({ id, running }: { id: string; running: boolean }): JSX.Element {
  const [data, error, reload] = useLoad(() => api<{ ports: ExposedPort[] }>('GET', `/v1/sandboxes/${id}/ports`), [id]);
  const [exposed, setExposed] = useState<ExposedPort>();
  const [actionError, setActionError] = useState<unknown>();
  return (
    <>
      <form
        class="row"
        aria-label="Expose a port"
        onSubmit={async (e) => {
          const f = fields(e);
          const ttl = Number(f.value('ttl'));
          setActionError(undefined);
          try {
            setExposed(await api<ExposedPort>('POST', `/v1/sandboxes/${id}/ports`, { port: Number(f.value('port')), public: f.checked('public'), ...(ttl ? { expiresInS: ttl } : {}) }));
            reload();
          } catch (err) {
            setActionError(err);
          }
        }}
      >
        <label>
          Port <input name="port" type="number" min={1} max={65535} required class="narrow" placeholder="8000" />
        </label>
        <label>
          <input name="public" type="checkbox" /> public (no token)
        </label>
        <label>
          For{' '}
          <select name="ttl">
            {TTLS.map(([s, label]) => (
              <option key={s} value={s}>
                {label}
              </option>
            ))}
          </select>
        </label>
        <button type="submit" disabled={!running}>
          Expose
        </button>
      </form>
      {exposed ? (
        <p role="status" class="notice">
          Port {exposed.port} is exposed at {linkOf(exposed)}
          {exposed.token ? (
            <>
              . Its access token (shown once; programs send it as <code>X-Space-Access-Token</code>): <code>{exposed.token}</code>
            </>
          ) : null}
        </p>
      ) : null}
      <ErrorBox error={actionError ?? error} />
      {data && !data.ports.length ? (
        <p class="muted">No port is exposed.</p>
      ) : (
        <Table caption="Exposed ports" columns={['Port', 'Link', 'Access', 'Until', 'Actions']}>
          {(data?.ports ?? []).map((p) => (
            <tr key={p.port}>
              <td>{p.port || 'every port'}</td>
              <td>{linkOf(p)}</td>
              <td>{p.public ? 'public' : 'token or signed link'}</td>
              <td>{p.expiresAt ? new Date(p.expiresAt).toLocaleString() : 'while it lives'}</td>
              <td>
                <Action label="Close" danger confirm={`Stop exposing port ${p.port}? Its links and token stop working at once.`} run={async () => (await api('DELETE', `/v1/sandboxes/${id}/ports/${p.port}`), setExposed(undefined), reload())} onError={setActionError} />
              </td>
            </tr>
          ))}
        </Table>
      )}
    </>
  );
}
