// The fast lane's harness: core's real SandboxService on the in-memory fake driver, real SQLite,
// a real blob store and the real wire protocol, in this process. Also what a crash is in here:
// a service "dies" by being cut off from the store, the blobs and the driver at one exact call
// (every later call of its never returns, as for a killed process), and a new service starts
// over the same store, blobs and driver.
import path from 'node:path';
import { Channel } from '../packages/protocol/dist/index.js';
import { SandboxService } from '../packages/core/dist/index.js';
import { LocalBlobStore } from '../packages/blob-local/dist/index.js';
import { FakeRootfs } from '../packages/driver-fake/dist/index.js';

export const T = 'tenant-a';
export const quiet = { info() {}, warn() {}, error() {}, debug() {} };
const never = () => new Promise(() => {});

/** Polls `fn` until it returns a truthy value (or gives up after 20 s: a failure, not a timing assumption). */
export async function until(fn, what) {
  const deadline = Date.now() + 20_000;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/**
 * A life for one service instance: `wrap(x)` gives the service a view of `x` whose calls stop
 * returning once the life ends — at `end()`, or at the k-th call after `dieAt(k)`.
 * @example const life = new Life(); const store = life.wrap(realStore); life.dieAt(7);
 */
export class Life {
  dead = false;
  #countdown = Infinity;
  #onEnd;
  /** Resolves when the life ends. */
  ended = new Promise((r) => (this.#onEnd = r));

  /** Ends this life now. */
  end() {
    if (this.dead) return;
    this.dead = true;
    this.#onEnd();
  }

  /** Ends this life at the k-th proxied call from now (1 = the next one); that call never returns. */
  dieAt(k) {
    this.#countdown = k;
  }

  wrap(target) {
    return new Proxy(target, {
      get: (t, key) => {
        const v = t[key];
        if (typeof v !== 'function') return v;
        return (...args) => {
          if (!this.dead && --this.#countdown <= 0) this.end();
          return this.dead ? never() : v.apply(t, args);
        };
      },
    });
  }
}

/**
 * Builds services over one directory, store and fake driver (and `blobsDir`: the blob store's
 * directory, which nodes of a cluster share; default under `dir`).
 * @example const h = fakeHarness(dir, store, driver); const svc = h.service(); await svc.start();
 */
export function fakeHarness(dir, store, driver, { blobsDir = path.join(dir, 'blobs') } = {}) {
  const blobs = new LocalBlobStore(blobsDir);
  /** A SandboxService as the daemon makes it; with `life`, one that can die (see {@link Life}). */
  function service(opts = {}, life) {
    const w = (x) => (life ? life.wrap(x) : x);
    return new SandboxService({
      store: w(store),
      driver: w(driver),
      logger: quiet,
      blobs: w(blobs),
      rootfs: new FakeRootfs(path.join(dir, 'rootfs')),
      imagesDir: path.join(dir, 'images'),
      uploadsDir: path.join(dir, 'uploads'),
      workDir: path.join(dir, 'work'),
      usageSampleMs: 60_000,
      ...(life ? { faultAction: () => (life.end(), never()) } : {}),
      ...opts,
    });
  }
  /** Runs a fake command line (in a sandbox of `tenant`); resolves to { exitCode, stdout, stderr }. */
  async function run(svc, id, line, tenant = T) {
    const call = await svc.call(tenant, id, 'exec', { op: 'exec', argv: line.split(' ') });
    await call.reply;
    let stdout = '';
    let stderr = '';
    for await (const c of call.output()) (c.channel === Channel.Stderr ? (stderr += c.data) : (stdout += c.data));
    const end = await call.done;
    return { exitCode: end.exitCode, stdout, stderr };
  }
  return { service, run, out: async (svc, id, line) => (await run(svc, id, line)).stdout, blobs };
}
