/** The sandboxes of the tenant: state, template, driver, node, age, usage, labels; filter, search, live. */
import type { JSX } from 'preact';
import { useEffect, useMemo, useState } from 'preact/hooks';
import { parseVolumeMount, type Sandbox, type SandboxState } from '@space/api';
import { api, type Session } from '../api.js';
import { live } from '../live.js';
import { ago, bytes, ErrorBox, Link, navigate, StateBadge, useLoad, Table, fields } from '../ui.js';

interface Usage {
  rssBytes: number;
  cgroupBytes?: number;
  cpuNs?: number;
  diskUsedBytes?: number;
  diskLimitBytes?: number;
}

const STATES: SandboxState[] = ['starting', 'running', 'paused', 'hibernated', 'killed', 'dead'];
/** Whether a sandbox has ended (killed on request, or dead). */
export const ended = (s: { state: string }) => s.state === 'killed' || s.state === 'dead';

/** Every sandbox of the tenant (pages of 1000 through the cursor). */
export async function allSandboxes(): Promise<Sandbox[]> {
  const out: Sandbox[] = [];
  let cursor: string | undefined;
  do {
    const page = await api<{ items: Sandbox[]; nextCursor?: string }>('GET', `/v1/sandboxes?limit=1000${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
    out.push(...page.items);
    cursor = page.nextCursor;
  } while (cursor && out.length < 10_000);
  return out;
}

function CreateForm({ onError }: { onError: (e: unknown) => void }): JSX.Element {
  const [templates] = useLoad(() => api<{ templates: { name: string }[] }>('GET', '/v1/templates'), []);
  const [busy, setBusy] = useState(false);
  return (
    <form
      class="row create"
      aria-label="New sandbox"
      onSubmit={async (e) => {
        const v = fields(e).value;
        setBusy(true);
        try {
          const volumes = v('volumes').split(/[\s,]+/).filter(Boolean).map(parseVolumeMount);
          const sb = await api<Sandbox>('POST', '/v1/sandboxes', { template: v('template'), memoryMb: Number(v('memory')), ...(volumes.length ? { volumes } : {}) });
          navigate(`/console/sandboxes/${sb.id}`);
        } catch (err) {
          onError(err);
        } finally {
          setBusy(false);
        }
      }}
    >
      <label>
        Template{' '}
        <select name="template">
          {(templates?.templates ?? [{ name: 'base' }]).map((t) => (
            <option key={t.name} value={t.name}>
              {t.name}
            </option>
          ))}
        </select>
      </label>
      <label>
        Memory (MiB) <input name="memory" type="number" min={64} step={64} defaultValue={512} required />
      </label>
      <label>
        Volumes <input name="volumes" placeholder="data:/data, refs:/refs:ro" />
      </label>
      <button type="submit" disabled={busy}>
        {busy ? 'Creating…' : 'New sandbox'}
      </button>
    </form>
  );
}

/** The sandboxes page. */
export function SandboxesPage({ session }: { session: Session }): JSX.Element {
  const [list, error, reload, setList] = useLoad(allSandboxes, []);
  const [usage, setUsage] = useState<Record<string, Usage>>({});
  const [query, setQuery] = useState('');
  const [state, setState] = useState('unended');
  const [actionError, setActionError] = useState<unknown>();
  // Ages move on without asking the daemon: a re-render every 30 s.
  const [, tick] = useState(0);
  useEffect(() => {
    const t = setInterval(() => tick((n) => n + 1), 30_000);
    return () => clearInterval(t);
  }, []);

  useEffect(
    () =>
      live((m) => {
        if (m.type === 'reconnected') reload();
        if (m.type !== 'sandbox') return;
        const sb = m.data as unknown as Sandbox;
        setList((cur) => {
          const xs = cur ?? [];
          const i = xs.findIndex((x) => x.id === sb.id);
          return i < 0 ? [sb, ...xs] : xs.map((x, j) => (j === i ? sb : x));
        });
      }),
    [],
  );
  // Usage of the running ones, once per load (not a poll).
  useEffect(() => {
    for (const sb of (list ?? []).filter((s) => s.state === 'running' && !usage[s.id]).slice(0, 50)) {
      api<Usage>('GET', `/v1/sandboxes/${sb.id}/usage`).then((u) => setUsage((cur) => ({ ...cur, [sb.id]: u })), () => {});
    }
  }, [list?.length]);

  const shown = useMemo(() => {
    const q = query.toLowerCase();
    return (list ?? [])
      .filter((s) => (state === 'all' ? true : state === 'unended' ? !ended(s) : s.state === state))
      .filter((s) => !q || [s.id, s.template, s.driver, s.node ?? '', ...Object.entries(s.metadata ?? {}).map(([k, v]) => `${k}=${v}`)].some((x) => x.toLowerCase().includes(q)))
      .sort((a, b) => b.createdAt.localeCompare(a.createdAt));
  }, [list, query, state]);

  return (
    <section aria-labelledby="h-sandboxes">
      <h1 id="h-sandboxes">Sandboxes</h1>
      <CreateForm onError={setActionError} />
      <ErrorBox error={actionError ?? error} />
      <div class="row filters">
        <label>
          Search <input type="search" value={query} onInput={(e) => setQuery((e.currentTarget as HTMLInputElement).value)} placeholder="id, template, label=value" />
        </label>
        <label>
          State{' '}
          <select value={state} onChange={(e) => setState((e.currentTarget as HTMLSelectElement).value)}>
            <option value="unended">not ended</option>
            <option value="all">all</option>
            {STATES.map((s) => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
        </label>
        <span class="muted" aria-live="polite">
          {list ? `${shown.length} of ${list.length}` : 'loading…'}
        </span>
      </div>
      <Table caption={`Sandboxes of tenant ${session.tenantId}`} columns={['Sandbox', 'State', 'Template', 'Driver', 'Node', 'Age', 'CPU / memory', 'Used', 'Labels']}>
        {shown.map((s) => {
          const u = usage[s.id];
          return (
            <tr key={s.id}>
              <td>
                <Link href={`/console/sandboxes/${s.id}`}>{s.id}</Link>
              </td>
              <td>
                <StateBadge state={s.state} />
                {s.endReason ? <span class="muted"> {s.endReason}</span> : null}
              </td>
              <td>{s.template}</td>
              <td>{s.driver}</td>
              <td>{s.node ?? '—'}</td>
              <td>
                <time dateTime={s.createdAt} title={s.createdAt}>
                  {ago(s.createdAt)}
                </time>
              </td>
              <td>
                {s.cpu} CPU, {s.memoryMb} MiB{s.diskMb ? `, disk ${s.diskMb} MiB` : ''}
              </td>
              <td>{u ? `${bytes(u.cgroupBytes ?? u.rssBytes)}${u.cpuNs !== undefined ? `, ${(u.cpuNs / 1e9).toFixed(1)} s CPU` : ''}${u.diskUsedBytes !== undefined ? `, disk ${bytes(u.diskUsedBytes)}` : ''}` : '—'}</td>
              <td>
                {Object.entries(s.metadata ?? {}).map(([k, v]) => (
                  <span class="label" key={k}>
                    {k}={v}
                  </span>
                ))}
              </td>
            </tr>
          );
        })}
      </Table>
    </section>
  );
}
