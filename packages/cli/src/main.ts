#!/usr/bin/env node
/**
 * `space` — the SPACE command line. Client commands use only the public SDK; `up`, `down`
 * and `daemon` manage a local daemon; `doctor` checks this host.
 */
import { spawn } from 'node:child_process';
import { createReadStream, createWriteStream, existsSync, openSync, promises as fs, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { fileURLToPath } from 'node:url';
import { Command, Option } from 'commander';
import { parseSizeMb, parseVolumeMount } from '@space/api';
import { ApiClient, Commands, Nodes, Sandbox, Secrets, SpaceError, Templates, type BuildProgress, type EgressPolicy, type SandboxInfo, type TemplateInfo } from '@space/sdk';
import { defaultDataDir } from '@space/server/state';
import { checkContextName, connection, e2bKeys, parseDuration, parsePairs, readConfig, selectedContext, upCommand, writeConfig } from './config.js';
import { answers, daemonStatus, installOnPath } from './daemon.js';
import { mib, table } from './table.js';
import { registerVolumeCommands } from './volumes.js';

// The launcher (bin/space) moved NODE_EXTRA_CA_CERTS aside so node would not parse it at start;
// the processes this CLI starts (the daemon) get it back.
if (process.env.SPACE_EXTRA_CA_CERTS && !process.env.NODE_EXTRA_CA_CERTS) process.env.NODE_EXTRA_CA_CERTS = process.env.SPACE_EXTRA_CA_CERTS;

const collectList = (v: string, prev: string[] = []) => [...prev, v];
const program = new Command('space')
  .description('SPACE: stateful sandboxes for AI agents')
  .option('--context <name>', 'the daemon to talk to, by context name (default: the current one; see `space context ls`)')
  .showHelpAfterError()
  // Commands read the context through connection(): hand the flag on as SPACE_CONTEXT.
  .hook('preAction', (cmd) => {
    const name = cmd.opts<{ context?: string }>().context;
    if (name) process.env.SPACE_CONTEXT = checkContextName(name);
  });

function age(iso: string | undefined): string {
  if (!iso) return '-';
  const s = Math.round((Date.now() - Date.parse(iso)) / 1000);
  return s < 60 ? `${s}s` : s < 3600 ? `${Math.round(s / 60)}m` : `${Math.round(s / 3600)}h`;
}

async function sleep(ms: number) {
  await new Promise((r) => setTimeout(r, ms));
}

/** A progress bar on stderr (one line on a terminal, a line per step otherwise). */
function progressBar(label: string): { update: BuildProgress; done(msg: string): void } {
  let last = '';
  return {
    update: (pct, step) => {
      const p = Math.max(0, Math.min(100, Math.round(pct)));
      const line = `${label} [${'#'.repeat(Math.round(p / 5)).padEnd(20, '.')}] ${String(p).padStart(3)}% ${step}`;
      if (line === last) return;
      if (process.stderr.isTTY) process.stderr.write(`\r${line}\x1b[K`);
      else if (line.replace(/\[.*?%/, '') !== last.replace(/\[.*?%/, '')) process.stderr.write(`${line}\n`);
      last = line;
    },
    done: (msg) => {
      if (last && process.stderr.isTTY) process.stderr.write(`\r${msg}\x1b[K\n`);
    },
  };
}

/** Makes sure a template is ready (a built-in is built on first use), showing progress. */
async function ensureTemplate(name: string): Promise<void> {
  const t = await Templates.get(name, connection());
  if (t.state === 'ready') return;
  const bar = progressBar(`preparing template ${name}`);
  await Templates.prepare(name, { ...connection(), onProgress: bar.update });
  bar.done(`template ${name} ready`);
}

// ---------- daemon management
const spacedBin = () => path.join(path.dirname(fileURLToPath(import.meta.resolve('@space/server'))), 'main.js');

interface DaemonFlags {
  dataDir: string;
  listen: string;
  templatesDir?: string;
  maxSandboxes?: string;
  maxMemory?: string;
  pool?: string;
  driver?: string;
  drivers?: string;
  microvmAccel?: string;
  e2bInternet?: string;
  e2bPublicTraffic?: string;
  disks?: string;
  diskPool?: string;
  diskDefault?: string;
  diskMax?: string;
  diskPoolSize?: string;
  volumes?: string;
  database?: string;
  blobStore?: string;
  workDir?: string;
  nodeName?: string;
  advertiseUrl?: string;
}

/** The flags `up` and `daemon` share, passed on to spaced. */
function daemonCommand(name: string, description: string): Command {
  return program
    .command(name)
    .description(description)
    .option('--data-dir <dir>', 'data directory', defaultDataDir())
    .option('--listen <host:port>', 'address to listen on', '127.0.0.1:7070')
    .option('--templates-dir <dir>', 'template cache directory')
    .option('--max-sandboxes <n>', 'most sandboxes at once')
    .option('--max-memory <size>', 'most the sandboxes\' memory limits may add up to, e.g. 40G (default: twice the host\'s memory)')
    .option('--pool <template=n,...>', 'warm pools of the built-in templates, e.g. minimal=2')
    .option('--driver <name>', 'default isolation driver of the sandboxes: gvisor or microvm')
    .option('--drivers <list>', 'drivers a sandbox may choose at creation, e.g. gvisor,microvm')
    .option('--microvm-accel <mode>', 'microvm acceleration: auto, kvm or tcg')
    .option('--e2b-internet <allow|deny>', "what E2B's allowInternetAccess: true gives E2B-created sandboxes: allow (public destinations through the egress proxy) or deny")
    .option('--e2b-public-traffic <allow|deny>', "whether E2B-created sandboxes' ports may be reached without their traffic token (E2B's allowPublicTraffic): allow (E2B's default) or deny")
    .option('--disks <auto|on|off>', 'auto (the default): on for a new data directory of a node on its own on a host with btrfs and loop devices, decided once per data directory; on: sandbox files on bounded disks in a btrfs pool (not in memory); off: in memory (a sandbox that writes more than its memory dies)')
    .option('--disk-pool <dir>', 'directory of the disk pool (default: DATA_DIR/disks)')
    .option('--disk-default <size>', 'disk size of a sandbox whose create gives none, e.g. 5G')
    .option('--disk-max <size>', 'largest disk a create may ask for, e.g. 64G')
    .option('--disk-pool-size <size>', 'size of a new disk pool, taken on the host when it is made (default: 32G, or half of the free space if less)')
    .option('--volumes <auto|on|off>', 'named volumes: auto (on when the host can: fscrypt, ext4 encryption), on, or off')
    .option('--database <url>', 'metadata in PostgreSQL: postgres://USER@HOST:PORT/DB (password in PGPASSWORD or ~/.pgpass); default SQLite in the data directory')
    .option('--blob-store <url>', 'snapshots and template images: file:///PATH or s3://BUCKET[/PREFIX]?endpoint=http://HOST:PORT (keys in AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY); default DATA_DIR/blobs')
    .option('--work-dir <dir>', 'where checkpoint images pass through (up to a sandbox\'s memory each); default in RAM, /dev/shm')
    .option('--node-name <name>', 'this node\'s name in its deployment (space nodes); default the host name')
    .option('--advertise-url <url>', 'where other nodes sharing the database reach this one\'s API, e.g. http://10.0.0.5:7070; default the listen address');
}

function daemonArgs(o: DaemonFlags): string[] {
  return ['--data-dir', o.dataDir, '--listen', o.listen, ...(o.templatesDir ? ['--templates-dir', o.templatesDir] : []), ...(o.maxSandboxes ? ['--max-sandboxes', o.maxSandboxes] : []), ...(o.maxMemory ? ['--max-memory', o.maxMemory] : []), ...(o.pool ? ['--pool', o.pool] : []), ...(o.driver ? ['--driver', o.driver] : []), ...(o.drivers ? ['--drivers', o.drivers] : []), ...(o.microvmAccel ? ['--microvm-accel', o.microvmAccel] : []), ...(o.e2bInternet ? ['--e2b-internet', o.e2bInternet] : []), ...(o.e2bPublicTraffic ? ['--e2b-public-traffic', o.e2bPublicTraffic] : []), ...(o.disks ? ['--disks', o.disks] : []), ...(o.diskPool ? ['--disk-pool', o.diskPool] : []), ...(o.diskDefault ? ['--disk-default', o.diskDefault] : []), ...(o.diskMax ? ['--disk-max', o.diskMax] : []), ...(o.diskPoolSize ? ['--disk-pool-size', o.diskPoolSize] : []), ...(o.volumes ? ['--volumes', o.volumes] : []), ...(o.database ? ['--database', o.database] : []), ...(o.blobStore ? ['--blob-store', o.blobStore] : []), ...(o.workDir ? ['--work-dir', o.workDir] : []), ...(o.nodeName ? ['--node-name', o.nodeName] : []), ...(o.advertiseUrl ? ['--advertise-url', o.advertiseUrl] : [])];
}

/**
 * The node's encryption key, as an operator would make it: the daemon never writes key files,
 * so `up` and `daemon` create `<data>/keys/node.key` (32 random bytes, 0600) the first time,
 * unless SPACE_KEY_DIR points at keys the operator manages.
 */
async function ensureNodeKey(dataDir: string): Promise<void> {
  if (process.env.SPACE_KEY_DIR) return;
  const dir = path.join(dataDir, 'keys');
  const file = path.join(dir, process.env.SPACE_NODE_KEY ?? 'node.key');
  if (existsSync(file)) return;
  await fs.mkdir(dir, { recursive: true, mode: 0o700 });
  const { randomBytes } = await import('node:crypto');
  await fs.writeFile(file, randomBytes(32), { mode: 0o600, flag: 'wx' }).catch((err: NodeJS.ErrnoException) => {
    if (err.code !== 'EEXIST') throw err;
  });
  process.stderr.write(`created the node's encryption key ${file}: back it up — snapshots cannot be read without it\n`);
}

/** This CLI's launcher (bin/space, which starts this bundle): what a `space` on the PATH points at. */
const launcherPath = () => fileURLToPath(new URL('../bin/space', import.meta.url));

/** The context a data directory gets when `up` is not told one: `default` for the default directory. */
function contextFor(dataDir: string): string {
  if (dataDir === path.resolve(defaultDataDir())) return 'default';
  const base = path.basename(dataDir).replace(/[^A-Za-z0-9_.-]/g, '-').replace(/^[^A-Za-z0-9]+/, '');
  return base ? base.slice(0, 63) : 'local';
}

daemonCommand('up', 'start the daemon in the background (or find it running), record it as a CLI context and print how to reach it')
  .option('--timeout <duration>', 'how long to wait for the daemon', '120s')
  .addHelpText('after', '\nThe daemon is recorded as the CLI context named by --context (default: "default" for the default data dir, else the directory\'s name).\nIt becomes the current context only if there is none: a second, private daemon does not take the CLI away from the first.')
  .action(async (o: DaemonFlags & { timeout: string }) => {
    const dataDir = path.resolve(o.dataDir);
    const deadline = Date.now() + parseDuration(o.timeout);
    let status = await daemonStatus(dataDir);
    // A daemon whose process runs but does not answer may be starting: give it the timeout.
    while (status.state === 'silent' && Date.now() < deadline) {
      await sleep(250);
      status = await daemonStatus(dataDir);
    }
    if (status.state === 'silent') throw new Error(`spaced (pid ${status.st.pid}) runs but does not answer at ${status.st.url}; see ${path.join(dataDir, 'spaced.log')}, or stop it (kill ${status.st.pid}) and run \`space up\` again`);
    let st = status.state === 'running' ? status.st : undefined;
    if (!st) {
      if (status.st) process.stderr.write(`spaced (pid ${status.st.pid}) is gone without stopping (crashed or killed); starting it again\n`);
      await fs.mkdir(dataDir, { recursive: true, mode: 0o700 });
      await ensureNodeKey(dataDir);
      const logFile = path.join(dataDir, 'spaced.log');
      const log = openSync(logFile, 'a', 0o600);
      process.stderr.write(`starting spaced (log: ${logFile}) ...\n`);
      const child = spawn(process.execPath, [spacedBin(), ...daemonArgs({ ...o, dataDir })], { detached: true, stdio: ['ignore', log, log] });
      let exited: number | null | undefined;
      child.on('exit', (code) => (exited = code));
      child.unref();
      for (;;) {
        const s2 = await daemonStatus(dataDir);
        if (s2.state === 'running' && s2.st.pid === child.pid) {
          st = s2.st;
          break;
        }
        if (exited !== undefined) {
          const tail = readFileSync(logFile, 'utf8').trim().split('\n').slice(-5).join('\n');
          throw new Error(`spaced exited with code ${exited}:\n${tail}`);
        }
        if (Date.now() > deadline) throw new Error(`spaced did not come up within ${o.timeout}; see ${logFile}`);
        await sleep(100);
      }
    }
    // Record the daemon as a context; it becomes the current one only if there is none (a
    // second, private daemon must not take the CLI away from the first).
    const name = checkContextName(program.opts<{ context?: string }>().context ?? contextFor(dataDir));
    const cfg = readConfig();
    cfg.contexts[name] = { url: st.url, keyFile: st.keyFile, dataDir };
    const current = !cfg.current || !cfg.contexts[cfg.current] || cfg.current === name;
    if (current) cfg.current = name;
    writeConfig(cfg);
    const onPath = installOnPath(launcherPath());
    // A node that joined a deployment which has keys already writes none of its own: the
    // deployment's keys work on every node (it shares their database).
    const keyNote = existsSync(st.keyFile) ? st.keyFile : `${st.keyFile} — none written: this node joined a deployment that has API keys; put one of them there (e.g. another node's admin.key) for this context`;
    process.stdout.write(
      `SPACE is running\n  url:      ${st.url}\n  console:  ${st.url}/ (sign in with the API key)\n  data dir: ${dataDir}\n  API key:  ${keyNote}\n  pid:      ${st.pid}\n${st.disks ? `  disks:    ${st.disks.mode} (${st.disks.why})${st.disks.poolBytes ? `; the pool takes ${(st.disks.poolBytes / 2 ** 30).toFixed(1)} GiB of the host's disk: --disk-pool-size` : ''}\n` : ''}${st.e2bUrl ? `  E2B API:  ${st.e2bUrl} (export $(space e2b env))\n` : ''}` +
        `  context:  ${name}${current ? ' (current)' : ` (not current: use it with \`space --context ${name} …\` or \`space context use ${name}\`)`}\n` +
        ('error' in onPath ? `  command:  not installed (${onPath.error})\n` : `  command:  ${onPath.path}${onPath.installed ? ' (installed now)' : ''}\n`) +
        `${current ? 'The CLI is configured; try: space create\n' : ''}`,
    );
  });

program
  .command('down')
  .description('stop a daemon: the current context\'s, or that of --data-dir (sandboxes keep running and are re-adopted by the next `space up`)')
  .option('--data-dir <dir>', 'data directory (default: the current context\'s)')
  .action(async (o: { dataDir?: string }) => {
    const dataDir = path.resolve(o.dataDir ?? selectedContext()?.ctx.dataDir ?? defaultDataDir());
    const status = await daemonStatus(dataDir);
    if (status.state === 'stopped') return void process.stdout.write(`no daemon running for ${dataDir}\n${nextContext(dataDir)}`);
    const { pid } = status.st;
    process.kill(pid, 'SIGTERM');
    for (let i = 0; i < 300; i++) {
      if ((await daemonStatus(dataDir)).state === 'stopped') return void process.stdout.write(`stopped spaced (pid ${pid})\n${nextContext(dataDir)}`);
      await sleep(100);
    }
    throw new Error(`spaced (pid ${pid}) did not stop within 30 s`);
  });

/** After `down`: what the CLI's current context now reaches, and the running alternatives. */
function nextContext(stoppedDir: string): string {
  const cfg = readConfig();
  const cur = cfg.current ? cfg.contexts[cfg.current] : undefined;
  if (!cur || path.resolve(cur.dataDir) !== stoppedDir) return '';
  return `the CLI's current context "${cfg.current}" has no daemon now: \`${upCommand(cfg.current!, cur)}\` starts it again${Object.keys(cfg.contexts).length > 1 ? `, \`space context use NAME\` switches (\`space context ls\`)` : ''}\n`;
}

const context = program.command('context').description('the daemons the CLI knows (contexts), and which one commands use');
context
  .command('ls')
  .description('list contexts: * marks the current one; whether each daemon answers')
  .action(async () => {
    const cfg = readConfig();
    const rows = [['', 'NAME', 'URL', 'DATA DIR', 'DAEMON']];
    for (const [name, c] of Object.entries(cfg.contexts)) {
      const up = await answers({ url: c.url }, 1000);
      rows.push([name === cfg.current ? '*' : '', name, c.url, c.dataDir, up ? 'running' : 'stopped']);
    }
    process.stdout.write(rows.length > 1 ? `${table(rows)}\n` : 'no contexts yet: `space up` makes one\n');
  });
context
  .command('use <name>')
  .description('make a context the current one')
  .action((name: string) => {
    const cfg = readConfig();
    if (!cfg.contexts[checkContextName(name)]) throw new Error(`no context ${JSON.stringify(name)} (known: ${Object.keys(cfg.contexts).join(', ') || 'none'}); \`space up --context ${name}\` makes it`);
    cfg.current = name;
    writeConfig(cfg);
    process.stdout.write(`current context: ${name} (${cfg.contexts[name]!.url})\n`);
  });
context
  .command('rm <name>')
  .description('forget a context (its daemon keeps running)')
  .action((name: string) => {
    const cfg = readConfig();
    if (!cfg.contexts[name]) throw new Error(`no context ${JSON.stringify(name)}`);
    delete cfg.contexts[name];
    if (cfg.current === name) delete cfg.current;
    writeConfig(cfg);
    process.stdout.write(`removed context ${name}${cfg.current ? '' : '; no current context now: `space context use NAME`'}\n`);
  });

daemonCommand('daemon', 'run the daemon in the foreground').action(async (o: DaemonFlags) => {
    await fs.mkdir(path.resolve(o.dataDir), { recursive: true, mode: 0o700 });
    await ensureNodeKey(path.resolve(o.dataDir));
    const child = spawn(process.execPath, [spacedBin(), ...daemonArgs(o)], { stdio: 'inherit' });
    for (const sig of ['SIGINT', 'SIGTERM'] as const) process.on(sig, () => child.kill(sig));
    await new Promise<void>((resolve) => child.on('exit', (code) => { process.exitCode = code ?? 1; resolve(); }));
  });

program
  .command('doctor')
  .description('check this host: runsc, cgroups, namespaces, nftables; which drivers can run here; whether it can keep volumes; whether preview names resolve')
  .option('--json', 'print JSON')
  .option('--data-dir <dir>', 'data directory (the microvm driver keeps its guest kernel there)', defaultDataDir())
  .action(async (o: { json?: boolean; dataDir: string }) => {
    const { GvisorDriver } = await import('@space/driver-gvisor');
    const { MicrovmDriver } = await import('@space/driver-microvm');
    const g = await new GvisorDriver({ dataDir: '/nonexistent' }).doctor();
    // The microvm check fetches and builds the guest kernel into the data directory once (as `up` would).
    const m = await new MicrovmDriver({ dataDir: o.dataDir }).doctor();
    const reports = [g, m];
    const { Ext4Volumes } = await import('@space/volume-ext4');
    const volumes = await new Ext4Volumes({ dir: '/nonexistent' }).doctor();
    const { localNamesResolve } = await import('@space/ingress');
    const previewNames = await localNamesResolve('localhost');
    const ingress = { localhostResolves: previewNames, detail: previewNames ? '*.localhost resolves to loopback for every program (preview URLs work in code too)' : '*.localhost resolves in browsers and curl only: install libnss-myhostname for programs (Node fetch, Python), or use --ingress-domain with wildcard DNS' };
    if (o.json) return void process.stdout.write(JSON.stringify({ drivers: reports, volumes, ingress }, null, 2) + '\n');
    for (const r of reports) {
      process.stdout.write(`${r.driver}: ${r.available ? 'AVAILABLE' : 'NOT AVAILABLE'}\n`);
      for (const c of r.checks) process.stdout.write(`  ${c.ok ? 'ok  ' : 'FAIL'} ${c.name.padEnd(20)} ${c.detail}\n`);
    }
    process.stdout.write(`volumes: ${volumes.available ? 'AVAILABLE' : 'NOT AVAILABLE'} (${volumes.detail})\n`);
    process.stdout.write(`ingress names: ${previewNames ? 'ok' : 'BROWSERS AND CURL ONLY'} (${ingress.detail})\n`);
    if (!g.available) process.exitCode = 1;
  });

// ---------- sandboxes
program
  .command('create')
  .description('create a sandbox and print its id')
  .option('-t, --template <name>', 'template', 'minimal')
  .option('--driver <name>', 'isolation driver: gvisor or microvm (one the daemon enables; default: the daemon\'s)')
  .option('--cpu <n>', 'CPU cores', Number)
  .option('--memory <mb>', 'memory limit in MiB', Number)
  .option('--disk <size>', "disk size, template files included, e.g. 4G (daemons with disks, the default on a single node; default: the daemon's --disk-default)")
  .option('--timeout <duration>', 'kill it after this long (0 = never)', '30m')
  .option('--on-timeout <action>', 'kill or hibernate when the timeout is reached', 'kill')
  .option('--idle-timeout <duration>', 'hibernate after this long without API calls')
  .option('-e, --env <K=V>', 'environment variable (repeatable)', collectList)
  .option('-l, --label <k=v>', 'label (repeatable)', collectList)
  .option('--secret <name>', 'attach a secret: the sandbox gets a placeholder in env var NAME (repeatable)', collectList)
  .option('--allow-domain <host>', 'egress: allow a host, or *.example.org for its subdomains (repeatable)', collectList)
  .option('--allow-cidr <cidr>', 'egress: allow an address range (repeatable)', collectList)
  .option('--allow-port <port>', 'egress: allow a destination port (repeatable; default 80 and 443)', collectList)
  .option('--passthrough <host:port>', 'egress: raw TCP to this destination, no TLS interception (repeatable)', collectList)
  .option('-v, --volume <name:/path[:ro]>', 'mount a volume (repeatable): read-write by this sandbox alone, or :ro shared', collectList)
  .option('--json', 'print the sandbox as JSON')
  .action(async (o: { template: string; driver?: string; cpu?: number; memory?: number; disk?: string; timeout: string; onTimeout: string; idleTimeout?: string; env?: string[]; label?: string[]; secret?: string[]; volume?: string[]; json?: boolean } & EgressFlags) => {
    if (o.onTimeout !== 'kill' && o.onTimeout !== 'hibernate') throw new Error('--on-timeout takes kill or hibernate');
    const diskMb = o.disk !== undefined ? parseSizeMb(o.disk, '--disk') : undefined;
    const volumes = o.volume?.map(parseVolumeMount);
    await ensureTemplate(o.template);
    const env = parsePairs(o.env, 'env');
    const metadata = parsePairs(o.label, 'label');
    const sb = await Sandbox.create({
      ...connection(),
      template: o.template,
      ...(o.driver ? { driver: o.driver } : {}),
      ...(o.cpu !== undefined ? { cpu: o.cpu } : {}),
      ...(o.memory !== undefined ? { memoryMb: o.memory } : {}),
      ...(diskMb !== undefined ? { diskMb } : {}),
      timeoutMs: parseDuration(o.timeout),
      onTimeout: o.onTimeout,
      ...(o.idleTimeout ? { idleTimeoutMs: parseDuration(o.idleTimeout) } : {}),
      ...(env ? { env } : {}),
      ...(metadata ? { metadata } : {}),
      ...(o.secret ? { secrets: o.secret } : {}),
      ...(volumes ? { volumes } : {}),
      ...(hasEgressFlags(o) ? { egress: egressOf(o) } : {}),
    });
    process.stdout.write(o.json ? JSON.stringify(sb.info, null, 2) + '\n' : sb.id + '\n');
  });

program
  .command('nodes')
  .description('the deployment\'s nodes: state, sandboxes, memory reserved by their limits, load, capacity, warm sandboxes ready, last heartbeat (admin key)')
  .option('--json', 'print JSON')
  .action(async (o: { json?: boolean }) => {
    const nodes = await Nodes.list(connection());
    if (o.json) return void process.stdout.write(JSON.stringify(nodes, null, 2) + '\n');
    const rows = [['NAME', 'STATE', 'SANDBOXES', 'RESERVED', 'CPUS', 'LOAD', 'MEMORY', 'DRIVERS', 'WARM', 'HEARTBEAT', 'URL']];
    for (const n of nodes) rows.push([n.name, n.draining ? `${n.state}, drained` : n.state, `${n.sandboxes}/${n.maxSandboxes}`, `${mib(n.memoryReservedMb)}/${mib(n.maxMemoryMb)}`, String(n.cpus), n.load === undefined ? '-' : n.load.toFixed(2), mib(n.memoryMb), n.drivers.join(','), String(Object.values(n.warm ?? {}).reduce((a, b) => a + b, 0)), `${age(n.heartbeatAt)} ago`, n.url]);
    process.stdout.write(table(rows) + '\n');
  });

const nodeCmd = program.command('node').description('drain or undrain a node of the cluster (admin key)');
nodeCmd
  .command('drain <name>')
  .description('place no new sandbox on the node and move every session it runs to the node with most room (hibernated on it, woken on the new node if it ran)')
  .option('--json', 'print JSON')
  .action(async (name: string, o: { json?: boolean }) => {
    const t0 = Date.now();
    process.stderr.write(`draining node ${name}: moving its sessions off...\n`);
    const r = await Nodes.drain(name, {
      ...connection(),
      onProgress: (ev) => {
        if (ev.type === 'plan') process.stderr.write(`${ev.sessions} session${ev.sessions === 1 ? '' : 's'} to move\n`);
        else if (ev.type === 'moved') process.stderr.write(`[${ev.done}/${ev.sessions}] ${ev.id} moved to node ${ev.node} (${Math.round((Date.now() - t0) / 1000)} s)\n`);
        else if (ev.type === 'stayed') process.stderr.write(`[${ev.done}/${ev.sessions}] ${ev.id} stayed: ${ev.reason}\n`);
      },
    });
    if (o.json) return void process.stdout.write(JSON.stringify(r, null, 2) + '\n');
    for (const m of r.moved) process.stdout.write(`${m.id} moved to node ${m.node}\n`);
    for (const s of r.stayed) process.stdout.write(`${s.id} stayed: ${s.reason}\n`);
    process.stdout.write(`node ${r.node} drained: ${r.moved.length} moved, ${r.stayed.length} stayed (${Date.now() - t0} ms)\n`);
    if (r.stayed.length) process.exitCode = 1;
  });
nodeCmd
  .command('undrain <name>')
  .description('let the node take new sandboxes again')
  .action(async (name: string) => {
    const r = await Nodes.undrain(name, connection());
    process.stdout.write(`node ${r.node} takes new sandboxes again\n`);
  });

program
  .command('ls')
  .description('list your sandboxes')
  .option('--json', 'print JSON')
  .option('-a, --all', 'include ended sandboxes')
  .option('-l, --label <k=v>', 'filter by label (repeatable)', collectList)
  .option('--limit <n>', 'page size', Number, 100)
  .action(async (o: { json?: boolean; all?: boolean; label?: string[]; limit: number }) => {
    const metadata = parsePairs(o.label, 'label');
    const page = await Sandbox.list({ ...connection(), ...(o.all ? {} : { state: ['starting', 'running'] }), ...(metadata ? { metadata } : {}), limit: o.limit });
    if (o.json) return void process.stdout.write(JSON.stringify(page.items, null, 2) + '\n');
    const rows = [['ID', 'STATE', 'TEMPLATE', 'CPU', 'MEMORY', 'AGE', 'LABELS']];
    for (const s of page.items) rows.push([s.id, s.state + (s.endReason && s.state !== 'running' ? `(${s.endReason})` : ''), s.template, String(s.cpu), `${s.memoryMb}M`, age(s.createdAt), Object.entries(s.metadata).map(([k, v]) => `${k}=${v}`).join(',')]);
    process.stdout.write(table(rows) + '\n');
  });

program
  .command('inspect <id>')
  .description('show one sandbox')
  .option('--json', 'print JSON')
  .action(async (id: string, o: { json?: boolean }) => {
    const sb = await Sandbox.connect(id, connection());
    // Usage comes from the node that runs it, which may be down (the record still answers).
    const usage = sb.info.state === 'running' ? await sb.usage().catch(() => undefined) : undefined;
    const out: SandboxInfo & { usage?: unknown } = { ...sb.info, ...(usage ? { usage } : {}) };
    if (o.json) return void process.stdout.write(JSON.stringify(out, null, 2) + '\n');
    for (const [k, v] of Object.entries(out)) {
      if (k === 'createTimings' && v) {
        const t = v as NonNullable<SandboxInfo['createTimings']>;
        const parts = [`queue ${t.queueMs}`, t.restoreMs !== undefined ? `restore ${t.restoreMs}` : '', t.bootMs !== undefined ? `boot ${t.bootMs}` : '', `agent ${t.agentMs}`, `identity ${t.identityMs}`].filter(Boolean);
        process.stdout.write(`${'created'.padEnd(12)} ${t.totalMs} ms from ${t.source} (${parts.join(' + ')} ms)\n`);
      } else if (k === 'usage' && usage) {
        const mib = (n: number) => `${Math.round(n / 1048576)} MiB`;
        process.stdout.write(`${'memory used'.padEnd(12)} ${mib(usage.cgroupBytes ?? usage.rssBytes)}\n`);
        if (usage.diskLimitBytes !== undefined) process.stdout.write(`${'disk used'.padEnd(12)} ${mib(usage.diskUsedBytes ?? 0)} of ${mib(usage.diskLimitBytes)}\n`);
      } else if (k === 'volumes' && Array.isArray(v)) {
        process.stdout.write(`${'volumes'.padEnd(12)} ${sb.info.volumes!.map((m) => `${m.volume}:${m.path}${m.readOnly ? ':ro' : ''}`).join(' ')}\n`);
      } else process.stdout.write(`${k.padEnd(12)} ${typeof v === 'object' ? JSON.stringify(v) : String(v)}\n`);
    }
  });

program
  .command('kill <id...>')
  .description('kill sandboxes')
  .action(async (ids: string[]) => {
    for (const id of ids) {
      const s = await Sandbox.kill(id, connection());
      process.stdout.write(`${s.id} ${s.state}\n`);
    }
  });

program
  .command('exec <id> <cmd...>')
  .description('run a command in a sandbox (put it after --); exits with its exit code')
  .option('--cwd <dir>', 'working directory')
  .option('-e, --env <K=V>', 'environment variable (repeatable)', collectList)
  .option('-u, --user <user>', 'user name or uid')
  .option('--timeout <duration>', 'kill the command after this long')
  .action(async (id: string, cmd: string[], o: { cwd?: string; env?: string[]; user?: string; timeout?: string }) => {
    // No Sandbox.connect: its GET is a round trip the command's own call makes redundant (an
    // unknown id fails there with SANDBOX_NOT_FOUND all the same).
    const commands = new Commands(new ApiClient(connection()), id);
    const env = parsePairs(o.env, 'env');
    const r = await commands.run(cmd.length === 1 ? ['/bin/sh', '-c', cmd[0]!] : cmd, {
      onStdout: (d) => process.stdout.write(d),
      onStderr: (d) => process.stderr.write(d),
      ...(o.cwd ? { cwd: o.cwd } : {}),
      ...(env ? { env } : {}),
      ...(o.user ? { user: o.user } : {}),
      ...(o.timeout ? { timeoutMs: parseDuration(o.timeout) } : {}),
    });
    if (r.timedOut) process.stderr.write(`space: command timed out after ${o.timeout}\n`);
    process.exitCode = r.exitCode ?? 128 + 9;
  });

program
  .command('expose <id> <port>')
  .description('expose a port of a sandbox through the ingress; prints a link that opens it on its first line')
  .option('--public', 'reachable by anyone with the URL, without the token')
  .option('--ttl <duration>', 'the exposure ends after this long (e.g. 1h, 7d; at most 30d)')
  .option('--json', 'print JSON')
  .action(async (id: string, portText: string, o: { public?: boolean; ttl?: string; json?: boolean }) => {
    const port = Number(portText);
    if (!Number.isInteger(port) || port < 1 || port > 65535) throw new SpaceError('INVALID_PORT', `port must be a number from 1 to 65535; got ${JSON.stringify(portText)}`);
    const sb = await Sandbox.connect(id, connection());
    const p = await sb.ports.expose(port, { ...(o.public ? { public: true } : {}), ...(o.ttl ? { ttlS: Math.ceil(parseDuration(o.ttl) / 1000) } : {}) });
    if (o.json) return void process.stdout.write(JSON.stringify(p, null, 2) + '\n');
    process.stdout.write(
      `${p.public ? p.url : (p.signedUrl ?? p.url)}\n` +
        (p.public ? `  public: anyone with the URL reaches port ${p.port}\n` : `  url:    ${p.url} (send X-Space-Access-Token)\n  token:  ${p.token} (shown once)\n  link:   valid until ${p.signedUrlExpiresAt}; it sets a cookie for that host (curl: -L -b jar -c jar)\n`) +
        (p.expiresAt ? `  ends:   ${p.expiresAt}\n` : ''),
    );
  });

program
  .command('ports <id>')
  .description('list the exposed ports of a sandbox, each with a fresh signed link')
  .option('--json', 'print JSON')
  .action(async (id: string, o: { json?: boolean }) => {
    const sb = await Sandbox.connect(id, connection());
    const ports = await sb.ports.list();
    if (o.json) return void process.stdout.write(JSON.stringify(ports, null, 2) + '\n');
    if (!ports.length) return void process.stdout.write(`no exposed ports: \`space expose ${id} PORT\` exposes one\n`);
    process.stdout.write(table([['PORT', 'ACCESS', 'URL', 'ENDS', 'SIGNED LINK'], ...ports.map((p) => [p.port === 0 ? 'every' : String(p.port), p.public ? 'public' : 'token', p.url, p.expiresAt ?? '-', p.public ? '-' : (p.signedUrl ?? '-')])]) + '\n');
  });

program
  .command('ingress')
  .description('the ingress: requests to sandboxes\' ports')
  .command('log <id>')
  .description('every request through the ingress to a sandbox\'s ports, newest first (refusals of an exposed port included)')
  .option('--limit <n>', 'entries', Number, 50)
  .option('--json', 'print JSON')
  .action(async (id: string, o: { limit: number; json?: boolean }) => {
    const page = await (await Sandbox.connect(id, connection())).ports.log({ limit: o.limit });
    if (o.json) return void process.stdout.write(JSON.stringify(page.items, null, 2) + '\n');
    if (!page.items.length) return void process.stdout.write('no ingress requests yet\n');
    process.stdout.write(table([['TIME', 'PORT', 'ACCESS', 'METHOD', 'PATH', 'STATUS', 'IN', 'OUT', 'MS', 'CLIENT'], ...page.items.map((e) => [e.at, String(e.port), e.access, e.websocket ? 'WS' : e.method, e.path.slice(0, 60), String(e.status), String(e.bytesIn), String(e.bytesOut), String(e.durationMs), e.client])]) + '\n');
  });

program
  .command('unexpose <id> <port>')
  .description('stop exposing a port ("every": close the opening of every port an E2B-made sandbox has); its token and links stop working at once')
  .action(async (id: string, portText: string) => {
    const port = portText === 'every' ? 0 : Number(portText);
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new SpaceError('INVALID_PORT', `port must be a number from 1 to 65535, or "every"; got ${JSON.stringify(portText)}`);
    const sb = await Sandbox.connect(id, connection());
    await sb.ports.unexpose(port);
    process.stdout.write(`${id} ${port === 0 ? 'every port' : `port ${port}`} no longer exposed\n`);
  });

program
  .command('shell <id>')
  .description('open an interactive terminal in a sandbox')
  .option('-u, --user <user>', 'user name or uid')
  .option('--cmd <program>', "program to run (default: the user's login shell, as a login shell)")
  .action(async (id: string, o: { user?: string; cmd?: string }) => {
    const sb = await Sandbox.connect(id, connection());
    const stdin = process.stdin;
    // A terminal that reports no size (0x0: `script` under a program without one, some serial
    // consoles) gets 80x24, as ssh gives it; the API refuses 0.
    const size = () => ({ cols: process.stdout.columns || 80, rows: process.stdout.rows || 24 });
    const t = await sb.pty.create({ ...size(), ...(o.cmd ? { cmd: [o.cmd, '-l'] } : {}), ...(o.user ? { user: o.user } : {}), onData: (d) => process.stdout.write(d) });
    if (stdin.isTTY) stdin.setRawMode(true);
    stdin.on('data', (d: Buffer) => void t.sendInput(d).catch(() => {}));
    process.stdout.on('resize', () => void t.resize(size().cols, size().rows).catch(() => {}));
    const r = await t.wait();
    if (stdin.isTTY) stdin.setRawMode(false);
    stdin.pause();
    process.exitCode = r.exitCode ?? 1;
  });

program
  .command('cp <src> <dst>')
  .description('copy a file to or from a sandbox: space cp ./a ID:/tmp/a, space cp ID:/tmp/a ./a')
  .action(async (src: string, dst: string) => {
    const remote = (s: string) => /^sb[a-z0-9]{18}:/.exec(s) ? { id: s.slice(0, 20), path: s.slice(21) } : undefined;
    const rs = remote(src);
    const rd = remote(dst);
    if (!!rs === !!rd) throw new Error('exactly one of SRC and DST must be ID:/path');
    if (rd) {
      const size = statSync(src).size;
      const sb = await Sandbox.connect(rd.id, connection());
      const t0 = Date.now();
      const r = await sb.files.write(rd.path, createReadStream(src));
      process.stderr.write(`copied ${r.size} bytes to ${rd.id}:${rd.path} in ${Date.now() - t0} ms\n`);
      if (r.size !== size) throw new Error(`size mismatch: sent ${size}, sandbox has ${r.size}`);
    } else {
      const sb = await Sandbox.connect(rs!.id, connection());
      const t0 = Date.now();
      await pipeline(await sb.files.read(rs!.path, { format: 'stream' }), createWriteStream(dst));
      process.stderr.write(`copied ${statSync(dst).size} bytes from ${rs!.id}:${rs!.path} in ${Date.now() - t0} ms\n`);
    }
  });

// ---------- stateful sessions
for (const [name, what] of [
  ['pause', 'freeze a sandbox in memory'],
  ['resume', 'unfreeze a paused sandbox'],
  ['hibernate', 'save a sandbox to a snapshot and free its host resources'],
  ['wake', 'restore a hibernated sandbox'],
] as const) {
  program
    .command(`${name} <id>`)
    .description(what)
    .action(async (id: string) => {
      const sb = await Sandbox.connect(id, connection());
      const t0 = Date.now();
      await sb[name]();
      process.stdout.write(`${sb.id} ${sb.info.state} (${Date.now() - t0} ms)\n`);
    });
}

program
  .command('move <id>')
  .description('move a sandbox to another node of the cluster: hibernated here, woken there (space nodes lists them)')
  .requiredOption('--node <name>', 'the node to move it to')
  .action(async (id: string, o: { node: string }) => {
    const sb = await Sandbox.connect(id, connection());
    const from = sb.info.node;
    const t0 = Date.now();
    process.stderr.write(`moving ${sb.id} from node ${from ?? '?'} to node ${o.node} (hibernate, then wake there)...\n`);
    await sb.move(o.node);
    process.stdout.write(`${sb.id} ${sb.info.state} on node ${sb.info.node} (${Date.now() - t0} ms)\n`);
  });

program
  .command('snapshot <id>')
  .description('take a snapshot now (the sandbox keeps running)')
  .option('--name <name>', 'a name for it')
  .option('--json', 'print JSON')
  .action(async (id: string, o: { name?: string; json?: boolean }) => {
    const sb = await Sandbox.connect(id, connection());
    const s = await sb.snapshot(o.name ? { name: o.name } : {});
    process.stdout.write(o.json ? JSON.stringify(s, null, 2) + '\n' : `${s.id}\n`);
    if (!o.json) process.stderr.write(`${(s.sizeBytes / 1048576).toFixed(1)} MiB, ${s.downtimeMs} ms downtime\n`);
  });

program
  .command('snapshots <id>')
  .description("list a sandbox's snapshots")
  .option('--json', 'print JSON')
  .action(async (id: string, o: { json?: boolean }) => {
    const list = await (await Sandbox.connect(id, connection())).snapshots();
    if (o.json) return void process.stdout.write(JSON.stringify(list, null, 2) + '\n');
    process.stdout.write(table([['ID', 'CREATED', 'TRIGGER', 'NAME', 'SIZE', 'DOWNTIME', 'PARENT'], ...list.map((s) => [s.id, s.createdAt, s.trigger, s.name ?? '', `${(s.sizeBytes / 1048576).toFixed(1)}M`, `${s.downtimeMs}ms`, s.parentSnapshotId ?? ''])]) + '\n');
  });

program
  .command('snapshot-rm <id> <snapshot...>')
  .description("delete snapshots of a sandbox (the others stay restorable; not the one a hibernated sandbox sleeps in)")
  .action(async (id: string, snapshots: string[]) => {
    const sb = await Sandbox.connect(id, connection());
    for (const s of snapshots) {
      await sb.deleteSnapshot(s);
      process.stdout.write(`${s} deleted\n`);
    }
  });

program
  .command('rollback <id> <snapshot>')
  .description('roll a sandbox back to one of its snapshots')
  .action(async (id: string, snapshot: string) => {
    const sb = await Sandbox.connect(id, connection());
    await sb.rollback(snapshot);
    process.stdout.write(`${sb.id} ${sb.info.state} at ${snapshot}\n`);
  });

program
  .command('fork <id>')
  .description('copy a sandbox into N new ones (prints their ids, one a line)')
  .option('-n, --count <n>', 'how many copies', Number, 1)
  .option('--from <snapshot>', 'fork this snapshot instead of taking one now')
  .action(async (id: string, o: { count: number; from?: string }) => {
    const sb = await Sandbox.connect(id, connection());
    const copies = await sb.fork({ count: o.count, ...(o.from ? { fromSnapshot: o.from } : {}) });
    for (const c of copies) process.stdout.write(`${c.id}\n`);
    if (copies.length < o.count) {
      process.stderr.write(`space: only ${copies.length} of ${o.count} copies started\n`);
      process.exitCode = 1;
    }
  });

program
  .command('snapshot-policy <id>')
  .description('rolling snapshots: --every 10m --keep 6, or --off')
  .option('--every <duration>', 'interval')
  .option('--keep <n>', 'how many scheduled snapshots to keep', Number)
  .option('--off', 'stop rolling snapshots')
  .action(async (id: string, o: { every?: string; keep?: number; off?: boolean }) => {
    const sb = await Sandbox.connect(id, connection());
    if (o.off) await sb.setSnapshotPolicy(null);
    else {
      if (!o.every || !o.keep) throw new Error('give --every DURATION and --keep N, or --off');
      await sb.setSnapshotPolicy({ intervalMs: parseDuration(o.every), keep: o.keep });
    }
    process.stdout.write(`${sb.id} ${sb.info.snapshotPolicy ? `every ${sb.info.snapshotPolicy.intervalMs} ms, keep ${sb.info.snapshotPolicy.keep}` : 'no rolling snapshots'}\n`);
  });

program
  .command('events <id>')
  .description("a sandbox's event log")
  .option('--json', 'print JSON')
  .action(async (id: string, o: { json?: boolean }) => {
    const ev = await (await Sandbox.connect(id, connection())).events();
    if (o.json) return void process.stdout.write(JSON.stringify(ev, null, 2) + '\n');
    for (const e of ev) process.stdout.write(`${e.at}  ${e.type.padEnd(16)} ${e.message}\n`);
  });

// ---------- templates
const tpl = program.command('template').description('templates: build from Debian packages, an image tarball or a directory; warm pools');
tpl
  .command('ls')
  .description('list templates (built-ins and yours)')
  .option('--json', 'print JSON')
  .action(async (o: { json?: boolean }) => {
    const ts = await Templates.list(connection());
    if (o.json) return void process.stdout.write(JSON.stringify(ts, null, 2) + '\n');
    const src = (t: TemplateInfo) => (t.source.type === 'debian' ? `debian: ${t.source.packages.join(' ')}` : t.source.type === 'upload' ? `${t.source.format} image` : 'built-in');
    const mb = (n: number | undefined) => (n === undefined ? '-' : `${(n / 1048576).toFixed(1)}M`);
    process.stdout.write(table([['NAME', 'STATE', 'SOURCE', 'SNAPSHOT', 'POOL', 'START'], ...ts.map((t) => [t.name, t.state, src(t).slice(0, 40), t.image ? mb(t.image.sizeBytes) : '-', `${t.pool.ready}/${t.pool.size}`, t.start?.cmd.slice(0, 30) ?? ''])]) + '\n');
  });
tpl
  .command('build <name>')
  .description('build a template (or make a built-in ready) and take its snapshot, showing progress')
  .option('-p, --packages <list>', 'Debian packages, comma-separated (e.g. jq,ripgrep)')
  .option('--image <file>', 'an OCI layout tarball, `docker save` output or rootfs tarball')
  .option('--dir <dir>', 'a local directory to use as the root file system')
  .option('--start <cmd>', 'command started before the snapshot (e.g. a server)')
  .option('--ready <cmd>', 'command that exits 0 once the start command is ready')
  .option('--ready-timeout <duration>', 'how long to wait for --ready', '60s')
  .option('-e, --env <K=V>', 'environment variable of every sandbox (repeatable)', collectList)
  .option('--pool <n>', 'warm pool size', Number)
  .option('--json', 'print the template as JSON')
  .action(async (name: string, o: { packages?: string; image?: string; dir?: string; start?: string; ready?: string; readyTimeout: string; env?: string[]; pool?: number; json?: boolean }) => {
    const bar = progressBar(`building ${name}`);
    let t: TemplateInfo;
    if (!o.packages && !o.image && !o.dir) {
      if (o.start || o.env || o.pool !== undefined) throw new SpaceError('BAD_REQUEST', 'Give --packages, --image or --dir to build a new template');
      t = await Templates.prepare(name, { ...connection(), onProgress: bar.update });
    } else {
      if (o.ready && !o.start) throw new SpaceError('BAD_REQUEST', '--ready needs --start');
      const env = parsePairs(o.env, 'env');
      t = await Templates.build({
        ...connection(),
        name,
        ...(o.packages ? { packages: o.packages.split(',').map((p) => p.trim()).filter(Boolean) } : {}),
        ...(o.image ? { image: o.image } : {}),
        ...(o.dir ? { dir: o.dir } : {}),
        ...(o.start ? { start: { cmd: o.start, ...(o.ready ? { readyCmd: o.ready } : {}), readyTimeoutMs: parseDuration(o.readyTimeout) } } : {}),
        ...(env ? { env } : {}),
        ...(o.pool !== undefined ? { poolSize: o.pool } : {}),
        onProgress: bar.update,
      });
    }
    bar.done(`template ${name} ready`);
    process.stdout.write(o.json ? JSON.stringify(t, null, 2) + '\n' : `${name} ready\n`);
  });
tpl
  .command('rm <name>')
  .description('remove one of your templates (refused while sandboxes use it)')
  .action(async (name: string) => {
    await Templates.remove(name, connection());
    process.stdout.write(`${name} removed\n`);
  });
tpl
  .command('pool <name> <size>')
  .description('set how many sandboxes of the template are kept restored and ready')
  .action(async (name: string, size: string) => {
    const t = await Templates.setPool(name, Number(size), connection());
    process.stdout.write(`${name}: pool of ${t.pool.size} (${t.pool.ready} ready now)\n`);
  });

// ---------- encryption keys (bring your own key)
interface EncKey { id: string; provider: string; ref: string; state: string; description: string; createdAt: string }
const ekey = program.command('key').description('your tenant\'s encryption key: set (or rotate), ls, revoke, enable, destroy');
ekey
  .command('ls')
  .option('--json', 'print JSON')
  .action(async (o: { json?: boolean }) => {
    const r = await new ApiClient(connection()).json<{ keys: EncKey[] }>('GET', '/v1/encryption-keys');
    if (o.json) return void process.stdout.write(JSON.stringify(r.keys, null, 2) + '\n');
    if (!r.keys.length) return void process.stdout.write("no key of your own: your data is encrypted under the node's key (space key set to bring yours)\n");
    process.stdout.write(table([['ID', 'STATE', 'PROVIDER', 'KEY', 'CREATED'], ...r.keys.map((k) => [k.id, k.state, k.provider, k.ref, k.createdAt])]) + '\n');
  });
ekey
  .command('set')
  .description('use this key for your data; with a key already set, rotate to it (data keys are re-wrapped online)')
  .requiredOption('--provider <name>', 'key provider: local')
  .requiredOption('--ref <ref>', 'the key: for local, a file name in the daemon\'s key directory')
  .action(async (o: { provider: string; ref: string }) => {
    const k = await new ApiClient(connection()).json<EncKey>('POST', '/v1/encryption-keys', { json: { provider: o.provider, ref: o.ref } });
    process.stdout.write(`${k.id} active (${k.description})\n`);
  });
for (const [verb, what] of [['revoke', 'make everything the key protects unreadable until it is enabled again'], ['enable', 'enable a revoked key']] as const) {
  ekey
    .command(`${verb} <id>`)
    .description(what)
    .action(async (id: string) => {
      const k = await new ApiClient(connection()).json<EncKey>('POST', `/v1/encryption-keys/${encodeURIComponent(id)}/${verb}`);
      process.stdout.write(`${k.id} ${k.state}\n`);
    });
}
ekey
  .command('destroy <id>')
  .description('forget a key for good; data only it protects becomes unreadable (crypto-shredding)')
  .option('--shred', 'confirm destroying a key that still protects data')
  .action(async (id: string, o: { shred?: boolean }) => {
    const k = await new ApiClient(connection()).json<EncKey>('DELETE', `/v1/encryption-keys/${encodeURIComponent(id)}`, { query: { shred: o.shred ? 'true' : undefined } });
    process.stdout.write(`${k.id} ${k.state}\n`);
  });

// ---------- egress and secrets
interface EgressFlags { allowDomain?: string[]; allowCidr?: string[]; allowPort?: string[]; passthrough?: string[] }
const hasEgressFlags = (o: EgressFlags) => !!(o.allowDomain || o.allowCidr || o.allowPort || o.passthrough);

/** The policy the flags give, added to `base` when given (`egress allow`). */
function egressOf(o: EgressFlags, base?: EgressPolicy): Partial<EgressPolicy> {
  const ports = o.allowPort?.map((p) => {
    const n = Number(p);
    if (!Number.isInteger(n) || n < 1 || n > 65535) throw new SpaceError('EGRESS_POLICY_INVALID', `Port ${p}: give a port from 1 to 65535`);
    return n;
  });
  const merge = <T>(a: T[] | undefined, b: T[] | undefined): T[] | undefined => (a || b ? [...new Set([...(a ?? []), ...(b ?? [])])] : undefined);
  const out: Partial<EgressPolicy> = {};
  const domains = merge(base?.domains, o.allowDomain);
  const cidrs = merge(base?.cidrs, o.allowCidr);
  const portList = merge(base?.ports, ports);
  const passthrough = merge(base?.passthrough, o.passthrough);
  if (domains) out.domains = domains;
  if (cidrs) out.cidrs = cidrs;
  if (portList) out.ports = portList;
  if (passthrough) out.passthrough = passthrough;
  return out;
}

function printPolicy(p: EgressPolicy): void {
  process.stdout.write(`domains      ${p.domains.join(' ') || '-'}\ncidrs        ${p.cidrs.join(' ') || '-'}\nports        ${p.ports.join(' ') || '-'}\npassthrough  ${p.passthrough.join(' ') || '-'}\n`);
}

registerVolumeCommands(program);

const secret = program.command('secret').description('secrets: kept by the daemon, swapped in by the egress proxy for their hosts only');
secret
  .command('set <name>')
  .description('create or replace a secret; the value comes from stdin (or --value-file / --from-env), never from argv')
  .requiredOption('--host <host>', 'a host the value may be sent to, or *.example.org (repeatable)', collectList)
  .option('--header <name>', 'set this request header on every request to the hosts')
  .option('--format <text>', 'the header\'s value, {value} standing for the secret (default "{value}")')
  .option('--value-file <file>', 'read the value from a file')
  .option('--from-env <var>', 'read the value from an environment variable of this shell')
  .action(async (name: string, o: { host: string[]; header?: string; format?: string; valueFile?: string; fromEnv?: string }) => {
    let value: string;
    if (o.valueFile) value = readFileSync(o.valueFile, 'utf8');
    else if (o.fromEnv) {
      const v = process.env[o.fromEnv];
      if (v === undefined) throw new SpaceError('SECRET_INVALID', `Environment variable ${o.fromEnv} is not set`);
      value = v;
    } else {
      if (process.stdin.isTTY) process.stderr.write(`value of ${name} (then Enter, Ctrl-D): `);
      const chunks: Buffer[] = [];
      for await (const c of process.stdin) chunks.push(Buffer.from(c as Buffer));
      value = Buffer.concat(chunks).toString('utf8');
    }
    value = value.replace(/\r?\n$/, '');
    const s = await Secrets.set(name, { ...connection(), value, hosts: o.host, ...(o.header ? { header: o.header } : {}), ...(o.format ? { format: o.format } : {}) });
    process.stdout.write(`${s.name} set for ${s.hosts.join(', ')}${s.header ? ` (header ${s.header}: ${s.format})` : ''}\n`);
  });
secret
  .command('ls')
  .option('--json', 'print JSON')
  .action(async (o: { json?: boolean }) => {
    const list = await Secrets.list(connection());
    if (o.json) return void process.stdout.write(JSON.stringify(list, null, 2) + '\n');
    if (!list.length) return void process.stdout.write('no secrets (space secret set NAME --host HOST < value-file)\n');
    process.stdout.write(table([['NAME', 'HOSTS', 'HEADER', 'UPDATED'], ...list.map((x) => [x.name, x.hosts.join(','), x.header ? `${x.header}: ${x.format}` : '-', x.updatedAt])]) + '\n');
  });
secret
  .command('rm <name>')
  .action(async (name: string) => {
    await Secrets.remove(name, connection());
    process.stdout.write(`removed ${name}\n`);
  });
secret
  .command('attach <id> <names...>')
  .description('attach secrets to a running sandbox (processes started afterwards see the placeholders)')
  .action(async (id: string, names: string[]) => {
    const sb = await Sandbox.connect(id, connection());
    await sb.attachSecrets(names);
    process.stdout.write(`${id}: ${(sb.info.secrets ?? []).map((a) => a.name).join(', ')}\n`);
  });
secret
  .command('detach <id> <name>')
  .description('detach a secret: the proxy stops replacing its placeholder at the next request')
  .action(async (id: string, name: string) => {
    const sb = await Sandbox.connect(id, connection());
    await sb.detachSecret(name);
    process.stdout.write(`${id}: detached ${name}\n`);
  });

const egress = program.command('egress').description("a sandbox's egress policy and audit log");
egress
  .command('show <id>')
  .option('--json', 'print JSON')
  .action(async (id: string, o: { json?: boolean }) => {
    const p = await (await Sandbox.connect(id, connection())).egress();
    if (o.json) return void process.stdout.write(JSON.stringify(p, null, 2) + '\n');
    printPolicy(p);
  });
for (const [verb, what] of [['set', 'replace the policy with exactly these entries'], ['allow', 'add these entries to the policy']] as const) {
  egress
    .command(`${verb} <id>`)
    .description(`${what} (applies from the next request on)`)
    .option('--domain <host>', 'a host, or *.example.org for its subdomains (repeatable)', collectList)
    .option('--cidr <cidr>', 'an address range (repeatable)', collectList)
    .option('--port <port>', 'a destination port (repeatable)', collectList)
    .option('--passthrough <host:port>', 'raw TCP, no TLS interception (repeatable)', collectList)
    .action(async (id: string, o: { domain?: string[]; cidr?: string[]; port?: string[]; passthrough?: string[] }) => {
      const sb = await Sandbox.connect(id, connection());
      const flags = { allowDomain: o.domain, allowCidr: o.cidr, allowPort: o.port, passthrough: o.passthrough };
      await sb.setEgress(egressOf(flags, verb === 'allow' ? await sb.egress() : undefined));
      printPolicy(await sb.egress());
    });
}
egress
  .command('log <id>')
  .description('every request through the egress proxy, newest first')
  .option('--limit <n>', 'entries', Number, 50)
  .option('--json', 'print JSON')
  .action(async (id: string, o: { limit: number; json?: boolean }) => {
    const page = await (await Sandbox.connect(id, connection())).egressLog({ limit: o.limit });
    if (o.json) return void process.stdout.write(JSON.stringify(page.items, null, 2) + '\n');
    if (!page.items.length) return void process.stdout.write('no egress yet\n');
    process.stdout.write(table([['TIME', 'DECISION', 'METHOD', 'DESTINATION', 'STATUS', 'OUT', 'IN', 'SECRETS', 'REASON'], ...page.items.map((e) => [e.at, e.decision, e.method, `${e.scheme}://${e.host}:${e.port}${e.path ?? ''}`.slice(0, 80), String(e.status ?? '-'), String(e.bytesOut), String(e.bytesIn), e.secrets.join(',') || '-', e.reason ?? ''])]) + '\n');
  });

// ---------- E2B
const e2b = program.command('e2b').description('the E2B-compatible API (agents written for E2B\'s SDK)');
e2b
  .command('env')
  .description('print E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_API_KEY for this daemon and tenant: export $(space e2b env)')
  .action(async () => {
    const conn = connection();
    const api = new ApiClient(conn);
    const { url } = await api.json<{ url: string | null }>('GET', '/v1/e2b');
    if (!url) throw new SpaceError('BAD_REQUEST', 'The daemon runs without the E2B-compatible API (started with --e2b-listen off)');
    // E2B's SDKs want keys shaped e2b_<hex>: reuse the current key if it is one, else one made earlier, else make one.
    const store = e2bKeys();
    let key = conn.apiKey?.startsWith('e2b_') ? conn.apiKey : store.get(api.url);
    if (key && !(await new ApiClient({ ...conn, apiKey: key }).request('GET', '/v1/keys').then(() => true, () => false))) key = undefined;
    if (!key) {
      key = (await api.json<{ key: string }>('POST', '/v1/keys', { json: { name: 'e2b (space e2b env)', format: 'e2b' } })).key;
      store.set(api.url, key);
    }
    process.stdout.write(`E2B_API_URL=${url}\nE2B_SANDBOX_URL=${url}\nE2B_VOLUME_API_URL=${url}\nE2B_API_KEY=${key}\n`);
  });

// ---------- keys
const keys = program.command('keys').description('API keys');
keys
  .command('create')
  .option('--name <name>', 'a name to recognise it by')
  .option('--tenant <tenant>', "tenant (admin keys only; default: your key's tenant)")
  .option('--admin', 'an admin key')
  .option('--json', 'print JSON')
  .action(async (o: { name?: string; tenant?: string; admin?: boolean; json?: boolean }) => {
    const r = await new ApiClient(connection()).json<{ key: string; record: { id: string; tenantId: string } }>('POST', '/v1/keys', { json: { ...(o.name ? { name: o.name } : {}), ...(o.tenant ? { tenant: o.tenant } : {}), ...(o.admin ? { admin: true } : {}) } });
    if (o.json) return void process.stdout.write(JSON.stringify(r, null, 2) + '\n');
    process.stdout.write(`${r.key}\n`);
    process.stderr.write(`key ${r.record.id} for tenant ${r.record.tenantId}; it is shown only once\n`);
  });
keys
  .command('ls')
  .option('--json', 'print JSON')
  .action(async (o: { json?: boolean }) => {
    const r = await new ApiClient(connection()).json<{ keys: { id: string; tenantId: string; name: string; prefix: string; admin: boolean; createdAt: string; revokedAt?: string }[] }>('GET', '/v1/keys');
    if (o.json) return void process.stdout.write(JSON.stringify(r.keys, null, 2) + '\n');
    process.stdout.write(table([['ID', 'TENANT', 'NAME', 'PREFIX', 'ADMIN', 'CREATED', 'REVOKED'], ...r.keys.map((k) => [k.id, k.tenantId, k.name, k.prefix + '…', k.admin ? 'yes' : 'no', k.createdAt, k.revokedAt ?? '-'])]) + '\n');
  });
keys
  .command('revoke <keyId>')
  .action(async (keyId: string) => {
    await new ApiClient(connection()).json('DELETE', `/v1/keys/${encodeURIComponent(keyId)}`);
    process.stdout.write(`revoked ${keyId}\n`);
  });

program
  .command('mcp')
  .description('serve SPACE to MCP clients: over stdio (default), or streamable HTTP with --http')
  .option('--http <host:port>', 'serve MCP over streamable HTTP at http://HOST:PORT/mcp; each client sends its SPACE API key as a bearer token')
  .action(async (o: { http?: string }) => {
    // Loaded on use only: every other command starts without the MCP SDK.
    const mcp = await import('@space/mcp');
    const conn = connection();
    if (!o.http) return mcp.serveStdio(conn);
    const server = await mcp.serveHttp({ listen: o.http, apiUrl: conn.apiUrl ?? 'http://127.0.0.1:7070' });
    process.stderr.write(`space mcp: serving MCP at ${server.url} (clients authenticate with their SPACE API key as a bearer token)\n`);
    await new Promise<void>((resolve) => {
      for (const sig of ['SIGINT', 'SIGTERM'] as const) process.once(sig, () => resolve());
    });
    await server.close();
  });

program.addOption(new Option('--version').hideHelp()).on('option:version', () => {
  process.stdout.write(JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')).version + '\n');
  process.exit(0);
});

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof SpaceError) {
    let hint = err.hint;
    if (err.code === 'DAEMON_UNREACHABLE' && !process.env.SPACE_URL) {
      const sel = (() => { try { return selectedContext(); } catch { return undefined; } })();
      if (sel) hint = `This is context "${sel.name}" (data dir ${sel.ctx.dataDir}): start its daemon with \`${upCommand(sel.name, sel.ctx)}\`, or pick another with \`space context ls\` / \`space context use NAME\`.`;
    }
    process.stderr.write(`space: ${err.code}: ${err.message}\n${hint ? `  hint: ${hint}\n` : ''}`);
  } else {
    process.stderr.write(`space: ${err instanceof Error ? err.message : String(err)}\n`);
  }
  process.exitCode = 1;
}
// Done: exit once stdout and stderr are flushed, whatever else is still pending (nothing a
// command started needs to finish after its action resolved). Commands that
// serve (`daemon`, `mcp`) or hand over a terminal (`shell`) resolve only when they are finished.
await Promise.all([process.stdout, process.stderr].map((s) => new Promise<void>((r) => (s.writableLength === 0 ? r() : s.write('', () => r())))));
process.exit();
