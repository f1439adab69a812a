/**
 * Egress policies, secrets and the egress audit log as the API takes and returns them.
 */

/**
 * Where a sandbox may connect through its egress proxy. Everything else is denied.
 *
 * @example
 * const policy: EgressPolicy = { domains: ['api.github.com', '*.pypi.org'], cidrs: [], ports: [443], passthrough: ['db.example.com:5432'] };
 */
export interface EgressPolicy {
  /** Host names ("api.example.com") and wildcards ("*.example.org": any subdomain, not the apex). */
  domains: string[];
  /**
   * Address ranges ("203.0.113.0/24", "2001:db8::/32") reachable by literal IP, and the ranges a
   * private address may be reached in: a name that resolves to a loopback, private, link-local
   * or shared address is refused unless a range here contains that address.
   */
  cidrs: string[];
  /** Destination ports. @default [80, 443] */
  ports: number[];
  /** `host:port` pairs tunnelled as raw TCP (CONNECT only), without TLS interception or secrets. */
  passthrough: string[];
  /**
   * Any public destination on {@link ports}, by name or literal address, as E2B's
   * `allowInternetAccess: true` means. Never private, loopback, link-local or reserved
   * addresses (unless a range in {@link cidrs} allows them), the metadata service, the sandbox
   * network or the daemon; every request is audited, and secrets are still injected only for
   * their own hosts. Absent: false.
   */
  publicInternet?: boolean;
  /**
   * With {@link publicInternet}: host names (and `*.` wildcards) and address ranges refused
   * although public, checked after the allow lists (an allowed destination stays allowed, as
   * in E2B's `denyOut`). Absent: none.
   */
  deny?: { domains?: string[]; cidrs?: string[] };
}

/** A secret as listed: everything but its value. */
export interface SecretInfo {
  name: string;
  /** Hosts (and `*.` wildcards) the value may be sent to. */
  hosts: string[];
  /** When set, the proxy sets this request header on requests to the hosts... */
  header?: string;
  /** ...to this text, `{value}` standing for the value. @default "{value}" */
  format?: string;
  /** Set for a header rule of one sandbox (see {@link HeaderRule}): deleted when that sandbox ends. */
  sandboxId?: string;
  createdAt: string;
  updatedAt: string;
}

/**
 * A request header the egress proxy sets on a sandbox's requests to some hosts (E2B's network
 * `rules` with a header `transform`). The value is stored sealed as a secret of the sandbox's
 * own and never enters the sandbox; unlike a secret, a rule grants no access to its hosts.
 */
export interface HeaderRule {
  /** Hosts (and `*.` wildcards) whose requests get the header. */
  hosts: string[];
  header: string;
  value: string;
}

/** A secret attached to a sandbox: the sandbox holds only the placeholder. */
export interface SecretAttachment {
  name: string;
  /** Random per sandbox; the env var `name` holds it inside the sandbox. */
  placeholder: string;
  /** A header rule ({@link HeaderRule}): no env var, and its hosts are not opened by it. */
  rule?: true;
}

/** One request through the egress proxy (allowed or denied). */
export interface EgressLogEntry {
  sandboxId: string;
  tenantId: string;
  at: string;
  /** HTTP method, `CONNECT` for tunnels, `TCP` for passthrough. */
  method: string;
  scheme: 'http' | 'https' | 'tcp';
  host: string;
  port: number;
  path?: string;
  /** HTTP status returned to the sandbox (the upstream's, or the proxy's own refusal). */
  status?: number;
  /** Bytes sent upstream / received from upstream. */
  bytesOut: number;
  bytesIn: number;
  /** Names of the secrets injected into the request. */
  secrets: string[];
  decision: 'allowed' | 'denied';
  /** Why it was denied (or why it failed). */
  reason?: string;
  durationMs: number;
}

/** A page of the audit log, newest first. */
export interface EgressLogPage {
  items: (EgressLogEntry & { seq: number })[];
  nextCursor?: string;
}

/** One request through the ingress to a sandbox's port (answered, or refused after its port was found). */
export interface IngressLogEntry {
  at: string;
  tenantId: string;
  sandboxId: string;
  port: number;
  method: string;
  /** The request target as the client sent it (at most 2,048 characters). */
  path: string;
  /** What the client got: the sandbox's status, or the ingress's own refusal (401, 409, 502, 504). */
  status: number;
  /** Bytes from the client / to the client, headers included. */
  bytesIn: number;
  bytesOut: number;
  durationMs: number;
  /** The client's address as the ingress saw it. */
  client: string;
  /** How the request was let in: a public port, the port's token, a pass (signed link cookie), or not at all. */
  access: 'public' | 'token' | 'pass' | 'refused';
  websocket: boolean;
}

/** A page of the ingress log, newest first. */
export interface IngressLogPage {
  items: (IngressLogEntry & { seq: number })[];
  nextCursor?: string;
}

/**
 * An exposed port of a sandbox, as the API returns it: reachable through the ingress at
 * {@link url} (with the access token in `X-Space-Access-Token`, unless public) or through
 * {@link signedUrl} in a browser (it sets a cookie for that host, then redirects to `/`).
 *
 * @example
 * const p: ExposedPort = { port: 8000, public: false, url: 'http://8000-sb….localhost:7072/', signedUrl: 'http://8000-sb….localhost:7072/.space/auth?pass=…&next=/', signedUrlExpiresAt: '…', createdAt: '…' };
 */
export interface ExposedPort {
  /** The port; 0 for every port (a sandbox made through the E2B-compatible API, where each port has a host). */
  port: number;
  public: boolean;
  /** The port's origin; for port 0 a template, `{port}` standing for the port. */
  url: string;
  /** Opens the port in a browser (absent for port 0). */
  signedUrl?: string;
  signedUrlExpiresAt?: string;
  createdAt: string;
  /** When the exposure ends; absent: while the sandbox lives. */
  expiresAt?: string;
  /** The access token: only in the answer to the expose request, never again. */
  token?: string;
}
