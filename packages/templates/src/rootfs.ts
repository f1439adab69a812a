/**
 * Root file systems for sandboxes. `minimal` is busybox from Debian's busybox-static and
 * builds in milliseconds with no download; `base` is a Debian bookworm (bash, coreutils,
 * python3, git, curl, ca-certificates) made with mmdebstrap, built once and cached. A template
 * becomes visible only when complete (built in a temporary directory, then renamed).
 */
import { spawn } from 'node:child_process';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { SpaceError } from '@space/core';
import { run } from './exec.js';

/** Build state of one template. */
export interface TemplateStatus {
  name: string;
  state: 'ready' | 'building' | 'missing' | 'failed';
  /** 0–100 while building. */
  progress?: number;
  /** Current build step, or the failure. */
  message?: string;
  rootfs?: string;
}

/** Progress callback of a build. */
export type Progress = (percent: number, step: string) => void;

/** Templates this driver knows how to build. */
export const BUILTIN_TEMPLATES = ['minimal', 'base'] as const;

const BASE_PACKAGES = ['bash', 'coreutils', 'python3', 'git', 'curl', 'ca-certificates', 'procps'];

const PASSWD = 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n';
const GROUP = 'root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n';

/** mmdebstrap's info lines, in order, mapped to overall progress. */
const MMDEBSTRAP_STEPS: [RegExp, number, string][] = [
  [/chosen mode/, 5, 'preparing'],
  [/running apt-get update/, 10, 'updating package lists'],
  [/downloading packages/, 20, 'downloading packages'],
  [/extracting archives/, 45, 'extracting'],
  [/installing essential packages/, 55, 'installing essential packages'],
  [/installing remaining packages/, 70, 'installing packages'],
  [/running --customize-hook/, 88, 'adding the sandbox user'],
  [/cleaning package lists/, 93, 'cleaning up'],
  [/success/, 99, 'finishing'],
];

/**
 * Builds and finds template root file systems under one directory.
 *
 * @example
 * const t = new Templates('/var/lib/space/templates');
 * const rootfs = await t.ensure('minimal');
 */
export class Templates {
  private readonly building = new Map<string, { promise: Promise<string>; progress: number; step: string }>();
  private readonly failed = new Map<string, string>();

  constructor(
    readonly dir: string,
    private readonly opts: { mirror?: string; buildTimeoutMs?: number } = {},
  ) {}

  rootfs(name: string): string {
    return path.join(this.dir, name, 'rootfs');
  }

  isReady(name: string): boolean {
    return existsSync(path.join(this.dir, name, '.complete'));
  }

  status(name: string): TemplateStatus {
    if (!(BUILTIN_TEMPLATES as readonly string[]).includes(name)) throw new SpaceError('TEMPLATE_NOT_FOUND', `No template ${JSON.stringify(name)}; available: ${BUILTIN_TEMPLATES.join(', ')}`);
    if (this.isReady(name)) return { name, state: 'ready', rootfs: this.rootfs(name) };
    const b = this.building.get(name);
    if (b) return { name, state: 'building', progress: b.progress, message: b.step };
    const f = this.failed.get(name);
    if (f) return { name, state: 'failed', message: f };
    return { name, state: 'missing' };
  }

  /** Returns the template's rootfs, building it first if needed (one build at a time per name). */
  ensure(name: string, onProgress?: Progress): Promise<string> {
    if (this.isReady(name)) return Promise.resolve(this.rootfs(name));
    this.status(name); // validates the name
    let b = this.building.get(name);
    if (!b) {
      const entry = { progress: 0, step: 'starting', promise: Promise.resolve('') };
      const report: Progress = (p, s) => {
        entry.progress = p;
        entry.step = s;
      };
      entry.promise = this.build(name, report).then(
        (r) => {
          this.building.delete(name);
          this.failed.delete(name);
          return r;
        },
        (err: unknown) => {
          this.building.delete(name);
          this.failed.set(name, err instanceof Error ? err.message : String(err));
          throw err;
        },
      );
      this.building.set(name, entry);
      b = entry;
    }
    if (onProgress) {
      const entry = b;
      const t = setInterval(() => onProgress(entry.progress, entry.step), 500);
      void entry.promise.finally(() => clearInterval(t)).catch(() => {});
    }
    return b.promise;
  }

  private async build(name: string, progress: Progress): Promise<string> {
    const final = path.join(this.dir, name);
    const tmp = `${final}.tmp-${process.pid}-${Date.now()}`;
    await fs.mkdir(this.dir, { recursive: true });
    await fs.rm(final, { recursive: true, force: true });
    try {
      await fs.mkdir(tmp, { recursive: true });
      if (name === 'minimal') await this.buildMinimal(path.join(tmp, 'rootfs'));
      else await this.buildBase(path.join(tmp, 'rootfs'), progress);
      await fs.writeFile(path.join(tmp, '.complete'), new Date().toISOString());
      await fs.rename(tmp, final);
      progress(100, 'ready');
      return this.rootfs(name);
    } catch (err) {
      await fs.rm(tmp, { recursive: true, force: true });
      if (err instanceof SpaceError) throw err;
      throw new SpaceError('TEMPLATE_BUILD_FAILED', `Template ${name} failed to build: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
  }

  private async buildMinimal(root: string): Promise<void> {
    const busybox = ['/bin/busybox', '/usr/bin/busybox'].find((p) => existsSync(p));
    if (!busybox) throw new SpaceError('TEMPLATE_BUILD_FAILED', 'busybox is not installed', { details: { hint: 'apt-get install busybox-static' } });
    const { stdout: info } = await run('file', ['-L', busybox]).catch(() => ({ stdout: 'statically linked' }));
    if (!/static/.test(info)) throw new SpaceError('TEMPLATE_BUILD_FAILED', `${busybox} is not statically linked; install Debian's busybox-static`);
    for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'tmp', 'root', 'home/user', 'proc', 'sys', 'dev', 'run', 'var/tmp']) await fs.mkdir(path.join(root, d), { recursive: true });
    await fs.copyFile(busybox, path.join(root, 'bin/busybox'));
    await fs.chmod(path.join(root, 'bin/busybox'), 0o755);
    const { stdout } = await run(busybox, ['--list-full']);
    for (const applet of stdout.split('\n').map((s) => s.trim()).filter(Boolean)) {
      if (applet === 'bin/busybox' || applet.includes('..')) continue;
      const target = path.join(root, applet);
      await fs.mkdir(path.dirname(target), { recursive: true });
      await fs.symlink('/bin/busybox', target).catch(() => {});
    }
    await fs.writeFile(path.join(root, 'etc/passwd'), PASSWD);
    await fs.writeFile(path.join(root, 'etc/group'), GROUP);
    await fs.writeFile(path.join(root, 'etc/hosts'), '127.0.0.1 localhost\n::1 localhost\n');
    await fs.chmod(path.join(root, 'tmp'), 0o1777);
    await fs.chmod(path.join(root, 'var/tmp'), 0o1777);
    await fs.chmod(path.join(root, 'root'), 0o700);
    await fs.chown(path.join(root, 'home/user'), 1000, 1000);
  }

  private buildBase(root: string, progress: Progress): Promise<void> {
    const args = [
      '--variant=minbase',
      `--include=${BASE_PACKAGES.join(',')}`,
      '--customize-hook=chroot "$1" useradd --create-home --uid 1000 --user-group --shell /bin/bash user',
      'bookworm',
      root,
      ...(this.opts.mirror ? [this.opts.mirror] : []),
    ];
    return new Promise((resolve, reject) => {
      const child = spawn('mmdebstrap', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      const tail: string[] = [];
      let buf = '';
      const onData = (d: Buffer) => {
        buf += d.toString();
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          tail.push(line);
          if (tail.length > 20) tail.shift();
          for (const [re, pct, step] of MMDEBSTRAP_STEPS) if (re.test(line)) progress(pct, step);
        }
      };
      child.stdout.on('data', onData);
      child.stderr.on('data', onData);
      const timer = setTimeout(() => child.kill('SIGKILL'), this.opts.buildTimeoutMs ?? 15 * 60_000);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new SpaceError('TEMPLATE_BUILD_FAILED', `Cannot run mmdebstrap (${(err as NodeJS.ErrnoException).code}); install it: apt-get install mmdebstrap`, { cause: err }));
      });
      child.on('exit', (code, sig) => {
        clearTimeout(timer);
        if (code === 0) resolve();
        else reject(new SpaceError('TEMPLATE_BUILD_FAILED', `mmdebstrap failed (${sig ?? `exit ${code}`}) at step "${tail.filter((l) => /^[IE]:/.test(l)).pop() ?? '?'}": ${tail.slice(-3).join(' | ')}`));
      });
    });
  }
}
