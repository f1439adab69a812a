/**
 * The agents' connections: accepting an agent (its hello, a restored copy's new identity), waiting
 * for one, and what its going away means (a reconnect, or a sandbox that died).
 */
import type { Duplex } from 'node:stream';
import { PROTOCOL_VERSION } from '@space/protocol';
import { AgentChannel } from '../agent/channel.js';
import { SpaceError, toSpaceError } from '../errors.js';
import { TERMINAL_STATES, assertAllowed, type EndReason } from '../model.js';
import type { AgentHooks, SandboxContext } from './context.js';
import { sendIdentity } from './identity.js';

/** Identity failures where the agent did not answer: its reconnect asks it again. */
const TRANSIENT_IDENTITY_FAILURES = new Set(['TIMEOUT', 'AGENT_UNAVAILABLE', 'AGENT_DISCONNECTED']);

/** The agents' connections. Built by the facade (SandboxService), which wires it into the hooks. */
export class AgentLinks implements AgentHooks {
  constructor(private readonly c: SandboxContext) {}

  async channel(id: string): Promise<AgentChannel> {
    const e = this.c.live.entry(id);
    if (e.openChannel) return e.openChannel;
    const ch = await e.waitAgent(this.c.reconnectWaitMs);
    if (!ch) {
      const sb = await this.c.store.getSandbox(id);
      if (sb && TERMINAL_STATES.includes(sb.state)) assertAllowed(sb, 'exec');
      throw new SpaceError('AGENT_UNAVAILABLE', `The agent of sandbox ${id} did not reconnect within ${this.c.reconnectWaitMs} ms`);
    }
    return ch;
  }

  /**
   * Runs `use` on the sandbox's agent channel once no checkpoint is under way, in the same
   * tick as that check: a call can never slip in between a snapshot's "no open calls" check
   * and its quiesce (which would cut it).
   */
  async withChannel<T>(id: string, use: (ch: AgentChannel) => T): Promise<T> {
    for (;;) {
      const gate = this.c.live.get(id)?.gate;
      if (gate) {
        await gate;
        continue;
      }
      const ch = await this.channel(id);
      if (!this.c.live.get(id)?.gate) return use(ch);
    }
  }

  onAgent(id: string, stream: Duplex): void {
    const ch = new AgentChannel(stream);
    const hello = setTimeout(() => ch.destroy(new Error('no hello within 10 s')), 10_000);
    ch.once('event', (ev) => {
      clearTimeout(hello);
      const e = this.c.live.entry(id);
      // A fork's agent was restored from another sandbox's snapshot and still says that id.
      const fromSnapshotOf = e.restoringFrom;
      if (ev.event !== 'hello' || (ev.sandboxId !== id && ev.sandboxId !== fromSnapshotOf) || ev.version !== PROTOCOL_VERSION) {
        this.c.log.warn({ sandboxId: id, hello: JSON.stringify(ev).slice(0, 200) }, 'agent sent a bad hello; dropping it');
        ch.destroy(new Error('bad hello'));
        return;
      }
      const accept = () => {
        e.accept(ch);
        this.c.log.debug({ sandboxId: id }, 'agent connected');
        ch.on('close', () => void this.onAgentClose(id, ch).catch((err: unknown) => this.c.log.error({ err, sandboxId: id }, 'handling the agent\'s disconnection failed')));
      };
      if (ev.sandboxId === id) return accept();
      const t0 = performance.now();
      const ident = e.identity;
      sendIdentity(ch, id, ident).then(() => {
        e.identityMs = Math.round(performance.now() - t0);
        accept();
      }, (err: unknown) => {
        this.c.log.warn({ err, sandboxId: id }, 'agent did not take its new identity');
        ch.destroy();
        // An agent that answered with a refusal (a disk it cannot grow) will refuse again:
        // whoever waits for it (a restore, a fork, a create from a template image) fails now
        // with its reason, not at the end of the boot timeout. A lost connection or no answer
        // may pass: the agent reconnects and is asked again, within the same timeout.
        const why = toSpaceError(err);
        if (!TRANSIENT_IDENTITY_FAILURES.has(why.code)) e.fail(new SpaceError(why.code, `The agent of ${id} did not take the sandbox's identity: ${why.message}`, { cause: err }));
      });
    });
  }

  private async onAgentClose(id: string, ch: AgentChannel): Promise<void> {
    const e = this.c.live.get(id);
    if (!e || e.channel !== ch || e.killing || e.quiescing || this.c.stopping()) return;
    e.channel = undefined;
    // The agent went away: either the sandbox died (OOM, crash) or the agent is reconnecting.
    const st = await this.c.driver.status(id).catch(() => ({ running: false, reason: 'crashed' as EndReason, detail: 'runtime status unavailable' }));
    if (st.running) return;
    const sb = await this.c.store.getSandbox(id);
    // Ended, or another node's now (taken over): nothing of this node's to bring back.
    if (!sb || TERMINAL_STATES.includes(sb.state) || !this.c.owns(sb)) return;
    this.c.log.warn({ sandboxId: id, reason: st.reason, detail: st.detail }, 'sandbox died');
    // A crash (not an overrun of its own limits) is survivable when there is a snapshot to go back to.
    if (st.reason !== 'oom' && sb.lastSnapshotId) {
      await this.c.driver.destroy(id).catch((err) => this.c.log.error({ err, sandboxId: id }, 'cleanup of the crashed runtime failed'));
      await this.c.hooks.recovery.recover(sb, `the sandbox crashed (${st.detail ?? 'the runtime stopped'})`);
      return;
    }
    await this.c.hooks.endings.terminate(id, 'dead', st.reason ?? 'crashed', st.detail ?? 'the sandbox stopped unexpectedly');
  }
}
