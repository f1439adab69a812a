/**
 * Egress control and credential brokering, the part that needs no network code: egress
 * policies and their matching, tenants' secrets (stored encrypted, values write-only), the
 * placeholders a sandbox gets instead of them, and the audit log. The proxy that applies
 * all of this lives in `@space/egress`; the sandbox network in `@space/sandbox-net`.
 */
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { SpaceError } from '../errors.js';
import type { EgressLogEntry, EgressLogPage, EgressPolicy, HeaderRule, SecretAttachment, SecretInfo, SecretRecord } from '../records.js';

export type { EgressLogEntry, EgressLogPage, EgressPolicy, HeaderRule, SecretAttachment, SecretInfo, SecretRecord } from '../records.js';
import { seal, unseal, type KeyService } from './keys.js';
import type { MetadataStore } from '../ports/metadata-store.js';


/** The policy of a new sandbox: nothing allowed. */
export const DEFAULT_EGRESS_POLICY: EgressPolicy = { domains: [], cidrs: [], ports: [80, 443], passthrough: [] };

/** Limits of an egress policy. */
export const EGRESS_LIMITS = { entries: 256 };

const LABEL = /^(?!-)[a-z0-9-]{1,63}(?<!-)$/;

/** True when `name` is a DNS name (lowercase, at least one dot or `localhost`-like single label). */
function isHostName(name: string): boolean {
  return name.length <= 253 && name.split('.').every((l) => LABEL.test(l));
}

/** Normalises a domain pattern, or throws with `code`. */
export function checkDomainPattern(raw: unknown, code: 'EGRESS_POLICY_INVALID' | 'SECRET_INVALID', field: string): string {
  const d = typeof raw === 'string' ? raw.trim().toLowerCase().replace(/\.$/, '') : '';
  const bare = d.startsWith('*.') ? d.slice(2) : d;
  if (!bare || net.isIP(bare) || !isHostName(bare) || (d.startsWith('*.') && !bare.includes('.'))) {
    throw new SpaceError(code, `${field}: ${JSON.stringify(raw)} is not a host name or wildcard like *.example.org`, { details: { field } });
  }
  return d;
}

/** Parses "a.b.c.d/n" or "v6/n" (a bare address is a /32 or /128). */
export function parseCidr(raw: string): { address: string; prefix: number; family: 'ipv4' | 'ipv6' } | undefined {
  const [addr, bits, extra] = raw.trim().split('/');
  if (extra !== undefined || !addr) return undefined;
  const v = net.isIP(addr);
  if (!v) return undefined;
  const max = v === 4 ? 32 : 128;
  const prefix = bits === undefined ? max : /^\d{1,3}$/.test(bits) ? Number(bits) : NaN;
  if (!(prefix >= 0 && prefix <= max)) return undefined;
  return { address: addr, prefix, family: v === 4 ? 'ipv4' : 'ipv6' };
}

/** Validates and normalises an egress policy (missing fields take their defaults). */
export function checkEgressPolicy(input: unknown): EgressPolicy {
  if (typeof input !== 'object' || input === null || Array.isArray(input)) throw new SpaceError('EGRESS_POLICY_INVALID', 'The egress policy must be an object with domains, cidrs, ports and passthrough');
  const p = input as Partial<Record<keyof EgressPolicy, unknown>>;
  const list = (field: keyof EgressPolicy, fallback: unknown[]): unknown[] => {
    const v = p[field] ?? fallback;
    if (!Array.isArray(v) || v.length > EGRESS_LIMITS.entries) throw new SpaceError('EGRESS_POLICY_INVALID', `${field} must be an array of at most ${EGRESS_LIMITS.entries} entries`, { details: { field } });
    return v;
  };
  for (const k of Object.keys(p)) if (!['domains', 'cidrs', 'ports', 'passthrough', 'publicInternet', 'deny'].includes(k)) throw new SpaceError('EGRESS_POLICY_INVALID', `Unknown egress policy field ${JSON.stringify(k)}`, { details: { field: k } });
  const domains = list('domains', []).map((d, i) => checkDomainPattern(d, 'EGRESS_POLICY_INVALID', `domains[${i}]`));
  const cidrs = list('cidrs', []).map((c, i) => {
    const parsed = typeof c === 'string' ? parseCidr(c) : undefined;
    if (!parsed) throw new SpaceError('EGRESS_POLICY_INVALID', `cidrs[${i}]: ${JSON.stringify(c)} is not an address range like 203.0.113.0/24`, { details: { field: `cidrs[${i}]` } });
    return `${parsed.address}/${parsed.prefix}`;
  });
  const ports = list('ports', DEFAULT_EGRESS_POLICY.ports).map((n, i) => {
    if (!Number.isInteger(n) || (n as number) < 1 || (n as number) > 65535) throw new SpaceError('EGRESS_POLICY_INVALID', `ports[${i}]: ${JSON.stringify(n)} is not a port from 1 to 65535`, { details: { field: `ports[${i}]` } });
    return n as number;
  });
  const passthrough = list('passthrough', []).map((hp, i) => {
    const m = typeof hp === 'string' ? /^(.+):(\d{1,5})$/.exec(hp.trim().toLowerCase()) : null;
    const host = m?.[1]?.replace(/^\[(.*)\]$/, '$1');
    const port = Number(m?.[2]);
    if (!host || !(port >= 1 && port <= 65535) || (!net.isIP(host) && !isHostName(host))) throw new SpaceError('EGRESS_POLICY_INVALID', `passthrough[${i}]: ${JSON.stringify(hp)} is not host:port`, { details: { field: `passthrough[${i}]` } });
    return `${net.isIP(host) === 6 ? `[${host}]` : host}:${port}`;
  });
  if (p.publicInternet !== undefined && typeof p.publicInternet !== 'boolean') throw new SpaceError('EGRESS_POLICY_INVALID', 'publicInternet must be true or false', { details: { field: 'publicInternet' } });
  let deny: EgressPolicy['deny'];
  if (p.deny !== undefined) {
    const d = p.deny as { domains?: unknown; cidrs?: unknown };
    if (typeof d !== 'object' || d === null || Array.isArray(d) || Object.keys(d).some((k) => k !== 'domains' && k !== 'cidrs')) throw new SpaceError('EGRESS_POLICY_INVALID', 'deny must be an object with domains and cidrs', { details: { field: 'deny' } });
    const checked = checkEgressPolicy({ domains: d.domains ?? [], cidrs: d.cidrs ?? [] });
    if (checked.domains.length || checked.cidrs.length) deny = { domains: checked.domains, cidrs: checked.cidrs };
  }
  return { domains: [...new Set(domains)], cidrs: [...new Set(cidrs)], ports: [...new Set(ports)].sort((a, b) => a - b), passthrough: [...new Set(passthrough)], ...(p.publicInternet ? { publicInternet: true } : {}), ...(deny ? { deny } : {}) };
}

/** True when host name `host` matches pattern `p` (exact, or `*.` for any subdomain). */
export function hostMatches(p: string, host: string): boolean {
  const h = host.toLowerCase().replace(/\.$/, '');
  if (p.startsWith('*.')) return h.endsWith(p.slice(1)) && h.length > p.length - 1;
  return h === p;
}

/** A block list of a policy's ranges. */
export function cidrList(cidrs: string[]): net.BlockList {
  const bl = new net.BlockList();
  for (const c of cidrs) {
    const p = parseCidr(c);
    if (p) bl.addSubnet(p.address, p.prefix, p.family);
  }
  return bl;
}




/** What `space secret set` sends. */
export interface SecretSpec {
  name: string;
  value: string;
  hosts: string[];
  header?: string;
  format?: string;
}




const SECRET_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,127}$/;
const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,128}$/;
/** Headers a secret may not set: they frame the request or route it. */
const RESERVED_HEADERS = new Set(['host', 'content-length', 'transfer-encoding', 'connection', 'upgrade', 'te', 'trailer', 'keep-alive', 'proxy-connection', 'proxy-authorization']);
/** Env names a placeholder may not take over. */
const RESERVED_ENV = /^(PATH|HOME|USER|LOGNAME|SHELL|LANG|TERM|HOSTNAME|LD_.*|SPACE_.*|(HTTPS?|NO|ALL)_PROXY|(https?|no|all)_proxy|SSL_CERT_FILE|SSL_CERT_DIR|NODE_EXTRA_CA_CERTS|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|NODE_USE_ENV_PROXY)$/;

/** Largest secret value, bytes. */
export const MAX_SECRET_BYTES = 16 * 1024;

function aad(tenantId: string, name: string): Buffer {
  return Buffer.from(`space-secret\0${tenantId}\0${name}`);
}

/** Validates a secret name (also the env var the placeholder goes into). */
export function checkSecretName(name: unknown): string {
  if (typeof name !== 'string' || !SECRET_NAME.test(name) || RESERVED_ENV.test(name)) {
    throw new SpaceError('SECRET_INVALID', `Invalid secret name ${JSON.stringify(name)}: use an environment variable name like OPENAI_API_KEY (letters, digits, _; not PATH, HOME, *_PROXY or SPACE_*)`, { details: { field: 'name' } });
  }
  return name;
}

/** Validates header rules (hosts, header name, value) without storing anything. */
export function checkHeaderRules(rules: unknown): HeaderRule[] {
  if (!Array.isArray(rules) || rules.length > 32) throw new SpaceError('SECRET_INVALID', 'headers must be a list of at most 32 rules { hosts, header, value }', { details: { field: 'headers' } });
  return rules.map((r: Partial<HeaderRule>, i) => {
    if (typeof r !== 'object' || r === null || !Array.isArray(r.hosts) || r.hosts.length === 0 || r.hosts.length > 32) throw new SpaceError('SECRET_INVALID', `headers[${i}].hosts must list 1 to 32 hosts`, { details: { field: `headers[${i}].hosts` } });
    const hosts = [...new Set(r.hosts.map((h, j) => checkDomainPattern(h, 'SECRET_INVALID', `headers[${i}].hosts[${j}]`)))];
    if (typeof r.header !== 'string' || !HEADER_NAME.test(r.header) || RESERVED_HEADERS.has(r.header.toLowerCase())) throw new SpaceError('SECRET_INVALID', `headers[${i}].header: ${JSON.stringify(r.header)} is not a request header the proxy may set`, { details: { field: `headers[${i}].header` } });
    if (typeof r.value !== 'string' || !r.value || Buffer.byteLength(r.value) > MAX_SECRET_BYTES || /[\r\n\0]/.test(r.value)) throw new SpaceError('SECRET_INVALID', `headers[${i}].value must be a non-empty string of at most ${MAX_SECRET_BYTES} bytes without CR, LF or NUL`, { details: { field: `headers[${i}].value` } });
    return { hosts, header: r.header, value: r.value };
  });
}

/**
 * Tenants' secrets and the audit log of their sandboxes' egress.
 *
 * @example
 * const secrets = new SecretService({ store, keys });
 * await secrets.set('tenant-a', { name: 'GITHUB_TOKEN', value: 'ghp_...', hosts: ['api.github.com'], header: 'Authorization', format: 'Bearer {value}' });
 * const attached = await secrets.attach('tenant-a', ['GITHUB_TOKEN'], []);
 * // attached[0].placeholder goes into the sandbox; the proxy swaps it for the value.
 */
export class SecretService {
  constructor(private readonly opts: { store: MetadataStore; keys: KeyService }) {}

  /** Creates or replaces a secret; the new value is used from the next request on. */
  async set(tenantId: string, spec: SecretSpec, ownerSandboxId?: string): Promise<SecretInfo> {
    if (typeof spec !== 'object' || spec === null) throw new SpaceError('SECRET_INVALID', 'Send { name, value, hosts }');
    const name = checkSecretName(spec.name);
    if (typeof spec.value !== 'string' || !spec.value || Buffer.byteLength(spec.value) > MAX_SECRET_BYTES || /[\r\n\0]/.test(spec.value)) {
      throw new SpaceError('SECRET_INVALID', `The value must be a non-empty string of at most ${MAX_SECRET_BYTES} bytes without CR, LF or NUL (it goes into HTTP headers)`, { details: { field: 'value' } });
    }
    if (!Array.isArray(spec.hosts) || spec.hosts.length === 0 || spec.hosts.length > 32) throw new SpaceError('SECRET_INVALID', 'hosts must list 1 to 32 hosts the secret may be sent to, e.g. ["api.example.com"]', { details: { field: 'hosts' } });
    const hosts = [...new Set(spec.hosts.map((h, i) => checkDomainPattern(h, 'SECRET_INVALID', `hosts[${i}]`)))];
    if (spec.header !== undefined && (typeof spec.header !== 'string' || !HEADER_NAME.test(spec.header) || RESERVED_HEADERS.has(spec.header.toLowerCase()))) {
      throw new SpaceError('SECRET_INVALID', `Invalid header ${JSON.stringify(spec.header)}: give a request header name such as Authorization or X-Api-Key`, { details: { field: 'header' } });
    }
    if (spec.format !== undefined && (typeof spec.format !== 'string' || !spec.format.includes('{value}') || spec.format.length > 256 || /[\r\n\0]/.test(spec.format))) {
      throw new SpaceError('SECRET_INVALID', 'format must contain {value}, e.g. "Bearer {value}"', { details: { field: 'format' } });
    }
    if (spec.format !== undefined && spec.header === undefined) throw new SpaceError('SECRET_INVALID', 'format needs header (the header it formats)', { details: { field: 'format' } });
    const { dataKey, record } = await this.opts.keys.newDataKey(tenantId, `secret/${tenantId}/${name}`);
    const now = new Date().toISOString();
    const prev = await this.opts.store.getSecret(tenantId, name);
    const rec: SecretRecord = {
      tenantId,
      name,
      hosts,
      ...(spec.header ? { header: spec.header } : {}),
      ...(spec.header ? { format: spec.format ?? '{value}' } : {}),
      ...(ownerSandboxId ? { sandboxId: ownerSandboxId } : {}),
      createdAt: prev?.createdAt ?? now,
      updatedAt: now,
      sealed: seal(dataKey, Buffer.from(spec.value, 'utf8'), aad(tenantId, name)),
    };
    // The data key first: a crash between the two leaves an unused key, never an unreadable secret.
    await this.opts.store.putDataKey(record);
    await this.opts.store.putSecret(rec);
    return info(rec);
  }

  /** A tenant's secrets, without values. */
  async list(tenantId: string): Promise<SecretInfo[]> {
    return (await this.opts.store.listSecrets(tenantId)).map(info);
  }

  /** One secret, without its value. */
  async get(tenantId: string, name: string): Promise<SecretInfo> {
    const r = await this.opts.store.getSecret(tenantId, name);
    if (!r) throw new SpaceError('SECRET_NOT_FOUND', `No secret ${JSON.stringify(name)} for this tenant`, { details: { name } });
    return info(r);
  }

  /** Forgets a secret: sandboxes that have it attached keep a placeholder nothing replaces. */
  async remove(tenantId: string, name: string): Promise<void> {
    await this.get(tenantId, name);
    await this.opts.store.deleteSecret(tenantId, name);
    await this.opts.store.deleteDataKey(`secret/${tenantId}/${name}`);
  }

  /**
   * The secret with its value, for the proxy at the point of use (`undefined` when it no longer
   * exists). Throws `KEY_REVOKED` / `KEY_DESTROYED` when the tenant's key forbids reading it.
   */
  async reveal(tenantId: string, name: string): Promise<(SecretInfo & { value: string }) | undefined> {
    const r = await this.opts.store.getSecret(tenantId, name);
    if (!r) return undefined;
    const d = await this.opts.store.getDataKey(`secret/${tenantId}/${name}`);
    if (!d) throw new SpaceError('INTERNAL', `The data key of secret ${name} is missing`);
    const value = unseal(await this.opts.keys.unwrapRecord(d), r.sealed, aad(tenantId, name)).toString('utf8');
    return { ...info(r), value };
  }

  /**
   * The attachments of a sandbox after attaching `names`: existing ones keep their
   * placeholder, new ones get a fresh random one. Every name must be a secret of the tenant.
   */
  async attach(tenantId: string, names: unknown, current: SecretAttachment[]): Promise<SecretAttachment[]> {
    if (!Array.isArray(names) || names.length > 64) throw new SpaceError('SECRET_INVALID', 'secrets must be an array of at most 64 secret names', { details: { field: 'secrets' } });
    const out = [...current];
    for (const n of names) {
      const name = checkSecretName(n);
      await this.get(tenantId, name);
      if (!out.some((a) => a.name === name)) out.push({ name, placeholder: newPlaceholder() });
    }
    return out;
  }

  /**
   * Stores header rules as secrets owned by `sandboxId` (named `RULE_<sandbox>_<n>`) and
   * returns their attachments. Replaces the sandbox's earlier rules.
   */
  async setRules(tenantId: string, sandboxId: string, rules: HeaderRule[]): Promise<SecretAttachment[]> {
    if (!Array.isArray(rules) || rules.length > 32) throw new SpaceError('SECRET_INVALID', 'At most 32 header rules per sandbox', { details: { field: 'rules' } });
    await this.removeOwned(tenantId, sandboxId);
    const out: SecretAttachment[] = [];
    for (const [i, r] of rules.entries()) {
      const name = `RULE_${sandboxId}_${i}`;
      await this.set(tenantId, { name, value: r.value, hosts: r.hosts, header: r.header }, sandboxId);
      out.push({ name, placeholder: newPlaceholder(), rule: true });
    }
    return out;
  }

  /** Deletes the secrets `sandboxId` owns (its header rules). */
  async removeOwned(tenantId: string, sandboxId: string): Promise<void> {
    for (const r of await this.opts.store.listSecrets(tenantId)) if (r.sandboxId === sandboxId) await this.remove(tenantId, r.name);
  }

  /** Copies `from`'s header rules to a copy of it (a fork), as rules of its own. */
  async copyRules(tenantId: string, from: SecretAttachment[], toSandboxId: string): Promise<SecretAttachment[]> {
    const rules: HeaderRule[] = [];
    for (const a of from.filter((x) => x.rule)) {
      const s = await this.reveal(tenantId, a.name);
      if (s?.header) rules.push({ hosts: s.hosts, header: s.header, value: s.value });
    }
    return [...from.filter((x) => !x.rule), ...(rules.length ? await this.setRules(tenantId, toSandboxId, rules) : [])];
  }

  /** Records one egress request. */
  async audit(e: EgressLogEntry): Promise<void> {
    await this.opts.store.insertEgressLog(e);
    for (const l of this.auditListeners) {
      try {
        l(e);
      } catch {
        // a listener's failure is its own (a closed event stream)
      }
    }
  }

  private readonly auditListeners = new Set<(e: EgressLogEntry) => void>();

  /**
   * Calls `listener` with each egress request this node records from now on (every tenant's:
   * filter by `tenantId`). Returns the function that stops it.
   *
   * @example
   * const stop = secrets.onAudit((e) => e.decision === 'denied' && console.log(e.host));
   */
  onAudit(listener: (e: EgressLogEntry) => void): () => void {
    this.auditListeners.add(listener);
    return () => this.auditListeners.delete(listener);
  }

  /** A sandbox's egress log, newest first. */
  async log(sandboxId: string, limit: number, cursor?: string): Promise<EgressLogPage> {
    return this.opts.store.listEgressLog(sandboxId, limit, cursor);
  }
}

/** A placeholder: random, recognisable, and shaped like an API key. */
export function newPlaceholder(): string {
  return `space_ph_${randomBytes(16).toString('hex')}`;
}

function info(r: SecretRecord): SecretInfo {
  return { name: r.name, hosts: r.hosts, ...(r.header ? { header: r.header, format: r.format ?? '{value}' } : {}), ...(r.sandboxId ? { sandboxId: r.sandboxId } : {}), createdAt: r.createdAt, updatedAt: r.updatedAt };
}
