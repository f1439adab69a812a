/**
 * Template root file systems on disk, by content key. Built-ins: `minimal` is busybox from
 * Debian's busybox-static (milliseconds, no download); `base` is Debian bookworm with what
 * coding agents reach for (see {@link BASE_PACKAGES}), made by mmdebstrap. Custom templates come from a list of
 * Debian packages or from an uploaded image (see image.ts). Every build happens in a temporary
 * directory that is renamed into place when complete, so a crash or failure leaves nothing.
 */
import { execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import { SpaceError, type Progress, type RootfsBuild, type RootfsBuilder, type RootfsSource } from '@space/core';
import { importImage } from './image.js';

const exec = promisify(execFile);

/** Templates every node has. */
export const BUILTIN_TEMPLATES = ['minimal', 'base'] as const;

/**
 * Debian packages of the `base` template: a shell and the usual tools, Python with pip and
 * venv (`python` is python3), Node.js with npm, a C/C++ toolchain, sudo, and the small tools
 * agents call (jq, ripgrep, unzip, less, ps). Changing it changes the template's key.
 */
export const BASE_PACKAGES = [
  'bash', 'coreutils', 'procps', 'psmisc', 'less', 'file', 'sudo', 'tzdata',
  'ca-certificates', 'curl', 'git', 'jq', 'ripgrep', 'unzip', 'zip', 'xz-utils', 'sqlite3',
  'python3', 'python-is-python3', 'python3-pip', 'python3-venv',
  'nodejs', 'npm', 'build-essential',
];
const USER_HOOK = '--customize-hook=chroot "$1" sh -c "id -u user >/dev/null 2>&1 || useradd --create-home --uid 1000 --user-group --shell /bin/bash user"';
/**
 * What `base` sets up beyond its packages: passwordless sudo for `user` (root inside the
 * sandbox's own kernel; the sandbox is the boundary), and pip allowed to install outside a
 * venv (Debian 12 marks its Python externally managed; a sandbox is disposable, and agents run
 * `pip install` as on any laptop: as `user` it lands in ~/.local).
 */
const BASE_HOOKS = [
  `--customize-hook=printf 'user ALL=(ALL:ALL) NOPASSWD: ALL\\n' > "$1/etc/sudoers.d/space-user" && chmod 0440 "$1/etc/sudoers.d/space-user" && chroot "$1" usermod -aG sudo user`,
  `--customize-hook=printf '[global]\\nbreak-system-packages = true\\n' > "$1/etc/pip.conf"`,
];

/** What {@link RootfsStore.buildMinimal} lays out beyond users: a change here must bump it (a new cache key). */
const MINIMAL_LAYOUT = 2;
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

/** Debian package names (policy §5.6.1). */
const PACKAGE_RE = /^[a-z0-9][a-z0-9+.-]{1,99}$/;

/** Options of {@link RootfsStore}. */
export interface RootfsStoreOptions {
  /** Debian mirror for mmdebstrap. */
  mirror?: string;
  /** Longest a build may take. @default 15 min */
  buildTimeoutMs?: number;
}

/**
 * Root file systems cached under one directory: `<dir>/<key>/rootfs`.
 *
 * @example
 * const store = new RootfsStore('/var/lib/space/templates');
 * await store.build('minimal', { type: 'builtin', name: 'minimal' });
 * store.path('minimal'); // '/var/lib/space/templates/minimal/rootfs'
 */
export class RootfsStore implements RootfsBuilder {
  readonly builtins = BUILTIN_TEMPLATES;
  private readonly building = new Map<string, { promise: Promise<RootfsBuild>; listeners: Set<Progress>; last: [number, string] }>();

  constructor(
    readonly dir: string,
    private readonly opts: RootfsStoreOptions = {},
  ) {}

  /**
   * `minimal-<hash of its users and layout>` and `base-<hash of its package list and set-up>`: a
   * node upgraded to a new built-in builds it anew instead of serving the old one from its cache.
   */
  builtinKey(name: string): string {
    if (name === 'minimal') return `minimal-${createHash('sha256').update(JSON.stringify([PASSWD, GROUP, MINIMAL_LAYOUT])).digest('hex').slice(0, 12)}`;
    if (name !== 'base') return name;
    return `base-${createHash('sha256').update(JSON.stringify([BASE_PACKAGES, USER_HOOK, BASE_HOOKS])).digest('hex').slice(0, 12)}`;
  }

  path(key: string): string {
    return path.join(this.dir, key, 'rootfs');
  }

  has(key: string): boolean {
    return existsSync(path.join(this.dir, key, '.complete'));
  }

  async remove(key: string): Promise<void> {
    await fs.rm(path.join(this.dir, key), { recursive: true, force: true });
  }

  build(key: string, source: RootfsSource, progress?: Progress, signal?: AbortSignal): Promise<RootfsBuild> {
    if (!/^[a-z0-9][a-z0-9._-]{0,127}$/.test(key)) throw new SpaceError('BAD_REQUEST', `Invalid template key ${JSON.stringify(key)}`);
    let b = this.building.get(key);
    if (!b) {
      if (this.has(key)) return this.readBuild(key);
      const entry = { listeners: new Set<Progress>(), last: [0, 'starting'] as [number, string], promise: Promise.resolve({} as RootfsBuild) };
      const report: Progress = (p, s) => {
        entry.last = [p, s];
        for (const l of entry.listeners) l(p, s);
      };
      entry.promise = this.buildNow(key, source, report, signal).finally(() => this.building.delete(key));
      this.building.set(key, entry);
      b = entry;
    }
    if (progress) {
      const entry = b;
      entry.listeners.add(progress);
      progress(...entry.last);
      void entry.promise.finally(() => entry.listeners.delete(progress)).catch(() => {});
    }
    return b.promise;
  }

  private async readBuild(key: string): Promise<RootfsBuild> {
    try {
      return JSON.parse(await fs.readFile(path.join(this.dir, key, 'build.json'), 'utf8')) as RootfsBuild;
    } catch {
      return { sizeBytes: 0, env: {} };
    }
  }

  private async buildNow(key: string, source: RootfsSource, progress: Progress, signal?: AbortSignal): Promise<RootfsBuild> {
    const final = path.join(this.dir, key);
    const tmp = `${final}.tmp-${process.pid}-${Date.now()}`;
    await fs.mkdir(this.dir, { recursive: true });
    await fs.rm(final, { recursive: true, force: true });
    const root = path.join(tmp, 'rootfs');
    try {
      await fs.mkdir(root, { recursive: true, mode: 0o755 });
      let result: RootfsBuild = { sizeBytes: 0, env: {} };
      if (source.type === 'builtin') {
        if (source.name === 'minimal') await this.buildMinimal(root);
        else if (source.name === 'base') await this.debootstrap(root, BASE_PACKAGES, progress, signal, BASE_HOOKS);
        else throw new SpaceError('TEMPLATE_NOT_FOUND', `No built-in template ${JSON.stringify(source.name)}`);
      } else if (source.type === 'debian') {
        const bad = source.packages.filter((p) => !PACKAGE_RE.test(p));
        if (bad.length || !source.packages.length) throw new SpaceError('BAD_REQUEST', `Invalid Debian package names: ${bad.join(', ') || '(none given)'}`);
        await this.debootstrap(root, source.packages, progress, signal);
      } else {
        const imported = await importImage(source.file, root, path.join(tmp, 'work'), progress, signal);
        result = { ...result, env: imported.env, format: imported.format };
        await fs.rm(path.join(tmp, 'work'), { recursive: true, force: true });
      }
      progress(95, 'preparing the root file system');
      await prepareRootfs(root);
      result.sizeBytes = await duBytes(root);
      await fs.writeFile(path.join(tmp, 'build.json'), JSON.stringify(result));
      await fs.writeFile(path.join(tmp, '.complete'), new Date().toISOString());
      await fs.rename(tmp, final);
      progress(100, 'root file system ready');
      return result;
    } catch (err) {
      await fs.rm(tmp, { recursive: true, force: true });
      if (err instanceof SpaceError) throw err;
      throw new SpaceError('TEMPLATE_BUILD_FAILED', `Template build failed: ${err instanceof Error ? err.message : String(err)}`, { cause: err });
    }
  }

  private async buildMinimal(root: string): Promise<void> {
    const busybox = ['/bin/busybox', '/usr/bin/busybox'].find((p) => existsSync(p));
    if (!busybox) throw new SpaceError('TEMPLATE_BUILD_FAILED', 'busybox is not installed', { details: { hint: 'apt-get install busybox-static' } });
    const { stdout: info } = await exec('file', ['-L', busybox]).catch(() => ({ stdout: 'statically linked' }));
    if (!/static/.test(info)) throw new SpaceError('TEMPLATE_BUILD_FAILED', `${busybox} is not statically linked; install Debian's busybox-static`);
    for (const d of ['bin', 'sbin', 'usr/bin', 'usr/sbin', 'etc', 'tmp', 'root', 'home/user', 'var/tmp']) await fs.mkdir(path.join(root, d), { recursive: true });
    await fs.copyFile(busybox, path.join(root, 'bin/busybox'));
    await fs.chmod(path.join(root, 'bin/busybox'), 0o755);
    const { stdout } = await exec(busybox, ['--list-full']);
    for (const applet of stdout.split('\n').map((s) => s.trim()).filter(Boolean)) {
      if (applet === 'bin/busybox' || applet.includes('..')) continue;
      const target = path.join(root, applet);
      await fs.mkdir(path.dirname(target), { recursive: true });
      await fs.symlink('/bin/busybox', target).catch(() => {});
    }
    await fs.writeFile(path.join(root, 'etc/passwd'), PASSWD);
    await fs.writeFile(path.join(root, 'etc/group'), GROUP);
    await fs.chmod(path.join(root, 'root'), 0o700);
    // The default user's home is its own (it was root's: `user` could not write in ~).
    await fs.chown(path.join(root, 'home/user'), 1000, 1000);
    await fs.chmod(path.join(root, 'home/user'), 0o755);
  }

  private debootstrap(root: string, packages: readonly string[], progress: Progress, signal?: AbortSignal, hooks: readonly string[] = []): Promise<void> {
    const args = ['--variant=minbase', `--include=${packages.join(',')}`, USER_HOOK, ...hooks, 'bookworm', root, ...(this.opts.mirror ? [this.opts.mirror] : [])];
    return new Promise((resolve, reject) => {
      const child = spawn('mmdebstrap', args, { stdio: ['ignore', 'pipe', 'pipe'] });
      const tail: string[] = [];
      let step = 'starting mmdebstrap';
      let buf = '';
      const onData = (d: Buffer) => {
        buf += d.toString();
        let i: number;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i);
          buf = buf.slice(i + 1);
          tail.push(line);
          if (tail.length > 30) tail.shift();
          for (const [re, pct, s] of MMDEBSTRAP_STEPS) if (re.test(line)) progress(pct * 0.9, (step = s));
        }
      };
      child.stdout.on('data', onData);
      child.stderr.on('data', onData);
      const kill = () => child.kill('SIGKILL');
      signal?.addEventListener('abort', kill, { once: true });
      const timer = setTimeout(kill, this.opts.buildTimeoutMs ?? 15 * 60_000);
      child.on('error', (err) => {
        clearTimeout(timer);
        reject(new SpaceError('TEMPLATE_BUILD_FAILED', `Cannot run mmdebstrap (${(err as NodeJS.ErrnoException).code}); install it: apt-get install mmdebstrap`, { cause: err }));
      });
      child.on('exit', (code, sig) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', kill);
        if (code === 0) return resolve();
        // apt's "E: Unable to locate package X" is the usual reason: say it plainly.
        const missing = tail.map((l) => /Unable to locate package (\S+)/.exec(l)?.[1]).filter(Boolean);
        const errors = tail.filter((l) => /^E:/.test(l)).slice(-3);
        const why = missing.length ? `no Debian package named ${missing.join(', ')} in bookworm` : errors.join(' | ') || tail.slice(-3).join(' | ');
        reject(new SpaceError('TEMPLATE_BUILD_FAILED', `mmdebstrap failed (${signal?.aborted ? 'cancelled' : (sig ?? `exit ${code}`)}) at step "${step}": ${why}`, { details: { step, missingPackages: missing } }));
      });
    });
  }
}

/**
 * What every sandbox needs of its root file system, whatever it was made from: the mount
 * points, a world-writable /tmp, and the default user (uid 1000) with a home directory.
 */
async function prepareRootfs(root: string): Promise<void> {
  for (const d of ['proc', 'sys', 'dev', 'run', 'tmp', 'var/tmp', 'etc', 'root']) await fs.mkdir(path.join(root, d), { recursive: true });
  await fs.chmod(path.join(root, 'tmp'), 0o1777);
  await fs.chmod(path.join(root, 'var/tmp'), 0o1777);
  const passwdFile = path.join(root, 'etc/passwd');
  const passwd = await fs.readFile(passwdFile, 'utf8').catch(() => '');
  const users = new Set(passwd.split('\n').map((l) => l.split(':')[0]));
  const uids = new Set(passwd.split('\n').map((l) => l.split(':')[2]));
  let add = '';
  if (!users.has('root')) add += 'root:x:0:0:root:/root:/bin/sh\n';
  if (!users.has('user') && !uids.has('1000')) add += 'user:x:1000:1000:user:/home/user:/bin/sh\n';
  if (add) await fs.writeFile(passwdFile, (passwd && !passwd.endsWith('\n') ? passwd + '\n' : passwd) + add);
  const groupFile = path.join(root, 'etc/group');
  const group = await fs.readFile(groupFile, 'utf8').catch(() => '');
  const groups = new Set(group.split('\n').map((l) => l.split(':')[0]));
  let addG = '';
  if (!groups.has('root')) addG += 'root:x:0:\n';
  if (!groups.has('user')) addG += 'user:x:1000:\n';
  if (addG) await fs.writeFile(groupFile, (group && !group.endsWith('\n') ? group + '\n' : group) + addG);
  if (!existsSync(path.join(root, 'etc/hosts'))) await fs.writeFile(path.join(root, 'etc/hosts'), '127.0.0.1 localhost\n::1 localhost\n');
  const home = path.join(root, 'home/user');
  if (!existsSync(home)) {
    await fs.mkdir(home, { recursive: true });
    await fs.chown(home, 1000, 1000);
  }
}

async function duBytes(dir: string): Promise<number> {
  const { stdout } = await exec('du', ['-sb', dir], { maxBuffer: 1 << 20 });
  return Number(stdout.split('\t')[0]) || 0;
}
