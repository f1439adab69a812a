/**
 * @space/driver-gvisor — sandboxes on gVisor (`runsc`), the default driver where there is no KVM.
 */
export { GvisorDriver } from './driver.js';
export type { GvisorDriverOptions } from './driver.js';
export { STATEFILE_HELPER, StatefileCodec } from './statefile-codec.js';
export { ensureRuntime, AGENT_ARGV } from '@space/core';
export { DiskPool, MIN_POOL_BYTES, MIN_WORK_ROOM_BYTES } from '@space/disk-pool';
export type { DiskPoolOptions, DiskUsage } from '@space/disk-pool';
