// What the crash tests share (test/crash-lifecycle.test.mjs on runsc, test/crash-fake.test.mjs in
// the fast lane): every fault point with the operation that reaches it, and a seeded generator.

/**
 * [operation, fault point, 'fresh' when the point needs a session's first snapshot (no older one
 * to fall back to)]: every step boundary of create, snapshot, hibernate, wake, rollback and fork.
 */
export const FAULT_MATRIX = [
  ['create', 'create:after-record'],
  ['create', 'create:during-start'],
  ['snapshot', 'snapshot:after-intent', 'fresh'],
  ['snapshot', 'snapshot:after-quiesce', 'fresh'],
  ['snapshot', 'snapshot:during-checkpoint', 'fresh'],
  ['snapshot', 'snapshot:after-checkpoint', 'fresh'],
  ['snapshot', 'snapshot:during-restore'],
  ['snapshot', 'snapshot:after-restore'],
  ['snapshot', 'snapshot:during-store'],
  ['snapshot', 'snapshot:after-blob'],
  ['snapshot', 'snapshot:after-record'],
  ['hibernate', 'snapshot:after-quiesce'],
  ['hibernate', 'snapshot:during-checkpoint'],
  ['hibernate', 'snapshot:after-checkpoint'],
  ['hibernate', 'snapshot:during-store'],
  ['hibernate', 'snapshot:after-blob'],
  ['hibernate', 'hibernate:after-snapshot'],
  ['wake', 'wake:after-intent'],
  ['wake', 'wake:during-restore'],
  ['wake', 'wake:after-restore'],
  ['rollback', 'rollback:after-verify'],
  ['rollback', 'rollback:during-restore'],
  ['rollback', 'rollback:after-restore'],
  ['fork', 'fork:after-record'],
  ['fork', 'fork:during-restore'],
];

/** mulberry32: a small seeded generator, so a failing run can be replayed with SPACE_CRASH_SEED. */
export function generator(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
