#!/usr/bin/env node
// microVM driver vs gVisor driver, side by side in one run, at the driver level (no daemon):
// boot-to-agent, checkpoint (time, size), restore-to-agent, pause/resume, fork into 4 (time,
// host memory of 4 copies vs 4 independent sandboxes). Under software emulation (this machine)
// the microVM numbers are correctness checks, not performance figures.
//   node scripts/bench-microvm.mjs [--iterations 3] [--write]
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { AgentChannel } from '../packages/core/dist/index.js';
import { GvisorDriver } from '../packages/driver-gvisor/dist/index.js';
import { MicrovmDriver } from '../packages/driver-microvm/dist/index.js';
import { TEMPLATES_DIR } from '../test/helpers.mjs';
import { quantile, templateRootfs, writeSection } from './bench-lib.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '3' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const now = () => performance.now();
const MEM = 256;
const rootfs = templateRootfs(TEMPLATES_DIR, 'minimal');
const dataDir = mkdtempSync('/tmp/spbm-');
const cacheDir = process.env.SPACE_MICROVM_CACHE_DIR ?? '/var/cache/space/microvm';

/** A driver with a "wait for this sandbox's agent hello" helper. */
async function harness(name, driver) {
  const waiting = new Map();
  const channels = new Map();
  driver.bind({
    agentConnected(id, stream) {
      const ch = new AgentChannel(stream);
      ch.once('event', (ev) => {
        if (ev.event !== 'hello') return;
        channels.get(id)?.destroy();
        channels.set(id, ch);
        waiting.get(id)?.();
        waiting.delete(id);
      });
    },
  });
  await driver.init();
  const hello = (id) => new Promise((r, j) => {
    waiting.set(id, r);
    setTimeout(() => j(new Error(`${name} ${id}: no hello in 180 s`)), 180_000).unref();
  });
  const spec = (id) => ({ id, template: 'minimal', rootfs, cpu: 1, memoryMb: MEM, env: {} });
  return {
    name,
    driver,
    async boot(id) {
      const h = hello(id);
      const t = now();
      await driver.create(spec(id));
      await h;
      return now() - t;
    },
    async checkpoint(id, dir) {
      const ch = channels.get(id);
      await driver.detachAgent(id);
      const closed = new Promise((r) => (ch.closed ? r() : ch.once('close', r)));
      await ch.unary({ op: 'quiesce' }, 10_000);
      await closed;
      channels.delete(id);
      const t = now();
      await driver.checkpoint(id, dir);
      return now() - t;
    },
    async restore(id, dir) {
      const h = hello(id);
      const t = now();
      await driver.restore(spec(id), dir);
      await h;
      return now() - t;
    },
    async rss(ids) {
      let s = 0;
      for (const id of ids) s += (await driver.usage(id)).rssBytes;
      return s;
    },
    /** Proportional set size of the VMM processes (shared pages split between their users); microVM only. */
    pss(ids) {
      let s = 0;
      for (const id of ids) {
        const pid = readFileSync(path.join(dataDir, 'm', 'microvm', 'boxes', id, 'qemu.pid'), 'utf8').trim();
        s += Number(/^Pss:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/smaps_rollup`, 'utf8'))[1]) * 1024;
      }
      return s;
    },
  };
}

/** Bytes a checkpoint occupies on disk (the microVM RAM file is sparse: its holes are not stored). */
const dirSize = (d) => readdirSync(d).reduce((a, f) => a + statSync(path.join(d, f)).blocks * 512, 0);
const fmt = (ms) => (ms < 10 ? ms.toFixed(2) : ms.toFixed(0));
const mib = (b) => (b / 1048576).toFixed(0);

const gv = await harness('gvisor', new GvisorDriver({ dataDir: path.join(dataDir, 'g') }));
const mv = await harness('microvm', new MicrovmDriver({ dataDir: path.join(dataDir, 'm'), cacheDir }));
const results = {};
const ids = [];
try {
  for (const h of [gv, mv]) {
    const r = (results[h.name] = { boot: [], ckpt: [], size: [], restore: [], pause: [], resume: [], fork4: [], rss4fork: 0, rss4indep: 0, pss4fork: 0, pss4indep: 0, fork4own: [], rss4forkOwn: 0, pss4forkOwn: 0, ckptRestored: [], sizeRestored: [] });
    const tag = h.name[0];
    for (let i = 0; i < N; i++) {
      const id = `sb${tag}b${i}x`;
      ids.push([h, id]);
      r.boot.push(await h.boot(id));
      let t = now();
      await h.driver.pause(id);
      r.pause.push(now() - t);
      t = now();
      await h.driver.resume(id);
      r.resume.push(now() - t);
      const img = path.join(dataDir, `${id}-img`);
      r.ckpt.push(await h.checkpoint(id, img));
      r.size.push(dirSize(img));
      await h.driver.retire(id);
      r.restore.push(await h.restore(id, img));
      if (i === N - 1) {
        // Fork into 4: four copies restored from one image at once (time, host memory once settled).
        const forkInto4 = async (image, prefix) => {
          const forks = [0, 1, 2, 3].map((k) => `sb${tag}${prefix}${k}x`);
          forks.forEach((f) => ids.push([h, f]));
          const t0 = now();
          await Promise.all(forks.map((f) => h.restore(f, image)));
          const ms = now() - t0;
          await new Promise((res) => setTimeout(res, 3000));
          const out = { ms, rss: await h.rss(forks), pss: h.name === 'microvm' ? h.pss(forks) : 0 };
          for (const f of forks) await h.driver.destroy(f);
          rmSync(image, { recursive: true, force: true });
          return out;
        };
        // From this VM, which was restored: on microVM it runs on a private mapping of its image's RAM.
        r.ckptRestored.push(await h.checkpoint(id, `${img}-f`));
        r.sizeRestored.push(dirSize(`${img}-f`));
        await h.driver.retire(id);
        const restored = await forkInto4(`${img}-f`, 'f');
        r.fork4.push(restored.ms);
        r.rss4fork = restored.rss;
        r.pss4fork = restored.pss;
        // From a VM that was booted, not restored: it owns its RAM file, so the checkpoint leaves
        // RAM out of the stream and the restores map that file copy-on-write.
        const src = `sb${tag}s${i}x`;
        ids.push([h, src]);
        await h.boot(src);
        await h.checkpoint(src, `${img}-g`);
        await h.driver.retire(src);
        const booted = await forkInto4(`${img}-g`, 'g');
        r.fork4own.push(booted.ms);
        r.rss4forkOwn = booted.rss;
        r.pss4forkOwn = booted.pss;
        await h.driver.destroy(src);
        const indep = [0, 1, 2, 3].map((k) => `sb${tag}i${k}x`);
        indep.forEach((f) => ids.push([h, f]));
        for (const f of indep) await h.boot(f);
        await new Promise((res) => setTimeout(res, 3000));
        r.rss4indep = await h.rss(indep);
        if (h.name === 'microvm') r.pss4indep = h.pss(indep);
        for (const f of indep) await h.driver.destroy(f);
      }
      await h.driver.destroy(id);
      rmSync(img, { recursive: true, force: true });
    }
  }
} finally {
  for (const [h, id] of ids) await h.driver.destroy(id).catch(() => {});
  await gv.driver.close();
  await mv.driver.close();
  rmSync(dataDir, { recursive: true, force: true });
}

const q = (xs) => (xs.length ? fmt(quantile(xs, 50)) : '—');
const g = results.gvisor;
const m = results.microvm;
const accel = (await mv.driver.doctor()).checks.find((c) => c.name === 'acceleration')?.detail ?? '?';
const rows = [
  ['boot to agent hello (ms)', q(g.boot), q(m.boot)],
  ['checkpoint (ms)', q(g.ckpt), q(m.ckpt)],
  ['checkpoint on disk (MiB)', mib(quantile(g.size, 50)), mib(quantile(m.size, 50))],
  ['checkpoint of a restored VM (ms)', q(g.ckptRestored), q(m.ckptRestored)],
  ['checkpoint of a restored VM on disk (MiB)', mib(quantile(g.sizeRestored, 50)), mib(quantile(m.sizeRestored, 50))],
  ['restore to agent hello (ms)', q(g.restore), q(m.restore)],
  ['pause (ms)', q(g.pause), q(m.pause)],
  ['resume (ms)', q(g.resume), q(m.resume)],
  ['fork into 4 a booted VM, all agents up (ms)', q(g.fork4own), q(m.fork4own)],
  ['fork into 4 a restored VM, all agents up (ms)', q(g.fork4), q(m.fork4)],
  ['host RSS: 4 forks of a booted VM (MiB)', mib(g.rss4forkOwn), mib(m.rss4forkOwn)],
  ['host RSS: 4 forks of a restored VM (MiB)', mib(g.rss4fork), mib(m.rss4fork)],
  ['host RSS: 4 independent boots (MiB)', mib(g.rss4indep), mib(m.rss4indep)],
  ['host PSS: 4 forks of a booted VM (MiB)', '—', mib(m.pss4forkOwn)],
  ['host PSS: 4 forks of a restored VM (MiB)', '—', mib(m.pss4fork)],
  ['host PSS: 4 independent boots (MiB)', '—', mib(m.pss4indep)],
];
const table = ['| measure (p50 of ' + N + ') | gVisor (runsc, ptrace) | microVM (QEMU microvm, ' + accel.split(':')[0] + ') | microVM / gVisor |', '|---|---:|---:|---:|'];
for (const [name, a, b] of rows) table.push(`| ${name} | ${a} | ${b} | ${Number(a) > 0 && Number(b) > 0 ? (Number(b) / Number(a)).toFixed(2) + 'x' : '—'} |`);
const out = table.join('\n');
console.log(out);
console.log(`\nmicroVM acceleration: ${accel}; guest ${MEM} MiB, 1 vCPU, template minimal, no sandbox network.`);
if (values.write) {
  writeSection('microvm', 'microVM driver vs gVisor (driver level)', [
    `\`node scripts/bench-microvm.mjs --iterations ${N} --write\` — both drivers in one process, one after the other, each sandbox booted`,
    'from the `minimal` template with 256 MiB, 1 vCPU and no sandbox network; "agent hello" is the agent\'s first frame on its',
    `channel. microVM acceleration here: ${accel}. Under software emulation these are correctness checks, not performance figures`,
    '(DESIGN.md: emulation is 3–8x slower than native); KVM figures will be added when a KVM host is available.',
    '',
    out,
    '',
    'RSS counts a page in every process that maps it; PSS splits shared pages between them. A booted microVM owns its RAM file: its',
    'checkpoint leaves RAM out of the stream and the forks map that file copy-on-write, so their PSS shows what they share. A VM that',
    'was itself restored runs on a private mapping of its image\'s RAM: its checkpoint carries all RAM in the stream, and a loader',
    'QEMU (whose guest never runs) reads that stream into a RAM file of the new image and saves the machine again without it; that',
    'is the extra time of "checkpoint of a restored VM". Its forks then map that file copy-on-write as well (issue 17\'s target:',
    `4 forks of a restored VM ≤ 1.5x the PSS of 4 forks of a booted VM; here ${(m.pss4fork / m.pss4forkOwn).toFixed(2)}x). gVisor forks restore private copies (RSS is their measure).`,
  ].join('\n'));
}
