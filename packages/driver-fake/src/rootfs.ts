/**
 * A {@link RootfsBuilder} that builds nothing: each template's "root file system" is an empty
 * directory (the fake driver keeps its machines in memory). Built-ins: `minimal`.
 */
import { existsSync, promises as fs } from 'node:fs';
import path from 'node:path';
import type { RootfsBuild, RootfsBuilder, RootfsSource } from '@space/core';

/**
 * @example
 * const rootfs = new FakeRootfs('/tmp/t/templates');
 */
export class FakeRootfs implements RootfsBuilder {
  readonly builtins = ['minimal'] as const;

  constructor(private readonly dir: string) {}

  builtinKey(name: string): string {
    return `builtin-${name}`;
  }

  path(key: string): string {
    return path.join(this.dir, key);
  }

  has(key: string): boolean {
    return existsSync(this.path(key));
  }

  async build(key: string, _source: RootfsSource): Promise<RootfsBuild> {
    await fs.mkdir(this.path(key), { recursive: true });
    return { sizeBytes: 0, env: {} };
  }

  async remove(key: string): Promise<void> {
    await fs.rm(this.path(key), { recursive: true, force: true });
  }
}
