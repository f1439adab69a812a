/**
 * @space/key-pkcs11 — a {@link KeyProvider} whose keys never leave a PKCS#11 token (an HSM;
 * SoftHSM2 in the tests). A tenant's key reference is the label of an AES-256 secret key in the
 * token; data keys are wrapped and unwrapped by the token with CKM_AES_GCM (random 96-bit IV,
 * the label as associated data). Uses graphene-pk11 over pkcs11js.
 */
import { randomBytes } from 'node:crypto';
import * as graphene from 'graphene-pk11';
import { SpaceError, type KeyProvider } from '@space/core';

/** How to reach the token. */
export interface Pkcs11Options {
  /** The PKCS#11 module, e.g. /usr/lib/softhsm/libsofthsm2.so. */
  module: string;
  /** Label of the token to use. */
  tokenLabel: string;
  /** The user PIN. */
  pin: string;
}

/**
 * PKCS#11 key provider.
 *
 * @example
 * const p = Pkcs11KeyProvider.open({ module: '/usr/lib/softhsm/libsofthsm2.so', tokenLabel: 'space', pin: '1234' });
 * await p.check('tenant-a');
 */
export class Pkcs11KeyProvider implements KeyProvider {
  readonly name = 'pkcs11';

  private constructor(
    private readonly mod: graphene.Module,
    private readonly session: graphene.Session,
    private readonly token: string,
  ) {}

  /**
   * Loads the module, opens the token and logs in — a wrong module, token or PIN fails here
   * (at daemon start), with `KEY_INVALID`.
   */
  static open(opts: Pkcs11Options): Pkcs11KeyProvider {
    let mod: graphene.Module;
    try {
      mod = graphene.Module.load(opts.module, 'pkcs11');
      mod.initialize();
    } catch (err) {
      throw new SpaceError('KEY_INVALID', `Cannot load the PKCS#11 module ${opts.module}: ${(err as Error).message}`, { cause: err });
    }
    try {
      const slots = mod.getSlots(true);
      let slot: graphene.Slot | undefined;
      for (let i = 0; i < slots.length; i++) if (slots.items(i).getToken().label.trim() === opts.tokenLabel) slot = slots.items(i);
      if (!slot) throw new SpaceError('KEY_INVALID', `No PKCS#11 token labelled ${JSON.stringify(opts.tokenLabel)} in ${opts.module}`);
      const session = slot.open(graphene.SessionFlag.SERIAL_SESSION | graphene.SessionFlag.RW_SESSION);
      try {
        session.login(opts.pin, graphene.UserType.USER);
      } catch (err) {
        session.close();
        throw new SpaceError('KEY_INVALID', `Logging in to PKCS#11 token ${opts.tokenLabel} failed (wrong PIN?): ${(err as Error).message}`, { cause: err });
      }
      return new Pkcs11KeyProvider(mod, session, opts.tokenLabel);
    } catch (err) {
      mod.finalize();
      throw err;
    }
  }

  private key(label: string): graphene.SecretKey {
    if (typeof label !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/.test(label)) throw new SpaceError('KEY_INVALID', `PKCS#11 key references are key labels (letters, digits, ".", "_", "-"); got ${JSON.stringify(label)}`);
    const found = this.session.find({ class: graphene.ObjectClass.SECRET_KEY, label });
    if (found.length === 0) throw new SpaceError('KEY_INVALID', `No secret key labelled ${JSON.stringify(label)} in PKCS#11 token ${this.token}`);
    const key = found.items(0).toType<graphene.SecretKey>();
    if (key.type !== graphene.KeyType.AES || key.getAttribute({ valueLen: null }).valueLen !== 32) throw new SpaceError('KEY_INVALID', `Key ${label} in token ${this.token} is not an AES-256 key`);
    return key;
  }

  async check(ref: string): Promise<{ description: string }> {
    const k = this.key(ref);
    if (!k.encrypt || !k.decrypt) throw new SpaceError('KEY_INVALID', `Key ${ref} in token ${this.token} may not encrypt and decrypt (CKA_ENCRYPT/CKA_DECRYPT)`);
    return { description: `AES-256 key ${ref} in PKCS#11 token ${this.token}` };
  }

  async wrap(ref: string, dataKey: Buffer): Promise<Buffer> {
    const iv = randomBytes(12);
    const cipher = this.session.createCipher({ name: 'AES_GCM', params: new graphene.AesGcmParams(iv, Buffer.from(`space-dek:${ref}`), 128) }, this.key(ref));
    return Buffer.concat([iv, cipher.once(dataKey, Buffer.alloc(dataKey.length + 16))]);
  }

  async unwrap(ref: string, wrapped: Buffer): Promise<Buffer> {
    const key = this.key(ref);
    try {
      const d = this.session.createDecipher({ name: 'AES_GCM', params: new graphene.AesGcmParams(wrapped.subarray(0, 12), Buffer.from(`space-dek:${ref}`), 128) }, key);
      return d.once(wrapped.subarray(12), Buffer.alloc(wrapped.length));
    } catch (err) {
      throw new SpaceError('KEY_INVALID', `Key ${ref} in token ${this.token} does not unwrap this data key`, { cause: err });
    }
  }

  async health(): Promise<{ ok: boolean; detail: string }> {
    try {
      this.session.find({ label: '__space_health_probe__' });
      return { ok: true, detail: `PKCS#11 token ${this.token}` };
    } catch (err) {
      return { ok: false, detail: `PKCS#11 token ${this.token}: ${(err as Error).message}` };
    }
  }

  /** Logs out and unloads the module. */
  close(): void {
    try {
      this.session.logout();
      this.session.close();
    } finally {
      this.mod.finalize();
    }
  }
}
