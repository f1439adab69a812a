/**
 * @space/api — SPACE's wire contract, one home for what the daemon, the SDK and the CLI share:
 * the sandbox states, the records the API returns, what a create asks for, and the one
 * registry of error codes (`ERRORS`, `SpaceError`). Imports nothing.
 *
 * @example
 * import { SpaceError, type Sandbox } from '@space/api';
 */
export { ERRORS, SpaceError, asErrorCode, isErrorCode, toSpaceError } from './errors.js';
export type { ErrorBody, ErrorCode, ErrorSpec, SpaceErrorOptions } from './errors.js';
export { SANDBOX_STATES } from './sandbox.js';
export type { CreateSandboxOpts, CreateTimings, EndReason, Sandbox, SandboxEvent, SandboxState, Snapshot, SnapshotPolicy, SnapshotTrigger } from './sandbox.js';
export type { EgressLogEntry, EgressLogPage, EgressPolicy, ExposedPort, HeaderRule, IngressLogEntry, IngressLogPage, SecretAttachment, SecretInfo } from './records.js';
export { parseSizeMb } from './sizes.js';
export { parseVolumeMount } from './volume.js';
export type { DrainEvent, DrainResult, NodeInfo, NodeState } from './node.js';
export type { Volume, VolumeEntry, VolumeMount, VolumeSnapshot, VolumeUser } from './volume.js';
