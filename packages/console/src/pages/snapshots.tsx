/** The snapshot timeline: every snapshot of a session on a time axis, with rollback, fork and delete, and the rolling policy. */
import type { JSX } from 'preact';
import { useState } from 'preact/hooks';
import type { Sandbox, Snapshot } from '@space/api';
import { api, ApiError } from '../api.js';
import { Action, bytes, ErrorBox, navigate, Table, fields } from '../ui.js';

/** Forks a sandbox (`count` copies, from `snapshotId` or from now); rejects with the first failure if none was made. */
export async function forkOf(id: string, body: { count?: number; snapshotId?: string }): Promise<Sandbox[]> {
  const { results } = await api<{ results: { sandbox?: Sandbox; error?: { code: string; message: string } }[] }>('POST', `/v1/sandboxes/${id}/fork`, body);
  const made = results.flatMap((r) => (r.sandbox ? [r.sandbox] : []));
  if (!made.length) throw new ApiError(409, results[0]?.error?.code ?? 'ERROR', results[0]?.error?.message ?? 'no fork was made');
  return made;
}

/** The timeline tab. `reloadKey` changes when a snapshot event arrives. */
export function SnapshotsView({ sb, snapshots, encryptionKey, reload }: { sb: Sandbox; snapshots: Snapshot[]; encryptionKey?: string; reload: () => void }): JSX.Element {
  const [error, setError] = useState<unknown>();
  const [picked, setPicked] = useState<string>();
  const sorted = [...snapshots].sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  const t0 = sorted.length ? Date.parse(sorted[0]!.createdAt) : 0;
  const t1 = sorted.length ? Math.max(Date.parse(sorted[sorted.length - 1]!.createdAt), t0 + 1000) : 1;
  const W = 900;
  const x = (iso: string) => 30 + ((Date.parse(iso) - t0) / (t1 - t0)) * (W - 60);
  return (
    <div>
      <ErrorBox error={error} />
      {sorted.length === 0 ? <p class="muted">No snapshots yet.</p> : null}
      {sorted.length ? (
        <svg class="timeline" viewBox={`0 0 ${W} 70`} role="img" aria-label={`Timeline of ${sorted.length} snapshots from ${sorted[0]!.createdAt} to ${sorted[sorted.length - 1]!.createdAt}`}>
          <line x1={20} y1={35} x2={W - 20} y2={35} class="axis" />
          {sorted.map((s) => (
            <g key={s.id} class={`snap t-${s.trigger === 'manual' ? 'manual' : 'auto'}${picked === s.id ? ' picked' : ''}`} onClick={() => setPicked(s.id)}>
              <circle cx={x(s.createdAt)} cy={35} r={s.trigger === 'manual' ? 9 : 6} />
              {sorted.length <= 12 ? (
                <text x={x(s.createdAt)} y={18} class="tick" text-anchor="middle">
                  {s.name ?? s.id.slice(-6)}
                </text>
              ) : null}
              <title>{`${s.name ?? s.id} (${s.trigger}) ${s.createdAt}`}</title>
            </g>
          ))}
          <text x={20} y={65} class="tick">
            {new Date(t0).toLocaleTimeString()}
          </text>
          <text x={W - 20} y={65} class="tick" text-anchor="end">
            {new Date(t1).toLocaleTimeString()}
          </text>
        </svg>
      ) : null}
      <p class="muted legend">
        <span class="key-manual">●</span> manual <span class="key-auto">●</span> rolling, hibernate or fork · encrypted under {encryptionKey ? `key ${encryptionKey}` : 'the node key'}
      </p>
      <Table caption="Snapshots" columns={['Snapshot', 'Taken', 'Trigger', 'Stored', 'Downtime', 'Actions']}>
        {[...sorted].reverse().map((s) => (
          <tr key={s.id} class={picked === s.id ? 'picked' : ''} data-snapshot={s.id}>
            <td>
              <code>{s.id}</code>
              {s.name ? <span> “{s.name}”</span> : null}
            </td>
            <td>
              <time dateTime={s.createdAt}>{new Date(s.createdAt).toLocaleString()}</time>
            </td>
            <td>{s.trigger}</td>
            <td>{bytes(s.sizeBytes)}</td>
            <td>{s.downtimeMs} ms</td>
            <td>
              <div class="row">
                <Action label="Roll back" confirm={`Roll ${sb.id} back to ${s.id}? Its memory, processes and files become what they were then; what happened since is lost.`} danger run={async () => (await api('POST', `/v1/sandboxes/${sb.id}/rollback`, { snapshotId: s.id }), reload())} onError={setError} />
                <Action
                  label="Fork from here"
                  run={async () => {
                    const r = await forkOf(sb.id, { snapshotId: s.id });
                    navigate(`/console/sandboxes/${r[0]!.id}/forks`);
                  }}
                  onError={setError}
                />
                <Action label="Delete" confirm={`Delete snapshot ${s.id}? It cannot be restored afterwards.`} danger run={async () => (await api('DELETE', `/v1/sandboxes/${sb.id}/snapshots/${s.id}`), reload())} onError={setError} />
              </div>
            </td>
          </tr>
        ))}
      </Table>
      <PolicyForm sb={sb} onError={setError} reload={reload} />
    </div>
  );
}

function PolicyForm({ sb, onError, reload }: { sb: Sandbox; onError: (e: unknown) => void; reload: () => void }): JSX.Element {
  const p = sb.snapshotPolicy;
  return (
    <form
      class="row policy"
      aria-label="Rolling snapshots"
      onSubmit={async (e) => {
        const f = fields(e);
        const on = f.checked('on');
        const every = Number(f.value('every'));
        const keep = Number(f.value('keep'));
        try {
          await api('PUT', `/v1/sandboxes/${sb.id}/snapshot-policy`, on ? { intervalMs: Math.round(every * 1000), keep } : null);
          reload();
        } catch (err) {
          onError(err);
        }
      }}
    >
      <strong>Rolling snapshots</strong>
      <label>
        <input name="on" type="checkbox" defaultChecked={!!p} /> on
      </label>
      <label>
        every (s) <input name="every" type="number" min={1} defaultValue={p ? p.intervalMs / 1000 : 300} />
      </label>
      <label>
        keep <input name="keep" type="number" min={1} max={1000} defaultValue={p?.keep ?? 10} />
      </label>
      <button type="submit">Save policy</button>
    </form>
  );
}
