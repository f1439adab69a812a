/**
 * SPACE's tools for MCP clients: sandboxes, commands, background processes, files, and what
 * no other sandbox offers as tools — snapshots, rollback and forks, so an agent can explore
 * and undo. Every tool goes through `@space/sdk` with the caller's connection (its own API key),
 * so the daemon applies the same tenancy and limits as to any client. Secret values never pass
 * through here: sandboxes are given secret names only.
 */
import { Sandbox, SpaceError, type ConnectionOpts } from '@space/sdk';
import type { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { z } from 'zod';

/** Output kept of each stream of a command (the rest is cut, with a note saying so). */
export const OUTPUT_CAP_BYTES = 64 * 1024;
/** Largest file `read_file` returns as text, and as base64. */
export const READ_CAP_BYTES = { text: 1024 * 1024, base64: 512 * 1024 } as const;
/** Largest command timeout a tool call may ask for. */
const MAX_COMMAND_S = 600;

const sandboxId = z.string().regex(/^sb[a-z0-9]{18}$/, 'a sandbox id: "sb" and 18 of [a-z0-9]').describe('The sandbox id, as create_sandbox or list_sandboxes returned it');
const path = z.string().min(1).max(4096).describe('Absolute path inside the sandbox (relative paths are from the user\'s home, /home/user)');

/** A tool's text answer, with the same facts as structured content. */
function ok(text: string, structured?: Record<string, unknown>): CallToolResult {
  return { content: [{ type: 'text', text }], ...(structured ? { structuredContent: structured } : {}) };
}

/**
 * A tool error carrying SPACE's error code and fix-it hint, so the model can act on it
 * (e.g. `SNAPSHOT_UNSUPPORTED_STATE` names the process to stop).
 */
export function toolError(err: unknown): CallToolResult {
  const e = err instanceof SpaceError ? err : undefined;
  const code = e?.code ?? 'INTERNAL';
  const message = err instanceof Error ? err.message : String(err);
  const hint = e?.hint;
  return {
    isError: true,
    content: [{ type: 'text', text: `${code}: ${message}${hint ? `\nhint: ${hint}` : ''}` }],
    structuredContent: { error: { code, message, ...(hint ? { hint } : {}) } },
  };
}

/** Runs a tool body; any error becomes a tool error with its code. */
function guarded<A>(fn: (args: A) => Promise<CallToolResult>): (args: A) => Promise<CallToolResult> {
  return async (args) => {
    try {
      return await fn(args);
    } catch (err) {
      return toolError(err);
    }
  };
}

/** Keeps the first `cap` bytes of `s` (UTF-8), saying how much was cut. */
export function capped(s: string, cap = OUTPUT_CAP_BYTES): { text: string; truncated: number } {
  const b = Buffer.from(s);
  if (b.length <= cap) return { text: s, truncated: 0 };
  return { text: `${b.subarray(0, cap).toString()}\n[... ${b.length - cap} more bytes cut: redirect to a file and read parts of it]`, truncated: b.length - cap };
}

/** What a sandbox looks like to a model. */
function describeSandbox(s: Sandbox['info']): Record<string, unknown> {
  return { sandboxId: s.id, state: s.state, template: s.template, driver: s.driver, memoryMb: s.memoryMb, createdAt: s.createdAt, ...(s.endReason ? { endReason: s.endReason } : {}) };
}

/**
 * Registers every SPACE tool on `server`; `conn` says which daemon and key each call uses.
 *
 * @example
 * const server = new McpServer({ name: 'space', version: '0.1.0' });
 * registerTools(server, () => ({ apiUrl: 'http://127.0.0.1:7070', apiKey: key }));
 */
export function registerTools(server: McpServer, conn: () => ConnectionOpts): void {
  const sb = (id: string) => Sandbox.connect(id, conn());

  server.registerTool(
    'create_sandbox',
    {
      title: 'Create a sandbox',
      description:
        'Creates an isolated Linux sandbox (its own kernel) and returns its id. Template "base" is Debian with bash, python3 (pip, venv), node/npm, gcc, git, sudo; "minimal" is busybox. The sandbox has no network except the domains you allow (through an egress proxy that injects the named secrets; their values never enter the sandbox). It is killed after timeoutMinutes.',
      inputSchema: {
        template: z.string().max(128).default('base').describe('Template name: "base" (Debian, the usual tools) or "minimal" (busybox), or one of your own'),
        memoryMb: z.number().int().min(64).max(65536).optional().describe('Memory limit in MiB (default 512)'),
        cpu: z.number().min(0.1).max(64).optional().describe('CPU cores (default 1)'),
        timeoutMinutes: z.number().int().min(0).max(10080).default(30).describe('Kill the sandbox after this many minutes (0: never)'),
        secrets: z.array(z.string().max(128)).max(64).optional().describe('Names of secrets (set with `space secret set`) to attach: the sandbox gets placeholder env vars of those names, swapped for the values on requests to the secrets\' hosts'),
        allowDomains: z.array(z.string().max(253)).max(256).optional().describe('Domains the sandbox may reach over HTTP(S), e.g. "pypi.org", "*.github.com"'),
        metadata: z.record(z.string(), z.string()).optional().describe('Labels to find the sandbox by later'),
      },
    },
    guarded(async (a) => {
      const s = await Sandbox.create({
        ...conn(),
        template: a.template,
        timeoutMs: a.timeoutMinutes * 60_000,
        ...(a.memoryMb ? { memoryMb: a.memoryMb } : {}),
        ...(a.cpu ? { cpu: a.cpu } : {}),
        ...(a.secrets?.length ? { secrets: a.secrets } : {}),
        ...(a.allowDomains?.length ? { egress: { domains: a.allowDomains } } : {}),
        ...(a.metadata ? { metadata: a.metadata } : {}),
      });
      return ok(`Created sandbox ${s.id} (template ${s.info.template}, ${s.info.memoryMb} MiB).`, describeSandbox(s.info));
    }),
  );

  server.registerTool(
    'list_sandboxes',
    { title: 'List sandboxes', description: 'Lists your sandboxes that have not ended (running, paused, hibernated), newest first.', inputSchema: {} },
    guarded(async () => {
      const page = await Sandbox.list({ ...conn(), state: ['starting', 'running', 'paused', 'hibernated'], limit: 100 });
      const rows = page.items.map(describeSandbox);
      return ok(rows.length ? rows.map((r) => `${r.sandboxId} ${r.state} ${r.template}`).join('\n') : 'No sandboxes.', { sandboxes: rows });
    }),
  );

  server.registerTool(
    'run_command',
    {
      title: 'Run a command',
      description: `Runs a shell command (bash -c if the template has bash, else sh -c) in a sandbox and waits for it to end; returns its exit code, stdout and stderr (each cut after ${OUTPUT_CAP_BYTES / 1024} KiB, with a note). For servers and long jobs use start_process.`,
      inputSchema: {
        sandboxId,
        command: z.string().min(1).max(65536).describe('The shell command line'),
        cwd: z.string().max(4096).optional().describe('Working directory (default: the user\'s home)'),
        user: z.string().max(64).optional().describe('"user" (default, uid 1000) or "root"'),
        env: z.record(z.string(), z.string()).optional().describe('Extra environment variables'),
        timeoutSeconds: z.number().int().min(1).max(MAX_COMMAND_S).default(60).describe(`Kill the command after this many seconds (at most ${MAX_COMMAND_S})`),
      },
    },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      const shell = `if command -v bash >/dev/null 2>&1; then exec bash -c "$SPACE_MCP_CMD"; else exec sh -c "$SPACE_MCP_CMD"; fi`;
      const r = await s.commands.run(['/bin/sh', '-c', shell], { env: { ...(a.env ?? {}), SPACE_MCP_CMD: a.command }, timeoutMs: a.timeoutSeconds * 1000, ...(a.cwd ? { cwd: a.cwd } : {}), ...(a.user ? { user: a.user } : {}) });
      const out = capped(r.stdout);
      const err = capped(r.stderr);
      const head = r.timedOut ? `timed out after ${a.timeoutSeconds} s (killed)` : r.signal ? `killed by ${r.signal}` : `exit code ${r.exitCode}`;
      return ok(`${head}\n--- stdout ---\n${out.text}\n--- stderr ---\n${err.text}`, { exitCode: r.exitCode, signal: r.signal, timedOut: r.timedOut, stdout: out.text, stderr: err.text, truncatedBytes: out.truncated + err.truncated });
    }),
  );

  server.registerTool(
    'start_process',
    {
      title: 'Start a background process',
      description: 'Starts a long-running command (a server, a build, a watcher) in the background and returns its pid at once. Read its output later with read_process_output; stop it with kill_process.',
      inputSchema: {
        sandboxId,
        command: z.string().min(1).max(65536).describe('The shell command line'),
        cwd: z.string().max(4096).optional(),
        user: z.string().max(64).optional().describe('"user" (default) or "root"'),
        env: z.record(z.string(), z.string()).optional(),
        tag: z.string().max(64).optional().describe('A name to recognise it in list_processes'),
      },
    },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      const h = await s.commands.run(['/bin/sh', '-c', a.command], { background: true, ...(a.cwd ? { cwd: a.cwd } : {}), ...(a.user ? { user: a.user } : {}), ...(a.env ? { env: a.env } : {}), ...(a.tag ? { tag: a.tag } : {}) });
      return ok(`Started pid ${h.pid}.`, { pid: h.pid });
    }),
  );

  server.registerTool(
    'read_process_output',
    {
      title: 'Read a background process\'s output',
      description: 'Returns what a background process printed since the last read (the sandbox keeps the last 64 KiB while nobody reads), waiting up to waitSeconds for more, and whether it has exited (with its exit code).',
      inputSchema: { sandboxId, pid: z.number().int().positive(), waitSeconds: z.number().min(0).max(60).default(1).describe('How long to wait for more output or the exit') },
    },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      let stdout = '';
      let stderr = '';
      const h = await s.commands.connect(a.pid, { onStdout: (d) => (stdout += d), onStderr: (d) => (stderr += d) });
      const stop = new AbortController();
      const timer = setTimeout(() => stop.abort(), a.waitSeconds * 1000);
      let exit: Awaited<ReturnType<typeof h.wait>> | undefined;
      try {
        exit = await h.wait({ signal: stop.signal });
      } catch (err) {
        if (!stop.signal.aborted) throw err;
      } finally {
        clearTimeout(timer);
      }
      const out = capped(stdout);
      const err = capped(stderr);
      const state = exit ? `exited: ${exit.signal ? `killed by ${exit.signal}` : `exit code ${exit.exitCode}`}` : 'still running';
      return ok(`${state}\n--- stdout ---\n${out.text}\n--- stderr ---\n${err.text}`, { running: !exit, ...(exit ? { exitCode: exit.exitCode, signal: exit.signal } : {}), stdout: out.text, stderr: err.text });
    }),
  );

  server.registerTool(
    'list_processes',
    { title: 'List processes', description: 'Lists the processes started through SPACE in a sandbox (running and recently exited).', inputSchema: { sandboxId } },
    guarded(async (a) => {
      const procs = await (await sb(a.sandboxId)).commands.list();
      return ok(procs.map((p) => `${p.pid} ${p.running ? 'running' : `exited ${p.exitCode}`} ${p.tag ?? ''} ${p.argv.join(' ').slice(0, 200)}`).join('\n') || 'No processes.', { processes: procs });
    }),
  );

  server.registerTool(
    'kill_process',
    { title: 'Stop a process', description: 'Sends a signal (default SIGTERM) to a process started through SPACE, and its process group.', inputSchema: { sandboxId, pid: z.number().int().positive(), signal: z.enum(['SIGTERM', 'SIGKILL', 'SIGINT', 'SIGHUP']).default('SIGTERM') } },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      await (await s.commands.connect(a.pid)).kill(a.signal);
      return ok(`Sent ${a.signal} to ${a.pid}.`);
    }),
  );

  server.registerTool(
    'read_file',
    {
      title: 'Read a file',
      description: `Reads a file from a sandbox: as UTF-8 text (up to ${READ_CAP_BYTES.text / 1024} KiB) or, for binary files, as base64 (up to ${READ_CAP_BYTES.base64 / 1024} KiB). Larger files: read parts with run_command (head, tail, sed -n).`,
      inputSchema: { sandboxId, path, encoding: z.enum(['text', 'base64']).default('text') },
    },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      const info = await s.files.stat(a.path);
      const cap = READ_CAP_BYTES[a.encoding];
      if (info.size > cap) throw new SpaceError('BAD_REQUEST', `${a.path} has ${info.size} bytes, more than read_file returns as ${a.encoding} (${cap}); read parts of it with run_command`);
      const bytes = Buffer.from(await s.files.read(a.path, { format: 'bytes' }));
      const content = a.encoding === 'base64' ? bytes.toString('base64') : bytes.toString('utf8');
      return ok(content, { path: a.path, size: bytes.length, encoding: a.encoding, content });
    }),
  );

  server.registerTool(
    'write_file',
    {
      title: 'Write a file',
      description: 'Writes a file in a sandbox (parent directories are created), replacing it if it exists. Content is UTF-8 text, or base64 for binary.',
      inputSchema: { sandboxId, path, content: z.string().max(8 * 1024 * 1024), encoding: z.enum(['text', 'base64']).default('text') },
    },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      const data = a.encoding === 'base64' ? Buffer.from(a.content, 'base64') : Buffer.from(a.content, 'utf8');
      const r = await s.files.write(a.path, data);
      return ok(`Wrote ${r.size} bytes to ${r.path}.`, { path: r.path, size: r.size });
    }),
  );

  server.registerTool(
    'list_files',
    { title: 'List a directory', description: 'Lists a directory in a sandbox: name, type, size. depth > 1 lists subdirectories too.', inputSchema: { sandboxId, path, depth: z.number().int().min(1).max(5).default(1) } },
    guarded(async (a) => {
      const entries = await (await sb(a.sandboxId)).files.list(a.path, { depth: a.depth });
      return ok(entries.map((e) => `${e.type === 'dir' ? 'd' : '-'} ${String(e.size).padStart(10)} ${e.path}`).join('\n') || '(empty)', { entries: entries.map((e) => ({ name: e.name, path: e.path, type: e.type, size: e.size })) });
    }),
  );

  server.registerTool(
    'snapshot',
    {
      title: 'Snapshot a sandbox',
      description: 'Saves the whole sandbox — memory, running processes, files — as a snapshot you can roll back to or fork from later. The sandbox keeps running. Take one before a risky change.',
      inputSchema: { sandboxId, name: z.string().max(128).optional().describe('A label for the snapshot') },
    },
    guarded(async (a) => {
      const snap = await (await sb(a.sandboxId)).snapshot(a.name ? { name: a.name } : {});
      return ok(`Snapshot ${snap.id} taken${snap.name ? ` (${snap.name})` : ''}.`, { snapshotId: snap.id, name: snap.name ?? null, createdAt: snap.createdAt });
    }),
  );

  server.registerTool(
    'list_snapshots',
    { title: 'List snapshots', description: 'Lists a sandbox\'s snapshots, oldest first.', inputSchema: { sandboxId } },
    guarded(async (a) => {
      const snaps = await (await sb(a.sandboxId)).snapshots();
      return ok(snaps.map((x) => `${x.id} ${x.createdAt} ${x.trigger} ${x.name ?? ''}`).join('\n') || 'No snapshots.', { snapshots: snaps.map((x) => ({ snapshotId: x.id, name: x.name ?? null, trigger: x.trigger, createdAt: x.createdAt, parentSnapshotId: x.parentSnapshotId ?? null })) });
    }),
  );

  server.registerTool(
    'rollback',
    { title: 'Roll back', description: 'Puts a sandbox back to one of its snapshots: memory, processes and files as they were then. What happened since is gone (take a snapshot first to keep it).', inputSchema: { sandboxId, snapshotId: z.string().min(1).max(64) } },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      await s.rollback(a.snapshotId);
      return ok(`Sandbox ${a.sandboxId} is back at snapshot ${a.snapshotId}.`, describeSandbox(s.info));
    }),
  );

  server.registerTool(
    'fork',
    {
      title: 'Fork a sandbox',
      description: 'Copies a sandbox (as it is now, or as a snapshot was) into `count` new independent sandboxes that diverge from there: try several approaches in parallel and keep the one that works.',
      inputSchema: { sandboxId, count: z.number().int().min(1).max(10).default(2), snapshotId: z.string().max(64).optional().describe('Fork from this snapshot instead of now') },
    },
    guarded(async (a) => {
      const copies = await (await sb(a.sandboxId)).fork({ count: a.count, ...(a.snapshotId ? { fromSnapshot: a.snapshotId } : {}) });
      return ok(`Forked into ${copies.length}: ${copies.map((c) => c.id).join(', ')}.`, { sandboxIds: copies.map((c) => c.id) });
    }),
  );

  server.registerTool(
    'hibernate',
    { title: 'Hibernate', description: 'Saves a sandbox and frees its host resources; it wakes (processes and files intact) with wake or on the next command.', inputSchema: { sandboxId } },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      await s.hibernate();
      return ok(`Sandbox ${a.sandboxId} is hibernated.`, describeSandbox(s.info));
    }),
  );

  server.registerTool(
    'wake',
    { title: 'Wake', description: 'Restores a hibernated sandbox now.', inputSchema: { sandboxId } },
    guarded(async (a) => {
      const s = await sb(a.sandboxId);
      await s.wake();
      return ok(`Sandbox ${a.sandboxId} is ${s.info.state}.`, describeSandbox(s.info));
    }),
  );

  server.registerTool(
    'kill_sandbox',
    { title: 'Kill a sandbox', description: 'Ends a sandbox for good and deletes its snapshots.', inputSchema: { sandboxId } },
    guarded(async (a) => {
      await Sandbox.kill(a.sandboxId, conn());
      return ok(`Sandbox ${a.sandboxId} is killed.`);
    }),
  );

  server.registerTool(
    'egress_log',
    { title: 'Egress log', description: 'What a sandbox sent out through its egress proxy, newest first: host, method, path, allowed or denied and why, and which secret names were injected.', inputSchema: { sandboxId, limit: z.number().int().min(1).max(500).default(50) } },
    guarded(async (a) => {
      const page = await (await sb(a.sandboxId)).egressLog({ limit: a.limit });
      return ok(JSON.stringify(page.items, null, 1), { entries: page.items });
    }),
  );
}
