// Reads what a stored SPACE snapshot holds, decrypted and decompressed, so tests can scan a
// sandbox's memory and files for bytes that must not be there.
import { readFileSync, readdirSync, mkdtempSync, rmSync } from 'node:fs';
import { copyFile } from 'node:fs/promises';
import path from 'node:path';
import zlib from 'node:zlib';
import { DedupBlobStore, EncryptedBlobStore, KeyService, LocalKeyProvider, readSnapshot } from '../packages/core/dist/index.js';
import { SqliteStore } from '../packages/store-sqlite/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { StatefileCodec } from '../packages/driver-gvisor/dist/index.js';

const silent = { info() {}, warn() {}, error() {}, debug() {} };

/**
 * Decompresses a gVisor state file (runsc 2022-12): "gVisorSF", an 8-byte metadata length,
 * the metadata JSON and its 32-byte MAC, a 4-byte block size, then blocks of
 * [4-byte length, raw deflate].
 */
export function inflateStatefile(buf) {
  if (buf.subarray(0, 8).toString('latin1') !== 'gVisorSF') throw new Error('not a gVisor state file');
  let off = 16 + Number(buf.readBigUInt64BE(8)) + 32 + 4;
  const out = [];
  while (off + 4 <= buf.length) {
    const n = buf.readUInt32BE(off);
    off += 4;
    out.push(zlib.inflateRawSync(buf.subarray(off, off + n)));
    off += n;
  }
  return Buffer.concat(out);
}

/**
 * The decompressed checkpoint (memory, processes, in-memory root file system) of a stored
 * snapshot of a daemon's data directory, read through the same decryption as a restore.
 */
export async function snapshotContents(dataDir, snapshotId) {
  const dir = mkdtempSync('/tmp/spt-snap-');
  try {
    await unpackSnapshot(dataDir, snapshotId, dir);
    const parts = [];
    for (const f of readdirSync(dir)) {
      const raw = readFileSync(path.join(dir, f));
      parts.push(raw.subarray(0, 8).toString('latin1') === 'gVisorSF' ? inflateStatefile(raw) : raw);
    }
    return Buffer.concat(parts);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Unpacks a stored snapshot of a daemon's data directory into `dir` as the runtime wrote it,
 * through the same decryption and image codec as a restore.
 */
export async function unpackSnapshot(dataDir, snapshotId, dir) {
  const store = SqliteStore.open(path.join(dataDir, 'space.db'));
  try {
    const snap = await store.getSnapshot(snapshotId);
    if (!snap) throw new Error(`no snapshot ${snapshotId}`);
    const keys = new KeyService({ store, providers: [new LocalKeyProvider(path.join(dataDir, 'keys'))], nodeKey: { provider: 'local', ref: 'node.key' }, logger: silent });
    const blobs = new DedupBlobStore(new EncryptedBlobStore(new LocalBlobStore(path.join(dataDir, 'blobs')), keys, store), keys);
    const codec = new StatefileCodec();
    // A snapshot of a sandbox with a disk (--disks on) holds a mark naming the disk's copy; its
    // btrfs send stream is an object beside it (format 3), or, in snapshots from before, follows
    // the mark in the image: kept as stored (receiving it needs the daemon's pool).
    const disk = { name: 'gvisor-disk-btrfs-send-v1', decode: (src, dest) => copyFile(src, dest), encode: async () => false };
    return await readSnapshot(snap.id, await blobs.get(snap.blobKey), dir, 2 ** 34, (name) => (name === codec.name ? codec : name === disk.name ? disk : undefined));
  } finally {
    await store.close();
  }
}
