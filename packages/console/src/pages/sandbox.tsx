/** One sandbox: its actions and tabs (terminal, processes, files, snapshots, forks, egress, ports, events). */
import type { JSX } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import type { Sandbox, SandboxEvent, Snapshot } from '@space/api';
import { api } from '../api.js';
import { live } from '../live.js';
import { Action, ago, ErrorBox, Link, navigate, StateBadge, useLoad, Table } from '../ui.js';
import { EgressView } from './egress.js';
import { FilesView } from './files.js';
import { PortsView } from './ports.js';
import { ForksView } from './forks.js';
import { forkOf, SnapshotsView } from './snapshots.js';
import { TerminalView } from './terminal.js';

const TABS: [string, string][] = [
  ['terminal', 'Terminal'],
  ['processes', 'Processes'],
  ['files', 'Files'],
  ['snapshots', 'Snapshots'],
  ['forks', 'Fork tree'],
  ['egress', 'Egress'],
  ['ports', 'Ports'],
  ['events', 'Events'],
];

function Processes({ id }: { id: string }): JSX.Element {
  const [data, error, reload] = useLoad(() => api<{ processes: { pid: number; argv: string[]; tag?: string; running: boolean; exitCode: number | null }[] }>('GET', `/v1/sandboxes/${id}/commands`), [id]);
  const [actionError, setActionError] = useState<unknown>();
  return (
    <div>
      <div class="row">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </div>
      <ErrorBox error={actionError ?? error} />
      <Table caption="Processes" columns={['PID', 'Command', 'State', 'Actions']}>
        {(data?.processes ?? []).map((p) => (
          <tr key={p.pid}>
            <td>{p.pid}</td>
            <td>
              <code>{p.argv.join(' ')}</code>
            </td>
            <td>{p.running ? 'running' : `exited (${p.exitCode ?? 'signal'})`}</td>
            <td>
              <Action label="Kill" danger disabled={!p.running} confirm={`Send SIGKILL to process ${p.pid} (${p.argv.join(' ').slice(0, 80)})?`} run={async () => (await api('POST', `/v1/sandboxes/${id}/commands/${p.pid}/signal`, { signal: 'SIGKILL' }), reload())} onError={setActionError} />
            </td>
          </tr>
        ))}
      </Table>
    </div>
  );
}

function Events({ id, events }: { id: string; events: SandboxEvent[] }): JSX.Element {
  return (
    <ol class="events" aria-label={`Events of ${id}`}>
      {[...events].reverse().map((e, i) => (
        <li key={`${e.at}-${i}`}>
          <time dateTime={e.at}>{new Date(e.at).toLocaleString()}</time> <strong>{e.type}</strong> {e.message}
        </li>
      ))}
    </ol>
  );
}

/** The sandbox page. */
export function SandboxPage({ id, tab }: { id: string; tab: string }): JSX.Element {
  const [sb, error, reload, setSb] = useLoad(() => api<Sandbox>('GET', `/v1/sandboxes/${id}`), [id]);
  const [snapshots, , reloadSnapshots] = useLoad(() => api<{ snapshots: Snapshot[] }>('GET', `/v1/sandboxes/${id}/snapshots`).then((r) => r.snapshots), [id]);
  const [events, , reloadEvents, setEvents] = useLoad(() => api<{ events: SandboxEvent[] }>('GET', `/v1/sandboxes/${id}/events`).then((r) => r.events), [id]);
  const [keys] = useLoad(() => api<{ keys: { id: string; state: string }[] }>('GET', '/v1/encryption-keys').catch(() => ({ keys: [] })), []);
  const [actionError, setActionError] = useState<unknown>();
  const [copies, setCopies] = useState(1);
  const [forking, setForking] = useState<string>();
  useEffect(
    () =>
      live((m) => {
        if (m.type === 'reconnected') return void (reload(), reloadSnapshots(), reloadEvents());
        if (m.type === 'sandbox' && m.data.id === id) setSb(m.data as unknown as Sandbox);
        if (m.type === 'event' && m.data.sandboxId === id) {
          setEvents((cur) => [...(cur ?? []), m.data]);
          if (/snapshot|rolled-back|hibernated|recovered/.test(m.data.type)) reloadSnapshots();
        }
      }),
    [id],
  );
  if (error) return <ErrorBox error={error} />;
  if (!sb) return <p class="loading">Loading…</p>;
  const act = (verb: string) => async () => setSb(await api<Sandbox>('POST', `/v1/sandboxes/${id}/${verb}`));
  const s = sb.state;
  const activeKey = keys?.keys.find((k) => k.state === 'active')?.id;
  let body: JSX.Element;
  switch (tab) {
    case 'processes':
      body = s === 'running' ? <Processes id={id} /> : <p class="muted">Processes are listed while it runs.</p>;
      break;
    case 'files':
      body = s === 'running' ? <FilesView id={id} /> : <p class="muted">Files are browsed while it runs.</p>;
      break;
    case 'snapshots':
      body = <SnapshotsView sb={sb} snapshots={snapshots ?? []} {...(activeKey ? { encryptionKey: activeKey } : {})} reload={() => (reload(), reloadSnapshots())} />;
      break;
    case 'forks':
      body = <ForksView sb={sb} />;
      break;
    case 'egress':
      body = <EgressView sb={sb} onChange={setSb} />;
      break;
    case 'ports':
      body = <PortsView id={id} running={s === 'running'} />;
      break;
    case 'events':
      body = <Events id={id} events={events ?? []} />;
      break;
    default:
      body = <TerminalView id={id} running={s === 'running'} />;
  }
  return (
    <section aria-labelledby="h-sandbox">
      <p>
        <Link href="/console/sandboxes">← Sandboxes</Link>
      </p>
      <h1 id="h-sandbox">
        {sb.id} <StateBadge state={s} />
      </h1>
      <p class="muted">
        {sb.template} on {sb.driver}
        {sb.node ? `, node ${sb.node}` : ''} · created {ago(sb.createdAt)} · {sb.cpu} CPU, {sb.memoryMb} MiB
        {sb.parentId ? (
          <>
            {' '}
            · forked from <Link href={`/console/sandboxes/${sb.parentId}/forks`}>{sb.parentId}</Link>
          </>
        ) : null}
        {sb.endReason ? ` · ended: ${sb.endReason}${sb.endDetail ? ` (${sb.endDetail})` : ''}` : ''}
      </p>
      <div class="row actions" role="group" aria-label="Actions">
        <Action label="Pause" disabled={s !== 'running'} run={act('pause')} onError={setActionError} />
        <Action label="Resume" disabled={s !== 'paused'} run={act('resume')} onError={setActionError} />
        <Action label="Hibernate" disabled={s !== 'running' && s !== 'paused'} run={act('hibernate')} onError={setActionError} />
        <Action label="Wake" disabled={s !== 'hibernated'} run={act('wake')} onError={setActionError} />
        <Action label="Snapshot" disabled={s !== 'running'} run={async () => (await api('POST', `/v1/sandboxes/${id}/snapshots`, {}), reloadSnapshots())} onError={setActionError} />
        <label>
          copies <input type="number" min={1} max={32} value={copies} onInput={(e) => setCopies(Number((e.currentTarget as HTMLInputElement).value) || 1)} class="narrow" />
        </label>
        <Action
          label={copies > 1 ? `Fork into ${copies}` : 'Fork'}
          disabled={s !== 'running' && s !== 'paused'}
          run={async () => {
            setForking(`forking into ${copies}…`);
            try {
              const made = await forkOf(id, { count: copies });
              setForking(`${made.length} of ${copies} forks made`);
              navigate(`/console/sandboxes/${made[0]!.id}/forks`);
            } catch (err) {
              setForking(undefined);
              throw err;
            }
          }}
          onError={setActionError}
        />
        {forking ? <span role="status">{forking}</span> : null}
        <Action label="Kill" danger disabled={s === 'dead' || s === 'killed'} confirm={`Kill ${id}? Its processes stop and its snapshots are deleted; this cannot be undone.`} run={async () => setSb(await api<Sandbox>('DELETE', `/v1/sandboxes/${id}`))} onError={setActionError} />
      </div>
      <ErrorBox error={actionError} />
      <nav class="tabs" aria-label="Sandbox">
        {TABS.map(([t, label]) => (
          <Link key={t} href={`/console/sandboxes/${id}/${t}`} aria-current={tab === t ? 'page' : undefined}>
            {label}
          </Link>
        ))}
      </nav>
      <div class="tab">{body}</div>
    </section>
  );
}
