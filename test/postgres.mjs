// A throwaway PostgreSQL for the tests: Debian's server binaries, a cluster made with initdb in
// a temporary directory, listening on a free loopback port (and a socket in that directory),
// run as the `postgres` user (PostgreSQL refuses root), removed by stop().
import { execFileSync, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { freePort } from './free-port.mjs';
import path from 'node:path';

/** Debian's newest installed PostgreSQL bin directory, or undefined. */
export function postgresBin() {
  const root = '/usr/lib/postgresql';
  if (!existsSync(root)) return undefined;
  const versions = readdirSync(root).filter((v) => existsSync(`${root}/${v}/bin/initdb`)).sort((a, b) => Number(b) - Number(a));
  return versions.length ? `${root}/${versions[0]}/bin` : undefined;
}

/** Runs a PostgreSQL program as the postgres user (root cannot run the server). */
function asPostgres(bin, args) {
  const root = process.getuid?.() === 0;
  const r = spawnSync(root ? 'runuser' : bin, root ? ['-u', 'postgres', '--', bin, ...args] : args, { encoding: 'utf8', timeout: 60_000 });
  if (r.status !== 0) throw new Error(`${path.basename(bin)} ${args.join(' ')} failed (${r.status}): ${r.stderr || r.stdout}`);
  return r.stdout;
}

/**
 * Starts a fresh cluster with a `space` role (password `pw`, needed over TCP) owning database
 * `space`. Returns its URLs and controls. `settings`: more server settings (`name=value`).
 * @example const pg = await startPostgres(); … await pg.stop();
 */
export async function startPostgres({ settings = [] } = {}) {
  const bin = postgresBin();
  if (!bin) throw new Error('PostgreSQL is not installed: run ./space (the set-up installs Debian\'s postgresql)');
  const dir = mkdtempSync('/tmp/spt-pg-');
  const data = path.join(dir, 'data');
  if (process.getuid?.() === 0) chownSync(dir, Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' })), Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' })));
  asPostgres(`${bin}/initdb`, ['-D', data, '-U', 'postgres', '--auth-local=trust', '--auth-host=scram-sha-256', '--no-sync', '-E', 'UTF8', '--locale=C.UTF-8']);
  const port = await freePort();
  const start = () => asPostgres(`${bin}/pg_ctl`, ['-D', data, '-l', path.join(dir, 'log'), '-w', '-t', '60', '-o', `-c listen_addresses=127.0.0.1 -c port=${port} -c unix_socket_directories=${dir} -c fsync=off -c max_connections=200${settings.map((x) => ` -c ${x}`).join('')}`, 'start']);
  start();
  const psql = (sql, db = 'postgres') => asPostgres(`${bin}/psql`, ['-h', dir, '-p', String(port), '-U', 'postgres', '-d', db, '-v', 'ON_ERROR_STOP=1', '-Atc', sql]);
  psql("CREATE ROLE space LOGIN PASSWORD 'pw'");
  psql('CREATE DATABASE space OWNER space');
  let n = 0;
  return {
    port,
    /** The `space` database, password in the URL (tests only: the daemon refuses that on argv). */
    url: `postgres://space:pw@127.0.0.1:${port}/space`,
    /** A new empty database owned by `space`, for a test that needs a clean schema. */
    freshDatabase() {
      const name = `space_${++n}`;
      psql(`CREATE DATABASE ${name} OWNER space`);
      return `postgres://space:pw@127.0.0.1:${port}/${name}`;
    },
    psql,
    /** Stops the server (fast: disconnects clients), keeping its data. */
    halt() {
      asPostgres(`${bin}/pg_ctl`, ['-D', data, '-m', 'fast', '-w', 'stop']);
    },
    /** Starts it again after halt(). */
    resume: start,
    async stop() {
      try {
        asPostgres(`${bin}/pg_ctl`, ['-D', data, '-m', 'immediate', '-w', 'stop']);
      } catch {
        // already stopped (halt() without resume())
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
