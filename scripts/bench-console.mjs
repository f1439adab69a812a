#!/usr/bin/env node
// The web console's costs, in Debian's headless Chromium against a real daemon on runsc:
// - first load: the bytes of HTML, JavaScript and CSS, and the time until the sign-in form can
//   be used, against the same browser loading a trivial document (GET /v1/version) from the
//   same daemon in the same run;
// - keystroke echo: a character typed into the console's terminal until it shows on the page,
//   against the same through `space shell` (the CLI in a pseudo-terminal, node-pty), alternating.
//   node scripts/bench-console.mjs [--iterations 31] [--write]
import { mkdtempSync } from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { chromium } from 'playwright-core';
import pty from 'node-pty';
import { quantile, writeSection } from './bench-lib.mjs';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { removeDataDir, startSpaced, stopSpaced } from '../test/helpers.mjs';

const { values } = parseArgs({ options: { iterations: { type: 'string', default: '31' }, write: { type: 'boolean', default: false } } });
const N = Number(values.iterations);
const root = path.resolve(new URL('..', import.meta.url).pathname);
const dataDir = mkdtempSync('/tmp/space-bench-console-');
const spaced = await startSpaced(dataDir);
const { conn } = spaced;
const sb = await Sandbox.create({ ...conn, template: 'minimal', memoryMb: 256 });
const browser = await chromium.launch({ executablePath: process.env.SPACE_CHROMIUM ?? '/usr/bin/chromium', args: ['--no-sandbox'] });
let term;
// Whatever happens, the sandbox, the daemon and the browser go.
const cleanUp = async () => {
  term?.kill();
  await browser.close().catch(() => {});
  await sb.kill().catch(() => {});
  await stopSpaced(spaced);
  // With disks (the default) the pool stays mounted after the daemon: removeDataDir unmounts it.
  removeDataDir(dataDir);
};
process.on('uncaughtException', async (err) => {
  console.error(err);
  await cleanUp();
  process.exit(1);
});

// ---- first load
const bytes = {};
const loads = { console: [], floor: [] };
for (let i = 0; i < Math.min(N, 15); i++) {
  for (const which of ['floor', 'console']) {
    const ctx = await browser.newContext();
    const page = await ctx.newPage();
    // Bytes on the wire (compressed as sent), per file, from the first load.
    if (which === 'console' && i === 0) page.on('requestfinished', async (r) => (bytes[new URL(r.url()).pathname.split('/').pop() || 'index.html'] = (await r.sizes()).responseBodySize));
    if (which === 'floor') {
      await page.goto(`${conn.apiUrl}/v1/version`);
      loads.floor.push(await page.evaluate(() => performance.now()));
    } else {
      await page.goto(`${conn.apiUrl}/`);
      await page.locator('#key:enabled').waitFor();
      loads.console.push(await page.evaluate(() => performance.now()));
    }
    await ctx.close();
  }
}

// ---- keystroke echo through the console
const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
const page = await ctx.newPage();
await page.goto(`${conn.apiUrl}/console/sandboxes/${sb.id}/terminal`);
await page.getByLabel('API key').fill(conn.apiKey);
await page.keyboard.press('Enter');
await page.getByText('Terminal: connected').waitFor();
await page.locator('.term-box').click();
await page.waitForFunction(() => (document.querySelector('.term-box .xterm-rows')?.textContent ?? '').includes('$'));
const marks = 'abcdefghijklmnopqrstuvwxyz';
// Timed inside the page, so that the DevTools round trip that types the key is not in it: from
// the keydown to the terminal's rows changing on screen (xterm.js paints on the next frame).
await page.evaluate(() => {
  const w = window;
  w.__echo = [];
  document.addEventListener('keydown', () => (w.__t0 = performance.now()), true);
  new MutationObserver(() => {
    if (w.__t0 === undefined) return;
    w.__echo.push(performance.now() - w.__t0);
    w.__t0 = undefined;
  }).observe(document.querySelector('.term-box .xterm-rows'), { subtree: true, childList: true, characterData: true });
});
/** Types one character into the console's terminal; ms from its keydown until the page shows it. */
async function consoleEcho(i) {
  const n = await page.evaluate(() => window.__echo.length);
  await page.keyboard.type(marks[i % marks.length]);
  await page.waitForFunction((k) => window.__echo.length > k, n);
  return page.evaluate(() => window.__echo.at(-1));
}

// ---- keystroke echo through `space shell`
term = pty.spawn(path.join(root, 'packages/cli/bin/space'), ['shell', sb.id], { name: 'xterm', cols: 120, rows: 30, cwd: root, env: { ...process.env, SPACE_URL: conn.apiUrl, SPACE_API_KEY: conn.apiKey } });
let out = '';
const waiters = [];
term.onData((d) => {
  out += d;
  // busybox's line editor asks where the cursor is (DSR); a terminal answers.
  if (d.includes('\x1b[6n')) setTimeout(() => term.write('\x1b[1;5R'), 10);
  for (const w of waiters.splice(0)) w();
});
const until = async (pred) => {
  const deadline = Date.now() + 10_000;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`space shell: gave up waiting; it printed ${JSON.stringify(out.slice(-200))}`);
    await new Promise((r) => (waiters.push(r), setTimeout(r, 500)));
  }
};
await until(() => out.includes('$ '));
// (ash discards what is typed before the terminal's answer to its cursor query: let it arrive)
await new Promise((r) => setTimeout(r, 300));
/** Types one character into `space shell`; ms until it is echoed back. */
async function shellEcho(i) {
  const ch = marks[i % marks.length];
  const n = out.length;
  const t = process.hrtime.bigint();
  term.write(ch);
  await until(() => out.length > n && out.slice(n).includes(ch));
  return Number(process.hrtime.bigint() - t) / 1e6;
}

const echo = { console: [], shell: [] };
for (let i = 0; i < 3; i++) await consoleEcho(i), await shellEcho(i);
for (let i = 0; i < N; i++) {
  echo.console.push(await consoleEcho(i));
  echo.shell.push(await shellEcho(i));
}
await cleanUp();

const p50 = (xs) => quantile(xs, 50);
const total = Object.values(bytes).reduce((a, b) => a + b, 0);
const f = (x) => x.toFixed(1);
const table = [
  '| measurement | console | baseline (same run) | ratio |',
  '|---|---:|---:|---:|',
  `| first load: bytes on the wire, gzipped (${Object.entries(bytes).map(([k, v]) => `${k} ${(v / 1024).toFixed(0)} KiB`).join(', ')}) | ${(total / 1024).toFixed(0)} KiB | — | — |`,
  `| first load: sign-in form usable, ms p50 (p95) — baseline: GET /v1/version as a page | ${f(p50(loads.console))} (${f(quantile(loads.console, 95))}) | ${f(p50(loads.floor))} (${f(quantile(loads.floor, 95))}) | ${(p50(loads.console) / p50(loads.floor)).toFixed(2)}x |`,
  `| keystroke echo, ms p50 (p95) — baseline: \`space shell\` in a pseudo-terminal | ${f(p50(echo.console))} (${f(quantile(echo.console, 95))}) | ${f(p50(echo.shell))} (${f(quantile(echo.shell, 95))}) | ${(p50(echo.console) / p50(echo.shell)).toFixed(2)}x |`,
].join('\n');
console.log(table);
if (values.write) writeSection('console', 'Web console', `Measured with \`node scripts/bench-console.mjs --iterations ${N} --write\`: Debian's headless Chromium and a daemon on runsc on this machine, a \`minimal\` sandbox; first loads in fresh browser contexts (no cache), ${Math.min(N, 15)} of each; keystrokes alternate between the console and \`space shell\`, ${N} of each. The console's echo is timed in the page, from the keydown to the terminal's rows changing (xterm.js paints on the next animation frame); \`space shell\`'s from the write to its pseudo-terminal until the character comes back.\n\n${table}`);
process.exit(0);
