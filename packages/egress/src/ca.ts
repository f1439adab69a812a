/**
 * Tenants' egress CAs: one ECDSA P-256 CA per tenant, made on first use, its private key
 * sealed under a data key of the tenant (so it follows the tenant's key: rotated, revoked,
 * destroyed with it) and never leaving the daemon. Sandboxes trust its certificate; the proxy
 * issues server certificates from it on the fly, cached in memory.
 */
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import { randomBytes, webcrypto } from 'node:crypto';
import net from 'node:net';
import tls from 'node:tls';
import { seal, unseal, type KeyService, type MetadataStore, type TenantCaRecord } from '@space/core';

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

const ALG = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' } as const;
const DAY = 86_400_000;
/** Server certificates live this long (and are reissued a day before they end). */
const LEAF_DAYS = 7;
/** Server certificates kept in memory. */
const LEAF_CACHE = 4096;

interface LiveCa {
  cert: x509.X509Certificate;
  certPem: string;
  key: CryptoKey;
  /** One key pair for every server certificate of the tenant. */
  leafKeys: CryptoKeyPair;
  leafKeyPem: string;
}

const pem = (label: string, der: ArrayBuffer) => `-----BEGIN ${label}-----\n${Buffer.from(der).toString('base64').replace(/.{64}/g, '$&\n').replace(/\n?$/, '\n')}-----END ${label}-----\n`;

/**
 * The CAs of every tenant.
 *
 * @example
 * const cas = new TenantCas({ store, keys });
 * const pemCert = await cas.certificate('tenant-a');   // goes into the sandbox's trust store
 * const ctx = await cas.serverContext('tenant-a', 'api.example.com'); // for a TLS server socket
 */
export class TenantCas {
  private readonly live = new Map<string, Promise<LiveCa>>();
  private readonly leaves = new Map<string, { ctx: tls.SecureContext; notAfter: number }>();

  constructor(private readonly opts: { store: MetadataStore; keys: KeyService }) {}

  /** The tenant's CA certificate (PEM), made on first use. */
  async certificate(tenantId: string): Promise<string> {
    return (await this.ca(tenantId)).certPem;
  }

  /** A TLS server context for `host` (a name or an IP), signed by the tenant's CA. */
  async serverContext(tenantId: string, host: string): Promise<tls.SecureContext> {
    const k = `${tenantId}\0${host}`;
    const hit = this.leaves.get(k);
    if (hit && hit.notAfter - DAY > Date.now()) {
      this.leaves.delete(k);
      this.leaves.set(k, hit);
      return hit.ctx;
    }
    const ca = await this.ca(tenantId);
    const notBefore = new Date(Date.now() - DAY);
    const notAfter = new Date(Date.now() + LEAF_DAYS * DAY);
    const leaf = await x509.X509CertificateGenerator.create({
      serialNumber: randomBytes(16).toString('hex').replace(/^[89a-f]/, '1'),
      subject: `CN=${host.replace(/[,=+<>#;"\\]/g, '')}`,
      issuer: ca.cert.subject,
      notBefore,
      notAfter,
      signingAlgorithm: ALG,
      publicKey: ca.leafKeys.publicKey,
      signingKey: ca.key,
      extensions: [
        new x509.SubjectAlternativeNameExtension([net.isIP(host) ? { type: 'ip', value: host } : { type: 'dns', value: host }]),
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        await x509.AuthorityKeyIdentifierExtension.create(ca.cert),
      ],
    });
    const ctx = tls.createSecureContext({ key: ca.leafKeyPem, cert: leaf.toString('pem') + '\n' + ca.certPem, minVersion: 'TLSv1.2' });
    this.leaves.set(k, { ctx, notAfter: notAfter.getTime() });
    if (this.leaves.size > LEAF_CACHE) this.leaves.delete(this.leaves.keys().next().value!);
    return ctx;
  }

  /** Forgets what is cached of a tenant (its key changed state). */
  forget(tenantId: string): void {
    this.live.delete(tenantId);
    for (const k of this.leaves.keys()) if (k.startsWith(`${tenantId}\0`)) this.leaves.delete(k);
  }

  private ca(tenantId: string): Promise<LiveCa> {
    let p = this.live.get(tenantId);
    if (!p) {
      p = this.load(tenantId);
      this.live.set(tenantId, p);
      p.catch(() => this.live.delete(tenantId));
    }
    return p;
  }

  private async load(tenantId: string): Promise<LiveCa> {
    const objectKey = `ca/${tenantId}`;
    const aad = Buffer.from(`space-ca\0${tenantId}`);
    let rec: TenantCaRecord | undefined = await this.opts.store.getTenantCa(tenantId);
    if (!rec) {
      const keys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as CryptoKeyPair;
      const cert = await x509.X509CertificateGenerator.createSelfSigned({
        serialNumber: randomBytes(16).toString('hex').replace(/^[89a-f]/, '1'),
        name: `CN=SPACE egress CA ${tenantId || 'node'}, O=SPACE`,
        notBefore: new Date(Date.now() - DAY),
        notAfter: new Date(Date.now() + 3650 * DAY),
        signingAlgorithm: ALG,
        keys,
        extensions: [
          new x509.BasicConstraintsExtension(true, 0, true),
          new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
          await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
        ],
      });
      const { dataKey, record } = await this.opts.keys.newDataKey(tenantId, objectKey);
      const pkcs8 = Buffer.from(await webcrypto.subtle.exportKey('pkcs8', keys.privateKey));
      await this.opts.store.putDataKey(record);
      // One CA per tenant: this process makes at most one at a time (see `ca`), and the store keeps the first.
      rec = await this.opts.store.putTenantCaIfAbsent({ tenantId, certPem: cert.toString('pem') + '\n', sealedKey: seal(dataKey, pkcs8, aad), createdAt: new Date().toISOString() });
    }
    const d = await this.opts.store.getDataKey(objectKey);
    if (!d) throw new Error(`The data key of tenant ${tenantId}'s egress CA is missing`);
    const pkcs8 = unseal(await this.opts.keys.unwrapRecord(d), rec.sealedKey, aad);
    const key = await webcrypto.subtle.importKey('pkcs8', pkcs8, ALG, false, ['sign']);
    const leafKeys = (await webcrypto.subtle.generateKey(ALG, true, ['sign', 'verify'])) as CryptoKeyPair;
    const leafKeyPem = pem('PRIVATE KEY', await webcrypto.subtle.exportKey('pkcs8', leafKeys.privateKey));
    return { cert: new x509.X509Certificate(rec.certPem), certPem: rec.certPem, key, leafKeys, leafKeyPem };
  }
}
