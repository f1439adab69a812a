#!/usr/bin/env node
// A platform fact, measured: what the agent's memory inside a gVisor sandbox is made of, and
// what it costs the host (docs/architecture.md, "Memory and CPU of an idle sandbox"). One
// `minimal` sandbox of 512 MiB, files in memory:
// - the agent's VmRSS inside, split by mapping (/proc/<agent>/smaps: the Node binary, anonymous
//   memory, libraries), and what /proc/meminfo inside counts as used;
// - the host working set of the sandbox's cgroup (what its memory limit is enforced on) before
//   and after a second idle Node with the agent's flags starts inside, and the VmRSS gVisor gives it;
// - the VmRSS of the runtime's static C helper (`space-helper init`, pid 1), a compiled program.
// Run: node scripts/probe-agent-memory.mjs
import { mkdtempSync, readFileSync, readdirSync, rmSync } from 'node:fs';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { closeDiskPool, startSpaced, stopSpaced } from '../test/helpers.mjs';

const dir = mkdtempSync('/tmp/spb-agentmem-');
const d = await startSpaced(dir, { SPACE_DISKS: 'off' });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const NODE = "/.space/lib/ld-linux-x86-64.so.2 --library-path /.space/lib /.space/node --single-threaded --max-semi-space-size=1 --max-old-space-size=96 -e 'setInterval(() => {}, 1e6)'";
try {
  const sb = await Sandbox.create({ ...d.conn, template: 'minimal', memoryMb: 512 });
  try {
    const cg = `/sys/fs/cgroup/memory/space/${readdirSync('/sys/fs/cgroup/memory/space').find((x) => x.startsWith(`${sb.id}-`))}`;
    /** The cgroup's working set (usage less inactive file pages), MiB. */
    const workingSet = () => {
      const st = Object.fromEntries(readFileSync(`${cg}/memory.stat`, 'utf8').trim().split('\n').map((l) => l.split(' ')));
      return (Number(readFileSync(`${cg}/memory.usage_in_bytes`, 'utf8')) - Number(st.total_inactive_file)) / 1048576;
    };
    const inside = async (cmd) => (await sb.commands.run(cmd, { user: 'root', timeoutMs: 60_000 })).stdout;
    const vmrss = async (match) => Number((await inside(`for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline | grep -q -- '${match}' && grep VmRSS $p/status; done | head -1 | awk '{print $2}'`)) || 0) / 1024;
    const agentPid = (await inside("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline | grep -q 'agent.cjs' && tr '\\0' ' ' < $p/cmdline | grep -qv space-helper && echo ${p#/proc/}; done | head -1")).trim();
    const byMapping = await inside(`awk '/^[0-9a-f]+-/{name=$6} /^Rss:/{r[name==""?"(anonymous)":name]+=$2} END{for(n in r) if (r[n]>=256) printf "%.1f %s\\n", r[n]/1024, n}' /proc/${agentPid}/smaps | sort -rn`);
    const meminfo = Object.fromEntries((await inside('cat /proc/meminfo')).trim().split('\n').map((l) => [l.split(':')[0], Number(l.split(/\s+/)[1]) / 1024]));
    await sleep(3000);
    const before = workingSet();
    await inside(`(${NODE} >/dev/null 2>&1 &)`);
    await sleep(3000);
    const after = workingSet();
    const secondNode = await vmrss('setInterval');
    const agentRss = Number((await inside(`grep VmRSS /proc/${agentPid}/status | awk '{print $2}'`)).trim()) / 1024;
    console.log(`the agent's VmRSS inside: ${agentRss.toFixed(1)} MiB, by mapping (MiB):\n${byMapping}`);
    console.log(`/proc/meminfo inside: MemTotal ${meminfo.MemTotal.toFixed(0)}, MemFree ${meminfo.MemFree.toFixed(0)}, Cached ${meminfo.Cached.toFixed(0)}, Mapped ${meminfo.Mapped.toFixed(0)} (MiB)`);
    console.log(`a second idle Node (the agent's flags): VmRSS inside ${secondNode.toFixed(1)} MiB; the sandbox's host working set ${before.toFixed(1)} -> ${after.toFixed(1)} MiB (+${(after - before).toFixed(1)})`);
    console.log(`the static C helper (pid 1): VmRSS ${(await vmrss('space-helper init')).toFixed(1)} MiB`);
  } finally {
    await sb.kill();
  }
} finally {
  await stopSpaced(d);
  closeDiskPool(dir);
  rmSync(dir, { recursive: true, force: true });
}
