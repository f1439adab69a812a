/**
 * @space/core — the sandbox lifecycle, the error registry and the interfaces that drivers
 * (`SandboxDriver`) and stores (`MetadataStore`) implement. Imports no driver, HTTP framework
 * or database driver.
 */
export { ERRORS, SpaceError, isErrorCode, toSpaceError } from './errors.js';
export type { ErrorBody, ErrorCode, ErrorSpec, SpaceErrorOptions } from './errors.js';
export { ALLOWED, LIMITS, SANDBOX_ID_RE, TERMINAL_STATES, assertAllowed, newSandboxId, randomString } from './model.js';
export type { EndReason, Sandbox, SandboxAction, SandboxEvent, SandboxState, Snapshot, SnapshotPolicy, SnapshotTrigger } from './model.js';
export { newSnapshotId } from './model.js';
export type { BlobInfo, BlobStore } from './blobs.js';
export { SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC, packSnapshot, readSnapshot } from './snapshot-format.js';
export type { SnapshotMeta } from './snapshot-format.js';
export type { DriverCreateSpec, DriverEvents, DriverReport, RuntimeStatus, SandboxDriver, SandboxUsage } from './driver.js';
export type { ApiKeyRecord, MetadataStore, SandboxPage, SandboxQuery } from './store.js';
export { AgentCall, AgentChannel } from './agent-channel.js';
export type { OutputChunk } from './agent-channel.js';
export { SandboxService, checkPath } from './service.js';
export type { CreateSandboxOpts, ForkResult, ListSandboxesOpts, Logger, SandboxServiceOptions } from './service.js';
export { ApiKeys, publicKey } from './auth.js';
export type { CreatedApiKey, Principal } from './auth.js';
