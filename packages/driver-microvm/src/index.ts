/**
 * @space/driver-microvm — sandboxes as QEMU `microvm` machines: a guest kernel per sandbox,
 * KVM where it works and software emulation otherwise, full-machine snapshots.
 */
export { MicrovmDriver } from './driver.js';
export type { MicrovmDiskOptions, MicrovmDriverOptions } from './driver.js';
export { GuestBuilder } from './guest.js';
export type { GuestBuilderOptions, GuestKernel } from './guest.js';
export { GUEST_INIT } from './init.js';
export { qmp } from './qmp.js';
