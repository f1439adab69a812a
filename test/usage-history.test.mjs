// The usage history behind E2B's getMetrics (@space/core UsageHistory): a series stays oldest
// first and counts CPU over forward intervals, even when readings finish out of order (a loaded
// host, where one tick's usage read outlasts the interval).
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { UsageHistory } from '../packages/core/dist/index.js';

describe('usage history', () => {
  it('a reading that finishes after a later one is dropped; the series stays oldest first', async () => {
    const pending = [];
    // Each usage read waits until the test answers it, with the CPU time given.
    const source = { running: async () => [{ id: 'sb1', cpu: 1 }], usage: () => new Promise((r) => pending.push(r)) };
    const h = new UsageHistory(source, 1000);
    const until = async (n) => {
      while (pending.length < n) await new Promise((r) => setImmediate(r));
    };
    const first = h.sampleAll(1_000);
    await until(1);
    await Promise.all([pending[0]({ cpuNs: 0, rssBytes: 1 }), first]);
    // Two ticks under way at once: the later one (t = 3 s) answers first.
    const slow = h.sampleAll(2_000);
    const fast = h.sampleAll(3_000);
    await until(3);
    pending[2]({ cpuNs: 1e9, rssBytes: 3 });
    await fast;
    pending[1]({ cpuNs: 5e8, rssBytes: 2 });
    await slow;
    const series = h.series('sb1');
    assert.deepEqual(series.map((s) => s.at), [1_000, 3_000], 'the late reading of t = 2 s is not put after t = 3 s');
    assert.equal(series[1].cpuPct, 50, 'CPU over the 2 s from the first reading: 1 s of CPU on one core');
    assert.deepEqual(h.series('sb1', { start: 2_000 }).map((s) => s.at), [3_000]);
  });
});
