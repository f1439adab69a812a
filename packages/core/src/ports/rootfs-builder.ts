/**
 * The root-file-system builder interface: where template root file systems come from and
 * where they are cached. Implemented by `@space/templates`; core only orchestrates.
 */

/** Progress callback of a long build: overall percent (0–100) and the current step. */
export type Progress = (percent: number, step: string) => void;

/** What to build a root file system from. */
export type RootfsSource =
  | { type: 'builtin'; name: string }
  | { type: 'debian'; packages: string[] }
  /** A tarball on the daemon's disk: OCI image layout, `docker save` output, or a plain rootfs. */
  | { type: 'upload'; file: string };

/** Result of a build. */
export interface RootfsBuild {
  /** Bytes on disk. */
  sizeBytes: number;
  /** Environment the image declares (OCI/docker config `Env`), merged under the template's env. */
  env: Record<string, string>;
  /** What an upload turned out to be. */
  format?: 'oci' | 'docker' | 'rootfs';
}

/**
 * Builds and caches root file systems by content key. A root file system becomes visible
 * only when complete; a failed build leaves nothing behind.
 *
 * @example
 * await builder.build('t-3f2a…', { type: 'debian', packages: ['jq'] }, (p, s) => console.log(p, s));
 * const dir = builder.path('t-3f2a…');
 */
export interface RootfsBuilder {
  /** Names of the built-in templates, in order. */
  readonly builtins: readonly string[];
  /** Key of a built-in template. */
  builtinKey(name: string): string;
  /** Directory of the root file system of `key` (whether or not it exists yet). */
  path(key: string): string;
  /** Whether `key` is built. */
  has(key: string): boolean;
  /**
   * Builds `key` from `source` unless it is already there; concurrent builds of one key share
   * the work. Rejects with `TEMPLATE_BUILD_FAILED` or `TEMPLATE_IMAGE_INVALID` naming the step.
   */
  build(key: string, source: RootfsSource, progress?: Progress, signal?: AbortSignal): Promise<RootfsBuild>;
  /** Deletes `key`'s root file system. */
  remove(key: string): Promise<void>;
}
