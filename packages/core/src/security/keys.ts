/**
 * Bring-your-own-key: each tenant's data keys are wrapped by a key the tenant chooses, held by
 * a {@link KeyProvider}. SPACE never stores a tenant key, only a reference to it and the data
 * keys it wraps. Rotation re-wraps every data key under the new key (no data is re-encrypted);
 * revocation makes every read of the tenant's data fail with `KEY_REVOKED` until re-enabled;
 * destroying a key forgets it, and what only it wraps is unreadable for good.
 */
import { createCipheriv, createDecipheriv, randomBytes } from 'node:crypto';
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { SpaceError } from '../errors.js';
import { randomString } from '../ids.js';
import type { Logger } from '../logger.js';
import type { DataKeyRecord, TenantKey } from '../records.js';

export type { DataKeyRecord, TenantKey } from '../records.js';
import type { MetadataStore } from '../ports/metadata-store.js';

/**
 * Something that holds key-encryption keys and wraps data keys with them. A cloud KMS (AWS KMS
 * `Encrypt`/`Decrypt`, GCP KMS, Vault Transit) fits by implementing these four methods; the
 * codec never sees the key-encryption key.
 *
 * @example
 * const wrapped = await provider.wrap('tenant-a.key', dataKey);
 * const again = await provider.unwrap('tenant-a.key', wrapped);
 */
export interface KeyProvider {
  /** Name tenants choose it by (`local`, `pkcs11`, ...). */
  readonly name: string;
  /** Validates a key reference (exists, right size, usable) — called when a tenant configures it. */
  check(ref: string): Promise<{ description: string }>;
  /** Encrypts a 32-byte data key under the key `ref`. */
  wrap(ref: string, dataKey: Buffer): Promise<Buffer>;
  /** Decrypts a wrapped data key; rejects if it was not wrapped by `ref`. */
  unwrap(ref: string, wrapped: Buffer): Promise<Buffer>;
  /** Whether the provider works at all (for `space doctor`). */
  health(): Promise<{ ok: boolean; detail: string }>;
}

/**
 * AES-256-GCM with a random 96-bit nonce: nonce | tag | ciphertext. `aad` binds what the
 * ciphertext belongs to (it must be given again to open it).
 *
 * @example
 * const sealed = seal(dataKey, Buffer.from('value'), Buffer.from('secret\0tenant-a\0NAME'));
 * unseal(dataKey, sealed, Buffer.from('secret\0tenant-a\0NAME')).toString(); // "value"
 */
export function seal(key: Buffer, plain: Buffer, aad: Buffer): Buffer {
  const nonce = randomBytes(12);
  const c = createCipheriv('aes-256-gcm', key, nonce);
  c.setAAD(aad);
  const ct = Buffer.concat([c.update(plain), c.final()]);
  return Buffer.concat([nonce, c.getAuthTag(), ct]);
}

/** Opens what {@link seal} sealed; throws if the key, the data or `aad` differ. */
export function unseal(key: Buffer, sealed: Buffer, aad: Buffer): Buffer {
  const d = createDecipheriv('aes-256-gcm', key, sealed.subarray(0, 12));
  d.setAAD(aad);
  d.setAuthTag(sealed.subarray(12, 28));
  return Buffer.concat([d.update(sealed.subarray(28)), d.final()]);
}

/**
 * Key files the operator puts in one directory (SPACE never writes them): 32 bytes raw, 64
 * hex digits, or base64 of 32 bytes. A tenant names a file of that directory, nothing else.
 *
 * @example
 * const p = new LocalKeyProvider('/var/lib/space/keys');
 * await p.check('tenant-a.key');
 */
export class LocalKeyProvider implements KeyProvider {
  readonly name = 'local';
  constructor(readonly dir: string) {}

  private async load(ref: string): Promise<Buffer> {
    if (typeof ref !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(ref)) throw new SpaceError('KEY_INVALID', `Local key references are file names in ${this.dir} (letters, digits, ".", "_", "-"); got ${JSON.stringify(ref)}`);
    let raw: Buffer;
    try {
      raw = await fs.readFile(path.join(this.dir, ref));
    } catch (err) {
      throw new SpaceError('KEY_INVALID', `Key file ${path.join(this.dir, ref)} cannot be read (${(err as NodeJS.ErrnoException).code}); put a 32-byte key there, e.g. \`head -c 32 /dev/urandom > ${path.join(this.dir, ref)}\``, { cause: err });
    }
    const text = raw.toString('utf8').trim();
    if (raw.length === 32) return raw;
    if (/^[0-9a-fA-F]{64}$/.test(text)) return Buffer.from(text, 'hex');
    const b64 = /^[A-Za-z0-9+/]{43}=$/.test(text) ? Buffer.from(text, 'base64') : undefined;
    if (b64?.length === 32) return b64;
    throw new SpaceError('KEY_INVALID', `Key file ${path.join(this.dir, ref)} does not hold a 256-bit key (${raw.length} bytes): use 32 raw bytes, 64 hex digits or base64 of 32 bytes`);
  }

  async check(ref: string): Promise<{ description: string }> {
    await this.load(ref);
    return { description: `AES-256 key file ${path.join(this.dir, ref)}` };
  }

  async wrap(ref: string, dataKey: Buffer): Promise<Buffer> {
    return seal(await this.load(ref), dataKey, Buffer.from(`space-dek:${ref}`));
  }

  async unwrap(ref: string, wrapped: Buffer): Promise<Buffer> {
    const kek = await this.load(ref);
    try {
      return unseal(kek, wrapped, Buffer.from(`space-dek:${ref}`));
    } catch (err) {
      throw new SpaceError('KEY_INVALID', `Key ${ref} does not unwrap this data key (the key file changed?)`, { cause: err });
    }
  }

  async health(): Promise<{ ok: boolean; detail: string }> {
    const ok = await fs.access(this.dir).then(() => true, () => false);
    return { ok, detail: ok ? `key directory ${this.dir}` : `key directory ${this.dir} is missing` };
  }
}



/** The tenant whose data everyone without a key of their own uses: the node's own key. */
export const NODE_TENANT = '';

/**
 * Tenant keys: configure, rotate, revoke, enable, destroy; wrap and unwrap data keys.
 *
 * @example
 * const keys = new KeyService({ store, providers: [new LocalKeyProvider(dir)], nodeKey: { provider: 'local', ref: 'node.key' }, logger });
 * await keys.start();
 * const { keyId, wrapped, dataKey } = await keys.newDataKey('tenant-a');
 */
export class KeyService {
  private readonly providers = new Map<string, KeyProvider>();
  private rotations = new Map<string, Promise<void>>();

  constructor(
    private readonly opts: {
      store: MetadataStore;
      providers: KeyProvider[];
      /** The node's key (used for tenants without their own). */
      nodeKey: { provider: string; ref: string };
      logger: Logger;
      /** Crash tests: SIGKILL after re-wrapping this many data keys. Never set in production. */
      faultAfterRewraps?: number;
    },
  ) {
    for (const p of opts.providers) this.providers.set(p.name, p);
  }

  /** Checks the node key (a missing or bad key stops the daemon here, not at the first restore) and resumes interrupted rotations. */
  async start(): Promise<void> {
    const cur = (await this.opts.store.listTenantKeys(NODE_TENANT)).find((k) => k.state === 'active');
    const { provider, ref } = this.opts.nodeKey;
    const desc = await this.provider(provider).check(ref);
    if (!cur) await this.opts.store.putTenantKey({ id: `ek${randomString(16)}`, tenantId: NODE_TENANT, provider, ref, state: 'active', description: desc.description, createdAt: new Date().toISOString() });
    else if (cur.provider !== provider || cur.ref !== ref) await this.set(NODE_TENANT, { provider, ref });
    // A rotation a crash interrupted goes on (re-wrapping is idempotent).
    const tenants = new Set((await this.opts.store.listTenantKeys()).filter((k) => k.state === 'active' || k.state === 'rotating').map((k) => k.tenantId));
    for (const t of tenants) void this.resumeRotation(t).catch((err) => this.opts.logger.error({ err, tenantId: t }, 'key rotation failed'));
  }

  private provider(name: string): KeyProvider {
    const p = this.providers.get(name);
    if (!p) throw new SpaceError('KEY_INVALID', `Unknown key provider ${JSON.stringify(name)}; available: ${[...this.providers.keys()].join(', ')}`);
    return p;
  }

  /** A tenant's keys (the node's for tenants without any). */
  async list(tenantId: string): Promise<TenantKey[]> {
    return this.opts.store.listTenantKeys(tenantId);
  }

  /** The key new data of `tenantId` is wrapped with. */
  private async activeKey(tenantId: string): Promise<TenantKey> {
    const own = await this.opts.store.listTenantKeys(tenantId);
    const k = own.find((x) => x.state === 'active') ?? (own.length ? undefined : (await this.opts.store.listTenantKeys(NODE_TENANT)).find((x) => x.state === 'active'));
    if (!k) throw new SpaceError('KEY_REVOKED', `Tenant ${tenantId}'s key is revoked: nothing can be stored or restored until it is enabled again`);
    return k;
  }

  /**
   * Sets the tenant's key: the first one, or a new one that replaces the current (rotation:
   * every data key is re-wrapped under it, online, resumed after a crash).
   */
  async set(tenantId: string, spec: { provider: string; ref: string }): Promise<TenantKey> {
    const p = this.provider(spec.provider);
    const { description } = await p.check(spec.ref);
    const keys = await this.opts.store.listTenantKeys(tenantId);
    if (keys.some((k) => k.state === 'revoked')) throw new SpaceError('KEY_REVOKED', 'A key of this tenant is revoked: enable it before rotating');
    if (keys.some((k) => k.state === 'rotating')) throw new SpaceError('SANDBOX_INVALID_STATE', 'A rotation is still running; wait for it (space key ls)');
    const next: TenantKey = { id: `ek${randomString(16)}`, tenantId, provider: spec.provider, ref: spec.ref, state: 'active', description, createdAt: new Date().toISOString() };
    // Data of a tenant without a key of its own is wrapped by the node key: it moves too.
    const from = keys.find((k) => k.state === 'active') ?? (keys.length || tenantId === NODE_TENANT ? undefined : (await this.opts.store.listTenantKeys(NODE_TENANT)).find((k) => k.state === 'active'));
    await this.opts.store.switchTenantKey(next, from && from.tenantId === tenantId ? from.id : undefined);
    if (from) void this.resumeRotation(tenantId).catch((err) => this.opts.logger.error({ err, tenantId }, 'key rotation failed'));
    return next;
  }

  /** Re-wraps every data key of the tenant not under its active key. */
  private resumeRotation(tenantId: string): Promise<void> {
    let r = this.rotations.get(tenantId);
    if (!r) {
      r = this.rotate(tenantId).finally(() => this.rotations.delete(tenantId));
      this.rotations.set(tenantId, r);
    }
    return r;
  }

  /** Waits for a running rotation of the tenant (tests, `space key rotate --wait`). */
  async settled(tenantId: string): Promise<void> {
    await this.rotations.get(tenantId);
  }

  private async rotate(tenantId: string): Promise<void> {
    const active = await this.activeKey(tenantId);
    let n = 0;
    for (;;) {
      const batch = await this.opts.store.listDataKeys(tenantId, 100, active.id);
      if (!batch.length) break;
      for (const d of batch) {
        const dek = await this.unwrapRecord(d);
        await this.opts.store.putDataKey({ ...d, keyId: active.id, wrapped: await this.provider(active.provider).wrap(active.ref, dek) });
        n++;
        if (this.opts.faultAfterRewraps !== undefined && n >= this.opts.faultAfterRewraps) process.kill(process.pid, 'SIGKILL');
      }
    }
    for (const k of await this.opts.store.listTenantKeys(tenantId)) if (k.state === 'rotating') await this.opts.store.putTenantKey({ ...k, state: 'retired' });
    this.opts.logger.info({ tenantId, rewrapped: n, keyId: active.id }, 'key rotation finished');
  }

  /**
   * A 256-bit secret of the daemon's own (e.g. what signs E2B access tokens), made once and
   * kept like any data key: wrapped by the node key, in the metadata store, never in a file.
   */
  async daemonSecret(name: string): Promise<Buffer> {
    const objectKey = `daemon/${name}`;
    const cur = await this.opts.store.getDataKey(objectKey);
    if (cur) return this.unwrapRecord(cur);
    const { dataKey, record } = await this.newDataKey(NODE_TENANT, objectKey);
    await this.opts.store.putDataKey(record);
    return dataKey;
  }

  /** Throws `KEY_REVOKED` unless the tenant has a key new data can be stored under. */
  async assertUsable(tenantId: string): Promise<void> {
    await this.activeKey(tenantId);
  }

  /** A fresh data key for an object of `tenantId`, wrapped by its active key. */
  async newDataKey(tenantId: string, objectKey: string): Promise<{ dataKey: Buffer; record: DataKeyRecord }> {
    const k = await this.activeKey(tenantId);
    const dataKey = randomBytes(32);
    return { dataKey, record: { objectKey, tenantId, keyId: k.id, wrapped: await this.provider(k.provider).wrap(k.ref, dataKey) } };
  }

  /** Unwraps a data key; `KEY_REVOKED` / `KEY_DESTROYED` when its tenant key forbids it. */
  async unwrapRecord(d: DataKeyRecord): Promise<Buffer> {
    const k = await this.opts.store.getTenantKey(d.keyId);
    if (!k || k.state === 'destroyed') throw new SpaceError('KEY_DESTROYED', `The key that protects ${d.objectKey} was destroyed: the data is unreadable for good`);
    if (k.state === 'revoked') throw new SpaceError('KEY_REVOKED', `Tenant ${k.tenantId || '(node)'}'s key ${k.id} is revoked: enable it to read this data`);
    return this.provider(k.provider).unwrap(k.ref, d.wrapped);
  }

  private async own(tenantId: string, id: string): Promise<TenantKey> {
    const k = await this.opts.store.getTenantKey(id);
    if (!k || k.tenantId !== tenantId) throw new SpaceError('KEY_NOT_FOUND', `No encryption key ${JSON.stringify(id)} for this tenant`);
    return k;
  }

  /** Revokes a key: nothing it wraps can be read until {@link enable}. */
  async revoke(tenantId: string, id: string): Promise<TenantKey> {
    const k = await this.own(tenantId, id);
    if (k.state === 'destroyed' || k.state === 'revoked') return k;
    const next: TenantKey = { ...k, state: 'revoked', revokedFrom: k.state };
    await this.opts.store.putTenantKey(next);
    return next;
  }

  /** Re-enables a revoked key. */
  async enable(tenantId: string, id: string): Promise<TenantKey> {
    const k = await this.own(tenantId, id);
    if (k.state !== 'revoked') return k;
    const { revokedFrom: from, ...rest } = k;
    const next: TenantKey = { ...rest, state: from ?? 'active' };
    await this.opts.store.putTenantKey(next);
    if (next.state === 'rotating') void this.resumeRotation(tenantId).catch((err) => this.opts.logger.error({ err, tenantId }, 'key rotation failed'));
    return next;
  }

  /**
   * Forgets a key for good. Data only it wraps becomes unreadable (crypto-shredding); the
   * active key can only be destroyed when `shred` is set.
   */
  async destroy(tenantId: string, id: string, shred = false): Promise<TenantKey> {
    const k = await this.own(tenantId, id);
    if (k.state === 'rotating') throw new SpaceError('SANDBOX_INVALID_STATE', 'The key is still being rotated out; wait until it is retired');
    const wraps = await this.opts.store.countDataKeys(tenantId, id);
    if (wraps > 0 && !shred) throw new SpaceError('BAD_REQUEST', `Key ${id} still protects ${wraps} object(s); destroying it makes them unreadable for good — pass shred to confirm`);
    const next: TenantKey = { ...k, state: 'destroyed' };
    await this.opts.store.putTenantKey(next);
    return next;
  }
}
