/**
 * How sandboxes end: the runtime destroyed, the record ended with its reason, its snapshots and
 * header rules deleted.
 */
import type { EndReason, Sandbox } from '../model.js';
import type { EndingHooks, SandboxContext } from './context.js';

/** How sandboxes end. Built by the facade (SandboxService), which wires it into the hooks. */
export class Endings implements EndingHooks {
  constructor(private readonly c: SandboxContext) {}

  async terminate(id: string, state: 'killed' | 'dead', reason: EndReason, detail: string): Promise<Sandbox> {
    const e = this.c.live.entry(id);
    e.killing = true;
    e.clearTimers();
    // Read the end reason before the runtime forgets it (e.g. OOM counters live in the cgroup).
    let finalReason = reason;
    let finalDetail = detail;
    if (state === 'killed') {
      const st = await this.c.driver.status(id).catch(() => undefined);
      if (st && !st.running && st.reason === 'oom') {
        state = 'dead';
        finalReason = 'oom';
        finalDetail = st.detail ?? detail;
      }
    }
    e.channel?.destroy();
    await this.c.driver.destroy(id);
    const sb = await this.end(id, state, finalReason, finalDetail);
    // An ended sandbox's snapshots are deleted with it (they hold its whole memory).
    for (const sn of await this.c.store.listSnapshots(id)) await this.c.hooks.checkpoints.deleteSnapshot(sn);
    e.abandon();
    this.c.live.delete(id);
    this.c.log.info({ sandboxId: id, state, reason: finalReason }, 'sandbox ended');
    return sb;
  }

  async end(id: string, state: 'killed' | 'dead', endReason: EndReason, endDetail: string): Promise<Sandbox> {
    const sb = await this.c.store.updateSandbox(id, { state, endReason, endDetail, endedAt: new Date().toISOString() });
    await this.c.store.deleteExposures(id);
    // Its volumes are free for others again (closed when nobody else holds them).
    if (sb.volumes?.length) await this.c.volumes?.release(id);
    // Its header rules' values go with it.
    if (sb.secrets?.some((a) => a.rule)) await this.c.egress?.secrets.removeOwned(sb.tenantId, id).catch((err) => this.c.log.warn({ err, sandboxId: id }, 'deleting the header rules of an ended sandbox failed'));
    return sb;
  }
}
