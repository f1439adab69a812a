/** Named volumes: the tenant's persistent disks (create, delete), who mounts them, and their own snapshots (take, restore, delete). */
import type { JSX } from 'preact';
import { useState } from 'preact/hooks';
import type { Volume, VolumeSnapshot } from '@space/api';
import { api } from '../api.js';
import { Action, ago, ErrorBox, Link, Table, fields, useLoad } from '../ui.js';

const path = (name: string) => `/v1/volumes/${encodeURIComponent(name)}`;

/** One volume's point-in-time copies, with restore (while no sandbox holds it) and delete. */
function VolumeSnapshots({ volume, onError }: { volume: Volume; onError: (e: unknown) => void }): JSX.Element {
  const [data, error, reload] = useLoad(() => api<{ snapshots: VolumeSnapshot[] }>('GET', `${path(volume.name)}/snapshots`), [volume.name]);
  const held = volume.mountedBy.length > 0;
  return (
    <section aria-labelledby="h-volume-snapshots">
      <h2 id="h-volume-snapshots">Snapshots of {volume.name}</h2>
      <p class="muted">A volume is not rolled back with a sandbox's snapshots; these are its own copies. Restoring needs it free (no sandbox holding it).</p>
      <ErrorBox error={error} />
      <div class="row">
        <Action label={`Snapshot ${volume.name}`} run={async () => (await api('POST', `${path(volume.name)}/snapshots`), reload())} onError={onError} />
      </div>
      {data && !data.snapshots.length ? (
        <p class="muted">No snapshot yet.</p>
      ) : (
        <Table caption={`Snapshots of ${volume.name}`} columns={['Snapshot', 'Taken', 'Actions']}>
          {(data?.snapshots ?? []).map((s) => (
            <tr key={s.id}>
              <td>
                <code>{s.id}</code>
              </td>
              <td>
                <time dateTime={s.createdAt}>{new Date(s.createdAt).toLocaleString()}</time>
              </td>
              <td>
                <div class="row">
                  <Action label="Restore" disabled={held} confirm={`Put ${volume.name} back as it was at ${new Date(s.createdAt).toLocaleString()}? What it holds now is replaced.`} run={async () => api('POST', `${path(volume.name)}/restore`, { snapshotId: s.id })} onError={onError} />
                  <Action label="Delete" danger confirm={`Delete snapshot ${s.id} of ${volume.name}?`} run={async () => (await api('DELETE', `${path(volume.name)}/snapshots/${s.id}`), reload())} onError={onError} />
                </div>
              </td>
            </tr>
          ))}
        </Table>
      )}
    </section>
  );
}

/** The volumes page. */
export function VolumesPage(): JSX.Element {
  const [data, error, reload] = useLoad(() => api<{ volumes: Volume[] }>('GET', '/v1/volumes'), []);
  const [selected, setSelected] = useState<string>();
  const [actionError, setActionError] = useState<unknown>();
  const shown = data?.volumes.find((v) => v.name === selected);
  return (
    <section aria-labelledby="h-volumes">
      <h1 id="h-volumes">Volumes</h1>
      <p class="muted">
        Persistent disks that outlive sandboxes, encrypted at rest under the tenant's key. Mount one when creating a sandbox (<code>NAME:/data</code>, or <code>NAME:/data:ro</code> to share it read-only).
      </p>
      <form
        class="row"
        aria-label="New volume"
        onSubmit={async (e) => {
          const v = fields(e).value;
          setActionError(undefined);
          try {
            await api('POST', '/v1/volumes', { name: v('name'), sizeMb: Number(v('size')) });
            reload();
          } catch (err) {
            setActionError(err);
          }
        }}
      >
        <label>
          Name <input name="name" required pattern="[a-z0-9][a-z0-9._-]*" maxLength={63} />
        </label>
        <label>
          Size (MiB) <input name="size" type="number" min={1} defaultValue={1024} required class="narrow" />
        </label>
        <button type="submit">Create volume</button>
      </form>
      <ErrorBox error={actionError ?? error} />
      <Table caption="Volumes" columns={['Name', 'Size', 'Mounted by', 'Created', 'Actions']}>
        {(data?.volumes ?? []).map((v) => (
          <tr key={v.id}>
            <td>{v.name}</td>
            <td>{v.sizeMb} MiB</td>
            <td>
              {v.mountedBy.map((m) => (
                <span key={m.sandboxId} class="label">
                  <Link href={`/console/sandboxes/${m.sandboxId}`}>{m.sandboxId}</Link> {m.path}
                  {m.readOnly ? ' (read-only)' : ''}
                </span>
              ))}
            </td>
            <td>{ago(v.createdAt)}</td>
            <td>
              <div class="row">
                <button type="button" aria-pressed={selected === v.name} onClick={() => setSelected(selected === v.name ? undefined : v.name)}>
                  Snapshots
                </button>
                <Action label="Delete" danger disabled={v.mountedBy.length > 0} confirm={`Delete volume ${v.name} with its snapshots? Its files are gone for good.`} run={async () => (await api('DELETE', path(v.name)), setSelected(undefined), reload())} onError={setActionError} />
              </div>
            </td>
          </tr>
        ))}
      </Table>
      {shown ? <VolumeSnapshots key={shown.name} volume={shown} onError={setActionError} /> : null}
    </section>
  );
}
