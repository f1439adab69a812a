/**
 * Stores runsc's checkpoint image so that consecutive snapshots deduplicate (see
 * native/statefile.go): runsc compresses its state file in 1 MiB blocks, and a change early in
 * the file makes every later compressed block differ, while their contents barely do. The
 * helper stores each block decompressed when Go's compress/flate (the release runsc was built
 * with) compresses it back to the very same bytes, and rebuilds the file on restore, checked
 * against the original's SHA-256.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { SpaceError, run, tryRun, type ImageFileCodec } from '@space/core';

/** The helper built from native/statefile.go by `npm run build`. */
export const STATEFILE_HELPER = fileURLToPath(new URL('./space-statefile', import.meta.url));

/**
 * The gVisor driver's {@link ImageFileCodec}.
 *
 * @example
 * const codec = new StatefileCodec();
 * await codec.encode('/work/img/checkpoint.img', '/work/img.stored/checkpoint.img'); // true: blocks stored decompressed
 * await codec.decode('/work/r/checkpoint.img.stored', '/work/r/checkpoint.img');     // the original, bit for bit
 */
export class StatefileCodec implements ImageFileCodec {
  readonly name = 'gvisor-statefile-inflated-v1';

  constructor(
    private readonly bin = STATEFILE_HELPER,
    /** Per file; a state file of a few GiB takes seconds. */
    private readonly timeoutMs = 5 * 60_000,
  ) {}

  /** Whether the helper is there (without it every image is stored as runsc wrote it). */
  available(): boolean {
    return existsSync(this.bin);
  }

  /** Never fails a snapshot: anything the helper cannot do is stored as runsc wrote it. */
  async encode(src: string, dest: string): Promise<boolean> {
    if (!this.available()) return false;
    return (await tryRun(this.bin, ['inflate', src, dest], this.timeoutMs)) !== undefined;
  }

  async decode(src: string, dest: string): Promise<void> {
    if (!this.available()) throw new SpaceError('DRIVER_UNAVAILABLE', `${this.bin} is missing, and this snapshot's image is stored decompressed; rebuild SPACE (npm run build, which needs golang-go)`);
    await run(this.bin, ['deflate', src, dest], this.timeoutMs).catch((err: unknown) => {
      throw new SpaceError('SNAPSHOT_CORRUPT', `the stored checkpoint image does not rebuild: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    });
  }
}
