/**
 * @space/core — the sandbox lifecycle, the error registry and the interfaces that drivers
 * (`SandboxDriver`) and stores (`MetadataStore`) implement. Imports no driver, HTTP framework
 * or database driver.
 */
export { ERRORS, SpaceError, asErrorCode, isErrorCode, isUnreachableError, toSpaceError } from './errors.js';
export type { ErrorBody, ErrorCode, ErrorSpec, SpaceErrorOptions } from './errors.js';
export { ALLOWED, LIMITS, SANDBOX_ID_RE, SANDBOX_STATES, TERMINAL_STATES, assertAllowed, newSandboxId, randomString } from './model.js';
export type { CreateTimings, EndReason, Sandbox, SandboxAction, SandboxEvent, SandboxState, Snapshot, SnapshotPolicy, SnapshotTrigger, Template, TemplateImage, TemplateSource, TemplateStart } from './model.js';
export { TEMPLATE_NAME_RE } from './model.js';
export type { Progress, RootfsBuild, RootfsBuilder, RootfsSource } from './ports/rootfs-builder.js';
export { newSnapshotId } from './model.js';
export type { BlobCollectionLock, BlobInfo, BlobStore } from './ports/blob-store.js';
export { SNAPSHOT_FORMAT_VERSION, SNAPSHOT_MAGIC, packSnapshot, readSnapshot } from './storage/snapshot-format.js';
export type { SnapshotMeta } from './storage/snapshot-format.js';
export type { VolumeHost, VolumeHostReport } from './ports/volume-host.js';
export type { DriverCreateSpec, DriverDisks, DriverMount, DriverEvents, DriverReport, ImageFileCodec, RestoreTimings, RuntimeStatus, SandboxDriver, SandboxUsage } from './ports/driver.js';
export { Laps } from './laps.js';
export type { ApiKeyRecord, MetadataStore, SandboxExpectation, SandboxPage, SandboxQuery, TenantCaRecord } from './ports/metadata-store.js';
export { checkExpectation } from './ports/metadata-store.js';
export { AgentCall, AgentChannel } from './agent/channel.js';
export type { OutputChunk } from './agent/channel.js';
export { SandboxService } from './service.js';
export { FORK_PARALLEL } from './sandboxes/fork.js';
export { Journal } from './ports/intent-journal.js';
export { UsageHistory } from './sandboxes/usage-history.js';
export type { UsageSample, UsageSource } from './sandboxes/usage-history.js';
export type { Intent, IntentOp, IntentStep, IntentStore } from './ports/intent-journal.js';
export { checkPath, fileMetadataFromHeaders, FILE_METADATA_HEADER } from './validate.js';
export { TemplateService, templateImageBlobKey } from './templates/template-service.js';
export type { TemplateBuildRequest, TemplateImageStore, TemplateServiceOptions, TemplateUpload } from './templates/template-service.js';
export { WarmPool, poolKey } from './templates/warm-pool.js';
export type { PoolHooks, PoolStatus } from './templates/warm-pool.js';
export type { CreateSandboxOpts, ForkResult, ListSandboxesOpts, SandboxChange, SandboxEgressOptions, SandboxServiceOptions } from './service.js';
export type { Logger } from './logger.js';
export type { FaultAction } from './sandboxes/faults.js';
export { ApiKeys, publicKey } from './security/api-keys.js';
export type { CreatedApiKey, Principal } from './security/api-keys.js';
export { KeyService, LocalKeyProvider, NODE_TENANT, seal, unseal } from './security/keys.js';
export type { DataKeyRecord, KeyProvider, TenantKey } from './security/keys.js';
export type { NodeRecord, PortExposure, VolumeRecord, VolumeSnapshotRecord } from './records.js';
export { EncryptedBlobStore, ENCRYPTION_CHUNK } from './storage/encrypted-blobs.js';
export { DedupBlobStore, PACK_TARGET, cutPoint } from './storage/dedup-blobs.js';
export { AsyncQueue, KeyedSerial } from './async-queue.js';
export { Volumes, VOLUME_NAME_RE, checkMountPath } from './volumes/volumes.js';
export type { ResolvedMount, VolumesOptions } from './volumes/volumes.js';
export { VolumeFiles } from './volumes/volume-files.js';
export type { VolumeFileMeta } from './volumes/volume-files.js';
export { DEFAULT_EGRESS_POLICY, EGRESS_LIMITS, MAX_SECRET_BYTES, SecretService, checkEgressPolicy, checkHeaderRules, checkSecretName, cidrList, hostMatches, newPlaceholder, parseCidr } from './security/egress-policy.js';
export type { EgressLogEntry, EgressLogPage, EgressPolicy, HeaderRule, SecretAttachment, SecretInfo, SecretRecord, SecretSpec } from './security/egress-policy.js';
export type { SandboxNetwork } from './ports/driver.js';
export { CHECKPOINT_COMPLETE } from './ports/driver.js';
export { mountPoints, readKernelFile, run, tryRun } from './exec.js';
export type { RunResult } from './exec.js';
export { AGENT_ARGV, RUNTIME, ensureRuntime } from './agent/runtime.js';
export { EVERY_PORT, MAX_EXPOSURE_S, checkHostHeader } from './sandboxes/ports.js';
export type { ExposeEveryRequest, ExposeRequest } from './sandboxes/ports.js';
export type { IngressLogEntry, IngressLogPage } from './records.js';
export { DriverRouter } from './ports/driver-router.js';
