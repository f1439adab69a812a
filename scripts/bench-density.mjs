#!/usr/bin/env node
// Density (issue 17): N idle `minimal` sandboxes of a daemon (warm pool off) beside N bare runsc
// containers of the same rootfs running the agent's Node idle, in the same run: memory of their
// host processes (PSS; the bare ones also after a checkpoint and restore), what their cgroups
// charge, idle CPU (theirs and the daemon's), and the agent's own memory inside a sandbox beside
// an empty Node with the same flags.
//   node scripts/bench-density.mjs [--sandboxes 20] [--idle-seconds 30] [--write]
import { spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { bareOciConfig, quantile, runtimeDirOf, templateRootfs, writeSection } from './bench-lib.mjs';
import { AGENT_ARGV, RUNTIME, readKernelFile } from '../packages/core/dist/index.js';
import { Sandbox, Templates } from '../packages/sdk/dist/index.js';
import { TEMPLATES_DIR, startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { sandboxes: { type: 'string', default: '20' }, 'idle-seconds': { type: 'string', default: '30' }, iterations: { type: 'string' }, write: { type: 'boolean', default: false } } });
const N = Number(values.sandboxes);
const IDLE_S = Number(values['idle-seconds']);
const MiB = 1048576;
const CG = '/sys/fs/cgroup';
const TICK = Number(spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).stdout.trim()) || 100;

/** The host processes of a cgroup (memory controller) and their summed PSS in bytes. */
function pssOf(memCgroup) {
  let pss = 0;
  for (const pid of readKernelFile(path.join(memCgroup, 'cgroup.procs')).split('\n').filter(Boolean)) {
    const m = /^Pss:\s+(\d+) kB/m.exec(readKernelFile(`/proc/${pid}/smaps_rollup`));
    if (m) pss += Number(m[1]) * 1024;
  }
  return pss;
}
/** What a memory cgroup charges, less inactive file pages (the kernel reclaims those first). */
const workingSet = (memCgroup) => Number(readKernelFile(path.join(memCgroup, 'memory.usage_in_bytes'), '0')) - Number(/^total_inactive_file (\d+)$/m.exec(readKernelFile(path.join(memCgroup, 'memory.stat')))?.[1] ?? 0);
const cpuNs = (cpuCgroup) => Number(readKernelFile(path.join(cpuCgroup, 'cpuacct.usage'), '0'));
/** A process's user + system CPU time in ms. */
const procCpuMs = (pid) => {
  const f = readKernelFile(`/proc/${pid}/stat`).split(') ')[1]?.split(' ') ?? [];
  return ((Number(f[11]) + Number(f[12])) * 1000) / TICK;
};
const tryRmdir = (d) => {
  try {
    rmdirSync(d);
  } catch {
    // gone already, or shared by a controller listed twice
  }
};
/** The cgroups (memory, cpuacct) of each unit: SPACE's under space/<rid>, the bare ones under their own parent. */
const cgroupsUnder = (parent, names) => names.map((n) => ({ mem: path.join(CG, 'memory', parent, n), cpu: path.join(CG, 'cpuacct', parent, n) }));

/** PSS and working set of each unit now, and the CPU of all of them (and of `pid`) over the idle window. */
async function measure(units, pid) {
  const cpu0 = units.reduce((a, u) => a + cpuNs(u.cpu), 0);
  const d0 = pid ? procCpuMs(pid) : 0;
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, IDLE_S * 1000));
  const wall = performance.now() - t0;
  const cpu = (units.reduce((a, u) => a + cpuNs(u.cpu), 0) - cpu0) / 1e6;
  return {
    pss: units.map((u) => pssOf(u.mem)),
    ws: units.map((u) => workingSet(u.mem)),
    cpuPct: (100 * cpu) / wall,
    ...(pid ? { daemonPct: (100 * (procCpuMs(pid) - d0)) / wall } : {}),
  };
}

const dataDir = mkdtempSync('/tmp/spbd-');
// Files in memory (`--disks off`): the baseline is bare runsc with its root in memory; disks
// against memory are measured by bench-disks.mjs.
const spaced = await startSpaced(dataDir, { SPACE_DISKS: 'off' });
const { conn } = spaced;
const bareRoot = path.join(dataDir, 'bare');
const bareState = path.join(bareRoot, 'state');
const bareParent = `space-bench-${path.basename(dataDir)}`;
// (stdio ignored: a detached container inherits it, and spawnSync would wait for it to close)
const RUNSC = ['--root', bareState, '--network=none', '--overlay2=root:memory'];
const R = (...a) => spawnSync('runsc', [...RUNSC, ...a], { stdio: 'ignore' });
const made = [];
try {
  await Templates.setPool('minimal', 0, conn);
  await Templates.prepare('minimal', conn);
  for (let i = 0; i < N; i++) {
    const sb = await Sandbox.create({ ...conn, template: 'minimal', memoryMb: 256 });
    made.push(sb);
    await sb.commands.run('true');
  }
  // The agent inside (the largest process whose command line names it: the init that started
  // it does too), beside an empty Node with its flags (what the runtime itself takes).
  const agentRss = await Promise.all(made.slice(0, 5).map(async (sb) => Number((await sb.commands.run(`for p in /proc/[0-9]*; do if tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '${RUNTIME.agent}'; then sed -n 's/^VmRSS:[^0-9]*\\([0-9]*\\).*/\\1/p' $p/status; fi; done | sort -n | tail -1`, { user: 'root' })).stdout.trim()) * 1024));
  const emptyRss = Number((await made[0].commands.run([...AGENT_ARGV.slice(3, -1), '-e', 'setTimeout(() => console.log(process.memoryUsage().rss), 500)'])).stdout.trim());
  const rids = made.map((sb) => readdirSync(path.join(CG, 'memory', 'space')).find((d) => d === sb.id || d.startsWith(`${sb.id}-`)));
  const ours = await measure(cgroupsUnder('space', rids), spaced.child.pid);
  for (const sb of made.splice(0)) await sb.kill();

  const runtimeDir = runtimeDirOf(dataDir);
  const rootfs = templateRootfs(TEMPLATES_DIR, 'minimal');
  const names = [];
  for (let i = 0; i < N; i++) {
    // (Fixed width: runsc takes an id by its prefix, so `d1` would be ambiguous beside `d10`.)
    const name = `d${String(i).padStart(3, '0')}`;
    const b = path.join(bareRoot, name);
    mkdirSync(b, { recursive: true });
    writeFileSync(path.join(b, 'config.json'), JSON.stringify(bareOciConfig({ rootfs, runtimeDir, name, cgroupsPath: `/${bareParent}/${name}` })));
    const r = R('run', '--detach', '--bundle', b, name);
    if (r.status !== 0) throw new Error(`runsc run ${name} failed (exit ${r.status})`);
    names.push(name);
  }
  await new Promise((r) => setTimeout(r, 3000)); // the Node runtimes finish starting
  const bare = await measure(cgroupsUnder(bareParent, names));
  // The same containers checkpointed and restored, as every SPACE sandbox is (from its
  // template's image): what the runtime's restore itself costs in host memory.
  for (const name of names) {
    const img = path.join(bareRoot, `image-${name}`);
    mkdirSync(img);
    const c = spawnSync('runsc', [...RUNSC, 'checkpoint', '--image-path', img, name], { encoding: 'utf8' });
    if (c.status !== 0) throw new Error(`runsc checkpoint ${name} failed: ${c.stderr}`);
    R('delete', '--force', name);
    if (R('restore', '--detach', '--image-path', img, '--bundle', path.join(bareRoot, name), name).status !== 0) throw new Error(`runsc restore ${name} failed`);
  }
  const restored = await measure(cgroupsUnder(bareParent, names));

  const p50 = (xs) => quantile(xs, 50);
  const mib = (b) => (b / MiB).toFixed(1);
  const lines = [
    `| measurement (${N} idle sandboxes, 256 MiB each) | SPACE | bare runsc, same run | ratio | target |`,
    '|---|---:|---:|---:|---|',
    `| PSS of a sandbox's host processes, p50 (MiB) | ${mib(p50(ours.pss))} | ${mib(p50(bare.pss))} | ${(p50(ours.pss) / p50(bare.pss)).toFixed(2)}x | ≤ 50 MiB |`,
    `|   the same, against the bare containers checkpointed and restored | ${mib(p50(ours.pss))} | ${mib(p50(restored.pss))} | ${(p50(ours.pss) / p50(restored.pss)).toFixed(2)}x | — |`,
    `| memory charged to the sandbox's limit (cgroup working set), p50 (MiB) | ${mib(p50(ours.ws))} | ${mib(p50(bare.ws))} | ${(p50(ours.ws) / p50(bare.ws)).toFixed(2)}x | — |`,
    `|   the same, against the bare containers checkpointed and restored | ${mib(p50(ours.ws))} | ${mib(p50(restored.ws))} | ${(p50(ours.ws) / p50(restored.ws)).toFixed(2)}x | — |`,
    `| idle CPU of all ${N} sandboxes (% of one core, ${IDLE_S} s) | ${ours.cpuPct.toFixed(2)} | ${bare.cpuPct.toFixed(2)} | ${(ours.cpuPct / bare.cpuPct).toFixed(2)}x | ≤ 2% with the daemon |`,
    `| idle CPU of the daemon (% of one core) | ${ours.daemonPct.toFixed(2)} | — | — | (in the 2% above) |`,
    `| the agent's VmRSS inside a sandbox (MiB; bare: an empty Node, same flags) | ${mib(p50(agentRss))} | ${mib(emptyRss)} | ${(p50(agentRss) / emptyRss).toFixed(2)}x | ≤ 24 MiB |`,
  ];
  const table = lines.join('\n');
  console.log(table);
  if (values.write) {
    writeSection('density', 'Density: idle sandboxes on one host (issue 17)', `Measured ${new Date().toISOString().slice(0, 10)} on ${os.cpus().length} cores, ptrace platform, with \`node scripts/bench-density.mjs --write\` (part of \`./space bench\`): ${N} \`minimal\` sandboxes created one after another (warm pool off), each ran \`true\`, then ${IDLE_S} s idle; the bare baseline is ${N} \`runsc run\` containers of the same rootfs running the agent's Node idle (\`setInterval\`), without agent, API or network, measured as started and again after a \`runsc checkpoint\` and \`runsc restore\` of each (a SPACE sandbox is restored from its template's image).\n\n${table}`);
  }
} finally {
  for (const sb of made) await sb.kill().catch(() => {});
  for (const id of (spawnSync('runsc', ['--root', bareState, 'list', '-quiet'], { encoding: 'utf8' }).stdout ?? '').split('\n').filter(Boolean)) {
    spawnSync('runsc', ['--root', bareState, 'kill', id, 'KILL'], { stdio: 'ignore' });
    spawnSync('runsc', ['--root', bareState, 'delete', '--force', id], { stdio: 'ignore' });
  }
  // The bare containers' cgroups (runsc made them; empty now): rmdir, as cgroupfs wants.
  for (const ctl of ['memory', 'cpuacct', 'cpu', 'pids']) {
    const parent = path.join(CG, ctl, bareParent);
    if (!existsSync(parent)) continue;
    for (const d of readdirSync(parent, { withFileTypes: true })) if (d.isDirectory()) tryRmdir(path.join(parent, d.name));
    tryRmdir(parent);
  }
  await stopSpaced(spaced);
  rmSync(dataDir, { recursive: true, force: true });
}
