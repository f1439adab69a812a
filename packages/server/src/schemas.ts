/** JSON schemas of the API (TypeBox); they validate requests and generate /openapi.json. */
import { Type } from 'typebox';
import { SANDBOX_STATES, type SandboxState } from '@space/core';

const StrMap = Type.Record(Type.String(), Type.String());

export const ErrorSchema = Type.Object({
  error: Type.Object({
    code: Type.String({ description: 'Stable error code, e.g. SANDBOX_NOT_FOUND' }),
    message: Type.String(),
    hint: Type.Optional(Type.String()),
    details: Type.Optional(Type.Record(Type.String(), Type.Unknown())),
  }),
});

export const EgressPolicySchema = Type.Object(
  {
    domains: Type.Array(Type.String(), { description: 'Host names and wildcards ("*.example.org": subdomains) reachable through the proxy' }),
    cidrs: Type.Array(Type.String(), { description: 'Address ranges reachable by literal IP, and where private addresses may be reached' }),
    ports: Type.Array(Type.Integer(), { description: 'Destination ports. @default [80, 443]' }),
    passthrough: Type.Array(Type.String(), { description: 'host:port pairs tunnelled as raw TCP (no TLS interception, no secrets)' }),
    publicInternet: Type.Optional(Type.Boolean({ description: 'Any public destination on the allowed ports (never private, link-local, metadata, the sandbox network or the daemon); absent: false' })),
    deny: Type.Optional(Type.Object({ domains: Type.Optional(Type.Array(Type.String())), cidrs: Type.Optional(Type.Array(Type.String())) }, { description: 'With publicInternet: destinations refused although public, unless listed as allowed' })),
  },
  { description: 'Where a sandbox may connect through its egress proxy; everything else is denied' },
);

export const EgressPolicyBody = Type.Object(
  {
    domains: Type.Optional(Type.Array(Type.String({ maxLength: 256 }), { maxItems: 256 })),
    cidrs: Type.Optional(Type.Array(Type.String({ maxLength: 64 }), { maxItems: 256 })),
    ports: Type.Optional(Type.Array(Type.Integer(), { maxItems: 256 })),
    passthrough: Type.Optional(Type.Array(Type.String({ maxLength: 300 }), { maxItems: 256 })),
    publicInternet: Type.Optional(Type.Boolean()),
    deny: Type.Optional(Type.Object({ domains: Type.Optional(Type.Array(Type.String({ maxLength: 256 }), { maxItems: 256 })), cidrs: Type.Optional(Type.Array(Type.String({ maxLength: 64 }), { maxItems: 256 })) }, { additionalProperties: false })),
  },
  { additionalProperties: false },
);

export const SecretAttachmentSchema = Type.Object({ name: Type.String(), placeholder: Type.String({ description: 'What the sandbox holds in env var `name` instead of the value' }) });

export const SecretSchema = Type.Object({
  name: Type.String(),
  hosts: Type.Array(Type.String()),
  header: Type.Optional(Type.String()),
  format: Type.Optional(Type.String()),
  sandboxId: Type.Optional(Type.String({ description: 'Set for a header rule of one sandbox (E2B network rules): deleted when that sandbox ends' })),
  createdAt: Type.String(),
  updatedAt: Type.String(),
});

export const SetSecretBody = Type.Object(
  {
    value: Type.String({ description: 'The value; write-only, never returned' }),
    hosts: Type.Array(Type.String({ maxLength: 256 }), { description: 'Hosts (and *.wildcards) the value may be sent to', maxItems: 32 }),
    header: Type.Optional(Type.String({ description: 'A request header the proxy sets on requests to the hosts' })),
    format: Type.Optional(Type.String({ description: 'The header\'s value, {value} standing for the secret. @default "{value}"' })),
  },
  { additionalProperties: false },
);

export const SecretParams = Type.Object({ name: Type.String({ maxLength: 128 }) });
export const SandboxSecretParams = Type.Object({ id: Type.String({ maxLength: 64 }), name: Type.String({ maxLength: 128 }) });
export const AttachSecretsBody = Type.Object({ names: Type.Array(Type.String({ maxLength: 128 }), { maxItems: 64 }) }, { additionalProperties: false });

/** Paging of the egress and ingress audit logs. */
export const AuditLogQuery = Type.Object({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  cursor: Type.Optional(Type.String({ maxLength: 64 })),
});

export const VolumeMountSchema = Type.Object(
  {
    volume: Type.String({ maxLength: 128, description: 'Name of a volume of the tenant (`space volume create`)' }),
    path: Type.String({ maxLength: 1024, description: 'Absolute path inside the sandbox, e.g. /data' }),
    readOnly: Type.Optional(Type.Boolean({ description: 'Mounted read-only: many sandboxes may share a volume so; read-write, one alone. @default false' })),
  },
  { additionalProperties: false },
);

export const SandboxSchema = Type.Object({
  id: Type.String(),
  tenantId: Type.String(),
  template: Type.String(),
  driver: Type.String(),
  state: Type.Unsafe<SandboxState>({ type: 'string', enum: [...SANDBOX_STATES] }),
  endReason: Type.Optional(Type.String()),
  endDetail: Type.Optional(Type.String()),
  cpu: Type.Number(),
  memoryMb: Type.Integer(),
  diskMb: Type.Optional(Type.Integer()),
  timeoutMs: Type.Integer(),
  env: StrMap,
  metadata: StrMap,
  createdAt: Type.String(),
  startedAt: Type.Optional(Type.String()),
  endedAt: Type.Optional(Type.String()),
  expiresAt: Type.Optional(Type.String()),
  onTimeout: Type.Optional(Type.String()),
  idleTimeoutMs: Type.Optional(Type.Integer()),
  autoResume: Type.Optional(Type.Boolean()),
  egress: Type.Optional(EgressPolicySchema),
  secrets: Type.Optional(Type.Array(SecretAttachmentSchema)),
  volumes: Type.Optional(Type.Array(VolumeMountSchema)),
  node: Type.Optional(Type.String({ description: 'The node that runs it (GET /v1/nodes): where it was created, or moved to' })),
  generation: Type.Optional(Type.Integer({ description: 'How many times it changed node (the ownership\'s generation); absent: never' })),
  createTimings: Type.Optional(
    Type.Object(
      {
        source: Type.Union([Type.Literal('pool'), Type.Literal('snapshot'), Type.Literal('boot')], { description: 'Taken from the warm pool, restored from the template snapshot, or booted' }),
        queueMs: Type.Integer(),
        restoreMs: Type.Optional(Type.Integer()),
        bootMs: Type.Optional(Type.Integer()),
        agentMs: Type.Integer(),
        identityMs: Type.Integer(),
        totalMs: Type.Integer(),
      },
      { description: 'Where creation time went' },
    ),
  ),
  parentId: Type.Optional(Type.String({ description: 'The sandbox this one was forked from' })),
  fromSnapshotId: Type.Optional(Type.String({ description: 'The snapshot it was last restored or forked from' })),
  lastSnapshotId: Type.Optional(Type.String()),
  snapshotPolicy: Type.Optional(Type.Object({ intervalMs: Type.Integer(), keep: Type.Integer() })),
});

export const SnapshotSchema = Type.Object({
  id: Type.String(),
  sandboxId: Type.String(),
  tenantId: Type.String(),
  name: Type.Optional(Type.String()),
  trigger: Type.String({ description: 'manual, schedule, hibernate or fork' }),
  createdAt: Type.String(),
  sizeBytes: Type.Integer(),
  parentSnapshotId: Type.Optional(Type.String()),
  downtimeMs: Type.Integer({ description: 'How long the sandbox was stopped to take it' }),
  template: Type.String(),
  driver: Type.String(),
});
export const SnapshotBody = Type.Object({ name: Type.Optional(Type.String({ maxLength: 128 })) }, { additionalProperties: false });
export const NodeParams = Type.Object({ name: Type.String({ minLength: 1, maxLength: 63 }) });
export const MoveBody = Type.Object({ node: Type.String({ minLength: 1, maxLength: 63, description: 'The node to move to (GET /v1/nodes)' }) }, { additionalProperties: false });
export const RollbackBody = Type.Object({ snapshotId: Type.String({ maxLength: 64 }) }, { additionalProperties: false });
export const ForkBody = Type.Object({ count: Type.Optional(Type.Integer({ minimum: 1, maximum: 32, default: 1 })), snapshotId: Type.Optional(Type.String({ maxLength: 64 })) }, { additionalProperties: false });
export const PolicyBody = Type.Union([Type.Object({ intervalMs: Type.Integer({ minimum: 1000 }), keep: Type.Integer({ minimum: 1, maximum: 1000 }) }, { additionalProperties: false }), Type.Null()]);

export const CreateSandboxBody = Type.Object(
  {
    template: Type.Optional(Type.String({ maxLength: 128, description: 'Template name. @default "minimal"' })),
    driver: Type.Optional(Type.String({ maxLength: 32, description: 'Isolation driver, one the daemon enables (`gvisor`, `microvm`). @default the daemon\'s default' })),
    cpu: Type.Optional(Type.Number({ description: 'CPU cores (fractional allowed). @default 1' })),
    memoryMb: Type.Optional(Type.Integer({ description: 'Memory limit in MiB. @default 512' })),
    diskMb: Type.Optional(Type.Number({ description: "Disk size in MiB, template files included; a full disk fails the write (ENOSPC), not the sandbox. Only on daemons with disks (--disks auto, the default, on a single node; or --disks on). @default 5120 (the daemon's --disk-default)" })),
    timeoutMs: Type.Optional(Type.Integer({ description: 'Kill the sandbox this many ms after creation; 0 = never. @default 1800000' })),
    env: Type.Optional(StrMap),
    metadata: Type.Optional(StrMap),
    onTimeout: Type.Optional(Type.Union([Type.Literal('kill'), Type.Literal('hibernate')], { description: 'What the timeout does. @default "kill"' })),
    idleTimeoutMs: Type.Optional(Type.Integer({ description: 'Hibernate after this many ms without an API call for the sandbox; 0 = never. @default 0' })),
    autoResume: Type.Optional(Type.Boolean({ description: 'A request through the ingress to an exposed port wakes the sandbox when hibernated (resumes it when paused). @default false' })),
    egress: Type.Optional(EgressPolicyBody),
    secrets: Type.Optional(Type.Array(Type.String({ maxLength: 128 }), { maxItems: 64, description: 'Secrets to attach: the sandbox gets a placeholder in an env var of each name' })),
    volumes: Type.Optional(Type.Array(VolumeMountSchema, { maxItems: 8, description: 'Volumes to mount; held until the sandbox is killed or dies. Not rolled back with its snapshots.' })),
  },
  { additionalProperties: false },
);

export const IdParams = Type.Object({ id: Type.String({ maxLength: 64 }) });
export const SnapshotParams = Type.Object({ id: Type.String({ maxLength: 64 }), snapshotId: Type.String({ maxLength: 64 }) });
export const PortParams = Type.Object({ id: Type.String({ maxLength: 64 }), port: Type.Integer({ minimum: 0, maximum: 65535, description: '0: the opening of every port (a sandbox made through the E2B-compatible API)' }) });

export const ExposeBody = Type.Object(
  {
    port: Type.Integer({ description: 'TCP port a server inside the sandbox listens on (0.0.0.0)' }),
    public: Type.Optional(Type.Boolean({ description: 'Reachable without the access token. @default false' })),
    expiresInS: Type.Optional(Type.Integer({ description: 'The exposure ends after this many seconds (1 to 2592000); absent: while the sandbox lives' })),
  },
  { additionalProperties: false },
);

export const ExposedPortSchema = Type.Object({
  port: Type.Integer({ description: '0: every port (E2B\'s model: a sandbox made through the E2B-compatible API)' }),
  public: Type.Boolean(),
  url: Type.String({ description: 'The port\'s origin through the ingress (port 0: a template, {port} standing for the port)' }),
  signedUrl: Type.Optional(Type.String({ description: 'Opens the port in a browser: sets a cookie for its host, then redirects to / (none for port 0)' })),
  signedUrlExpiresAt: Type.Optional(Type.String()),
  createdAt: Type.String(),
  expiresAt: Type.Optional(Type.String()),
  token: Type.Optional(Type.String({ description: 'The access token (send as X-Space-Access-Token): only in the answer to the expose request' })),
});
export const PidParams = Type.Object({ id: Type.String({ maxLength: 64 }), pid: Type.Integer({ minimum: 1 }) });

export const ListQuery = Type.Object({
  state: Type.Optional(Type.String({ description: 'Comma-separated states, e.g. running,starting' })),
  label: Type.Optional(Type.Union([Type.String(), Type.Array(Type.String())], { description: 'k=v; repeat for several (all must match)' })),
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 50 })),
  cursor: Type.Optional(Type.String({ maxLength: 64 })),
});

export const ExecBody = Type.Object(
  {
    cmd: Type.Optional(Type.String({ maxLength: 65536, description: 'Shell command line, run with /bin/sh -c' })),
    argv: Type.Optional(Type.Array(Type.String({ maxLength: 65536 }), { minItems: 1, maxItems: 4096 })),
    env: Type.Optional(StrMap),
    cwd: Type.Optional(Type.String({ maxLength: 4096 })),
    user: Type.Optional(Type.String({ maxLength: 64, description: 'User name or uid. @default "user"' })),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 1, maximum: 7 * 24 * 3600 * 1000 })),
    background: Type.Optional(Type.Boolean({ description: 'Return {pid} at once; the process keeps running.' })),
    stdin: Type.Optional(Type.Boolean({ description: 'Keep stdin open for POST .../stdin' })),
    pty: Type.Optional(Type.Object({ cols: Type.Integer({ minimum: 1, maximum: 1000 }), rows: Type.Integer({ minimum: 1, maximum: 1000 }) })),
    tag: Type.Optional(Type.String({ maxLength: 256 })),
  },
  { additionalProperties: false },
);

export const StdinBody = Type.Object({ data: Type.Optional(Type.String({ maxLength: 700_000, description: 'base64' })), eof: Type.Optional(Type.Boolean()) }, { additionalProperties: false });
export const SignalBody = Type.Object({ signal: Type.String({ maxLength: 16 }) }, { additionalProperties: false });
export const ResizeBody = Type.Object({ cols: Type.Integer({ minimum: 1, maximum: 1000 }), rows: Type.Integer({ minimum: 1, maximum: 1000 }) }, { additionalProperties: false });

export const PathQuery = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }) });
/** Stat of a path; `metadata=true` adds its file metadata. */
export const StatQuery = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }), metadata: Type.Optional(Type.Boolean()) });
export const ListFilesQuery = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }), depth: Type.Optional(Type.Integer({ minimum: 1, maximum: 32 })), metadata: Type.Optional(Type.Boolean()) });
export const RemoveQuery = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }), recursive: Type.Optional(Type.Boolean()) });
export const UploadQuery = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }), mode: Type.Optional(Type.Integer({ minimum: 0, maximum: 0o7777 })), user: Type.Optional(Type.String({ maxLength: 64 })) });
export const MkdirBody = Type.Object({ path: Type.String({ minLength: 1, maxLength: 4096 }), user: Type.Optional(Type.String({ maxLength: 64 })) }, { additionalProperties: false });
export const RenameBody = Type.Object({ from: Type.String({ minLength: 1, maxLength: 4096 }), to: Type.String({ minLength: 1, maxLength: 4096 }) }, { additionalProperties: false });

export const CreateKeyBody = Type.Object(
  {
    name: Type.Optional(Type.String({ maxLength: 128 })),
    tenant: Type.Optional(Type.String({ maxLength: 63, description: 'Another tenant (admin keys only). @default the caller\'s tenant' })),
    admin: Type.Optional(Type.Boolean()),
    format: Type.Optional(Type.Union([Type.Literal('space'), Type.Literal('e2b')], { description: 'e2b: `e2b_` + 40 hex digits, for E2B SDKs. @default "space"' })),
  },
  { additionalProperties: false },
);
export const KeyParams = Type.Object({ keyId: Type.String({ maxLength: 64 }) });
export const TemplateParams = Type.Object({ name: Type.String({ maxLength: 128 }) });

export const TemplateSchema = Type.Object({
  name: Type.String(),
  builtin: Type.Boolean(),
  state: Type.Union([Type.Literal('ready'), Type.Literal('building'), Type.Literal('missing')], { description: 'missing: a built-in whose root file system is built on first use' }),
  source: Type.Record(Type.String(), Type.Unknown(), { description: 'builtin, debian (packages) or upload (format, sha256, sizeBytes)' }),
  start: Type.Optional(Type.Object({ cmd: Type.String(), readyCmd: Type.Optional(Type.String()), readyTimeoutMs: Type.Integer() })),
  env: StrMap,
  pool: Type.Object({ size: Type.Integer(), ready: Type.Integer() }),
  image: Type.Optional(Type.Object({ sizeBytes: Type.Integer(), captureMs: Type.Integer(), createdAt: Type.String() }, { description: 'The template snapshot creates restore' })),
  rootfsBytes: Type.Optional(Type.Integer()),
  createdAt: Type.String(),
  readyAt: Type.Optional(Type.String()),
});
export const BuildTemplateBody = Type.Object(
  {
    name: Type.String({ minLength: 1, maxLength: 63, description: 'Lowercase letters, digits, ".", "_", "-"' }),
    packages: Type.Optional(Type.Array(Type.String({ maxLength: 100 }), { minItems: 1, maxItems: 500, description: 'Debian bookworm packages' })),
    uploadId: Type.Optional(Type.String({ maxLength: 64, description: 'From POST /v1/template-uploads: an OCI layout, docker save or rootfs tarball' })),
    start: Type.Optional(
      Type.Object(
        {
          cmd: Type.String({ minLength: 1, maxLength: 8192, description: 'Started in the background before the snapshot' }),
          readyCmd: Type.Optional(Type.String({ minLength: 1, maxLength: 8192, description: 'Exits 0 once ready; retried every 200 ms' })),
          readyTimeoutMs: Type.Optional(Type.Integer({ minimum: 100, maximum: 600000, default: 60000 })),
        },
        { additionalProperties: false },
      ),
    ),
    env: Type.Optional(StrMap),
    poolSize: Type.Optional(Type.Integer({ minimum: 0, maximum: 64, description: 'Warm pool size. @default 0' })),
  },
  { additionalProperties: false },
);
export const PoolBody = Type.Object({ size: Type.Integer({ minimum: 0, maximum: 64 }) }, { additionalProperties: false });
export const UploadSchema = Type.Object({ uploadId: Type.String(), sizeBytes: Type.Integer(), sha256: Type.String(), createdAt: Type.String() });

export const SetKeyBody = Type.Object(
  {
    provider: Type.String({ maxLength: 32, description: 'Key provider: local (a key file in the daemon\'s key directory)' }),
    ref: Type.String({ minLength: 1, maxLength: 512, description: 'The key: for local, a file name in the key directory' }),
  },
  { additionalProperties: false },
);

export const VolumeSchema = Type.Object({
  id: Type.String(),
  name: Type.String(),
  sizeMb: Type.Integer(),
  createdAt: Type.String(),
  mountedBy: Type.Array(Type.Object({ sandboxId: Type.String(), path: Type.String(), readOnly: Type.Boolean() }), { description: 'Sandboxes that hold it (until they are killed or die)' }),
  node: Type.Optional(Type.String({ description: 'The node that keeps it, in a cluster: its sandboxes run there' })),
  usedBytes: Type.Optional(Type.Integer({ description: 'What it holds, while it is open (mounted by a sandbox)' })),
});
export const CreateVolumeBody = Type.Object(
  {
    name: Type.String({ maxLength: 63, description: "1 to 63 of a-z, 0-9, '.', '_' and '-'" }),
    sizeMb: Type.Optional(Type.Integer({ description: 'Size in MiB; a writer that fills it gets ENOSPC. @default 1024' })),
  },
  { additionalProperties: false },
);
export const VolumeParams = Type.Object({ name: Type.String({ maxLength: 128 }) });
export const VolumeSnapshotParams = Type.Object({ name: Type.String({ maxLength: 128 }), snapshotId: Type.String({ maxLength: 64 }) });
export const VolumeSnapshotSchema = Type.Object({ id: Type.String(), volume: Type.String(), createdAt: Type.String() });
export const VolumeRestoreBody = Type.Object({ snapshotId: Type.String({ maxLength: 64 }) }, { additionalProperties: false });
export const VolumePathQuery = Type.Object({ path: Type.String({ maxLength: 4096 }) });
export const VolumeListQuery = Type.Object({ path: Type.Optional(Type.String({ maxLength: 4096 })), depth: Type.Optional(Type.Integer({ minimum: 1, maximum: 32 })) });
export const VolumeMkdirBody = Type.Object({ path: Type.String({ maxLength: 4096 }), parents: Type.Optional(Type.Boolean()) }, { additionalProperties: false });
export const VolumeEntrySchema = Type.Object({
  name: Type.String(),
  path: Type.String(),
  type: Type.String({ description: 'file, directory, symlink or other' }),
  size: Type.Integer(),
  mode: Type.Integer(),
  uid: Type.Integer(),
  gid: Type.Integer(),
  mtime: Type.String(),
  atime: Type.String(),
  ctime: Type.String(),
  target: Type.Optional(Type.String({ description: 'Where a symbolic link points (transfers never follow one)' })),
});
