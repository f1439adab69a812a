/**
 * The metadata-store interface: sandboxes, tenants' API keys and keys' records, secrets, logs,
 * volumes, nodes. Implemented by `@space/store-sqlite` (the embedded default) and
 * `@space/store-postgres`, both on `@space/store-sql`'s queries (test/store-suite.mjs runs on each).
 */
import type { DataKeyRecord, NodeRecord, EgressLogEntry, EgressLogPage, IngressLogEntry, IngressLogPage, PortExposure, SecretRecord, TenantKey, VolumeRecord, VolumeSnapshotRecord } from '../records.js';
import type { IntentStore } from './intent-journal.js';
import type { BlobCollectionLock } from './blob-store.js';
import { SpaceError } from '../errors.js';
import type { Sandbox, SandboxEvent, SandboxState, Snapshot, Template } from '../model.js';

/** A stored API key (never the key itself, only its hash). */
export interface ApiKeyRecord {
  id: string;
  tenantId: string;
  name: string;
  /** SHA-256 of the key, hex. */
  hash: string;
  /** First characters of the key, to recognise it in listings. */
  prefix: string;
  admin: boolean;
  createdAt: string;
  revokedAt?: string;
}

/** A tenant's egress CA as stored (the key sealed like a secret, under data key `ca/<tenant>`). */
export interface TenantCaRecord {
  tenantId: string;
  certPem: string;
  /** iv (12) | tag (16) | PKCS#8 DER ciphertext. */
  sealedKey: Buffer;
  createdAt: string;
}

/** What a conditional sandbox update requires of the record (see MetadataStore.updateSandbox). */
export interface SandboxExpectation {
  /** The node it must be on (`null`: none recorded). */
  node?: string | null;
  state?: SandboxState;
}

/**
 * Throws unless `sb` meets `expect` (see MetadataStore.updateSandbox): the check every store
 * makes inside its update's transaction.
 */
export function checkExpectation(sb: Sandbox, expect: SandboxExpectation | undefined): void {
  if (!expect) return;
  if (expect.node !== undefined && (sb.node ?? null) !== expect.node) {
    throw new SpaceError('SANDBOX_ON_OTHER_NODE', `Sandbox ${sb.id} is now on node ${sb.node ?? '(none recorded)'}, not ${expect.node ?? '(none)'}`, { details: { sandboxId: sb.id, node: sb.node } });
  }
  if (expect.state !== undefined && sb.state !== expect.state) {
    throw new SpaceError('SANDBOX_INVALID_STATE', `Sandbox ${sb.id} is ${sb.state}, no longer ${expect.state}`, { details: { sandboxId: sb.id, state: sb.state } });
  }
}

/** Filter and page of a sandbox listing. */
export interface SandboxQuery {
  tenantId: string;
  states?: SandboxState[];
  /** Every pair must match the sandbox's metadata. */
  metadata?: Record<string, string>;
  /** Only sandboxes of this template. */
  template?: string;
  /** Only sandboxes created at or after this time (ISO 8601). */
  createdAfter?: string;
  /** Only sandboxes created at or before this time (ISO 8601). */
  createdBefore?: string;
  /** By creation: newest first (`desc`, the default) or oldest first. */
  order?: 'asc' | 'desc';
  limit: number;
  /** Opaque cursor from a previous page (of the same query and order). */
  cursor?: string;
}

/** One page of sandboxes. */
export interface SandboxPage {
  items: Sandbox[];
  nextCursor?: string;
}

/**
 * Persistent metadata. Every method is atomic; implementations must be safe to call from one
 * process concurrently.
 */
export interface MetadataStore extends IntentStore {
  insertSandbox(sb: Sandbox): Promise<void>;
  /**
   * Writes the changed fields; returns the updated sandbox. With `expect`, only if the record
   * still says so (in the same transaction): another node (`SANDBOX_ON_OTHER_NODE`) or another
   * state (`SANDBOX_INVALID_STATE`) changes nothing. A node's writes carry its name, so that one
   * that lost a sandbox to another node cannot write over the new owner's (fencing).
   */
  updateSandbox(id: string, patch: Partial<Omit<Sandbox, 'id' | 'tenantId'>>, expect?: SandboxExpectation): Promise<Sandbox>;
  getSandbox(id: string): Promise<Sandbox | undefined>;
  listSandboxes(q: SandboxQuery): Promise<SandboxPage>;
  /**
   * Every sandbox in one of these states, across tenants (for reconciliation); with `node`,
   * only that node's (an indexed query: what a cluster node asks about its own).
   *
   * @example const mine = await store.sandboxesInStates(['running'], { node: 'n1' });
   */
  sandboxesInStates(states: SandboxState[], opts?: { node?: string }): Promise<Sandbox[]>;
  /**
   * How many sandboxes in these states each node owns, and the sum of their memory limits (nodes
   * with none are absent): placement's one grouped query, whatever the number of sandboxes.
   *
   * @example const load = await store.sandboxLoadByNode(['starting', 'running', 'paused']); // { n1: { sandboxes: 12, memoryMb: 6144 }, n2: { sandboxes: 3, memoryMb: 768 } }
   */
  sandboxLoadByNode(states: SandboxState[]): Promise<Record<string, { sandboxes: number; memoryMb: number }>>;

  insertSnapshot(s: Snapshot): Promise<void>;
  getSnapshot(id: string): Promise<Snapshot | undefined>;
  /** A sandbox's snapshots, oldest first. */
  listSnapshots(sandboxId: string): Promise<Snapshot[]>;
  /**
   * Every snapshot of the deployment, in one read: what blob collection must keep.
   *
   * @example const keep = (await store.listAllSnapshots()).map((sn) => sn.blobKey);
   */
  listAllSnapshots(): Promise<Snapshot[]>;
  deleteSnapshot(id: string): Promise<void>;

  /** Inserts or replaces the exposure (sandboxId, port). */
  putExposure(e: PortExposure): Promise<void>;
  getExposure(sandboxId: string, port: number): Promise<PortExposure | undefined>;
  /** A sandbox's exposed ports, by port. */
  listExposures(sandboxId: string): Promise<PortExposure[]>;
  /** Removes one exposure, or every exposure of the sandbox when `port` is absent. */
  deleteExposures(sandboxId: string, port?: number): Promise<void>;

  insertEvent(e: SandboxEvent): Promise<void>;
  /** A sandbox's events, oldest first (the newest `limit`). */
  listEvents(sandboxId: string, limit: number): Promise<SandboxEvent[]>;

  /** Inserts or replaces the template (tenantId, name). */
  putTemplate(t: Template): Promise<void>;
  getTemplate(tenantId: string, name: string): Promise<Template | undefined>;
  /** Every template (all tenants and built-ins), by name. */
  listTemplates(): Promise<Template[]>;
  deleteTemplate(tenantId: string, name: string): Promise<void>;

  /** Inserts or replaces a tenant key record. */
  putTenantKey(k: TenantKey): Promise<void>;
  /** In one transaction: `fromId` (if any) becomes `rotating`, `next` is inserted as active. */
  switchTenantKey(next: TenantKey, fromId: string | undefined): Promise<void>;
  getTenantKey(id: string): Promise<TenantKey | undefined>;
  /** A tenant's keys (every tenant's when omitted), oldest first. */
  listTenantKeys(tenantId?: string): Promise<TenantKey[]>;
  /** Inserts or replaces the data key of an object. */
  putDataKey(d: DataKeyRecord): Promise<void>;
  getDataKey(objectKey: string): Promise<DataKeyRecord | undefined>;
  /** Up to `limit` data keys of a tenant (only those not wrapped by `exceptKeyId`, if given). */
  listDataKeys(tenantId: string, limit: number, exceptKeyId?: string): Promise<DataKeyRecord[]>;
  deleteDataKey(objectKey: string): Promise<void>;
  /** How many data keys of a tenant its key `keyId` wraps. */
  countDataKeys(tenantId: string, keyId: string): Promise<number>;

  /** Inserts or replaces a secret (tenantId, name). */
  putSecret(s: SecretRecord): Promise<void>;
  getSecret(tenantId: string, name: string): Promise<SecretRecord | undefined>;
  /** A tenant's secrets by name. */
  listSecrets(tenantId: string): Promise<SecretRecord[]>;
  deleteSecret(tenantId: string, name: string): Promise<void>;

  /** Appends to the egress audit log. */
  insertEgressLog(e: EgressLogEntry): Promise<void>;
  /** A sandbox's egress log, newest first; `cursor` from a previous page. */
  listEgressLog(sandboxId: string, limit: number, cursor?: string): Promise<EgressLogPage>;
  /** Deletes log entries older than `before` (ISO time); returns how many. */
  pruneEgressLog(before: string): Promise<number>;

  /** Appends to the ingress audit log. */
  insertIngressLog(e: IngressLogEntry): Promise<void>;
  /** A sandbox's ingress log, newest first; `cursor` from a previous page. */
  listIngressLog(sandboxId: string, limit: number, cursor?: string): Promise<IngressLogPage>;
  /** Deletes ingress log entries older than `before` (ISO time); returns how many. */
  pruneIngressLog(before: string): Promise<number>;

  /** The tenant's egress CA: its certificate and its private key sealed under a tenant data key. */
  getTenantCa(tenantId: string): Promise<TenantCaRecord | undefined>;
  /** Stores the CA unless the tenant has one already; returns the one that is stored. */
  putTenantCaIfAbsent(ca: TenantCaRecord): Promise<TenantCaRecord>;

  /** Inserts or replaces a node's record (its registration and every heartbeat). */
  putNode(n: NodeRecord): Promise<void>;
  /**
   * Every node that ever registered, by name; with `heartbeatBefore` (an ISO time), only those
   * whose last heartbeat is older — what a node's duties look at after each heartbeat, so that
   * their cost does not grow with the number of nodes.
   *
   * @example const silent = await store.listNodes({ heartbeatBefore: new Date(Date.now() - 30_000).toISOString() });
   */
  listNodes(opts?: { heartbeatBefore?: string }): Promise<NodeRecord[]>;

  /** A setting of the deployment itself (e.g. `deployment-id`), or undefined. */
  getMeta(key: string): Promise<string | undefined>;
  /** Stores `value` under `key` unless a value is there; returns the one that is stored. */
  putMetaIfAbsent(key: string, value: string): Promise<string>;
  /**
   * The lock that keeps every daemon's blob writes and collections apart, for a store several
   * daemons share (PostgreSQL); absent where one daemon has the store to itself (SQLite).
   *
   * @example const lock = store.blobCollectionLock?.();
   */
  blobCollectionLock?(): BlobCollectionLock;

  /** Inserts a volume; `VOLUME_EXISTS` when the tenant has one of that name (in any state). */
  insertVolume(v: VolumeRecord): Promise<void>;
  /** Writes the changed fields; returns the updated volume. */
  updateVolume(id: string, patch: Partial<Pick<VolumeRecord, 'state'>>): Promise<VolumeRecord>;
  getVolume(tenantId: string, name: string): Promise<VolumeRecord | undefined>;
  getVolumeById(id: string): Promise<VolumeRecord | undefined>;
  /** A tenant's volumes (every tenant's when omitted), by name, in every state. */
  listVolumes(tenantId?: string): Promise<VolumeRecord[]>;
  deleteVolume(id: string): Promise<void>;
  insertVolumeSnapshot(s: VolumeSnapshotRecord): Promise<void>;
  updateVolumeSnapshot(id: string, patch: Partial<Pick<VolumeSnapshotRecord, 'state'>>): Promise<VolumeSnapshotRecord>;
  getVolumeSnapshot(id: string): Promise<VolumeSnapshotRecord | undefined>;
  /** A volume's snapshots (every volume's when omitted), oldest first. */
  listVolumeSnapshots(volumeId?: string): Promise<VolumeSnapshotRecord[]>;
  deleteVolumeSnapshot(id: string): Promise<void>;

  insertApiKey(k: ApiKeyRecord): Promise<void>;
  findApiKeyByHash(hash: string): Promise<ApiKeyRecord | undefined>;
  listApiKeys(tenantId?: string): Promise<ApiKeyRecord[]>;
  revokeApiKey(id: string, at: string): Promise<ApiKeyRecord | undefined>;
  countApiKeys(): Promise<number>;

  close(): Promise<void>;
}
