/**
 * The lifecycle journal: every operation that moves where a session's state lives records
 * its intent durably before it starts, updates its step as it goes, and deletes the record
 * when its outcome is recorded. A daemon that starts with records left over knows exactly
 * which operations a crash interrupted, and how far each got (see `SandboxService.start`).
 */
import { randomString } from '../ids.js';
import type { SnapshotTrigger } from '../model.js';

/**
 * Operations that move a session's state. Creates (forks' copies included) need no record of
 * their own: a sandbox stored as `starting` is one whose create has not finished.
 */
export type IntentOp = 'snapshot' | 'hibernate' | 'wake' | 'rollback';

/**
 * Steps, in order. `snapshot`/`hibernate`: `checkpoint` (the agent may be quiesced; the
 * runtime may be checkpointing) → `checkpointed` (the image is complete) → `stored`.
 * `wake`: `restore`. `rollback`: `verify` (nothing changed yet) → `restore` (the old
 * incarnation may be gone).
 */
export type IntentStep = 'checkpoint' | 'checkpointed' | 'stored' | 'restore' | 'verify';

/** One unfinished lifecycle operation, as stored. */
export interface Intent {
  id: string;
  sandboxId: string;
  op: IntentOp;
  step: IntentStep;
  startedAt: string;
  updatedAt: string;
  /** The snapshot it produces (snapshot, hibernate) or starts from (wake, rollback). */
  snapshotId?: string;
  /** Where the runtime writes the checkpoint image (snapshot, hibernate). */
  imageDir?: string;
  /** Why the snapshot is taken (snapshot, hibernate). */
  trigger?: SnapshotTrigger;
  /** The snapshot's name, if given. */
  name?: string;
  /** Whether the sandbox runs on after the checkpoint (snapshot), or stops (hibernate). */
  keepRunning?: boolean;
  /** The sandbox was paused before the snapshot (and is paused again after it). */
  wasPaused?: boolean;
}

/** Where intents are kept: the metadata store. */
export interface IntentStore {
  /** Inserts or replaces an intent. */
  putIntent(i: Intent): Promise<void>;
  deleteIntent(id: string): Promise<void>;
  /** Every unfinished intent, oldest first. */
  listIntents(): Promise<Intent[]>;
}

/**
 * Writes intents. Each write is one durable store transaction: a crash after it returns
 * leaves the record for the next start to reconcile.
 *
 * @example
 * const journal = new Journal(store);
 * const intent = await journal.begin('sb…', 'wake', { step: 'restore', snapshotId });
 * await restore();
 * await journal.done(intent);
 */
export class Journal {
  constructor(private readonly store: IntentStore) {}

  /** Records that `op` on `sandboxId` is about to start. */
  async begin(sandboxId: string, op: IntentOp, fields: Omit<Intent, 'id' | 'sandboxId' | 'op' | 'startedAt' | 'updatedAt'>): Promise<Intent> {
    const now = new Date().toISOString();
    const intent: Intent = { id: `op${randomString(18)}`, sandboxId, op, startedAt: now, updatedAt: now, ...fields };
    await this.store.putIntent(intent);
    return intent;
  }

  /** Records that the operation has reached `step` (mutates and returns `intent`). */
  async step(intent: Intent, step: IntentStep): Promise<Intent> {
    intent.step = step;
    intent.updatedAt = new Date().toISOString();
    await this.store.putIntent(intent);
    return intent;
  }

  /** Records that the operation's outcome is recorded: nothing is left to reconcile. */
  async done(intent: Intent | undefined): Promise<void> {
    if (intent) await this.store.deleteIntent(intent.id);
  }

  list(): Promise<Intent[]> {
    return this.store.listIntents();
  }
}
