/**
 * The sandbox's disk, seen from inside: in a microVM, the writable layer is an ext4 file system
 * on a block device labelled `space-disk` (the guest's /init mounts it under the overlay). A
 * create that restores a template image made with a smaller disk gets a device the VMM has grown
 * (QMP `block_resize`); the file system is grown here, online, to fill it. In gVisor the disk is
 * a directory on the host (no block device): nothing to do.
 */
import { execFile } from 'node:child_process';
import { closeSync, openSync, readFileSync, readSync, readdirSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { AGENT_RUNTIME_DIR } from '@space/protocol';
import { AgentError } from './processes.js';

/** The label the driver gives the sandbox disk's file system (driver-microvm's DISK_LABEL). */
const LABEL = 'space-disk';
/** How long the guest kernel may take to see its device's new size (a config interrupt, handled by a worker). */
const DEVICE_WAIT_MS = 10_000;
/** How long growing may take (adding block groups; seconds under emulation for tens of GiB). */
const GROW_TIMEOUT_MS = 60_000;

const run = promisify(execFile);

/** An ext4 file system on a block device: its label and its size in bytes. */
interface Ext4Super {
  label: string;
  bytes: number;
}

/**
 * Reads the ext4 superblock of `device` (1 KiB at offset 1024), or undefined if it holds none.
 * Reads go through the device's page cache, which the mounted file system updates in place.
 */
function readSuper(device: string): Ext4Super | undefined {
  const sb = Buffer.alloc(1024);
  let fd: number | undefined;
  try {
    fd = openSync(device, 'r');
    if (readSync(fd, sb, 0, 1024, 1024) !== 1024) return undefined;
  } catch {
    return undefined;
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
  if (sb.readUInt16LE(56) !== 0xef53) return undefined;
  const blockSize = 1024 * 2 ** sb.readUInt32LE(24);
  // s_blocks_count_hi counts only with the 64bit feature (INCOMPAT_64BIT).
  const hi = sb.readUInt32LE(96) & 0x80 ? sb.readUInt32LE(0x150) : 0;
  const label = sb.subarray(120, 136).toString('latin1').replace(/\0[^]*$/, '');
  return { label, bytes: (hi * 2 ** 32 + sb.readUInt32LE(4)) * blockSize };
}

/** The block device (`vdc`) whose file system is the sandbox disk, with that file system's size, if the sandbox has one. */
function diskDevice(): { name: string; bytes: number } | undefined {
  let names: string[];
  try {
    names = readdirSync('/sys/block');
  } catch {
    return undefined; // no block devices (gVisor)
  }
  for (const name of names) {
    const sb = readSuper(`/dev/${name}`);
    if (sb?.label === LABEL) return { name, bytes: sb.bytes };
  }
  return undefined;
}

/** The size of block device `name` as the guest kernel sees it now, bytes. */
function deviceBytes(name: string): number {
  return Number(readFileSync(`/sys/block/${name}/size`, 'utf8').trim()) * 512;
}

/**
 * Makes the sandbox disk's file system as large as its device, which the daemon says is
 * `bytes`: waits for the guest kernel to see that size, then grows the file system online.
 * Without a sandbox disk on a block device, does nothing; a file system already that large is
 * left as it is (growing is all it does: a smaller size is not a shrink).
 *
 * @throws AgentError `DRIVER_FAILED` if the device never reaches `bytes` or the file system does not grow.
 * @example await growDisk(8 * 2 ** 30); // after a create from an image with a 5 GiB disk
 */
export async function growDisk(bytes: number): Promise<void> {
  const disk = diskDevice();
  if (!disk || disk.bytes >= bytes) return;
  const { name } = disk;
  const device = `/dev/${name}`;
  for (const start = Date.now(); deviceBytes(name) < bytes; await sleep(20)) {
    if (Date.now() - start > DEVICE_WAIT_MS) throw new AgentError('DRIVER_FAILED', `The sandbox disk ${device} is ${deviceBytes(name)} bytes, not the ${bytes} the daemon made it: the guest kernel did not see it grow`);
  }
  await run(`${AGENT_RUNTIME_DIR}/space-helper`, ['growfs', device], { timeout: GROW_TIMEOUT_MS }).catch((err: { stderr?: string; message: string }) => {
    throw new AgentError('DRIVER_FAILED', `Cannot grow the sandbox disk's file system: ${(err.stderr ?? '').trim() || err.message}`);
  });
  const now = readSuper(device)?.bytes ?? 0;
  // A last partial block of the device stays unused: the file system counts whole blocks.
  if (now < bytes - 65536) throw new AgentError('DRIVER_FAILED', `The sandbox disk's file system is ${now} bytes after growing, not ${bytes}`);
}
