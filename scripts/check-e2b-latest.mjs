#!/usr/bin/env node
// Runs the E2B compatibility tests against the newest published `e2b` SDK (the suite pins
// one version). Needs the npm registry: npm run check:e2b-latest
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import path from 'node:path';

const dir = mkdtempSync('/tmp/space-e2b-latest-');
try {
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--prefix', dir, 'e2b@latest'], { stdio: ['ignore', 'ignore', 'inherit'] });
  const pkg = path.join(dir, 'node_modules', 'e2b');
  const version = JSON.parse(readFileSync(path.join(pkg, 'package.json'), 'utf8')).version;
  console.log(`e2b ${version} (latest) against SPACE`);
  const r = spawnSync(process.execPath, ['--test', 'test/e2b.test.mjs'], { stdio: 'inherit', env: { ...process.env, SPACE_E2B_SDK: path.join(pkg, 'dist', 'index.mjs') } });
  process.exitCode = r.status ?? 1;
} finally {
  rmSync(dir, { recursive: true, force: true });
}
