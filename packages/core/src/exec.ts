/** Running host commands with a timeout, and errors that carry their output; the host's mount table. */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { SpaceError } from './errors.js';

/** Output of a finished command. */
export interface RunResult {
  stdout: string;
  stderr: string;
}

/**
 * Runs `cmd args` and resolves with its output; rejects with `DRIVER_FAILED` (stderr in the
 * message) when it fails or outlives `timeoutMs`. `input` is written to its stdin; `env` is added
 * to the daemon's environment.
 *
 * @example
 * const { stdout } = await run('runsc', ['--version']);
 */
export function run(cmd: string, args: string[], timeoutMs = 30_000, input?: string, env?: Record<string, string>): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = execFile(cmd, args, { timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 16 * 1024 * 1024, ...(env ? { env: { ...process.env, ...env } } : {}) }, (err, stdout, stderr) => {
      if (err) {
        // A Go panic's message is at the top and its stack at the bottom: keep the lines that say what went wrong.
        const lines = (stderr || err.message).trim().split('\n');
        const telling = lines.filter((l) => /panic|error|fatal|fail/i.test(l) && !/^\s*(goroutine|\S+\.go:\d+|created by)/.test(l.trim())).slice(0, 3);
        const detail = [...telling, ...lines.slice(-2)].join(' | ');
        reject(new SpaceError('DRIVER_FAILED', `${cmd} ${args.slice(0, 6).join(' ')} failed: ${detail}`, { cause: err }));
      } else resolve({ stdout, stderr });
    });
    if (input !== undefined) child.stdin?.end(input);
  });
}

/** Like {@link run} but never rejects; for clean-up steps. */
export async function tryRun(cmd: string, args: string[], timeoutMs = 30_000, input?: string): Promise<RunResult | undefined> {
  try {
    return await run(cmd, args, timeoutMs, input);
  } catch {
    return undefined;
  }
}

/**
 * A procfs, sysfs or cgroupfs file's text, or `fallback` if it cannot be read (gone, no
 * permission). Read synchronously: these files live in the kernel's memory and answer at once,
 * and a sampler reading a dozen per sandbox every few seconds spent nearly all of an idle
 * daemon's CPU handing them to the thread pool (1.9% → 0.4% of a core, 20 idle sandboxes).
 * Not for files on disk.
 *
 * @example
 * const limit = Number(readKernelFile('/sys/fs/cgroup/memory/space/ID/memory.limit_in_bytes', '0').trim());
 */
export function readKernelFile(file: string, fallback = ''): string {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return fallback;
  }
}

/**
 * The mount points of this host (of the daemon's mount namespace), from /proc/self/mountinfo.
 *
 * @example
 * if (!mountPoints().has('/var/lib/space/disks/mnt')) await run('mount', [...]);
 */
export function mountPoints(): Set<string> {
  return new Set(
    readFileSync('/proc/self/mountinfo', 'utf8')
      .split('\n')
      .map((l) => l.split(' ')[4] ?? '')
      .filter(Boolean),
  );
}
