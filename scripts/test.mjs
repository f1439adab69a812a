#!/usr/bin/env node
// Runs the whole suite with node's test runner, one file at a time (sandboxes are heavy on
// 2 cores). Pass test files to run only those: ./space test test/api.test.mjs
import { spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';

const files = readdirSync(new URL('../test/', import.meta.url)).filter((f) => f.endsWith('.test.mjs')).sort().map((f) => `test/${f}`);
const only = process.argv.slice(2);
const r = spawnSync(process.execPath, ['--test', '--test-concurrency=1', '--test-timeout=900000', ...(only.length ? only : files)], { stdio: 'inherit' });
process.exit(r.status ?? 1);
