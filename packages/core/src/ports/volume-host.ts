/**
 * Where a node keeps volumes (implemented by `@space/volume-ext4`): each one a file system of
 * its own size whose files are encrypted at rest under a key core gives it (a data key wrapped
 * by the tenant's key). Core decides who may use a volume; the host only stores, opens and
 * closes them.
 */

/** What the host checked (for `space doctor` and the daemon's start). */
export interface VolumeHostReport {
  available: boolean;
  detail: string;
}

/**
 * A node's volumes.
 *
 * @example
 * await host.create('vol-1a2b', 1024, key);
 * const dir = await host.open('vol-1a2b', key); // the files, plaintext, for mounts into sandboxes
 * await host.close('vol-1a2b');                  // ciphertext only, at rest
 */
export interface VolumeHost {
  /** Checks the host (tools, kernel support) without changing it. */
  doctor(): Promise<VolumeHostReport>;
  /** Makes a volume of `sizeMb` MiB, empty, its files encrypted under `key` (32 bytes); leaves it closed. */
  create(id: string, sizeMb: number, key: Buffer): Promise<void>;
  /**
   * Makes the volume's files readable (mounted, key added) and returns the directory holding
   * them. Idempotent: an open volume stays open and the same directory comes back.
   */
  open(id: string, key: Buffer): Promise<string>;
  /** Forgets the key and unmounts: only ciphertext is left. Idempotent. */
  close(id: string): Promise<void>;
  /** Ids of the volumes open now (e.g. after a daemon restart: mounts outlive the daemon). */
  openIds(): Promise<string[]>;
  /** What an open volume holds, bytes; undefined when it is closed. */
  usedBytes(id: string): Promise<number | undefined>;
  /** Deletes the volume and its snapshots. It must be closed. Idempotent. */
  remove(id: string): Promise<void>;
  /** Copies the volume as it is now into snapshot `snapshotId` (open or closed; writes pause meanwhile). */
  snapshot(id: string, snapshotId: string): Promise<void>;
  /** Puts snapshot `snapshotId`'s contents back as the volume's. It must be closed. */
  restore(id: string, snapshotId: string): Promise<void>;
  /** Deletes one snapshot. Idempotent. */
  removeSnapshot(id: string, snapshotId: string): Promise<void>;
  /** After a crash: undoes what an interrupted operation left (frozen writes, half-written copies). */
  recover(): Promise<void>;
}
