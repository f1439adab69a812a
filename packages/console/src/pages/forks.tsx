/** The fork tree: the lineage of a session — its root, every fork of forks, the snapshot each came from — across hibernated and dead members. */
import type { JSX } from 'preact';
import type { Sandbox } from '@space/api';
import { api } from '../api.js';
import { ErrorBox, Link, StateBadge, useLoad } from '../ui.js';
import { allSandboxes } from './sandboxes.js';

/** The tree's root (following parents) and every sandbox of the tenant. */
async function lineage(sb: Sandbox): Promise<{ root: Sandbox; all: Sandbox[] }> {
  const all = await allSandboxes();
  const byId = new Map(all.map((s) => [s.id, s]));
  let root = sb;
  for (let i = 0; i < 1000 && root.parentId; i++) {
    const p = byId.get(root.parentId) ?? (await api<Sandbox>('GET', `/v1/sandboxes/${root.parentId}`).catch(() => undefined));
    if (!p) break;
    byId.set(p.id, p);
    root = p;
  }
  return { root, all: [...byId.values()] };
}

function Node({ sb, children, current, depth }: { sb: Sandbox; children: Map<string, Sandbox[]>; current: string; depth: number }): JSX.Element {
  const kids = (children.get(sb.id) ?? []).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
  return (
    <li role="treeitem" aria-expanded={kids.length ? true : undefined} aria-level={depth} aria-current={sb.id === current ? 'true' : undefined} class={sb.id === current ? 'current' : ''}>
      <span class="node">
        <Link href={`/console/sandboxes/${sb.id}/forks`}>{sb.id}</Link> <StateBadge state={sb.state} />
        {sb.parentId && sb.fromSnapshotId ? <span class="muted"> from snapshot {sb.fromSnapshotId}</span> : null}
      </span>
      {kids.length ? (
        <ul role="group">
          {kids.map((k) => (
            <Node key={k.id} sb={k} children={children} current={current} depth={depth + 1} />
          ))}
        </ul>
      ) : null}
    </li>
  );
}

/** The fork tree tab. */
export function ForksView({ sb }: { sb: Sandbox }): JSX.Element {
  const [data, error] = useLoad(() => lineage(sb), [sb.id, sb.state]);
  if (error) return <ErrorBox error={error} />;
  if (!data) return <p class="loading">Loading…</p>;
  const children = new Map<string, Sandbox[]>();
  for (const s of data.all) if (s.parentId) children.set(s.parentId, [...(children.get(s.parentId) ?? []), s]);
  return (
    <div>
      <p class="muted">Each fork is shown under the sandbox it was forked from, with the snapshot it started from. Select one to open its tree.</p>
      <ul class="tree" role="tree" aria-label={`Fork tree of ${data.root.id}`}>
        <Node sb={data.root} children={children} current={sb.id} depth={1} />
      </ul>
    </div>
  );
}
