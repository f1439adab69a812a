// Makes small container images on disk for the template tests, with no registry and no
// docker: an OCI image layout tarball (two layers, one gzipped, a whiteout) and the same
// image as `docker save` writes it.
import { createHash } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { chmodSync, copyFileSync, mkdirSync, mkdtempSync, readFileSync, realpathSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import * as tar from 'tar';

const sha = (b) => createHash('sha256').update(b).digest('hex');

async function tarDir(dir, gzip) {
  const chunks = [];
  for await (const c of tar.c({ cwd: dir, gzip, portable: true }, ['.'])) chunks.push(c);
  return Buffer.concat(chunks);
}

/** The two layers: busybox + files, then a layer that deletes one file and adds another. */
function layerDirs(work, marker) {
  const l1 = path.join(work, 'l1');
  for (const d of ['bin', 'opt/app', 'etc']) mkdirSync(path.join(l1, d), { recursive: true });
  copyFileSync('/bin/busybox', path.join(l1, 'bin/busybox'));
  for (const a of ['sh', 'cat', 'ls', 'sleep', 'hostname', 'date', 'env', 'test', 'echo', 'ps', 'head', 'od', 'tr', 'grep']) symlinkSync('busybox', path.join(l1, 'bin', a));
  writeFileSync(path.join(l1, 'opt/app/hello.txt'), `hello from the image ${marker}\n`);
  writeFileSync(path.join(l1, 'opt/app/remove-me'), 'deleted by layer 2\n');
  const l2 = path.join(work, 'l2');
  mkdirSync(path.join(l2, 'opt/app'), { recursive: true });
  writeFileSync(path.join(l2, 'opt/app/.wh.remove-me'), '');
  writeFileSync(path.join(l2, 'opt/app/layer2.txt'), 'from layer 2\n');
  return [l1, l2];
}

const CONFIG = (diffIds) => ({
  architecture: 'amd64',
  os: 'linux',
  config: { Env: ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'APPVAR=from-image-config'] },
  rootfs: { type: 'layers', diff_ids: diffIds.map((d) => `sha256:${d}`) },
});

/**
 * Writes an OCI image layout tarball; returns its path. `corrupt` flips a byte of layer 1.
 *
 * @example
 * const file = await makeOciImage('/tmp/x', { marker: 'abc' });
 */
export async function makeOciImage(outDir, { marker = 'm', corrupt = false } = {}) {
  const work = mkdtempSync(path.join(tmpdir(), 'space-oci-'));
  try {
    const [l1, l2] = layerDirs(work, marker);
    return await writeOciLayout(work, path.join(outDir, `oci-${marker}${corrupt ? '-corrupt' : ''}.tar`), [l1, l2], { corrupt, gzipLast: true });
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/**
 * An OCI image of Debian's own programs: dash as /bin/sh and coreutils' ls, stat, cp and
 * friends, dynamically linked against glibc, with every library they load (taken from this
 * Debian host). It is what stock Debian user space does in a container, without a download.
 *
 * @example
 * const file = await makeDebianToolsImage('/tmp/x');
 */
export async function makeDebianToolsImage(outDir) {
  const work = mkdtempSync(path.join(tmpdir(), 'space-deb-'));
  try {
    const root = path.join(work, 'root');
    const tools = ['/bin/sh', '/bin/dash', '/usr/bin/ls', '/usr/bin/stat', '/usr/bin/cp', '/usr/bin/mv', '/usr/bin/cat', '/usr/bin/mkdir', '/usr/bin/chmod', '/usr/bin/du', '/usr/bin/readlink', '/usr/bin/id', '/usr/bin/sha256sum', '/usr/bin/touch', '/usr/bin/rm', '/usr/bin/sleep', '/usr/bin/echo', '/usr/bin/env'];
    const files = new Set(tools);
    for (const t of tools) {
      for (const line of execFileSync('ldd', [t], { encoding: 'utf8' }).split('\n')) {
        const m = /(\/\S+\.so[^\s]*)/.exec(line.includes('=>') ? line.split('=>')[1] : line);
        if (m) files.add(m[1]);
      }
    }
    for (const f of files) {
      const dst = path.join(root, f);
      mkdirSync(path.dirname(dst), { recursive: true });
      copyFileSync(realpathSync(f), dst);
      chmodSync(dst, 0o755);
    }
    for (const d of ['etc', 'tmp', 'home/user']) mkdirSync(path.join(root, d), { recursive: true });
    writeFileSync(path.join(root, 'etc/passwd'), 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh\n');
    writeFileSync(path.join(root, 'etc/group'), 'root:x:0:\nuser:x:1000:\n');
    return await writeOciLayout(work, path.join(outDir, 'oci-debian-tools.tar'), [root]);
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

/** Packs layer directories into an OCI image layout tarball at `file`. */
async function writeOciLayout(work, file, layers, { corrupt = false, gzipLast = false } = {}) {
  const layout = path.join(work, 'layout');
  const blobs = path.join(layout, 'blobs/sha256');
  mkdirSync(blobs, { recursive: true });
  const put = (buf) => {
    const d = sha(buf);
    writeFileSync(path.join(blobs, d), buf);
    return d;
  };
  const descs = [];
  const diffIds = [];
  for (const [i, dir] of layers.entries()) {
    const raw = await tarDir(dir, false);
    const gz = gzipLast && i === layers.length - 1 && i > 0;
    const stored = gz ? await tarDir(dir, true) : raw;
    const d = put(stored);
    if (corrupt && i === 0) {
      const b = readFileSync(path.join(blobs, d));
      b[b.length >> 1] ^= 0xff;
      writeFileSync(path.join(blobs, d), b);
    }
    diffIds.push(sha(raw));
    descs.push({ mediaType: `application/vnd.oci.image.layer.v1.tar${gz ? '+gzip' : ''}`, digest: `sha256:${d}`, size: stored.length });
  }
  const config = Buffer.from(JSON.stringify(CONFIG(diffIds)));
  const dc = put(config);
  const manifest = Buffer.from(JSON.stringify({ schemaVersion: 2, mediaType: 'application/vnd.oci.image.manifest.v1+json', config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: `sha256:${dc}`, size: config.length }, layers: descs }));
  const dm = put(manifest);
  writeFileSync(path.join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  writeFileSync(path.join(layout, 'index.json'), JSON.stringify({ schemaVersion: 2, manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', digest: `sha256:${dm}`, size: manifest.length }] }));
  writeFileSync(file, await tarDir(layout, false));
  return file;
}

/** Writes the same image as `docker save` does (manifest.json + layer.tar per layer). */
export async function makeDockerSave(outDir, { marker = 'm' } = {}) {
  const work = mkdtempSync(path.join(tmpdir(), 'space-docker-'));
  try {
    const [l1, l2] = layerDirs(work, marker);
    const out = path.join(work, 'out');
    const layers = [];
    const diffIds = [];
    for (const [i, l] of [l1, l2].entries()) {
      const buf = await tarDir(l, false);
      mkdirSync(path.join(out, `layer${i}`), { recursive: true });
      writeFileSync(path.join(out, `layer${i}/layer.tar`), buf);
      layers.push(`layer${i}/layer.tar`);
      diffIds.push(sha(buf));
    }
    writeFileSync(path.join(out, 'config.json'), JSON.stringify(CONFIG(diffIds)));
    writeFileSync(path.join(out, 'manifest.json'), JSON.stringify([{ Config: 'config.json', RepoTags: ['test:latest'], Layers: layers }]));
    const file = path.join(outDir, `docker-${marker}.tar`);
    writeFileSync(file, await tarDir(out, false));
    return file;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}
