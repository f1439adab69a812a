/**
 * The one error registry of SPACE: `code → HTTP status, message, fix-it hint`.
 * The daemon serializes errors from it, the SDK rebuilds typed errors from the `code`.
 * Codes are stable API: match on `error.code`, never on the message.
 */

/** Row of the registry. */
export interface ErrorSpec {
  status: number;
  /** Default message when the thrower gives none. */
  message: string;
  /** How to fix it, shown to users. */
  hint?: string;
}

/** Every error code SPACE can return. */
export const ERRORS = {
  BAD_REQUEST: { status: 400, message: 'The request is invalid', hint: 'Check the request against GET /openapi.json.' },
  CONFIG_INVALID: { status: 400, message: 'A setting is invalid', hint: 'Fix the flag or environment variable the message names; `--help` lists the flags.' },
  INVALID_JSON: { status: 400, message: 'The request body is not valid JSON', hint: 'Send a JSON object with Content-Type: application/json.' },
  INVALID_LIMITS: { status: 400, message: 'Resource limits are out of range', hint: 'Use cpu 0.1–16, memoryMb 64–65536, timeoutMs 1000–604800000, diskMb larger than the template up to the node\'s maximum, and a volume\'s sizeMb from 64 up to the node\'s maximum; sizes on the command line look like 512M, 4G, 1T.' },
  DISKS_UNAVAILABLE: { status: 400, message: 'This daemon keeps sandbox files in memory: it has no disks', hint: 'Leave diskMb out, or start the daemon with --disks on (it needs btrfs-progs and loop devices: `space doctor`; `--disks auto`, the default, is off in a cluster and for a data directory made before disks).' },
  VOLUMES_UNAVAILABLE: { status: 400, message: 'This daemon has no volumes', hint: 'Volumes mount into gVisor sandboxes of a daemon with disks (the default on a single node; `space up --disks on` to insist) and need fscrypt and e2fsprogs: `space doctor`.' },
  INVALID_PATH: { status: 400, message: 'The path is invalid', hint: 'Use an absolute path without NUL bytes, at most 4096 bytes long.' },
  INVALID_PORT: { status: 400, message: 'The port is invalid', hint: 'Use a TCP port from 1 to 65535 that a server inside the sandbox listens on.' },
  INGRESS_UNAUTHENTICATED: { status: 401, message: 'This port needs its access token', hint: 'Send the token `space expose` printed as "X-Space-Access-Token: <token>", or open the signed link it printed (it sets a cookie for this host).' },
  PORT_NOT_EXPOSED: { status: 404, message: 'Nothing is exposed at this address', hint: 'Expose the port first: `space expose ID PORT` prints its URL; `space ports ID` lists what is exposed.' },
  UNAUTHENTICATED: { status: 401, message: 'Missing or invalid API key', hint: 'Send the key as "Authorization: Bearer <key>" (SPACE_API_KEY for the SDK and CLI).' },
  CONSOLE_NOT_BUILT: { status: 404, message: 'The web console is not built into this installation', hint: 'Run `npm run build` (./space does it), then start the daemon again.' },
  CSRF_TOKEN_INVALID: { status: 403, message: 'This request needs the console session\'s CSRF token', hint: 'Send the csrfToken of GET /v1/session as "X-CSRF-Token" (the console does); or authenticate with "Authorization: Bearer <key>" instead of the session cookie.' },
  FORBIDDEN: { status: 403, message: 'This API key may not do that', hint: 'Use an admin key of the tenant.' },
  SANDBOX_NOT_FOUND: { status: 404, message: 'No such sandbox', hint: 'List your sandboxes with `space ls`; ids belong to the tenant of the API key.' },
  TEMPLATE_NOT_FOUND: { status: 404, message: 'No such template', hint: 'List templates with `space template ls`.' },
  PROCESS_NOT_FOUND: { status: 404, message: 'No such process in the sandbox', hint: 'List processes with GET /v1/sandboxes/{id}/commands.' },
  VOLUME_NOT_FOUND: { status: 404, message: 'No such volume', hint: 'List volumes with `space volume ls`; names belong to the tenant of the API key.' },
  FILE_NOT_FOUND: { status: 404, message: 'No such file or directory' },
  KEY_NOT_FOUND: { status: 404, message: 'No such API key' },
  VOLUME_EXISTS: { status: 409, message: 'A volume with that name exists', hint: 'Pick another name, or remove it first with `space volume rm NAME`.' },
  VOLUME_ON_OTHER_NODE: { status: 421, message: 'The volume is kept on another node', hint: 'Send the request to the SPACE API (/v1) of any node: it forwards it to the node that keeps the volume (`space volume ls` shows which).' },
  VOLUMES_ON_DIFFERENT_NODES: { status: 400, message: 'The volumes are kept on different nodes', hint: 'A sandbox mounts volumes of one node (a volume stays on the node that made it): `space volume ls` shows each one\'s node; copy the files into a volume of that node (`space volume cp`).' },
  VOLUME_IN_USE: { status: 409, message: 'The volume is in use', hint: 'A volume is mounted read-write by one sandbox, or read-only by many: kill the sandboxes that have it (`space volume ls` shows them), or mount it with :ro.' },
  FILE_EXISTS: { status: 409, message: 'The destination already exists' },
  FILE_CHANGED: { status: 409, message: 'The file shrank while it was read', hint: 'Something in the sandbox rewrote it meanwhile; read it again, or read a copy made first (cp FILE FILE.snap).' },
  NOT_A_DIRECTORY: { status: 400, message: 'A path component is not a directory' },
  IS_A_DIRECTORY: { status: 400, message: 'The path is a directory', hint: 'Use the list endpoint for directories.' },
  DIRECTORY_NOT_EMPTY: { status: 409, message: 'The directory is not empty', hint: 'Pass recursive=true to remove it with its contents.' },
  PERMISSION_DENIED: { status: 403, message: 'Permission denied inside the sandbox', hint: 'Run as a user that may access the path (user: "root").' },
  SANDBOX_NOT_RUNNING: { status: 409, message: 'The sandbox is not running', hint: 'Create a new sandbox; this one has ended (see its state and reason).' },
  SANDBOX_INVALID_STATE: { status: 409, message: 'The action is not allowed in the sandbox\'s current state' },
  PAYLOAD_TOO_LARGE: { status: 413, message: 'The upload exceeds the configured limit', hint: 'Raise limits.maxUploadBytes in the daemon config or upload a smaller file.' },
  CAPACITY_EXHAUSTED: { status: 429, message: 'The node has no capacity for another sandbox now', hint: 'Retry after the time in Retry-After, or raise limits.maxSandboxes.' },
  AGENT_UNAVAILABLE: { status: 503, message: 'The sandbox agent is not connected', hint: 'Retry in a moment; if it persists the sandbox has died (see `space inspect`).' },
  AGENT_DISCONNECTED: { status: 502, message: 'The sandbox agent disconnected during the operation' },
  AGENT_PROTOCOL_ERROR: { status: 502, message: 'The sandbox agent sent an invalid message' },
  COMMAND_FAILED_TO_START: { status: 400, message: 'The command could not be started', hint: 'Check that the program exists in the sandbox and cwd is a directory.' },
  SNAPSHOT_NOT_FOUND: { status: 404, message: 'No such snapshot', hint: 'List snapshots with `space snapshots ID`.' },
  SNAPSHOT_CORRUPT: { status: 422, message: 'The snapshot is corrupt and was not restored', hint: 'Restore another snapshot; this one failed its integrity check.' },
  SNAPSHOT_UNSUPPORTED_STATE: { status: 409, message: 'The sandbox is in a state this runtime cannot snapshot', hint: 'Stop the named process (or close its sockets) and retry, or run such servers in a sandbox of the microVM driver (create with driver "microvm"), whose full-machine snapshots take any socket state. The sandbox keeps running.' },
  SNAPSHOT_FAILED: { status: 500, message: 'The snapshot failed', hint: 'See the sandbox events; the sandbox was restored from its last good snapshot if it died.' },
  TIMEOUT: { status: 504, message: 'The operation timed out' },
  TEMPLATE_NOT_ON_DRIVER: { status: 400, message: 'This template cannot start on the requested driver', hint: 'A template with a start command runs from its snapshot, taken on the daemon\'s default driver: create it without driver.' },
  DRIVER_NOT_ENABLED: { status: 400, message: 'This daemon does not run the requested driver', hint: 'Omit driver (the daemon default), or start spaced with --drivers listing it.' },
  METADATA_UNAVAILABLE: { status: 503, message: 'The metadata database cannot be reached', hint: 'Retry in a moment; running sandboxes keep running. The operator should check that PostgreSQL is up and reachable from this node (the daemon log names the error).' },
  BLOB_STORE_UNAVAILABLE: { status: 503, message: 'The object store cannot be reached', hint: 'Retry in a moment; the sandbox keeps running and nothing was changed. The operator should check that the object store (--blob-store) is up and reachable from this node.' },
  BLOB_STORE_IN_USE: { status: 409, message: 'The blob store belongs to another SPACE deployment', hint: 'Give each deployment (metadata database) its own bucket, key prefix or directory: two would delete each other\'s snapshot chunks.' },
  DATABASE_IN_USE: { status: 409, message: 'Another SPACE daemon runs as this node on this database', hint: 'Give each node its own --node-name (daemons sharing a database are a cluster, each running its own sandboxes), or stop the other daemon.' },
  SANDBOX_ON_OTHER_NODE: { status: 421, message: 'The sandbox runs on another node', hint: 'Send the request to the SPACE API (/v1) of any node: it forwards it to the node that runs the sandbox (`space inspect` shows which).' },
  TEMPLATE_NOT_ON_NODE: { status: 409, message: 'The template\'s root file system is on another node', hint: 'Create it through the API (any node): a create of a tenant\'s template is forwarded to the node that built it. Built-in templates start on every node.' },
  NODE_UNAVAILABLE: { status: 503, message: 'The node that runs the sandbox does not answer', hint: 'Retry in a moment; `space nodes` shows whether that node is up. Its sandboxes are untouched.' },
  DRIVER_UNAVAILABLE: { status: 503, message: 'The isolation driver cannot run on this host', hint: 'Run `space doctor` to see what is missing.' },
  DRIVER_FAILED: { status: 500, message: 'The isolation driver failed', hint: 'See the daemon log for the runtime\'s output.' },
  TEMPLATE_BUILD_FAILED: { status: 422, message: 'The template could not be built', hint: 'The error names the failing step; fix the input (package names, image) and build again.' },
  TEMPLATE_EXISTS: { status: 409, message: 'A template with that name exists', hint: 'Pick another name, or remove it first with `space template rm NAME`.' },
  TEMPLATE_IN_USE: { status: 409, message: 'Sandboxes still use the template', hint: 'Kill the sandboxes made from it (`space ls`), then remove it.' },
  TEMPLATE_NOT_READY: { status: 409, message: 'The template is still being built', hint: 'Wait for its build to finish (`space template ls`).' },
  TEMPLATE_IMAGE_INVALID: { status: 422, message: 'The uploaded image is not a usable OCI layout, docker save or root file system tarball', hint: 'Make it with `docker save IMAGE > image.tar`, `skopeo copy ... oci-archive:image.tar`, or `tar -C rootfs -cf rootfs.tar .`.' },
  TEMPLATE_START_FAILED: { status: 422, message: 'The template\'s start command exited before it was ready', hint: 'Run the start command in a sandbox (`space exec`) to see why it fails.' },
  TEMPLATE_START_TIMEOUT: { status: 422, message: 'The template\'s start command did not become ready in time', hint: 'Check the ready command, or raise readyTimeoutMs.' },
  KEY_INVALID: { status: 400, message: 'The encryption key cannot be used', hint: 'Check the provider and the key reference: the message says what is wrong with it.' },
  KEY_REVOKED: { status: 403, message: 'The tenant\'s encryption key is revoked', hint: 'Enable the key again (`space key enable ID`) to read or store this tenant\'s data.' },
  KEY_DESTROYED: { status: 410, message: 'The encryption key was destroyed; the data it protected is unreadable for good' },
  SECRET_NOT_FOUND: { status: 404, message: 'No such secret', hint: 'List secrets with `space secret ls`; names belong to the tenant of the API key.' },
  SECRET_INVALID: { status: 400, message: 'The secret is invalid', hint: 'Give a name like OPENAI_API_KEY, a value, and at least one host (e.g. api.openai.com or *.example.org).' },
  EGRESS_POLICY_INVALID: { status: 400, message: 'The egress policy is invalid', hint: 'Use domains like "api.example.com" or "*.example.org", CIDRs like "203.0.113.0/24", ports 1–65535 and passthrough "host:port".' },
  EGRESS_DENIED: { status: 403, message: 'The egress proxy refused the request', hint: 'Allow the destination in the sandbox\'s egress policy (`space egress allow ID --domain HOST`).' },
  INGRESS_UNAVAILABLE: { status: 503, message: 'This daemon runs without an ingress', hint: 'Start spaced with --ingress-listen HOST:PORT (it needs the sandbox network: not with --egress off).' },
  INGRESS_BUSY: { status: 503, message: 'The sandbox has as many connections open through the ingress as it may', hint: 'Retry after the time in Retry-After; the operator can raise --ingress-max-connections.' },
  INGRESS_UPSTREAM_FAILED: { status: 502, message: 'Nothing answered on this port inside the sandbox', hint: 'Start a server listening on 0.0.0.0 (not only 127.0.0.1) on that port inside the sandbox.' },
  EGRESS_UPSTREAM_FAILED: { status: 502, message: 'The egress proxy could not reach the destination', hint: 'Check that the destination is up and reachable from the daemon\'s host; `space egress log ID` shows each attempt.' },
  EGRESS_UNAVAILABLE: { status: 503, message: 'Sandbox networking is off on this daemon', hint: 'Start the daemon without --egress off (it needs nftables and iproute2: `space doctor`).' },
  UPLOAD_NOT_FOUND: { status: 404, message: 'No such upload', hint: 'Upload the image first (POST /v1/template-uploads); uploads are kept for an hour.' },
  DAEMON_UNREACHABLE: { status: 503, message: 'Cannot reach the SPACE daemon', hint: 'Start it with `space up`, or point SPACE_URL at it.' },
  DAEMON_SHUTTING_DOWN: { status: 503, message: 'The daemon is shutting down', hint: 'Retry once it is back.' },
  INTERNAL: { status: 500, message: 'Internal error', hint: 'See the daemon log; please report it.' },
} as const satisfies Record<string, ErrorSpec>;

/** A stable error code. */
export type ErrorCode = keyof typeof ERRORS;

const BRAND = Symbol.for('space.error');

/** Extra fields for a {@link SpaceError}. */
export interface SpaceErrorOptions {
  cause?: unknown;
  /** Machine-readable details (e.g. `{ sandboxId }`, `{ retryAfterS }`). */
  details?: Record<string, unknown>;
}

/**
 * The base error of SPACE. Every error has a stable {@link ErrorCode}, an HTTP status from the
 * registry, a message, an optional fix-it `hint` and a `cause`. `instanceof` works across two
 * copies of the library.
 *
 * @example
 * throw new SpaceError('SANDBOX_NOT_FOUND', `No sandbox ${id}`, { details: { sandboxId: id } });
 * // elsewhere
 * if (err instanceof SpaceError && err.code === 'SANDBOX_NOT_FOUND') ...
 */
export class SpaceError extends Error {
  override readonly name: string = 'SpaceError';
  readonly code: ErrorCode;
  readonly status: number;
  readonly hint: string | undefined;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message?: string, opts: SpaceErrorOptions = {}) {
    const spec: ErrorSpec = ERRORS[code] ?? ERRORS.INTERNAL;
    super(message ?? spec.message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    this.status = spec.status;
    this.hint = spec.hint;
    this.details = opts.details;
    (this as unknown as Record<symbol, boolean>)[BRAND] = true;
  }

  static override [Symbol.hasInstance](v: unknown): boolean {
    return typeof v === 'object' && v !== null && (v as Record<symbol, unknown>)[BRAND] === true;
  }

  /** The JSON body the API answers with. */
  toJSON(): ErrorBody {
    return { error: { code: this.code, message: this.message, ...(this.hint ? { hint: this.hint } : {}), ...(this.details ? { details: this.details } : {}) } };
  }
}

/** JSON body of every error response. */
export interface ErrorBody {
  error: { code: string; message: string; hint?: string; details?: Record<string, unknown> };
}

/** True when `code` is a known error code. */
export function isErrorCode(code: unknown): code is ErrorCode {
  return typeof code === 'string' && Object.prototype.hasOwnProperty.call(ERRORS, code);
}

/**
 * A code received from elsewhere (the agent, the proxy, a response) as an {@link ErrorCode}:
 * itself when the registry has it, else `fallback`.
 * @example new SpaceError(asErrorCode(body.code), body.message)
 */
export function asErrorCode(code: unknown, fallback: ErrorCode = 'INTERNAL'): ErrorCode {
  return isErrorCode(code) ? code : fallback;
}

/** Wraps anything thrown into a {@link SpaceError} (unknown errors become `INTERNAL`). */
export function toSpaceError(err: unknown): SpaceError {
  if (err instanceof SpaceError) return err;
  return new SpaceError('INTERNAL', err instanceof Error ? err.message : String(err), { cause: err });
}
