/**
 * Messages carried in JSON frames. The daemon opens streams with odd ids; requests name an `op`.
 * Everything an agent sends is untrusted: the daemon validates shapes and sizes before use.
 */

/** Version of this protocol; the agent reports it in its hello event. */
export const PROTOCOL_VERSION = 1;

/** Path inside every sandbox where the per-sandbox host socket directory is mounted. */
export const AGENT_SOCKET_DIR = '/run/space';
/** Name of the socket the daemon listens on inside {@link AGENT_SOCKET_DIR}. */
export const AGENT_SOCKET_NAME = 'agent.sock';
/** Path inside every sandbox where the agent's read-only runtime (node + agent.js) is mounted. */
export const AGENT_RUNTIME_DIR = '/.space';

/** Sent by the agent as an Event frame right after it connects. */
export interface HelloEvent {
  event: 'hello';
  version: number;
  sandboxId: string;
  /** Agent process start time (ms since epoch), to tell a reconnect from a restart. */
  startedAt: number;
}

/**
 * Sent by the agent as its last frame when it leaves on purpose (a `quiesce` before a
 * checkpoint) over a transport that it cannot close itself, such as a microVM's virtio-serial
 * port, whose host end belongs to the VMM. The daemon closes the connection when it sees it.
 */
export interface ByeEvent {
  event: 'bye';
}

/**
 * How the daemon opens a connection over a serial transport (microVM): it writes
 * {@link SERIAL_OPEN_MAGIC}, the base64 of a JSON {@link SerialOpen}, and a newline. The agent
 * discards everything before the magic, so nothing left over from an earlier connection is
 * read as a frame, and answers with its hello.
 */
export const SERIAL_OPEN_MAGIC = '\0SPACE-OPEN ';

/** What the daemon tells a microVM's agent when it opens a connection. */
export interface SerialOpen {
  /** The sandbox's first environment; applied once, by an agent that has not had one yet (a fresh boot). */
  boot?: { sandboxId: string; env: Record<string, string> };
  /**
   * The sandbox's network on this incarnation (a restore or fork gets a new link): the agent
   * gives `eth0` this address and a route to `gateway` for `routes`.
   */
  net?: { address: string; prefixLength: number; gateway: string; routes: string[] };
  /** Host wall clock (ms since epoch): a restored guest's clock is as old as its snapshot. */
  now?: number;
  /** Fresh entropy (base64) for the guest kernel's pool: a restored guest would repeat its random numbers. */
  seed?: string;
}

/** Sent by the agent when a process it started has exited (whether or not a stream is attached). */
export interface ProcessExitEvent {
  event: 'process-exit';
  pid: number;
  exitCode: number | null;
  signal: string | null;
}

/**
 * Options of a process start. Exactly one of `argv` or `shell` is given, except for a
 * terminal (`pty`): with neither, it runs the user's login shell from /etc/passwd with `-l`.
 */
export interface ExecRequest {
  op: 'exec';
  argv?: string[];
  /** A shell command line, run with `/bin/sh -c`. */
  shell?: string;
  env?: Record<string, string>;
  cwd?: string;
  /** User name or numeric uid; default is the sandbox's non-root user. */
  user?: string;
  /** Kill the process (SIGKILL) after this many ms. */
  timeoutMs?: number;
  /** Allocate a PTY of this size; output then arrives on the Pty channel. */
  pty?: { cols: number; rows: number };
  /** Keep stdin open for {@link StdinRequest}s; otherwise stdin is /dev/null. */
  stdin?: boolean;
  /** Keep running when the stream is cancelled or the connection drops. */
  background?: boolean;
  tag?: string;
}

/** Reply to {@link ExecRequest}. */
export interface ExecReply {
  pid: number;
}

/** End payload of an exec or attach stream. */
export interface ExecEnd {
  exitCode: number | null;
  signal: string | null;
  /** Set when the process was killed by the agent for exceeding its timeout. */
  timedOut?: boolean;
  /** Bytes of output dropped while no client was attached (background processes). */
  dropped?: number;
}

/** Attach to a running process's output (and PTY). */
export interface AttachRequest {
  op: 'attach';
  pid: number;
}
/** Send data to a process's stdin. Data follows as DATA frames; End closes stdin when `eof`. */
export interface StdinRequest {
  op: 'stdin';
  pid: number;
  data: string; // base64
  eof?: boolean;
}
export interface SignalRequest {
  op: 'signal';
  pid: number;
  signal: string;
}
export interface ResizeRequest {
  op: 'resize';
  pid: number;
  cols: number;
  rows: number;
}
export interface ProcessListRequest {
  op: 'ps';
}
/** One process the agent started. */
export interface ProcessInfo {
  pid: number;
  argv: string[];
  tag?: string;
  cwd: string;
  user: string;
  pty: boolean;
  background: boolean;
  startedAt: number;
  running: boolean;
  exitCode: number | null;
}

/** Kinds of file-system entries. */
export type EntryType = 'file' | 'dir' | 'symlink' | 'other';
/** Stat of one path. */
export interface EntryInfo {
  name: string;
  path: string;
  type: EntryType;
  size: number;
  mode: number;
  mtimeMs: number;
  symlinkTarget?: string;
  /** The owner's user name (the numeric uid when /etc/passwd has none). */
  owner?: string;
  /** The group's name (the numeric gid when /etc/group has none). */
  group?: string;
  /** File metadata (extended attributes `user.space.meta.*`), when the request asked for it. */
  metadata?: Record<string, string>;
}

export interface StatRequest {
  op: 'stat';
  path: string;
  /** Also read the entry's file metadata (one helper process in the sandbox). */
  metadata?: boolean;
}
export interface ListRequest {
  op: 'list';
  path: string;
  /** 1 lists the directory itself; more descends. */
  depth?: number;
  /** Also read each entry's file metadata (one helper process for the whole list). */
  metadata?: boolean;
}
export interface MkdirRequest {
  op: 'mkdir';
  path: string;
  user?: string;
}
export interface RemoveRequest {
  op: 'remove';
  path: string;
  recursive?: boolean;
}
export interface RenameRequest {
  op: 'rename';
  from: string;
  to: string;
}
/** Read a file: reply `{ size }`, then DATA(File) frames under credit, then End. */
export interface ReadFileRequest {
  op: 'read';
  path: string;
}
/**
 * Watch a directory: reply `{}`, then one JSON line per change on DATA(Stdout) —
 * `{"name": <path relative to the directory>, "type": "create"|"write"|"remove"}` — until the
 * daemon cancels the call or the directory goes away.
 */
export interface WatchRequest {
  op: 'watch';
  path: string;
  recursive?: boolean;
}
/** Write a file: the daemon sends DATA(File) frames under the agent's credit, then End `{}`. */
export interface WriteFileRequest {
  op: 'write';
  path: string;
  mode?: number;
  user?: string;
  /** File metadata to set (keys: HTTP tokens; values: printable ASCII); other keys stay. */
  metadata?: Record<string, string>;
}
export interface PingRequest {
  op: 'ping';
}
/** Health of the agent: reply `{ uptimeMs, processes, memory }`. */
export interface HealthRequest {
  op: 'health';
}

/**
 * Before a checkpoint: the agent replies, closes its connection (a unix socket connected to
 * the host cannot be checkpointed) and reconnects only once the daemon's socket exists again.
 */
export interface QuiesceRequest {
  op: 'quiesce';
}
/** Lists processes whose sockets this runtime cannot checkpoint: reply `{ blockers: [...] }`. */
export interface SnapshotCheckRequest {
  op: 'snapshot-check';
}

/**
 * After a restore into a new sandbox (fork, template snapshot, warm pool): the agent's new
 * identity. It reports `sandboxId` in later hellos, sets the hostname, and gives every process
 * it starts from then on `env` (replacing the environment the image was taken with).
 */
export interface IdentityRequest {
  op: 'identity';
  sandboxId: string;
  /** UTS hostname to set. */
  hostname?: string;
  /** The sandbox's environment (template env merged with the create request's env). */
  env?: Record<string, string>;
  /**
   * A CA certificate (PEM) to trust: the tenant's egress CA. The agent writes it to
   * {@link TRUST_FILES} and adds it to the system bundle.
   */
  trust?: string;
  /**
   * The size of the sandbox's disk, bytes. Where the disk is a block device whose file system
   * is smaller (a microVM restored from a template image made with a smaller disk, its device
   * grown by the VMM), the agent grows the file system online to fill it before it answers; a
   * sandbox without such a device (gVisor) ignores it.
   */
  diskBytes?: number;
}

/** Where the agent puts the trusted egress CA inside the sandbox. */
export const TRUST_FILES = {
  /** The egress CA alone (NODE_EXTRA_CA_CERTS). */
  ca: '/etc/space/egress-ca.pem',
  /** The system's roots plus the egress CA (SSL_CERT_FILE, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE): a link to the system bundle, or the CA alone. */
  bundle: '/etc/space/ca-bundle.pem',
  /** The system bundle the CA is appended to, when the image has one. */
  system: '/etc/ssl/certs/ca-certificates.crt',
} as const;

/** Every request the daemon can send. */
export type AgentRequest =
  | ExecRequest
  | AttachRequest
  | StdinRequest
  | SignalRequest
  | ResizeRequest
  | ProcessListRequest
  | StatRequest
  | ListRequest
  | MkdirRequest
  | RemoveRequest
  | RenameRequest
  | ReadFileRequest
  | WriteFileRequest
  | PingRequest
  | HealthRequest
  | QuiesceRequest
  | SnapshotCheckRequest
  | IdentityRequest
  | WatchRequest;

/** Error shape carried in Reply/End frames. `code` is one of the daemon's error codes. */
export interface WireError {
  code: string;
  message: string;
}
