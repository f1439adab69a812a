/** The tenant's secrets, keys, templates and (admin keys) the cluster's nodes. */
import type { JSX } from 'preact';
import { useState } from 'preact/hooks';
import type { NodeInfo, SecretInfo } from '@space/api';
import { api, ApiError, sendFile, stream, type Session } from '../api.js';
import { Action, ago, bytes, ErrorBox, Link, useLoad, Table, fields } from '../ui.js';
import { allSandboxes, ended } from './sandboxes.js';

/** Secrets: names, hosts and the sandboxes they are attached to — never values (the API never answers them). */
export function SecretsPage(): JSX.Element {
  const [data, error] = useLoad(async () => ({ secrets: (await api<{ secrets: SecretInfo[] }>('GET', '/v1/secrets')).secrets, sandboxes: await allSandboxes() }), []);
  return (
    <section aria-labelledby="h-secrets">
      <h1 id="h-secrets">Secrets</h1>
      <p class="muted">Values are injected by the egress proxy at the point of use and never shown, here or inside a sandbox. Set them with <code>space secret set</code>.</p>
      <ErrorBox error={error} />
      <Table caption="Secrets" columns={['Name', 'Hosts', 'Injected as', 'Attached to', 'Created']}>
        {(data?.secrets ?? []).map((s) => (
          <tr key={s.name}>
            <td>{s.name}</td>
            <td>{s.hosts.join(', ')}</td>
            <td>{s.header ?? 'placeholder'}</td>
            <td>
              {(data?.sandboxes ?? [])
                .filter((sb) => !ended(sb) && (sb.secrets ?? []).some((a) => a.name === s.name))
                .map((sb) => (
                  <span key={sb.id} class="label">
                    <Link href={`/console/sandboxes/${sb.id}/egress`}>{sb.id}</Link>
                  </span>
                ))}
            </td>
            <td>{ago(s.createdAt)}</td>
          </tr>
        ))}
      </Table>
    </section>
  );
}

interface KeyRecord {
  id: string;
  name?: string;
  prefix?: string;
  admin?: boolean;
  createdAt?: string;
  revokedAt?: string;
}
interface EncryptionKey {
  id: string;
  state: string;
  provider?: string;
  ref?: string;
  createdAt?: string;
}

/** API keys (create, revoke) and encryption keys (state; rotation). */
export function KeysPage({ session }: { session: Session }): JSX.Element {
  const [keys, error, reload] = useLoad(() => api<{ keys: KeyRecord[] }>('GET', '/v1/keys'), []);
  const [ek, ekError, reloadEk] = useLoad(() => api<{ keys: EncryptionKey[] }>('GET', '/v1/encryption-keys'), []);
  const [rotateError, setRotateError] = useState<unknown>();
  const [rotating, setRotating] = useState(false);
  const [created, setCreated] = useState<string>();
  const [actionError, setActionError] = useState<unknown>();
  return (
    <section aria-labelledby="h-keys">
      <h1 id="h-keys">Keys</h1>
      <h2>API keys</h2>
      <ErrorBox error={actionError ?? error} />
      {session.admin ? (
        <form
          class="row"
          aria-label="New API key"
          onSubmit={async (e) => {
            const name = fields(e).value('name');
            try {
              const r = await api<{ key: string }>('POST', '/v1/keys', { name });
              setCreated(r.key);
              reload();
            } catch (err) {
              setActionError(err);
            }
          }}
        >
          <label>
            Name <input name="name" required maxLength={128} />
          </label>
          <button type="submit">Create key</button>
        </form>
      ) : null}
      {created ? (
        <p role="status" class="notice">
          New key (shown once, copy it now): <code>{created}</code>
        </p>
      ) : null}
      <Table caption="API keys" columns={['Key', 'Name', 'Admin', 'Created', 'State', 'Actions']}>
        {(keys?.keys ?? []).map((k) => (
          <tr key={k.id}>
            <td>
              <code>{k.prefix ? `${k.prefix}…` : k.id}</code>
            </td>
            <td>{k.name}</td>
            <td>{k.admin ? 'yes' : 'no'}</td>
            <td>{ago(k.createdAt)}</td>
            <td>{k.revokedAt ? `revoked ${ago(k.revokedAt)}` : k.id === session.keyId ? 'active (this session)' : 'active'}</td>
            <td>{k.revokedAt ? null : <Action label="Revoke" danger confirm={`Revoke key ${k.prefix ?? k.id} (${k.name ?? ''})? Everything using it, this console's sessions included, stops working.`} run={async () => (await api('DELETE', `/v1/keys/${k.id}`), reload())} onError={setActionError} />}</td>
          </tr>
        ))}
      </Table>
      <h2>Encryption keys</h2>
      <p class="muted">Everything stored for this tenant is encrypted under its active key (the node key when it has none). Setting a new key rotates: every data key is re-wrapped under it, online.</p>
      <ErrorBox error={ekError ?? rotateError} />
      <form
        class="row"
        aria-label="Set or rotate the encryption key"
        onSubmit={async (e) => {
          const v = fields(e).value;
          setRotateError(undefined);
          setRotating(true);
          try {
            await api('POST', '/v1/encryption-keys', { provider: v('provider'), ref: v('ref') });
            reloadEk();
          } catch (err) {
            setRotateError(err);
          } finally {
            setRotating(false);
          }
        }}
      >
        <label>
          Provider{' '}
          <select name="provider">
            <option value="local">local (a key file)</option>
            <option value="pkcs11">pkcs11 (a token)</option>
          </select>
        </label>
        <label>
          Key reference <input name="ref" required placeholder="tenant.key" />
        </label>
        <button type="submit" disabled={rotating}>
          {rotating ? 'Re-wrapping every data key…' : 'Set / rotate key'}
        </button>
      </form>
      <Table caption="Encryption keys" columns={['Key', 'State', 'Provider', 'Created']}>
        {(ek?.keys ?? []).map((k) => (
          <tr key={k.id}>
            <td>
              <code>{k.id}</code>
            </td>
            <td>{k.state}</td>
            <td>
              {k.provider ?? ''} {k.ref ?? ''}
            </td>
            <td>{ago(k.createdAt)}</td>
          </tr>
        ))}
      </Table>
    </section>
  );
}

interface TemplateView {
  name: string;
  builtin: boolean;
  state: string;
  pool: { size: number; ready: number };
  image?: { sizeBytes: number };
  rootfsBytes?: number;
  createdAt: string;
}

/**
 * Builds a template from Debian packages or from an image file (an OCI layout, `docker save` or
 * root file system tarball: uploaded first, with its progress), showing the build's progress as
 * it streams.
 */
function BuildForm({ onDone }: { onDone: () => void }): JSX.Element {
  const [progress, setProgress] = useState<{ percent: number; step: string }>();
  const [error, setError] = useState<unknown>();
  return (
    <form
      class="row"
      aria-label="Build a template"
      onSubmit={async (e) => {
        const v = fields(e).value;
        const image = ((e.currentTarget as HTMLFormElement).elements.namedItem('image') as HTMLInputElement).files?.[0];
        const packages = v('packages').split(/[\s,]+/).filter(Boolean);
        setError(undefined);
        if (!image && !packages.length) return setError(new ApiError(400, 'BAD_REQUEST', 'Give Debian packages or an image file to build from'));
        setProgress({ percent: 0, step: image ? 'uploading the image' : 'starting' });
        try {
          const source = image ? { uploadId: (await sendFile<{ uploadId: string }>('POST', '/v1/template-uploads', image, (f) => setProgress({ percent: 0, step: `uploading the image ${Math.round(f * 100)}%` }))).uploadId } : { packages };
          await stream('POST', '/v1/templates', { name: v('name'), ...source }, (l) => l.type === 'progress' && setProgress({ percent: Number(l.percent ?? 0), step: String(l.step ?? '') }));
          setProgress({ percent: 100, step: 'ready' });
          onDone();
        } catch (err) {
          setProgress(undefined);
          setError(err);
        }
      }}
    >
      <label>
        Name <input name="name" required pattern="[a-z0-9][a-z0-9._-]*" maxLength={63} />
      </label>
      <label>
        Debian packages <input name="packages" placeholder="python3 git" />
      </label>
      <label>
        or an image <input name="image" type="file" accept=".tar,.tar.gz,.tgz,application/x-tar,application/gzip" />
      </label>
      <button type="submit" disabled={!!progress && progress.percent < 100}>
        Build template
      </button>
      {progress ? (
        <>
          <progress max={100} value={progress.percent} aria-label="Build progress" />
          <span role="status">
            {progress.percent}% {progress.step}
          </span>
        </>
      ) : null}
      <ErrorBox error={error} />
    </form>
  );
}

/** Templates and their warm pools (size editable). */
export function TemplatesPage({ session }: { session: Session }): JSX.Element {
  const [data, error, reload] = useLoad(() => api<{ templates: TemplateView[] }>('GET', '/v1/templates'), []);
  const [actionError, setActionError] = useState<unknown>();
  return (
    <section aria-labelledby="h-templates">
      <h1 id="h-templates">Templates</h1>
      <BuildForm onDone={reload} />
      <ErrorBox error={actionError ?? error} />
      <Table caption="Templates" columns={['Name', 'State', 'Snapshot', 'Warm pool (ready / size)']}>
        {(data?.templates ?? []).map((t) => (
          <tr key={t.name}>
            <td>
              {t.name}
              {t.builtin ? <span class="muted"> built-in</span> : null}
            </td>
            <td>{t.state}</td>
            <td>{bytes(t.image?.sizeBytes)}</td>
            <td>
              <form
                class="row"
                aria-label={`Warm pool of ${t.name}`}
                onSubmit={async (e) => {
                  const size = Number(fields(e).value('size'));
                  try {
                    await api('PUT', `/v1/templates/${encodeURIComponent(t.name)}/pool`, { size });
                    reload();
                  } catch (err) {
                    setActionError(err);
                  }
                }}
              >
                <span>{t.pool.ready} /</span>
                <label>
                  <span class="sr-only">Pool size of {t.name}</span>
                  <input name="size" type="number" min={0} max={64} defaultValue={t.pool.size} disabled={t.builtin && !session.admin} />
                </label>
                <button type="submit" disabled={t.builtin && !session.admin}>
                  Set
                </button>
              </form>
            </td>
          </tr>
        ))}
      </Table>
    </section>
  );
}

/** The cluster's nodes (admin keys). */
export function NodesPage({ session }: { session: Session }): JSX.Element {
  const [data, error] = useLoad(() => (session.admin ? api<{ nodes: NodeInfo[] }>('GET', '/v1/nodes') : Promise.resolve({ nodes: [] })), []);
  if (!session.admin) return <p>Nodes are shown to admin keys.</p>;
  return (
    <section aria-labelledby="h-nodes">
      <h1 id="h-nodes">Nodes</h1>
      <ErrorBox error={error} />
      <Table caption="Nodes" columns={['Node', 'State', 'Sandboxes', 'Memory reserved', 'CPUs / load / memory', 'Drivers', 'Heartbeat']}>
        {(data?.nodes ?? []).map((n) => (
          <tr key={n.name}>
            <td>{n.name}</td>
            <td>
              {n.state}
              {n.draining ? ' (draining)' : ''}
            </td>
            <td>
              {n.sandboxes} / {n.maxSandboxes}
            </td>
            <td>
              {n.memoryReservedMb} / {n.maxMemoryMb} MiB
            </td>
            <td>
              {n.cpus} / {n.load === undefined ? '–' : n.load.toFixed(2)} / {n.memoryMb} MiB
            </td>
            <td>{n.drivers.join(', ')}</td>
            <td>{ago(n.heartbeatAt)}</td>
          </tr>
        ))}
      </Table>
    </section>
  );
}
