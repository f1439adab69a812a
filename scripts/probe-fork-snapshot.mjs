#!/usr/bin/env node
// A fact measured: what a fork's first snapshot costs when the parent's disk holds data
// (docs/disks.md, "The previous snapshot is the one the disk grew from"). One `minimal`
// sandbox with a disk writes MB random megabytes and takes a snapshot; then, FORKS times, a
// fork of it writes one small file and takes its first snapshot, timed from the client, with
// the bytes its disk change came to (the snapshot event) — or "the whole" where it stored it.
// Run: node scripts/probe-fork-snapshot.mjs [--mb 512] [--forks 3]
// Against another checkout (an A/B): node scripts/probe-fork-snapshot.mjs --repo /tmp/old
import path from 'node:path';
import { parseArgs } from 'node:util';

const { values: o } = parseArgs({ options: { mb: { type: 'string', default: '512' }, forks: { type: 'string', default: '3' }, repo: { type: 'string', default: path.join(import.meta.dirname, '..') } } });
const { startTestDaemon } = await import(path.join(path.resolve(o.repo), 'test/helpers.mjs'));
const mb = Number(o.mb);
const fx = await startTestDaemon({ disks: { mode: 'on', maxMb: 8192 } });
try {
  const parent = await fx.create({ template: 'minimal', diskMb: Math.max(1024, 2 * mb) });
  const w = await parent.commands.run(`head -c ${mb * 1048576} /dev/urandom > /tmp/data && sync`, { timeoutMs: 600_000 });
  if (w.exitCode) throw new Error(w.stderr);
  let t = Date.now();
  const ps = await parent.snapshot();
  console.log(`parent's snapshot (${mb} MiB written): ${Date.now() - t} ms, ${ps.sizeBytes} bytes`);
  for (let i = 0; i < Number(o.forks); i++) {
    const [child] = await parent.fork({ count: 1 });
    fx.track(child);
    await child.files.write('/tmp/child.txt', `child ${i}`);
    t = Date.now();
    const s = await child.snapshot();
    const ms = Date.now() - t;
    const said = (await child.events()).filter((e) => e.type === 'snapshot').map((e) => e.message).find((m) => m.includes(`snapshot ${s.id} `)) ?? '';
    console.log(`fork ${i + 1}'s first snapshot: ${ms} ms, ${s.sizeBytes} bytes; ${/disk stored as its changes since \w+ \(\d+ bytes\)/.exec(said)?.[0] ?? 'disk stored whole'}`);
    await child.kill();
  }
  await parent.kill();
} finally {
  const leaks = await fx.close();
  if (leaks.length) console.log('left behind:', leaks);
}
