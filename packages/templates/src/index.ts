/**
 * @space/templates — template root file systems: the built-ins, Debian package lists
 * (mmdebstrap), and uploaded images (OCI layout, `docker save`, rootfs tarball).
 */
export { RootfsStore, BUILTIN_TEMPLATES } from './rootfs.js';
export type { RootfsStoreOptions } from './rootfs.js';
export { importImage } from './image.js';
export type { ImportedImage } from './image.js';
