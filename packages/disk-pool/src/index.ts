/**
 * @space/disk-pool — sandbox disks on one node-wide btrfs pool (issue 23), shared by the drivers:
 * gVisor serves a disk's subvolume as the sandbox's root, the microVM driver keeps the guest's
 * ext4 image file in one. Both store a snapshot's disk as a `btrfs send` stream beside it.
 */
export { DiskPool, IMAGE_ID, MIN_POOL_BYTES, MIN_WORK_ROOM_BYTES, defaultPoolBytes, imageId } from './disk-pool.js';
export type { DiskPoolOptions, DiskUsage } from './disk-pool.js';
export { DISK_MARK, DiskCodec, DiskStream, parseDiskMark, templateOf } from './disk-codec.js';
export type { DiskMark } from './disk-codec.js';
