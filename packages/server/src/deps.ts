/** What the HTTP API is built from (its own module, so that app.ts and routes.ts need not import each other). */
import type { DrainEvent, DrainResult, NodeInfo } from '@space/api';
import type { Ingress } from './ingress.js';
import type { FastifyBaseLogger } from 'fastify';
import type { ApiKeys, KeyService, SandboxDriver, SandboxService, SecretService } from '@space/core';

/** What the app needs. */
export interface AppDeps {
  service: SandboxService;
  keys: ApiKeys;
  /** The deployment's secret that console session cookies are MACed with (the same on every node). */
  sessionSecret: Buffer;
  /** Tenants' encryption keys. */
  encryptionKeys: KeyService;
  /** Collects snapshot chunks nothing references; resolves to how many went. */
  gc?: () => Promise<number>;
  /** The enabled drivers, the default first (for /v1/version and /v1/doctor). */
  drivers: SandboxDriver[];
  /** Largest file upload, bytes. */
  maxUploadBytes: number;
  /** A pino logger instance, or false for none. */
  logger: false | FastifyBaseLogger;
  /** URL of the E2B-compatible listener, if it runs. */
  e2bUrl?: string;
  /** This run's id, answered by `GET /v1/health` (see DaemonState.instance). */
  instance?: string;
  /** The ingress (absent when it is off): the URLs of exposed ports. */
  ingress?: Ingress;
  /** Tenants' secrets and the egress log (absent when sandbox networking is off). */
  secrets?: SecretService;
  /** The deployment's nodes (admin keys: `GET /v1/nodes`). */
  nodes?: () => Promise<NodeInfo[]>;
  /**
   * Set when nodes share the database (a cluster): this node's name, and where the nodes are
   * and whether they are up. Requests for sandboxes other nodes run are forwarded to them (forward.ts).
   */
  cluster?: {
    self: string;
    nodes: () => Promise<Pick<NodeInfo, 'name' | 'url' | 'state' | 'heartbeatAt' | 'draining' | 'drivers' | 'warm'>[]>;
    /** Whether this node is drained (creates go elsewhere). */
    draining: () => boolean;
    /** Drains this node (moves every session it runs to other nodes, telling `progress` as each goes) or ends that. */
    drain: (on: boolean, progress?: (ev: DrainEvent) => void) => Promise<DrainResult>;
  };
}
