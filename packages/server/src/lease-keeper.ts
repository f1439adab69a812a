/**
 * The lease keeper: a cluster node's sandboxes must not run on once other nodes may have taken
 * them over. While the daemon lives, it pauses them itself when it cannot heartbeat (core's
 * `leaseLost`). A daemon that dies (SIGKILL, OOM, a crash) or hangs cannot: its runsc sandboxes
 * are processes of their own and run on, while after `--node-lost-after` another node restores
 * the same sessions from their snapshots — each session would then run twice, with its
 * credentials, side effects and all. The keeper is a small process of its own (detached, so it
 * outlives the daemon) that watches the daemon's lease file: when the daemon's last good
 * heartbeat is older than two thirds of `--node-lost-after` (before any other node may take
 * over; a live daemon renews it every third),
 * it pauses every running container of the node's runtime, says which in a file and exits. The
 * next daemon of the node (or this one, if it was only hung) resumes those still its own and
 * removes the rest (taken over).
 *
 * gVisor's containers are paused with `runsc pause`, microVMs with QMP `stop` (both freeze the
 * guest where it stands; `runsc resume` / QMP `cont` let it go on).
 *
 * Run by the daemon: `node lease-keeper.js CONFIG.json`.
 */
import { execFile, spawn } from 'node:child_process';
import { promises as fs, readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { readKernelFile } from '@space/core';
import { qmp } from '@space/driver-microvm';

const exec = promisify(execFile);

/** What the keeper is told (written by the daemon as its config file). */
export interface KeeperConfig {
  /** The lease file the daemon rewrites after each good heartbeat. */
  leaseFile: string;
  /** Where the keeper lists the sandboxes it paused. */
  pausedFile: string;
  /** The cluster's `--node-lost-after`: the keeper acts after two thirds of it without a good heartbeat. */
  lostAfterMs: number;
  /** The runsc binary and the state roots of the node's gVisor runtimes. */
  runsc: string;
  roots: string[];
  /** The microVM driver's VM directories (`<dir>/<sandbox id>/qmp.sock`). @default [] */
  vmDirs?: string[];
  /** How often the lease is read. @default 250 */
  everyMs?: number;
}

/** The lease file: the daemon's last good heartbeat, its keeper, and whether it stopped. */
export interface Lease {
  beatOkAt: number;
  /** The keeper watching this lease; another (older) keeper seeing a different pid exits. */
  keeper?: number;
  /** Set by a daemon stopping cleanly: its sandboxes stay as they are, the keeper exits. */
  stopped?: boolean;
}

/** What a keeper that acted leaves for the next daemon. */
export interface PausedByKeeper {
  at: string;
  /** The sandboxes (ids as the daemon names them). */
  ids: string[];
  /** The runtime's containers it paused (a sandbox's current incarnation and any stale one). */
  containers: { root: string; rid: string }[];
  /** The microVMs it stopped (QMP `stop`): each VM's control socket. */
  vms?: { id: string; qmp: string }[];
}

/** The keeper's config file of a lease (also how its process is recognised). */
function keeperConfigFile(leaseFile: string): string {
  return `${leaseFile}.keeper.json`;
}

/** Writes `data` to `file` whole (a reader never sees half of it). */
async function writeWhole(file: string, data: unknown): Promise<void> {
  await fs.writeFile(`${file}.tmp`, JSON.stringify(data), { mode: 0o600 });
  await fs.rename(`${file}.tmp`, file);
}

/**
 * The daemon's side: rewrites the lease after each good heartbeat, starts the keeper, and on a
 * clean stop tells it so and stops it.
 *
 * @example
 * const lease = new LeaseKeeper({ leaseFile, pausedFile, lostAfterMs: 30_000, runsc: 'runsc', roots: ['/var/lib/space/runsc'] });
 * await lease.start(); // after each good heartbeat: await lease.renewed();
 * await lease.stop();
 */
export class LeaseKeeper {
  private pid: number | undefined;

  constructor(private readonly config: KeeperConfig) {}

  /** Starts a keeper (a detached process) and writes a fresh lease naming it. */
  async start(): Promise<void> {
    const configFile = keeperConfigFile(this.config.leaseFile);
    await writeWhole(configFile, this.config);
    const script = path.join(path.dirname(fileURLToPath(import.meta.url)), 'lease-keeper.js');
    const child = spawn(process.execPath, [script, configFile], { detached: true, stdio: 'ignore' });
    child.unref();
    this.pid = child.pid;
    await writeWhole(this.config.leaseFile, { beatOkAt: Date.now(), ...(this.pid ? { keeper: this.pid } : {}) } satisfies Lease);
  }

  /**
   * The daemon heartbeated: the lease is fresh. If the keeper acted meanwhile (the daemon was
   * hung, or cut off from the database), a new one starts, and the ids it paused are returned:
   * the daemon resumes those still its own and removes the rest (core's `leaseRenewed`).
   */
  async renewed(): Promise<string[]> {
    const paused = await LeaseKeeper.takePaused(this.config.pausedFile);
    if (paused.length) return this.start().then(() => paused);
    await writeWhole(this.config.leaseFile, { beatOkAt: Date.now(), ...(this.pid ? { keeper: this.pid } : {}) } satisfies Lease);
    return [];
  }

  /** A clean stop: the sandboxes stay as they are (they are re-adopted at the next start). */
  async stop(): Promise<void> {
    await writeWhole(this.config.leaseFile, { beatOkAt: Date.now(), stopped: true } satisfies Lease).catch(() => {});
    if (this.pid) {
      try {
        process.kill(this.pid, 'SIGTERM');
      } catch {
        // gone already
      }
    }
    this.pid = undefined;
  }

  /**
   * A daemon starting, before it reads what a keeper paused: retires the keepers of the daemon
   * before it. One may be acting right now (the old daemon died and its lease went stale): it
   * pauses, *then* writes what it paused, so a daemon reading the record before it is written
   * would find none and the paused sandboxes would stay paused. The lease is marked stopped (a
   * keeper still watching exits without acting), then this waits for every keeper of the lease
   * to exit — found by its config file in its command line, not by a pid that may be reused —
   * killing any still there after `waitMs`. Returns how many it waited for and how many it killed.
   *
   * @example
   * await LeaseKeeper.retirePrevious(leaseFile);
   * await LeaseKeeper.resumeOwn(pausedFile, 'runsc', mine);
   */
  static async retirePrevious(leaseFile: string, waitMs = 30_000): Promise<{ waited: number; killed: number }> {
    const configFile = keeperConfigFile(leaseFile);
    const keepers = (): number[] => {
      const pids: number[] = [];
      for (const name of readdirSync('/proc')) {
        const pid = Number(name);
        if (!Number.isInteger(pid) || pid === process.pid) continue;
        if (readKernelFile(`/proc/${pid}/cmdline`).split('\0').includes(configFile)) pids.push(pid);
      }
      return pids;
    };
    const found = keepers();
    if (!found.length) return { waited: 0, killed: 0 };
    await writeWhole(leaseFile, { beatOkAt: Date.now(), stopped: true } satisfies Lease).catch(() => {});
    const deadline = Date.now() + waitMs;
    let left = found;
    while (left.length && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
      left = keepers();
    }
    for (const pid of left) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone meanwhile
      }
    }
    return { waited: found.length, killed: left.length };
  }

  /**
   * What a keeper paused while no daemon held the lease (and forgets it): the next daemon
   * resumes those that are still its own and running.
   */
  static async takePaused(pausedFile: string): Promise<string[]> {
    return (await LeaseKeeper.takePausedContainers(pausedFile))?.ids ?? [];
  }

  /** {@link takePaused} with the containers (for a daemon starting, before its runtime is adopted). */
  static async takePausedContainers(pausedFile: string): Promise<PausedByKeeper | undefined> {
    let paused: PausedByKeeper;
    try {
      paused = JSON.parse(await fs.readFile(pausedFile, 'utf8')) as PausedByKeeper;
    } catch {
      return undefined;
    }
    await fs.rm(pausedFile, { force: true });
    return paused;
  }

  /**
   * A daemon starting: resumes what a keeper paused of the sandboxes `mine` still says are this
   * node's and running (their re-adoption needs them running); the others, taken over by other
   * nodes meanwhile, stay paused until start-up recovery removes them.
   */
  static async resumeOwn(pausedFile: string, runsc: string, mine: (id: string) => Promise<boolean>): Promise<{ resumed: string[]; left: string[] }> {
    const paused = await LeaseKeeper.takePausedContainers(pausedFile);
    const out = { resumed: [] as string[], left: [] as string[] };
    for (const { root, rid } of paused?.containers ?? []) {
      const id = rid.split('-')[0]!;
      if (await mine(id)) {
        await exec(runsc, ['--root', root, 'resume', rid], { timeout: 10_000 }).catch(() => {});
        out.resumed.push(id);
      } else out.left.push(id);
    }
    for (const vm of paused?.vms ?? []) {
      if (await mine(vm.id)) {
        await qmp(vm.qmp, [{ execute: 'cont' }], 10_000).catch(() => {});
        out.resumed.push(vm.id);
      } else out.left.push(vm.id);
    }
    return out;
  }
}

/** Stops every running microVM under `dir` (QMP `stop`); returns those it stopped. */
async function stopVms(dir: string): Promise<{ id: string; qmp: string }[]> {
  const ids = await fs.readdir(dir).catch(() => [] as string[]);
  const stopped = await Promise.all(
    ids.map(async (id) => {
      const sock = path.join(dir, id, 'qmp.sock');
      try {
        // Only running ones: a VM its user paused stays paused when the next daemon resumes these.
        const [status] = (await qmp(sock, [{ execute: 'query-status' }], 5_000)) as { running?: boolean }[];
        if (!status?.running) return undefined;
        await qmp(sock, [{ execute: 'stop' }], 5_000);
        return { id, qmp: sock };
      } catch {
        return undefined; // no VM (a directory left behind), or its QEMU is gone
      }
    }),
  );
  return stopped.filter((v): v is { id: string; qmp: string } => !!v);
}

/** The running containers under a runsc root. */
async function runningContainers(runsc: string, root: string): Promise<string[]> {
  const { stdout } = await exec(runsc, ['--root', root, 'list', '-format=json'], { timeout: 10_000 });
  const list = (JSON.parse(stdout) as { id: string; status: string }[] | null) ?? [];
  return list.filter((c) => c.status === 'running').map((c) => c.id);
}

/**
 * The keeper's loop: returns when the daemon stopped cleanly, another keeper replaced this one,
 * or after pausing the runtime's sandboxes (the ids, as the daemon names sandboxes).
 */
export async function keep(config: KeeperConfig, self = process.pid): Promise<string[] | undefined> {
  for (;;) {
    let lease: Lease | undefined;
    try {
      lease = JSON.parse(await fs.readFile(config.leaseFile, 'utf8')) as Lease;
    } catch {
      lease = undefined; // being replaced, or gone with the data directory
    }
    if (!lease || lease.stopped || (lease.keeper !== undefined && lease.keeper !== self)) return undefined;
    if (Date.now() - lease.beatOkAt > (config.lostAfterMs * 2) / 3) {
      const containers: PausedByKeeper['containers'] = [];
      for (const root of config.roots) {
        // Every running container of the root (a session's, and its stale incarnations'), at once.
        const rids = await runningContainers(config.runsc, root).catch(() => []);
        await Promise.all(rids.map(async (rid) => {
          if (await exec(config.runsc, ['--root', root, 'pause', rid], { timeout: 10_000 }).then(() => true, () => false)) containers.push({ root, rid });
        }));
      }
      const vms = (await Promise.all((config.vmDirs ?? []).map(stopVms))).flat();
      const ids = [...new Set([...containers.map((c) => c.rid.split('-')[0]!), ...vms.map((v) => v.id)])];
      await writeWhole(config.pausedFile, { at: new Date().toISOString(), ids, containers, ...(vms.length ? { vms } : {}) } satisfies PausedByKeeper);
      return ids;
    }
    await new Promise((r) => setTimeout(r, config.everyMs ?? 250));
  }
}

// Run as a program: node lease-keeper.js CONFIG.json
if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const config = JSON.parse(readFileSync(process.argv[2]!, 'utf8')) as KeeperConfig;
  process.on('SIGTERM', () => process.exit(0));
  keep(config).then(
    () => process.exit(0),
    () => process.exit(1),
  );
}
