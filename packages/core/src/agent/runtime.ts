/**
 * The agent's runtime: the host's node binary, the shared libraries it links, the bundled
 * agent, its native files (the static helper, the compatibility shim) and node-pty's addon, laid out in one directory that every sandbox mounts read-only
 * at /.space. Run through the bundled dynamic loader, it works in any rootfs (even one with
 * only busybox). Built once per (node, agent) pair, atomically.
 */
import { createHash } from 'node:crypto';
import { existsSync, promises as fs } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { AGENT_RUNTIME_DIR } from '@space/protocol';
import { run } from '../exec.js';

/** Where things are inside the sandbox. */
export const RUNTIME = {
  loader: `${AGENT_RUNTIME_DIR}/lib/ld-linux-x86-64.so.2`,
  libDir: `${AGENT_RUNTIME_DIR}/lib`,
  node: `${AGENT_RUNTIME_DIR}/node`,
  agent: `${AGENT_RUNTIME_DIR}/agent.cjs`,
  /** The static helper (init, exec without CAP_SYS_ADMIN, terminals, sudo; native/helper.c). */
  helper: `${AGENT_RUNTIME_DIR}/space-helper`,
  /** The compatibility shim a driver may preload into the sandbox's programs (gVisor does). */
  compatLib: `${AGENT_RUNTIME_DIR}/libspace-compat.so`,
} as const;

/**
 * The argv that starts the agent inside a sandbox: under the helper's `init` as pid 1, which
 * reaps orphaned processes (the agent, a Node program, cannot), so none stays a zombie.
 */
export const AGENT_ARGV = [RUNTIME.helper, 'init', '--', RUNTIME.loader, '--library-path', RUNTIME.libDir, RUNTIME.node, '--single-threaded', '--max-semi-space-size=1', '--max-old-space-size=96', RUNTIME.agent];

async function libsOf(binary: string): Promise<{ libs: string[]; loader: string }> {
  const { stdout } = await run('ldd', [binary]);
  const libs: string[] = [];
  let loader = '';
  for (const line of stdout.split('\n')) {
    const m = /=>\s+(\S+)\s+\(/.exec(line);
    if (m) libs.push(m[1]!);
    else {
      const l = /^\s*(\/\S+ld-linux\S*)\s+\(/.exec(line);
      if (l) loader = l[1]!;
    }
  }
  if (!loader) throw new Error(`cannot find the dynamic loader of ${binary} in ldd output`);
  return { libs, loader };
}

async function copyDir(src: string, dst: string, skip: (rel: string) => boolean, rel = ''): Promise<void> {
  await fs.mkdir(dst, { recursive: true });
  for (const e of await fs.readdir(src, { withFileTypes: true })) {
    const r = path.join(rel, e.name);
    if (skip(r)) continue;
    if (e.isDirectory()) await copyDir(path.join(src, e.name), path.join(dst, e.name), skip, r);
    else if (e.isFile()) await fs.copyFile(path.join(src, e.name), path.join(dst, e.name));
  }
}

/**
 * Ensures the runtime directory under `baseDir` is current; returns its path. `nativeFiles`
 * (the helper, the compatibility shim) are copied to the runtime's top directory under their
 * own names, executable; their contents are part of the runtime's key.
 *
 * @example
 * const dir = await ensureRuntime('/var/lib/space/runtime', AGENT_BUNDLE, [AGENT_HELPER, AGENT_COMPAT_LIB]);
 */
export async function ensureRuntime(baseDir: string, agentBundle: string, nativeFiles: readonly string[], nodeBinary = process.execPath): Promise<string> {
  const nodeStat = await fs.stat(nodeBinary);
  const agent = await fs.readFile(agentBundle);
  const natives = await Promise.all(nativeFiles.map(async (f) => ({ name: path.basename(f), data: await fs.readFile(f) })));
  const require = createRequire(import.meta.url);
  const ptyDir = path.dirname(require.resolve('node-pty/package.json', { paths: [path.dirname(agentBundle)] }));
  const ptyAddon = path.join(ptyDir, 'build', 'Release', 'pty.node');
  const key = createHash('sha256')
    .update(`${nodeBinary}:${nodeStat.size}:${nodeStat.mtimeMs}\0`)
    .update(agent)
    .update(Buffer.concat(natives.flatMap((n) => [Buffer.from(`${n.name}\0`), n.data])))
    .update(existsSync(ptyAddon) ? await fs.readFile(ptyAddon) : Buffer.alloc(0))
    .digest('hex')
    .slice(0, 16);
  const dir = path.join(baseDir, key);
  if (existsSync(path.join(dir, '.complete'))) return dir;

  const tmp = `${dir}.tmp-${process.pid}`;
  await fs.rm(tmp, { recursive: true, force: true });
  await fs.mkdir(path.join(tmp, 'lib'), { recursive: true });
  await fs.copyFile(nodeBinary, path.join(tmp, 'node'));
  const { libs, loader } = await libsOf(nodeBinary);
  for (const lib of [...libs, loader]) await fs.copyFile(lib, path.join(tmp, 'lib', path.basename(lib)));
  await fs.writeFile(path.join(tmp, 'agent.cjs'), agent);
  for (const n of natives) await fs.writeFile(path.join(tmp, n.name), n.data, { mode: 0o755 });
  await copyDir(ptyDir, path.join(tmp, 'node_modules', 'node-pty'), (r) => /^(src|deps|scripts|third_party|typings|binding\.gyp)/.test(r) || (r.startsWith('build') && !r.startsWith(path.join('build', 'Release')) && r !== 'build') || /\.(o|d|mk|a)$/.test(r) || r.includes('obj.target') || r.includes('.deps'));
  for (const f of ['node', 'agent.cjs', ...natives.map((n) => n.name)]) await fs.chmod(path.join(tmp, f), 0o755);
  await fs.writeFile(path.join(tmp, '.complete'), new Date().toISOString());
  await fs.chmod(tmp, 0o755);
  try {
    await fs.rename(tmp, dir);
  } catch {
    // another process finished the same runtime first
    await fs.rm(tmp, { recursive: true, force: true });
  }
  return dir;
}
