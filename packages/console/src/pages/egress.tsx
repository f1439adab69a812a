/** Egress: the sandbox's policy (editable) and its audit log, filtered and updating live. */
import type { JSX } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import type { EgressLogEntry, EgressPolicy, Sandbox } from '@space/api';
import { api } from '../api.js';
import { live } from '../live.js';
import { bytes, ErrorBox, useLoad, Table, fields } from '../ui.js';

const lines = (s: string) => s.split(/[\n,]/).map((x) => x.trim()).filter(Boolean);

function PolicyForm({ sb, onChange }: { sb: Sandbox; onChange: (sb: Sandbox) => void }): JSX.Element {
  const [policy, error, reload] = useLoad(() => api<EgressPolicy>('GET', `/v1/sandboxes/${sb.id}/egress`), [sb.id]);
  const [saveError, setSaveError] = useState<unknown>();
  const [saved, setSaved] = useState(false);
  if (error) return <ErrorBox error={error} />;
  if (!policy) return <p class="loading">Loading…</p>;
  return (
    <form
      class="policy-form"
      aria-label="Egress policy"
      onSubmit={async (e) => {
        const f = fields(e);
        const v = f.value;
        setSaved(false);
        try {
          const next: EgressPolicy = {
            domains: lines(v('domains')),
            cidrs: lines(v('cidrs')),
            ports: lines(v('ports')).map(Number),
            passthrough: lines(v('passthrough')),
            publicInternet: f.checked('publicInternet'),
          };
          onChange(await api<Sandbox>('PUT', `/v1/sandboxes/${sb.id}/egress`, next));
          setSaveError(undefined);
          setSaved(true);
          reload();
        } catch (err) {
          setSaveError(err);
        }
      }}
    >
      <div class="grid">
        <label>
          Domains (one per line; *.example.org for subdomains)
          <textarea name="domains" rows={4} defaultValue={policy.domains.join('\n')} />
        </label>
        <label>
          Address ranges (CIDR)
          <textarea name="cidrs" rows={4} defaultValue={policy.cidrs.join('\n')} />
        </label>
        <label>
          Ports
          <textarea name="ports" rows={4} defaultValue={policy.ports.join('\n')} />
        </label>
        <label>
          Passthrough (host:port, raw TCP)
          <textarea name="passthrough" rows={4} defaultValue={policy.passthrough.join('\n')} />
        </label>
      </div>
      <label>
        <input type="checkbox" name="publicInternet" defaultChecked={!!policy.publicInternet} /> any public destination on these ports
      </label>
      <div class="row">
        <button type="submit">Save egress policy</button>
        <span role="status">{saved ? 'Saved: applies from the next request.' : ''}</span>
      </div>
      <ErrorBox error={saveError} />
    </form>
  );
}

/** The egress tab. */
export function EgressView({ sb, onChange }: { sb: Sandbox; onChange: (sb: Sandbox) => void }): JSX.Element {
  const [log, error, reload, setLog] = useLoad(() => api<{ items: EgressLogEntry[] }>('GET', `/v1/sandboxes/${sb.id}/egress/log?limit=500`).then((r) => r.items), [sb.id]);
  const [deniedOnly, setDeniedOnly] = useState(false);
  const [host, setHost] = useState('');
  const [secret, setSecret] = useState('');
  useEffect(
    () =>
      live((m) => {
        if (m.type === 'reconnected') reload();
        if (m.type === 'egress' && m.data.sandboxId === sb.id) setLog((cur) => [m.data as unknown as EgressLogEntry, ...(cur ?? [])].slice(0, 2000));
      }),
    [sb.id],
  );
  const shown = (log ?? []).filter((e) => (!deniedOnly || e.decision === 'denied') && (!host || e.host.includes(host)) && (!secret || e.secrets.some((s) => s.includes(secret))));
  return (
    <div>
      <h2>Policy</h2>
      <PolicyForm sb={sb} onChange={onChange} />
      <h2>Audit log</h2>
      <div class="row filters">
        <label>
          <input type="checkbox" checked={deniedOnly} onChange={(e) => setDeniedOnly((e.currentTarget as HTMLInputElement).checked)} /> denied only
        </label>
        <label>
          Host <input type="search" value={host} onInput={(e) => setHost((e.currentTarget as HTMLInputElement).value)} />
        </label>
        <label>
          Secret <input type="search" value={secret} onInput={(e) => setSecret((e.currentTarget as HTMLInputElement).value)} />
        </label>
      </div>
      <ErrorBox error={error} />
      <Table caption="Egress requests, newest first" columns={['When', 'Decision', 'Request', 'Status', 'Bytes out / in', 'Secrets', 'Reason']} class="audit">
        {shown.map((e, i) => (
          <tr key={`${e.at}-${i}`} class={e.decision}>
            <td>
              <time dateTime={e.at}>{new Date(e.at).toLocaleTimeString()}</time>
            </td>
            <td>{e.decision}</td>
            <td>
              <code>
                {e.method} {e.scheme}://{e.host}:{e.port}
                {e.path ?? ''}
              </code>
            </td>
            <td>{e.status ?? '—'}</td>
            <td>
              {bytes(e.bytesOut)} / {bytes(e.bytesIn)}
            </td>
            <td>{e.secrets.join(', ')}</td>
            <td>{e.reason ?? ''}</td>
          </tr>
        ))}
      </Table>
    </div>
  );
}
