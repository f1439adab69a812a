/**
 * API keys: random bearer tokens that belong to a tenant. Only their SHA-256 is stored; the
 * key itself is shown once, at creation.
 */
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { SpaceError } from '../errors.js';
import { randomString } from '../model.js';
import type { ApiKeyRecord, MetadataStore } from '../ports/metadata-store.js';

/** Who is calling. */
export interface Principal {
  tenantId: string;
  keyId: string;
  admin: boolean;
}

/** A key as shown to its creator, once. */
export interface CreatedApiKey {
  key: string;
  record: Omit<ApiKeyRecord, 'hash'>;
}

const TENANT_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;

function hashKey(key: string): string {
  return createHash('sha256').update(key).digest('hex');
}

/** Strips the hash before a key record leaves the daemon. */
export function publicKey(r: ApiKeyRecord): Omit<ApiKeyRecord, 'hash'> {
  const { hash: _hash, ...rest } = r;
  return rest;
}

/**
 * Creates, verifies and revokes API keys.
 *
 * @example
 * const auth = new ApiKeys(store);
 * const { key } = await auth.create({ tenantId: 'acme', name: 'ci', admin: false });
 * const who = await auth.verify(key); // { tenantId: 'acme', ... }
 */
export class ApiKeys {
  constructor(private readonly store: MetadataStore) {}

  /** Creates a key. `format` shapes it: `space_…` by default; `e2b` gives `e2b_` + 40 hex digits, the shape E2B's SDKs accept. */
  async create(opts: { tenantId: string; name?: string; admin?: boolean; format?: 'space' | 'e2b' }): Promise<CreatedApiKey> {
    if (!TENANT_RE.test(opts.tenantId)) {
      throw new SpaceError('BAD_REQUEST', `Invalid tenant ${JSON.stringify(opts.tenantId)}: use 1–63 lowercase letters, digits, "_" or "-"`);
    }
    const name = opts.name ?? 'key';
    if (name.length > 128) throw new SpaceError('BAD_REQUEST', 'Key name must be at most 128 characters');
    const key = opts.format === 'e2b' ? 'e2b_' + randomBytes(20).toString('hex') : 'space_' + randomBytes(24).toString('base64url');
    const record: ApiKeyRecord = {
      id: 'key' + randomString(12),
      tenantId: opts.tenantId,
      name,
      hash: hashKey(key),
      prefix: key.slice(0, 12),
      admin: opts.admin ?? false,
      createdAt: new Date().toISOString(),
    };
    await this.store.insertApiKey(record);
    return { key, record: publicKey(record) };
  }

  /** Resolves a bearer key to its principal, or throws `UNAUTHENTICATED`. */
  async verify(key: string | undefined): Promise<Principal> {
    if (!key || key.length > 256) throw new SpaceError('UNAUTHENTICATED');
    const h = hashKey(key);
    const r = await this.store.findApiKeyByHash(h);
    if (!r || r.revokedAt || !timingSafeEqual(Buffer.from(r.hash, 'hex'), Buffer.from(h, 'hex'))) throw new SpaceError('UNAUTHENTICATED');
    return { tenantId: r.tenantId, keyId: r.id, admin: r.admin };
  }

  /** Whether key `keyId` of tenant `tenantId` exists and is not revoked (console sessions re-check it). */
  async isActive(tenantId: string, keyId: string): Promise<boolean> {
    const k = (await this.store.listApiKeys(tenantId)).find((x) => x.id === keyId);
    return !!k && !k.revokedAt;
  }

  /** Keys of a tenant (or every key, for an admin of the default tenant). */
  async list(who: Principal): Promise<Omit<ApiKeyRecord, 'hash'>[]> {
    return (await this.store.listApiKeys(who.tenantId)).map(publicKey);
  }

  /** Revokes a key of the caller's tenant. */
  async revoke(who: Principal, id: string): Promise<Omit<ApiKeyRecord, 'hash'>> {
    const keys = await this.store.listApiKeys(who.tenantId);
    const k = keys.find((x) => x.id === id);
    if (!k) throw new SpaceError('KEY_NOT_FOUND', `No API key ${JSON.stringify(id)} in tenant ${who.tenantId}`);
    if (!who.admin && k.id !== who.keyId) throw new SpaceError('FORBIDDEN', 'Only an admin key may revoke other keys');
    const r = await this.store.revokeApiKey(id, new Date().toISOString());
    return publicKey(r!);
  }

  /** Whether any key exists (the daemon writes a first admin key when none does). */
  async any(): Promise<boolean> {
    return (await this.store.countApiKeys()) > 0;
  }
}
