// `space mcp` driven by the official MCP SDK's client, over stdio (the CLI spawned as MCP
// clients spawn it) and over streamable HTTP: the tools and their schemas, a session that
// creates a `base` sandbox, writes and runs Python, snapshots, breaks it, rolls back, forks in
// two that diverge, and kills; bad arguments and SPACE errors as tool errors with codes;
// resources and a change notification; and HTTP refused without a valid key.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { after, before, describe, it } from 'node:test';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ResourceUpdatedNotificationSchema } from '@modelcontextprotocol/sdk/types.js';
import { api, startTestDaemon } from './helpers.mjs';

const CLI = new URL('../packages/cli/dist/main.js', import.meta.url).pathname;
const TOOLS = ['create_sandbox', 'list_sandboxes', 'run_command', 'start_process', 'read_process_output', 'list_processes', 'kill_process', 'read_file', 'write_file', 'list_files', 'snapshot', 'list_snapshots', 'rollback', 'fork', 'hibernate', 'wake', 'kill_sandbox', 'egress_log'];

/** Calls a tool; returns its structured content, failing on a tool error. */
async function call(client, name, args) {
  const r = await client.callTool({ name, arguments: args });
  assert.ok(!r.isError, `${name} failed: ${r.content?.[0]?.text}`);
  return r.structuredContent ?? {};
}

describe('space mcp', () => {
  let fx;
  let home;
  const killed = [];
  before(async () => {
    fx = await startTestDaemon();
    home = mkdtempSync('/tmp/spm-home-');
  });
  after(async () => {
    const leaks = await fx?.close();
    rmSync(home, { recursive: true, force: true });
    assert.deepEqual(leaks ?? [], []);
  });

  /** A client connected to `space mcp` over stdio, configured like a user's CLI. */
  async function stdioClient() {
    const transport = new StdioClientTransport({ command: process.execPath, args: [CLI, 'mcp'], env: { ...process.env, XDG_CONFIG_HOME: home, SPACE_URL: fx.url, SPACE_API_KEY: fx.key }, stderr: 'pipe' });
    const client = new Client({ name: 'space-test', version: '1.0.0' });
    await client.connect(transport);
    return client;
  }

  it('over stdio: lists every tool with an object schema an LLM can fill', async () => {
    const client = await stdioClient();
    try {
      const { tools } = await client.listTools();
      assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort());
      for (const t of tools) {
        assert.equal(t.inputSchema.type, 'object', t.name);
        assert.ok(t.description && t.description.length > 20, `${t.name} has a description`);
      }
      const run = tools.find((t) => t.name === 'run_command');
      assert.deepEqual(run.inputSchema.required.sort(), ['command', 'sandboxId']);
      assert.equal(run.inputSchema.properties.timeoutSeconds.maximum, 600);
    } finally {
      await client.close();
    }
  });

  it('over stdio: create, write, run python, snapshot, break, roll back, fork in two that diverge, kill', async () => {
    const client = await stdioClient();
    try {
      const { sandboxId } = await call(client, 'create_sandbox', { template: 'base' });
      fx.track(sandboxId);
      assert.match(sandboxId, /^sb[a-z0-9]{18}$/);
      await call(client, 'write_file', { sandboxId, path: '/home/user/app.py', content: 'print("version", 1)\n' });
      let r = await call(client, 'run_command', { sandboxId, command: 'python3 app.py' });
      assert.equal(r.exitCode, 0);
      assert.equal(r.stdout, 'version 1\n');
      const { snapshotId } = await call(client, 'snapshot', { sandboxId, name: 'working' });
      await call(client, 'write_file', { sandboxId, path: '/home/user/app.py', content: 'raise SystemExit("broken")\n' });
      r = await call(client, 'run_command', { sandboxId, command: 'python3 app.py' });
      assert.equal(r.exitCode, 1);
      assert.match(r.stderr, /broken/);
      const snaps = await call(client, 'list_snapshots', { sandboxId });
      assert.deepEqual(snaps.snapshots.map((s) => s.name), ['working']);
      await call(client, 'rollback', { sandboxId, snapshotId });
      const file = await call(client, 'read_file', { sandboxId, path: '/home/user/app.py' });
      assert.equal(file.content, 'print("version", 1)\n');
      const { sandboxIds } = await call(client, 'fork', { sandboxId, count: 2 });
      for (const id of sandboxIds) fx.track(id);
      assert.equal(sandboxIds.length, 2);
      await call(client, 'write_file', { sandboxId: sandboxIds[0], path: '/home/user/app.py', content: 'print("fix A")\n' });
      await call(client, 'write_file', { sandboxId: sandboxIds[1], path: '/home/user/app.py', content: 'print("fix B")\n' });
      assert.equal((await call(client, 'run_command', { sandboxId: sandboxIds[0], command: 'python3 app.py' })).stdout, 'fix A\n');
      assert.equal((await call(client, 'run_command', { sandboxId: sandboxIds[1], command: 'python3 app.py' })).stdout, 'fix B\n');
      assert.equal((await call(client, 'run_command', { sandboxId, command: 'python3 app.py' })).stdout, 'version 1\n', 'the parent is unchanged');
      const { pid } = await call(client, 'start_process', { sandboxId, command: 'for i in 1 2 3; do echo tick $i; sleep 0.2; done' });
      let out = '';
      for (let i = 0; i < 20; i++) {
        const p = await call(client, 'read_process_output', { sandboxId, pid, waitSeconds: 2 });
        out += p.stdout;
        if (!p.running) break;
      }
      assert.equal(out, 'tick 1\ntick 2\ntick 3\n');
      const listed = await call(client, 'list_files', { sandboxId, path: '/home/user' });
      assert.ok(listed.entries.some((e) => e.name === 'app.py'));
      for (const id of [sandboxId, ...sandboxIds]) {
        await call(client, 'kill_sandbox', { sandboxId: id });
        killed.push(id);
      }
      assert.deepEqual((await call(client, 'list_sandboxes', {})).sandboxes.filter((s) => killed.includes(s.sandboxId)), []);
    } finally {
      await client.close();
    }
  });

  it('bad arguments and SPACE errors come back as tool errors with their codes and hints', async () => {
    const client = await stdioClient();
    try {
      const bad = await client.callTool({ name: 'run_command', arguments: { sandboxId: 'not-an-id', command: 'true' } });
      assert.equal(bad.isError, true);
      assert.match(bad.content[0].text, /sandbox id/);
      const missing = await client.callTool({ name: 'run_command', arguments: { sandboxId: 'sb000000000000000000', command: 'true' } });
      assert.equal(missing.isError, true);
      assert.equal(missing.structuredContent.error.code, 'SANDBOX_NOT_FOUND');
      assert.match(missing.content[0].text, /^SANDBOX_NOT_FOUND: .*\nhint: /);
      const tmpl = await client.callTool({ name: 'create_sandbox', arguments: { template: 'no-such-template' } });
      assert.equal(tmpl.structuredContent.error.code, 'TEMPLATE_NOT_FOUND');
      const limits = await client.callTool({ name: 'create_sandbox', arguments: { template: 'minimal', memoryMb: 10 } });
      assert.equal(limits.isError, true, 'the schema refuses less than 64 MiB');
    } finally {
      await client.close();
    }
  });

  describe('over streamable HTTP', () => {
    let server;
    let url;
    before(async () => {
      server = spawn(process.execPath, [CLI, 'mcp', '--http', '127.0.0.1:0'], { env: { ...process.env, XDG_CONFIG_HOME: home, SPACE_URL: fx.url, SPACE_API_KEY: '' }, stdio: ['ignore', 'ignore', 'pipe'] });
      url = await new Promise((resolve, reject) => {
        let err = '';
        server.stderr.on('data', (d) => {
          err += d;
          const m = /serving MCP at (http:\/\/\S+)/.exec(err);
          if (m) resolve(m[1]);
        });
        server.once('exit', (code) => reject(new Error(`space mcp --http exited ${code}: ${err}`)));
      });
    });
    after(() => server?.kill('SIGTERM'));

    const httpClient = async (key) => {
      const client = new Client({ name: 'space-test-http', version: '1.0.0' });
      await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: key ? { authorization: `Bearer ${key}` } : {} } }));
      return client;
    };

    it('refuses a missing or wrong API key with 401', async () => {
      await assert.rejects(httpClient(undefined), /401|UNAUTHENTICATED/);
      await assert.rejects(httpClient('sk_not_a_real_key'), /401|UNAUTHENTICATED/);
      const raw = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream' }, body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }) });
      assert.equal(raw.status, 401);
    });

    it('with a key: tools run as that tenant; resources read; a subscription hears the state change', async () => {
      const client = await httpClient(fx.key);
      try {
        const { tools } = await client.listTools();
        assert.equal(tools.length, TOOLS.length);
        const { sandboxId } = await call(client, 'create_sandbox', { template: 'minimal' });
        fx.track(sandboxId);
        const r = await call(client, 'run_command', { sandboxId, command: 'echo over-http' });
        assert.equal(r.stdout, 'over-http\n');
        const list = JSON.parse((await client.readResource({ uri: 'space://sandboxes' })).contents[0].text);
        assert.ok(list.some((s) => s.sandboxId === sandboxId));
        const one = JSON.parse((await client.readResource({ uri: `space://sandboxes/${sandboxId}` })).contents[0].text);
        assert.equal(one.state, 'running');
        const updated = new Promise((resolve) => client.setNotificationHandler(ResourceUpdatedNotificationSchema, (n) => resolve(n.params.uri)));
        await client.subscribeResource({ uri: `space://sandboxes/${sandboxId}` });
        await call(client, 'hibernate', { sandboxId });
        assert.equal(await updated, `space://sandboxes/${sandboxId}`);
        await call(client, 'snapshot', { sandboxId }).catch(() => {});
        const timeline = JSON.parse((await client.readResource({ uri: `space://sandboxes/${sandboxId}/snapshots` })).contents[0].text);
        assert.ok(timeline.length >= 1, 'the hibernation snapshot is on the timeline');
        // Another tenant's key sees nothing of this sandbox.
        const other = await api(fx, 'POST', '/v1/keys', { json: { name: 'other', tenant: 'other-tenant' } });
        assert.equal(other.status, 201, JSON.stringify(other.body));
        const stranger = await httpClient(other.body.key);
        try {
          const seen = await stranger.callTool({ name: 'run_command', arguments: { sandboxId, command: 'true' } });
          assert.equal(seen.structuredContent.error.code, 'SANDBOX_NOT_FOUND');
        } finally {
          await stranger.close();
        }
        await call(client, 'kill_sandbox', { sandboxId });
      } finally {
        await client.close();
      }
    });
  });
});
