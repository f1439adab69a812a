/** Files of a running sandbox: browse, download, upload with progress. */
import type { JSX } from 'preact';
import { useState } from 'preact/hooks';
import { api, upload } from '../api.js';
import { bytes, ErrorBox, useLoad, Table, fields } from '../ui.js';

interface Entry {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'other';
  size: number;
  mtimeMs: number;
}

/** The files tab. */
export function FilesView({ id }: { id: string }): JSX.Element {
  const [dir, setDir] = useState('/home/user');
  const [data, error, reload] = useLoad(() => api<{ entries: Entry[] }>('GET', `/v1/sandboxes/${id}/files?path=${encodeURIComponent(dir)}`), [id, dir]);
  const [progress, setProgress] = useState<string>();
  const [actionError, setActionError] = useState<unknown>();
  const parent = dir === '/' ? undefined : dir.replace(/\/[^/]+\/?$/, '') || '/';
  const entries = [...(data?.entries ?? [])].sort((a, b) => (a.type === 'dir' ? 0 : 1) - (b.type === 'dir' ? 0 : 1) || a.name.localeCompare(b.name));
  return (
    <div>
      <form
        class="row"
        aria-label="Go to directory"
        onSubmit={(e) => {
          setDir(fields(e).value('dir') || '/');
        }}
      >
        <label>
          Directory <input name="dir" defaultValue={dir} key={dir} />
        </label>
        <button type="submit">Go</button>
        {parent ? (
          <button type="button" onClick={() => setDir(parent)}>
            Up
          </button>
        ) : null}
        <label class="upload">
          Upload to this directory{' '}
          <input
            type="file"
            onChange={async (e) => {
              const input = e.currentTarget as HTMLInputElement;
              const f = input.files?.[0];
              if (!f) return;
              setActionError(undefined);
              try {
                const to = `${dir.replace(/\/$/, '')}/${f.name}`;
                await upload(id, to, f, (x) => setProgress(`${to}: ${Math.round(x * 100)}%`));
                setProgress(`${to}: uploaded`);
                reload();
              } catch (err) {
                setProgress(undefined);
                setActionError(err);
              }
              input.value = '';
            }}
          />
        </label>
        {progress ? (
          <progress aria-label="Upload progress" max={100} value={progress.endsWith('uploaded') ? 100 : Number(/(\d+)%$/.exec(progress)?.[1] ?? 0)} />
        ) : null}
        <span role="status">{progress}</span>
      </form>
      <ErrorBox error={actionError ?? error} />
      <Table caption={`Files in ${dir}`} columns={['Name', 'Size', 'Modified']}>
        {entries.map((e) => (
          <tr key={e.path}>
            <td>
              {e.type === 'dir' ? (
                <button type="button" class="link" onClick={() => setDir(e.path)}>
                  {e.name}/
                </button>
              ) : (
                <a href={`/v1/sandboxes/${encodeURIComponent(id)}/files/content?path=${encodeURIComponent(e.path)}`} download={e.name}>
                  {e.name}
                </a>
              )}
            </td>
            <td>{e.type === 'dir' ? '—' : bytes(e.size)}</td>
            <td>{new Date(e.mtimeMs).toLocaleString()}</td>
          </tr>
        ))}
      </Table>
    </div>
  );
}
