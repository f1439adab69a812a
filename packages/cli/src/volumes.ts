/** `space volume …`: named volumes, their snapshots, and copying files in and out without a sandbox. */
import { createReadStream, createWriteStream, promises as fs } from 'node:fs';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import type { Command } from 'commander';
import { parseSizeMb } from '@space/api';
import { SpaceError, Volumes } from '@space/sdk';
import { connection } from './config.js';
import { mib, table } from './table.js';

/** `NAME:/path` names a place in a volume; anything else is a local path. */
const REMOTE = /^([a-z0-9][a-z0-9._-]{0,62}):(\/.*)$/;

/** Uploads a local file or directory (recursively) to `name:dest`; returns how many files. */
async function upload(src: string, name: string, dest: string): Promise<number> {
  const st = await fs.stat(src).catch(() => {
    throw new SpaceError('FILE_NOT_FOUND', `No such local file or directory: ${src}`);
  });
  if (!st.isDirectory()) {
    await Volumes.write(name, dest, createReadStream(src), connection());
    return 1;
  }
  let n = 0;
  for (const e of await fs.readdir(src, { withFileTypes: true })) {
    if (e.isDirectory() || e.isFile()) n += await upload(path.join(src, e.name), name, path.posix.join(dest, e.name));
  }
  return n;
}

/** Downloads `name:src` (a file, or a directory recursively) to a local path; returns how many files. */
async function download(name: string, src: string, dest: string): Promise<number> {
  const entries = await Volumes.entries(name, src, { ...connection(), depth: 32 }).catch((err: unknown) => {
    if (err instanceof SpaceError && err.code === 'NOT_A_DIRECTORY') return undefined;
    throw err;
  });
  if (!entries) {
    await pipeline(await Volumes.read(name, src, { ...connection(), format: 'stream' }), createWriteStream(dest));
    return 1;
  }
  await fs.mkdir(dest, { recursive: true });
  let n = 0;
  for (const e of entries) {
    const local = path.join(dest, path.posix.relative(src, e.path));
    if (e.type === 'directory') await fs.mkdir(local, { recursive: true });
    else if (e.type === 'file') {
      await pipeline(await Volumes.read(name, e.path, { ...connection(), format: 'stream' }), createWriteStream(local));
      n++;
    }
  }
  return n;
}

/** Registers `space volume …` on the program. */
export function registerVolumeCommands(program: Command): void {
  const volume = program.command('volume').description('named volumes: persistent, encrypted at rest, mounted into sandboxes (space create --volume NAME:/data[:ro])');
  volume
    .command('create <name>')
    .description('make an empty volume')
    .option('--size <size>', 'its size, e.g. 10G (a writer that fills it gets ENOSPC)', '1G')
    .action(async (name: string, o: { size: string }) => {
      const v = await Volumes.create(name, { ...connection(), sizeMb: parseSizeMb(o.size, '--size') });
      process.stdout.write(`${v.name} (${mib(v.sizeMb)})\n`);
    });
  volume
    .command('ls')
    .description('list volumes and the sandboxes that hold them')
    .option('--json', 'print JSON')
    .action(async (o: { json?: boolean }) => {
      const list = await Volumes.list(connection());
      if (o.json) return void process.stdout.write(JSON.stringify(list, null, 2) + '\n');
      if (!list.length) return void process.stdout.write('no volumes (space volume create NAME --size 1G)\n');
      // The NODE column in a cluster only (a volume is kept on the node that made it).
      const nodes = list.some((v) => v.node);
      process.stdout.write(table([['NAME', 'SIZE', 'MOUNTED BY', ...(nodes ? ['NODE'] : []), 'CREATED'], ...list.map((v) => [v.name, mib(v.sizeMb), v.mountedBy.map((m) => `${m.sandboxId}:${m.path}${m.readOnly ? ':ro' : ''}`).join(' ') || '-', ...(nodes ? [v.node ?? '-'] : []), v.createdAt])]) + '\n');
    });
  volume
    .command('rm <name>')
    .description('delete a volume and its snapshots (refused while a sandbox holds it)')
    .action(async (name: string) => {
      await Volumes.remove(name, connection());
      process.stdout.write(`removed ${name}\n`);
    });
  volume
    .command('snapshot <name>')
    .description("copy a volume as it is now (its writers pause for the copy); sandboxes' own snapshots never include volumes")
    .action(async (name: string) => {
      const s = await Volumes.snapshot(name, connection());
      process.stdout.write(`${s.id}\n`);
    });
  volume
    .command('snapshots <name>')
    .description("list a volume's snapshots")
    .action(async (name: string) => {
      const list = await Volumes.snapshots(name, connection());
      if (!list.length) return void process.stdout.write(`no snapshots of ${name} (space volume snapshot ${name})\n`);
      process.stdout.write(table([['ID', 'CREATED'], ...list.map((s) => [s.id, s.createdAt])]) + '\n');
    });
  volume
    .command('restore <name> <snapshot>')
    .description("put a snapshot's contents back (the volume must not be mounted)")
    .action(async (name: string, snapshotId: string) => {
      await Volumes.restore(name, snapshotId, connection());
      process.stdout.write(`${name} restored to ${snapshotId}\n`);
    });
  volume
    .command('cp <src> <dest>')
    .description('copy files into or out of a volume without a sandbox: `space volume cp ./data NAME:/in`, `space volume cp NAME:/out ./out` (directories recursively)')
    .action(async (src: string, dest: string) => {
      const [from, to] = [REMOTE.exec(src), REMOTE.exec(dest)];
      if (!!from === !!to) throw new SpaceError('BAD_REQUEST', 'Give one side as NAME:/path (a volume) and the other as a local path, e.g. space volume cp ./data.csv datasets:/data.csv');
      const n = to ? await upload(src, to[1]!, to[2]!) : await download(from![1]!, from![2]!, dest);
      process.stdout.write(`copied ${n} file${n === 1 ? '' : 's'}\n`);
    });
}
