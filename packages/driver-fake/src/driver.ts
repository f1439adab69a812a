/**
 * An in-memory {@link SandboxDriver}: each "sandbox" is a {@link FakeMachine} object and a
 * {@link FakeAgent} on an in-memory stream; a checkpoint writes the machine as JSON into the
 * image directory (so snapshots, encryption, dedup and restores run through core's real code).
 * No runsc, no QEMU, no root: core's lifecycle is tested in seconds on any machine.
 */
import { promises as fs } from 'node:fs';
import path from 'node:path';
import { Duplex } from 'node:stream';
import { CHECKPOINT_COMPLETE, type DriverCreateSpec, type DriverDisks, type DriverEvents, type DriverReport, type EndReason, type RuntimeStatus, type SandboxDriver, type SandboxUsage } from '@space/core';
import { FakeAgent, newMachine, type FakeMachine } from './agent.js';

/** The image file a checkpoint writes. */
const STATE_FILE = 'fake-machine.json';

/** Two ends of an in-memory byte stream: what one writes, the other reads; destroying one ends both. */
function duplexPair(): [Duplex, Duplex] {
  const ends: Duplex[] = [];
  const make = (peer: () => Duplex) =>
    new Duplex({
      read() {},
      write(chunk: Buffer, _enc, cb) {
        const p = peer();
        if (!p.destroyed) p.push(chunk);
        cb();
      },
      final(cb) {
        peer().push(null);
        cb();
      },
      destroy(err, cb) {
        const p = peer();
        if (!p.destroyed) p.destroy();
        cb(err);
      },
    });
  ends.push(make(() => ends[1]!), make(() => ends[0]!));
  return [ends[0]!, ends[1]!];
}

interface FakeSandbox {
  machine: FakeMachine;
  running: boolean;
  paused: boolean;
  /** Why it stopped on its own (a `die` command), as the runtime would say. */
  died?: { reason: EndReason; detail: string };
  /** The agent stays away (quiesced before a checkpoint, or detached). */
  detached: boolean;
  agent?: FakeAgent;
}

/** Options of {@link FakeDriver}. */
export interface FakeDriverOptions {
  /** The driver's name. @default "fake" */
  name?: string;
  /**
   * Sandbox disks, as a driver with disks declares them (the fake keeps no files on them; its
   * agent records the size an identity gives it, see {@link FakeMachine.diskBytes}). @default none
   */
  disks?: DriverDisks;
}

/** What {@link FakeDriver.refuseIdentity} is asked about. */
export interface FakeIdentityRequest {
  /** The sandbox the agent runs in. */
  sandboxId: string;
  /** The identity request as the agent got it (`sandboxId`, `hostname`, `env`, `diskBytes`, …). */
  request: Record<string, unknown>;
}

/**
 * The fake driver. One instance may outlive a `SandboxService` (as a runtime outlives a
 * daemon): a new service over the same store adopts its sandboxes.
 *
 * @example
 * const driver = new FakeDriver();
 * const svc = new SandboxService({ driver, store, blobs, rootfs: new FakeRootfs(dir), ... });
 */
export class FakeDriver implements SandboxDriver {
  readonly name: string;
  readonly checkpointsAnyState = true;
  /** Takes mounts (volumes), recording them: {@link mountsOf} says what each boot or restore was given. */
  readonly mounts = true;
  private readonly mounted = new Map<string, DriverCreateSpec['mounts']>();
  private events: DriverEvents | undefined;
  private readonly sandboxes = new Map<string, FakeSandbox>();
  /**
   * Set by a test: agents refuse identity requests for which it returns a message (with
   * DRIVER_FAILED, as a real agent whose disk does not grow), or close their connection without
   * an answer where it returns `'drop'` (and reconnect), as long as it is set.
   * @example driver.refuseIdentity = (r) => (r.request.diskBytes ? 'the disk did not grow' : undefined);
   */
  refuseIdentity?: (r: FakeIdentityRequest) => string | undefined;
  /** Calls made, in order (`create sb…`, `checkpoint sb…`): for tests that assert what ran. */
  readonly calls: string[] = [];

  /** Sandbox disks, when given (see {@link FakeDriverOptions.disks}). */
  readonly disks?: DriverDisks;

  constructor(opts: FakeDriverOptions = {}) {
    this.name = opts.name ?? 'fake';
    if (opts.disks) this.disks = opts.disks;
  }

  bind(events: DriverEvents): void {
    this.events = events;
  }

  async doctor(): Promise<DriverReport> {
    return { driver: this.name, available: true, checks: [{ name: 'in-memory', ok: true, detail: 'no runtime needed' }] };
  }

  async init(): Promise<void> {}

  async version(): Promise<string> {
    return 'fake-1';
  }

  /** The mounts the sandbox's last boot or restore was given (`target:source[:ro]`). */
  mountsOf(id: string): string[] {
    return (this.mounted.get(id) ?? []).map((m) => `${m.target}:${m.source}${m.readOnly ? ':ro' : ''}`);
  }

  async create(spec: DriverCreateSpec): Promise<void> {
    this.calls.push(`create ${spec.id}`);
    this.mounted.set(spec.id, spec.mounts);
    this.boot(spec.id, newMachine(spec.id, spec.env));
  }

  async restore(spec: DriverCreateSpec, imageDir: string): Promise<void> {
    this.calls.push(`restore ${spec.id}`);
    this.mounted.set(spec.id, spec.mounts);
    const machine = JSON.parse(await fs.readFile(path.join(imageDir, STATE_FILE), 'utf8')) as FakeMachine;
    this.sandboxes.get(spec.id)?.agent?.close();
    this.boot(spec.id, machine);
  }

  async checkpoint(id: string, imageDir: string): Promise<void> {
    this.calls.push(`checkpoint ${id}`);
    const sb = this.must(id);
    await fs.mkdir(imageDir, { recursive: true });
    await fs.writeFile(path.join(imageDir, STATE_FILE), JSON.stringify(sb.machine));
    await fs.writeFile(path.join(imageDir, CHECKPOINT_COMPLETE), new Date().toISOString());
    // As a runtime's checkpoint does: the sandbox is stopped afterwards; a restore brings it back.
    sb.running = false;
    sb.agent?.close();
  }

  async adopt(id: string): Promise<boolean> {
    const sb = this.sandboxes.get(id);
    if (!sb?.running) return false;
    sb.detached = false;
    this.connect(id);
    return true;
  }

  async status(id: string): Promise<RuntimeStatus> {
    const sb = this.sandboxes.get(id);
    if (sb?.running) return { running: true };
    return { running: false, ...(sb?.died ? { reason: sb.died.reason, detail: sb.died.detail } : {}) };
  }

  async usage(id: string): Promise<SandboxUsage> {
    return { rssBytes: this.sandboxes.get(id)?.running ? 8 << 20 : 0 };
  }

  async pause(id: string): Promise<void> {
    this.must(id).paused = true;
  }

  async resume(id: string): Promise<void> {
    this.must(id).paused = false;
  }

  async detachAgent(id: string): Promise<void> {
    const sb = this.sandboxes.get(id);
    if (sb) sb.detached = true;
  }

  async retire(id: string): Promise<void> {
    const sb = this.sandboxes.get(id);
    if (sb && !sb.running) this.sandboxes.delete(id);
  }

  async destroy(id: string): Promise<void> {
    this.calls.push(`destroy ${id}`);
    this.sandboxes.get(id)?.agent?.close();
    this.sandboxes.delete(id);
  }

  async list(): Promise<string[]> {
    return [...this.sandboxes.keys()];
  }

  /** Drops every agent connection; the sandboxes keep "running" for the next service to adopt. */
  async close(): Promise<void> {
    for (const sb of this.sandboxes.values()) {
      sb.detached = true;
      sb.agent?.close();
      sb.agent = undefined;
    }
  }

  /** Whether the runtime holds the sandbox paused (undefined: it holds no such sandbox), for tests. */
  isPaused(id: string): boolean | undefined {
    return this.sandboxes.get(id)?.paused;
  }

  /** The machine of a sandbox, for tests that look inside. */
  machine(id: string): FakeMachine | undefined {
    return this.sandboxes.get(id)?.machine;
  }

  private must(id: string): FakeSandbox {
    const sb = this.sandboxes.get(id);
    if (!sb) throw new Error(`fake driver: no sandbox ${id}`);
    return sb;
  }

  private boot(id: string, machine: FakeMachine): void {
    this.sandboxes.set(id, { machine, running: true, paused: false, detached: false });
    setImmediate(() => this.connect(id));
  }

  private connect(id: string): void {
    const sb = this.sandboxes.get(id);
    if (!sb?.running || sb.detached || !this.events) return;
    const [daemonEnd, agentEnd] = duplexPair();
    const agent = new FakeAgent(sb.machine, agentEnd, {
      quiesced: () => (sb.detached = true),
      refuseIdentity: (request) => this.refuseIdentity?.({ sandboxId: id, request }),
      die: (reason) => {
        sb.running = false;
        sb.died = { reason, detail: reason === 'oom' ? 'the fake sandbox ran out of memory' : 'the fake sandbox crashed' };
        sb.agent?.close();
      },
    });
    sb.agent = agent;
    // Like a real agent: one that loses its connection while running comes back.
    agentEnd.on('close', () => {
      if (sb.agent === agent) sb.agent = undefined;
      if (sb.running && !sb.detached && this.sandboxes.get(id) === sb) setTimeout(() => this.connect(id), 20).unref();
    });
    this.events.agentConnected(id, daemonEnd);
  }
}
