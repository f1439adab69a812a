/**
 * @space/sdk — the TypeScript SDK of SPACE.
 *
 * @example
 * import { Sandbox } from '@space/sdk';
 * const sb = await Sandbox.create();        // SPACE_URL and SPACE_API_KEY from the environment
 * const { stdout } = await sb.commands.run('echo hi');
 * await sb.kill();
 */
export { Sandbox } from './sandbox.js';
export type { EgressLogPage, EgressPolicy, SandboxCreateOpts, SandboxEvent, SandboxInfo, SandboxListOpts, SandboxPage, SandboxState, SandboxUsage, SnapshotInfo, SnapshotPolicy } from './sandbox.js';
export { Commands, CommandHandle, outputEvents } from './commands.js';
export type { CommandResult, CommandRunOpts, OutputEvent, ProcessInfo } from './commands.js';
export { Files } from './files.js';
export type { EntryInfo, WriteData } from './files.js';
export { Ports } from './ports.js';
export type { ExposedPort, ExposeOpts, IngressLogPage } from './ports.js';
export { Pty, PtyHandle } from './pty.js';
export type { PtyCreateOpts } from './pty.js';
export { Secrets } from './secrets.js';
export type { SecretInfo, SecretSetOpts } from './secrets.js';
export { Volumes } from './volumes.js';
export { Nodes, type DrainEvent, type DrainOpts, type DrainResult } from './nodes.js';
export type { NodeInfo, NodeState } from './nodes.js';
export type { Volume, VolumeEntry, VolumeSnapshot } from './volumes.js';
export { Templates } from './templates.js';
export type { BuildProgress, TemplateBuildOpts, TemplateInfo } from './templates.js';
export { ApiClient, SpaceError } from './client.js';
export type { ConnectionOpts } from './client.js';
export type { ErrorCode } from '@space/api';
