/**
 * @space/driver-fake — an in-memory SandboxDriver (and root file system builder) for SPACE's
 * fast tests: core's whole lifecycle without runsc, QEMU or root.
 */
export { FakeDriver } from './driver.js';
export type { FakeDriverOptions, FakeIdentityRequest } from './driver.js';
export { FakeRootfs } from './rootfs.js';
export { newMachine } from './agent.js';
export type { FakeEntry, FakeMachine } from './agent.js';
