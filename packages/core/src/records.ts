/**
 * Record types the store keeps that never travel on the wire (the ones that do are in
 * @space/api, re-exported here). At the bottom of core: no import of core's.
 */
import type { NodeInfo, SecretInfo } from '@space/api';

export type { EgressLogEntry, EgressLogPage, EgressPolicy, HeaderRule, IngressLogEntry, IngressLogPage, SecretAttachment, SecretInfo } from '@space/api';




/** A stored secret: its description and its value sealed under a data key of the tenant. */
export interface SecretRecord extends SecretInfo {
  tenantId: string;
  /** iv (12) | tag (16) | ciphertext. */
  sealed: Buffer;
}




/** A tenant's key: a provider and a reference, never the key itself. */
export interface TenantKey {
  id: string;
  tenantId: string;
  provider: string;
  ref: string;
  /**
   * `active`: wraps new data keys (one per tenant). `rotating`: being replaced, its data keys
   * are being re-wrapped. `retired`: wraps nothing any more. `revoked`: nothing it wraps can be
   * read. `destroyed`: forgotten; what it wrapped is unreadable for good.
   */
  state: 'active' | 'rotating' | 'retired' | 'revoked' | 'destroyed';
  /** The state before a revocation (what `enable` goes back to). */
  revokedFrom?: 'active' | 'rotating' | 'retired';
  description: string;
  createdAt: string;
}

/** A data key, wrapped, and which tenant key wraps it. */
export interface DataKeyRecord {
  /** The object it encrypts (a blob key). */
  objectKey: string;
  tenantId: string;
  keyId: string;
  wrapped: Buffer;
}

/**
 * A port of a sandbox exposed through the ingress. Only the access token's hash is kept; the
 * token is shown once, when the port is exposed.
 */
export interface PortExposure {
  sandboxId: string;
  port: number;
  /** Reachable by anyone who has the URL. */
  public: boolean;
  /** SHA-256 (hex) of the access token: what the ingress compares (and signs passes over). */
  tokenHash: string;
  createdAt: string;
  /** When the exposure ends (ISO 8601); absent: while the sandbox lives. */
  expiresAt?: string;
  /**
   * The Host header requests reach the sandbox with, `${PORT}` standing for the port (E2B's
   * `maskRequestHost`); absent: the client's own.
   */
  hostHeader?: string;
}

/**
 * A named volume as stored. `creating` and `deleting` are intents: a restart finishes or undoes
 * them, and listings show only `ready` volumes. Its key is the data key `volume/<id>`.
 */
export interface VolumeRecord {
  id: string;
  tenantId: string;
  name: string;
  sizeMb: number;
  createdAt: string;
  state: 'creating' | 'ready' | 'deleting';
  /** The node whose disk keeps it, when nodes share the store (absent on a node of its own). */
  node?: string;
}

/** A volume's point-in-time copy as stored; `creating` until the copy is complete. */
export interface VolumeSnapshotRecord {
  id: string;
  volumeId: string;
  createdAt: string;
  state: 'creating' | 'ready';
}

/**
 * A node as stored: what it registered and its last heartbeat; its `state` and `sandboxes`
 * are derived when listed (`NodeInfo`), the rest is the same.
 */
export type NodeRecord = Omit<NodeInfo, 'state' | 'sandboxes' | 'memoryReservedMb'> & {
  /** Set when it stops gracefully. */
  stoppedAt?: string;
};
