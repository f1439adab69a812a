/**
 * A sandbox's network settings: its egress policy, attached secrets and header rules, and the
 * environment that carries them.
 */
import { DEFAULT_EGRESS_POLICY, checkEgressPolicy, checkHeaderRules } from '../security/egress-policy.js';
import { SpaceError } from '../errors.js';
import { TERMINAL_STATES, assertAllowed, type Sandbox } from '../model.js';
import type { EgressPolicy, SecretAttachment } from '../records.js';
import type { EgressHooks, SandboxContext, SandboxEgressOptions } from './context.js';
import { sendIdentity } from './identity.js';

/** A sandbox's network settings. Built by the facade (SandboxService), which wires it into the hooks. */
export class EgressSettings implements EgressHooks {
  constructor(private readonly c: SandboxContext) {}

  /** The environment of a sandbox's processes: template, request, proxy settings, placeholders. */
  envOf(templateEnv: Record<string, string>, env: Record<string, string>, secrets: SecretAttachment[] | undefined): Record<string, string> {
    return { ...templateEnv, ...env, ...(this.c.egress?.env ?? {}), ...Object.fromEntries((secrets ?? []).filter((a) => !a.rule).map((a) => [a.name, a.placeholder])) };
  }

  requireEgress(): SandboxEgressOptions {
    if (!this.c.egress) throw new SpaceError('EGRESS_UNAVAILABLE', 'This daemon runs sandboxes without a network (--egress off)');
    return this.c.egress;
  }

  /** Replaces a sandbox's egress policy; the proxy applies it from the next request on. */
  setEgress(tenantId: string, id: string, policy: unknown): Promise<Sandbox> {
    this.requireEgress();
    const egress = checkEgressPolicy(policy);
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'setEgress');
      return this.c.store.updateSandbox(id, { egress });
    });
  }

  /**
   * Attaches secrets to a running sandbox: each gets a placeholder, in an env var of its name
   * for every process started from now on. The proxy swaps it from the next request on.
   */
  attachSecrets(tenantId: string, id: string, names: unknown): Promise<Sandbox> {
    const eg = this.requireEgress();
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'attachSecrets');
      if (sb.state !== 'running') throw new SpaceError('SANDBOX_INVALID_STATE', `Secrets are attached to running sandboxes; ${id} is ${sb.state}: resume or wake it first`);
      const secrets = await eg.secrets.attach(tenantId, names, sb.secrets ?? []);
      const updated = await this.c.store.updateSandbox(id, { secrets });
      await this.pushEnv(updated);
      return updated;
    });
  }

  /** Detaches a secret: from the next request on, the proxy no longer swaps its placeholder. */
  detachSecret(tenantId: string, id: string, name: string): Promise<Sandbox> {
    this.requireEgress();
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      if (!(sb.secrets ?? []).some((a) => a.name === name)) throw new SpaceError('SECRET_NOT_FOUND', `Secret ${JSON.stringify(name)} is not attached to ${id}`, { details: { name } });
      const updated = await this.c.store.updateSandbox(id, { secrets: (sb.secrets ?? []).filter((a) => a.name !== name) });
      if (updated.state === 'running') await this.pushEnv(updated).catch((err) => this.c.log.warn({ err, sandboxId: id }, 'could not update the environment after detaching a secret'));
      return updated;
    });
  }

  /**
   * Replaces a sandbox's header rules (request headers the proxy sets for some hosts); an
   * empty list removes them. Applied from the next request on.
   *
   * @example
   * await svc.setHeaderRules('tenant1', id, [{ hosts: ['api.example.com'], header: 'Authorization', value: 'Bearer sk-…' }]);
   */
  setHeaderRules(tenantId: string, id: string, rules: unknown): Promise<Sandbox> {
    const eg = this.requireEgress();
    const checked = checkHeaderRules(rules);
    return this.c.withLock(id, async () => {
      const sb = await this.c.hooks.get(tenantId, id);
      assertAllowed(sb, 'setHeaderRules');
      const kept = (sb.secrets ?? []).filter((a) => !a.rule);
      const added = checked.length ? await eg.secrets.setRules(tenantId, id, checked) : (await eg.secrets.removeOwned(tenantId, id), []);
      return this.c.store.updateSandbox(id, { secrets: [...kept, ...added] });
    });
  }

  /** Gives the agent the sandbox's current environment (for processes started afterwards). */
  private async pushEnv(sb: Sandbox): Promise<void> {
    const t = await this.c.templates.resolve(sb.tenantId, sb.template).catch(() => undefined);
    await this.c.hooks.agents.withChannel(sb.id, (ch) => sendIdentity(ch, sb.id, { env: this.envOf(t?.env ?? {}, sb.env, sb.secrets) }));
  }

  /** What the egress proxy needs of a live sandbox (undefined once it has ended). */
  async egressContext(id: string): Promise<{ sandboxId: string; tenantId: string; policy: EgressPolicy; secrets: SecretAttachment[] } | undefined> {
    const sb = await this.c.store.getSandbox(id);
    if (!sb || TERMINAL_STATES.includes(sb.state)) return undefined;
    return { sandboxId: sb.id, tenantId: sb.tenantId, policy: sb.egress ?? DEFAULT_EGRESS_POLICY, secrets: sb.secrets ?? [] };
  }
}
