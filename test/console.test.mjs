// The web console as a person uses it: Debian's Chromium, headless, driven by playwright-core,
// against a real daemon on runsc. Signs in with the key, creates a sandbox, types in its
// terminal, uploads a file, takes two snapshots and sees them on the timeline, forks from the
// first and sees the fork in the tree, rolls back, denies an egress request and sees it appear
// in the audit log live, hibernates, wakes and kills it. Then: every user-controlled string is
// text (planted markup never runs), CSRF and sign-in refusals, a revoked key's session goes back
// to sign-in, the live views reconnect after the daemon restarts, axe-core finds no serious
// violation on any page, and nothing overflows a narrow window. Screenshots of each page go to
// SPACE_ARTIFACTS (default test-artifacts/console/), which docs/console.md shows.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { after, before, describe, it } from 'node:test';
import { chromium } from 'playwright-core';
import { startDaemon } from '../packages/server/dist/index.js';
import { Sandbox } from '../packages/sdk/dist/index.js';
import { egressRange, eventually, startTestDaemon, TEMPLATES_DIR } from './helpers.mjs';
import { makeOciImage } from './oci-image.mjs';
import { stablePort } from './free-port.mjs';
import WebSocket from 'ws';

const CHROMIUM = process.env.SPACE_CHROMIUM ?? '/usr/bin/chromium';
const ARTIFACTS = process.env.SPACE_ARTIFACTS ?? path.resolve('test-artifacts/console');
const AXE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8');
/** Markup planted in everything a user controls: it must show as text and never run. */
const XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>';
const STEP = { timeout: 180_000 };

describe('the web console in a browser (headless Chromium)', () => {
  let fx;
  let browser;
  let page;
  let context;
  let sbId;
  before(async () => {
    // A port it can have again after the restart step (see stablePort).
    fx = await startTestDaemon({ listen: `127.0.0.1:${await stablePort(3)}` });
    mkdirSync(ARTIFACTS, { recursive: true });
    // (Root in CI: Chromium's own sandbox needs an unprivileged user, so it is off; the pages are ours.)
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    page = await context.newPage();
    page.on('pageerror', (e) => console.log(`# page error: ${e.message}`));
  });
  after(async () => {
    await browser?.close();
    if (sbId) fx.track(sbId);
    assert.deepEqual(await fx.close(), []);
  });

  /** axe-core's serious and critical violations on the page as it is now. */
  const axe = async (name) => {
    // Evaluated through the DevTools protocol, so the page's CSP (scripts from the daemon only) stays on.
    const violations = await page.evaluate(`${AXE}; axe.run(document, { resultTypes: ['violations'] }).then((r) => r.violations.map((v) => ({ id: v.id, impact: v.impact, nodes: v.nodes.map((n) => n.target.join(' ')).slice(0, 3) })))`);
    const serious = violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
    assert.deepEqual(serious, [], `axe on ${name}: ${JSON.stringify(serious)}`);
  };
  const shot = (name) => page.screenshot({ path: path.join(ARTIFACTS, `${name}.png`), fullPage: true });
  const tab = async (name) => {
    await page.getByRole('navigation', { name: 'Sandbox' }).getByRole('link', { name }).click();
  };
  /** Waits for `locator` to read `text` (30 s at most); else fails saying what the page shows. */
  const showing = (locator, text) =>
    eventually(async () => (await locator.textContent()) === text, { tries: 300 }).catch(async (err) => {
      throw new Error(`${err.message}: waited for "${text}"; the page shows: ${await page.locator('main').textContent()}`);
    });
  /** Waits for `locator` to be visible; else fails saying what the page shows. */
  const seen = (locator) =>
    locator.waitFor().catch(async (err) => {
      throw new Error(`${err.message.split('\n')[0]}; the page shows: ${await page.locator('main').textContent()}`);
    });
  const confirm = async (label) => {
    await page.getByRole('button', { name: label, exact: true }).first().click();
    await page.getByRole('dialog').getByRole('button', { name: label, exact: true }).click();
  };

  it('a wrong key gets a clear message and no cookie; the right one, typed at the keyboard, signs in', STEP, async () => {
    await page.goto(`${fx.url}/`);
    await page.getByLabel('API key').fill('space_not-a-key');
    await page.keyboard.press('Enter');
    await page.getByRole('alert').filter({ hasText: 'not valid' }).waitFor();
    assert.deepEqual(await context.cookies(), []);
    await axe('sign-in');
    await shot('sign-in');
    // Keyboard only: focus the field, type, Enter.
    await page.getByLabel('API key').fill('');
    await page.getByLabel('API key').focus();
    await page.keyboard.type(fx.key);
    await page.keyboard.press('Enter');
    await page.getByRole('heading', { name: 'Sandboxes' }).waitFor();
    const [c] = await context.cookies();
    assert.equal(c.name, 'space_session');
    assert.equal(c.httpOnly, true);
    assert.equal(c.sameSite, 'Strict');
    assert.equal(await page.evaluate(() => document.cookie + JSON.stringify(localStorage) + JSON.stringify(sessionStorage)), '{}{}', 'the page holds neither key nor session');
    assert.ok(!(await page.content()).includes(fx.key), 'the key is not in the page');
  });

  it('creates a sandbox; the terminal echoes; a file uploads and is listed', STEP, async () => {
    await page.getByLabel('Template').selectOption('minimal');
    await page.getByLabel('Memory (MiB)').fill('256');
    await page.getByRole('button', { name: 'New sandbox' }).click();
    await page.getByText('Terminal: connected').waitFor();
    sbId = new URL(page.url()).pathname.split('/')[3];
    assert.match(sbId, /^sb[a-z0-9]+$/);
    // Typed only once the shell prompts: keys that arrive while it starts are dropped when it
    // takes the terminal over (seen in CI: "rom the console" ran).
    await page.waitForFunction(() => /\$ $/.test(document.querySelector('.term-box .xterm-rows')?.textContent?.trimEnd() + ' '));
    await page.locator('.term-box').click();
    await page.keyboard.type('echo hi from the console; echo $((6*7))\n');
    // The rows only: the box also holds xterm's generated CSS, which always has "42" (.xterm-fg-42).
    await page.waitForFunction(() => /^42$/m.test([...document.querySelectorAll('.term-box .xterm-rows > div')].map((r) => r.textContent.trim()).join('\n')));
    assert.match(await page.locator('.term-box .xterm-rows').textContent(), /hi from the console/);
    await shot('terminal');
    await axe('terminal');
    const running = async () => (await (await fetch(`${fx.url}/v1/sandboxes/${sbId}/commands`, { headers: { authorization: `Bearer ${fx.key}` } })).json()).processes.filter((p) => p.running);
    assert.equal((await running()).length, 1, 'the terminal\'s shell');

    // Leaving the terminal closes its socket, which hangs the shell up: nothing stays running.
    await tab('Files');
    await eventually(async () => (await running()).length === 0);
    await page.getByLabel('Directory', { exact: true }).fill('/tmp');
    await page.getByRole('button', { name: 'Go' }).click();
    await seen(page.getByRole('table', { name: 'Files in /tmp' }));
    await page.getByLabel('Upload to this directory').setInputFiles({ name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('uploaded through the console\n') });
    await page.getByRole('status').filter({ hasText: '/tmp/notes.txt: uploaded' }).waitFor();
    await page.getByRole('link', { name: 'notes.txt' }).waitFor();
    const sb = await Sandbox.connect(sbId, fx.conn);
    assert.equal(await sb.files.read('/tmp/notes.txt'), 'uploaded through the console\n');
    await shot('files');
    await axe('files');
  });

  it('two snapshots on the timeline; a fork from the first in the tree; a rollback to it', STEP, async () => {
    const sb = await Sandbox.connect(sbId, fx.conn);
    await sb.files.write('/tmp/when', 'first');
    await page.getByRole('button', { name: 'Snapshot', exact: true }).click();
    await tab('Snapshots');
    await eventually(async () => (await page.locator('svg.timeline circle').count()) === 1);
    await sb.files.write('/tmp/when', 'second');
    await page.getByRole('button', { name: 'Snapshot', exact: true }).click();
    await eventually(async () => (await page.locator('svg.timeline circle').count()) === 2);
    const snaps = (await sb.snapshots()).sort((a, b) => a.createdAt.localeCompare(b.createdAt));
    assert.equal(await page.locator('tr[data-snapshot]').count(), 2);
    await shot('snapshots');
    await axe('snapshots');

    // Fork from the first: the page goes to the fork's tree, which shows parent and fork.
    await page.locator(`tr[data-snapshot="${snaps[0].id}"]`).getByRole('button', { name: 'Fork from here' }).click();
    await page.getByRole('tree').waitFor();
    const forkId = new URL(page.url()).pathname.split('/')[3];
    assert.notEqual(forkId, sbId);
    fx.track(forkId);
    const tree = page.getByRole('tree');
    await tree.getByRole('link', { name: sbId }).waitFor();
    await tree.getByRole('link', { name: forkId }).waitFor();
    assert.match(await tree.textContent(), new RegExp(`from snapshot ${snaps[0].id}`));
    assert.equal(await (await Sandbox.connect(forkId, fx.conn)).files.read('/tmp/when'), 'first');
    await shot('fork-tree');
    await axe('fork tree');
    // Click through to the parent, then roll it back to the first snapshot.
    await tree.getByRole('link', { name: sbId }).click();
    await tab('Snapshots');
    await page.locator(`tr[data-snapshot="${snaps[0].id}"]`).getByRole('button', { name: 'Roll back' }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Roll back' }).click();
    await eventually(async () => (await sb.files.read('/tmp/when').catch(() => '')) === 'first');
    // Delete the second: one row and one point left.
    await page.locator(`tr[data-snapshot="${snaps[1].id}"]`).getByRole('button', { name: 'Delete' }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Delete' }).click();
    await eventually(async () => (await page.locator('tr[data-snapshot]').count()) === 1 && (await page.locator('svg.timeline circle').count()) === 1);
    assert.deepEqual((await sb.snapshots()).map((x) => x.id), [snaps[0].id]);
  });

  it('an egress rule set in the page; a request it denies appears in the audit log as it happens', STEP, async () => {
    await tab('Egress');
    await page.getByLabel('Domains (one per line; *.example.org for subdomains)').fill('allowed.example.test');
    await page.getByRole('button', { name: 'Save egress policy' }).click();
    await page.getByText('Saved: applies from the next request.').waitFor();
    const sb = await Sandbox.connect(sbId, fx.conn);
    assert.deepEqual((await sb.egress()).domains, ['allowed.example.test']);
    // (busybox's nc, straight to the sandbox's proxy: a plain-HTTP request for a host not allowed)
    const proxy = (await sb.commands.run('echo $HTTP_PROXY')).stdout.trim().replace('http://', '').split(':');
    await sb.commands.run(`printf 'GET http://denied.example.test/console-check HTTP/1.1\\r\\nHost: denied.example.test\\r\\n\\r\\n' | nc -w 3 ${proxy[0]} ${proxy[1]} | head -1`);
    const row = page.locator('table.audit tr.denied').filter({ hasText: 'denied.example.test' });
    await row.first().waitFor();
    assert.match(await row.first().textContent(), /console-check/);
    await page.getByLabel('denied only').check();
    await page.getByLabel('Host', { exact: true }).fill('nothing-like-it');
    assert.equal(await page.locator('table.audit tbody tr').count(), 0);
    await page.getByLabel('Host', { exact: true }).fill('denied.example');
    assert.equal(await page.locator('table.audit tbody tr').count(), 1);
    await shot('egress');
    await axe('egress');
  });

  it('hibernate, wake and kill from the buttons; the state follows live', STEP, async () => {
    const badge = page.getByRole('heading', { level: 1 }).locator('.badge');
    await page.getByRole('button', { name: 'Hibernate' }).click();
    await showing(badge, 'hibernated');
    await page.getByRole('button', { name: 'Wake' }).click();
    await showing(badge, 'running');
    assert.equal(await (await Sandbox.connect(sbId, fx.conn)).files.read('/tmp/when'), 'first');
    // Forks of many: two copies at once, both in the tree.
    await page.getByLabel('copies').fill('2');
    await page.getByRole('button', { name: 'Fork into 2' }).click();
    await page.getByRole('status').filter({ hasText: '2 of 2 forks made' }).waitFor();
    await page.getByRole('tree').waitFor();
    const forks = (await Sandbox.list(fx.conn)).items.filter((x) => x.parentId === sbId);
    for (const f of forks) fx.track(f.id);
    assert.equal(forks.length, 3, 'the fork from the snapshot and these two');
    for (const f of forks) await page.getByRole('tree').getByRole('link', { name: f.id }).waitFor();
    await page.getByRole('tree').getByRole('link', { name: sbId }).click();
    await tab('Events');
    await page.getByText(/woken from snapshot/).waitFor();
    await shot('events');
    await axe('events');
    await confirm('Kill');
    await showing(badge, 'killed');
    const rec = await (await fetch(`${fx.url}/v1/sandboxes/${sbId}`, { headers: { authorization: `Bearer ${fx.key}` } })).json();
    assert.equal(rec.state, 'killed');
  });

  it('markup in labels, file names, command lines, egress paths and messages is shown as text and never runs', STEP, async () => {
    const sb = await Sandbox.create({ ...fx.conn, template: 'minimal', memoryMb: 256, metadata: { note: XSS, [`k${'<b>x</b>'.replace(/[<>/]/g, '')}`]: 'plain' } });
    fx.track(sb);
    await sb.files.write(`/tmp/${XSS.replace(/\//g, '_')}`, 'x');
    await sb.commands.run(`sleep 600 # ${XSS}`, { background: true });
    const proxy = (await sb.commands.run('echo $HTTP_PROXY')).stdout.trim().replace('http://', '').split(':');
    await sb.commands.run(`printf 'GET http://denied.example.test/<img%%20src=x%%20onerror=window.__xss=3> HTTP/1.1\\r\\nHost: denied.example.test\\r\\n\\r\\n' | nc -w 3 ${proxy[0]} ${proxy[1]} | head -1`);
    await page.getByRole('link', { name: 'Sandboxes' }).first().click();
    await page.getByRole('link', { name: sb.id }).waitFor();
    await page.getByText(`note=${XSS}`).waitFor();
    await shot('sandboxes');
    await axe('sandboxes');
    await page.getByRole('link', { name: sb.id }).click();
    await tab('Processes');
    await page.getByText(XSS, { exact: false }).first().waitFor();
    await tab('Files');
    await page.getByLabel('Directory', { exact: true }).fill('/tmp');
    await page.getByRole('button', { name: 'Go' }).click();
    await page.getByRole('table', { name: 'Files in /tmp' }).waitFor();
    await page.getByRole('link', { name: XSS.replace(/\//g, '_') }).waitFor();
    await tab('Egress');
    await page.locator('table.audit tr.denied').first().waitFor();
    for (const t of ['Events', 'Snapshots', 'Fork tree', 'Ports']) await tab(t);
    assert.equal(await page.evaluate(() => window.__xss), undefined, 'no planted script ran');
    assert.equal(await page.locator('img[src="x"]').count(), 0, 'no planted element exists');
  });

  it('a request with the cookie but without the CSRF token is refused (403); with it, it works', STEP, async () => {
    const cookie = (await context.cookies()).map((c) => `${c.name}=${c.value}`).join('; ');
    const refused = await fetch(`${fx.url}/v1/sandboxes`, { method: 'POST', headers: { cookie, 'content-type': 'application/json' }, body: JSON.stringify({ template: 'minimal' }) });
    assert.equal(refused.status, 403);
    assert.equal((await refused.json()).error.code, 'CSRF_TOKEN_INVALID');
    const wrong = await fetch(`${fx.url}/v1/keys`, { method: 'POST', headers: { cookie, 'content-type': 'application/json', 'x-csrf-token': 'forged' }, body: JSON.stringify({ name: 'x' }) });
    assert.equal(wrong.status, 403);
    const { csrfToken } = await (await fetch(`${fx.url}/v1/session`, { headers: { cookie } })).json();
    const ok = await fetch(`${fx.url}/v1/keys`, { method: 'POST', headers: { cookie, 'content-type': 'application/json', 'x-csrf-token': csrfToken }, body: JSON.stringify({ name: 'made with the session' }) });
    assert.equal(ok.status, 201);
    // A session cookie forged or tampered with is nobody's.
    const forged = await fetch(`${fx.url}/v1/sandboxes`, { headers: { cookie: cookie.replace(/.$/, (c) => (c === 'A' ? 'B' : 'A')) } });
    assert.equal(forged.status, 401);
    // The terminal's WebSocket: another site's page with the cookie is refused before the upgrade, and so is an unknown sandbox.
    const upgrade = (id, headers) =>
      new Promise((resolve, reject) => {
        const ws = new WebSocket(`${fx.url.replace(/^http/, 'ws')}/v1/sandboxes/${id}/terminal`, { headers });
        ws.once('unexpected-response', (_req, res) => resolve(res.statusCode));
        ws.once('open', () => (ws.close(), resolve(101)));
        ws.once('error', reject);
      });
    assert.equal(await upgrade(sbId, { cookie, origin: 'http://evil.example' }), 403);
    assert.equal(await upgrade('sb-unknown', { cookie, origin: fx.url }), 404);
  });

  it('the live stream carries only the tenant\'s own changes', STEP, async () => {
    const other = await (await fetch(`${fx.url}/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${fx.key}`, 'content-type': 'application/json' }, body: JSON.stringify({ tenant: 'other-tenant', name: 'other' }) })).json();
    const ac = new AbortController();
    const r = await fetch(`${fx.url}/v1/events`, { headers: { authorization: `Bearer ${other.key}` }, signal: ac.signal });
    assert.equal(r.headers.get('content-type'), 'text/event-stream; charset=utf-8');
    let text = '';
    const reading = (async () => {
      for await (const chunk of r.body) text += Buffer.from(chunk).toString();
    })().catch(() => {});
    const mine = await Sandbox.create({ ...fx.conn, template: 'minimal', memoryMb: 256 });
    fx.track(mine);
    await mine.pause();
    const theirs = await Sandbox.create({ apiUrl: fx.url, apiKey: other.key, template: 'minimal', memoryMb: 256 });
    fx.track(theirs, { apiUrl: fx.url, apiKey: other.key });
    await eventually(() => text.includes(theirs.id));
    ac.abort();
    await reading;
    assert.ok(!text.includes(mine.id), 'another tenant\'s sandbox is not in the stream');
    assert.match(text, /^event: sandbox$/m);
  });

  it('the other pages render (templates, secrets, keys, nodes) and pass axe; nothing overflows a narrow window', STEP, async () => {
    for (const [name, heading] of [['Templates', 'Templates'], ['Secrets', 'Secrets'], ['Keys', 'Keys'], ['Nodes', 'Nodes']]) {
      await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name }).click();
      await page.getByRole('heading', { name: heading, level: 1 }).waitFor();
      await shot(name.toLowerCase());
      await axe(name);
    }
    await page.setViewportSize({ width: 420, height: 800 });
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Sandboxes' }).click();
    await page.getByRole('heading', { name: 'Sandboxes' }).waitFor();
    assert.ok(await page.evaluate(() => document.documentElement.scrollWidth <= window.innerWidth + 1), 'no sideways scrolling of the page at 420 px');
    await shot('sandboxes-narrow');
    await page.setViewportSize({ width: 1280, height: 800 });
  });

  it('volumes: created, snapshotted and deleted from their page', STEP, async () => {
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Volumes' }).click();
    await page.getByRole('heading', { name: 'Volumes', level: 1 }).waitFor();
    const form = page.getByRole('form', { name: 'New volume' });
    await form.getByLabel('Name').fill('notes');
    await form.getByLabel('Size (MiB)').fill('64');
    await form.getByRole('button', { name: 'Create volume' }).click();
    const row = page.getByRole('table', { name: 'Volumes' }).getByRole('row').filter({ hasText: 'notes' });
    await seen(row);
    assert.match(await row.textContent(), /64 MiB/);
    await row.getByRole('button', { name: 'Snapshots' }).click();
    await page.getByRole('button', { name: 'Snapshot notes' }).click();
    await seen(page.getByRole('table', { name: 'Snapshots of notes' }).getByRole('row').nth(1));
    const api = async (p) => (await fetch(`${fx.url}${p}`, { headers: { authorization: `Bearer ${fx.key}` } })).json();
    assert.equal((await api('/v1/volumes/notes/snapshots')).snapshots.length, 1);
    await shot('volumes');
    await axe('volumes');
    await row.getByRole('button', { name: 'Delete', exact: true }).click();
    await page.getByRole('dialog').getByRole('button', { name: 'Delete', exact: true }).click();
    await row.waitFor({ state: 'detached' });
    assert.deepEqual((await api('/v1/volumes')).volumes, []);
  });

  it('a port exposed from the Ports tab opens through its signed link, and closes', STEP, async () => {
    const sb = await fx.create({ template: 'minimal' });
    await sb.commands.run('mkdir -p /tmp/www && echo "served from $(hostname)" > /tmp/www/index.html');
    await sb.commands.start('busybox httpd -f -p 8000 -h /tmp/www', { stdin: false });
    await page.goto(`${fx.url}/console/sandboxes/${sb.id}/ports`);
    const form = page.getByRole('form', { name: 'Expose a port' });
    await form.getByLabel('Port').fill('8000');
    await form.getByLabel('For').selectOption({ label: '1 hour' });
    await form.getByRole('button', { name: 'Expose' }).click();
    await seen(page.getByRole('status').filter({ hasText: 'access token' }));
    const link = page.getByRole('table', { name: 'Exposed ports' }).getByRole('link');
    const href = await link.getAttribute('href');
    assert.match(href, new RegExp(`^http://8000-${sb.id}\\.`), href);
    const [opened] = await Promise.all([context.waitForEvent('page'), link.click()]);
    await eventually(async () => (await opened.reload()) && (await opened.textContent('body')).includes(`served from ${sb.id}`), { tries: 50 });
    await opened.close();
    await shot('ports');
    await axe('ports');
    await confirm('Close');
    await seen(page.getByText('No port is exposed.'));
    const r = await fetch(`${fx.url}/v1/sandboxes/${sb.id}/ports`, { headers: { authorization: `Bearer ${fx.key}` } });
    assert.deepEqual((await r.json()).ports, []);
    await sb.kill();
  });

  it('a template built from an image file uploaded in the page, its progress shown', STEP, async () => {
    const dir = mkdtempSync('/tmp/space-console-image-');
    try {
      const image = await makeOciImage(dir, { marker: 'console' });
      await page.goto(`${fx.url}/console/templates`);
      const form = page.getByRole('form', { name: 'Build a template' });
      await form.getByLabel('Name').fill('from-upload');
      await form.getByLabel('or an image').setInputFiles(image);
      await form.getByRole('button', { name: 'Build template' }).click();
      await seen(form.getByRole('status').filter({ hasText: '100% ready' }));
      await seen(page.getByRole('table', { name: 'Templates' }).getByRole('row').filter({ hasText: 'from-upload' }));
      const sb = await fx.create({ template: 'from-upload' });
      assert.equal((await sb.commands.run('cat /opt/app/hello.txt')).stdout, 'hello from the image console\n');
      await sb.kill();
    } finally {
      await fetch(`${fx.url}/v1/templates/from-upload`, { method: 'DELETE', headers: { authorization: `Bearer ${fx.key}` } });
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('the daemon restarting: the page reconnects its live view and shows what changed after', STEP, async () => {
    await page.getByRole('navigation', { name: 'Main' }).getByRole('link', { name: 'Sandboxes' }).click();
    await page.getByRole('heading', { name: 'Sandboxes' }).waitFor();
    const dot = page.locator('.who .dot');
    await eventually(async () => (await dot.getAttribute('class')) === 'dot on');
    const port = new URL(fx.url).port;
    await fx.daemon.close();
    await eventually(async () => (await dot.getAttribute('class')) === 'dot');
    fx.daemon = await startDaemon({ dataDir: fx.dataDir, listen: `127.0.0.1:${port}`, templatesDir: TEMPLATES_DIR, logLevel: process.env.SPACE_TEST_LOG ?? 'warn', egress: { range: egressRange(fx.dataDir) } });
    await eventually(async () => (await dot.getAttribute('class')) === 'dot on', { tries: 300 });
    const sb = await Sandbox.create({ ...fx.conn, template: 'minimal', memoryMb: 256 });
    fx.track(sb);
    await page.getByRole('link', { name: sb.id }).waitFor();
  });

  it('a session whose key is revoked goes back to sign-in, with no half-rendered page', STEP, async () => {
    const { key } = await (await fetch(`${fx.url}/v1/keys`, { method: 'POST', headers: { authorization: `Bearer ${fx.key}`, 'content-type': 'application/json' }, body: JSON.stringify({ name: 'short-lived' }) })).json();
    const other = await browser.newContext();
    const p2 = await other.newPage();
    await p2.goto(`${fx.url}/console/keys`);
    await p2.getByLabel('API key').fill(key);
    await p2.getByRole('button', { name: 'Sign in' }).click();
    await p2.getByRole('heading', { name: 'Keys', level: 1 }).waitFor();
    const keys = await (await fetch(`${fx.url}/v1/keys`, { headers: { authorization: `Bearer ${fx.key}` } })).json();
    const id = keys.keys.find((k) => k.name === 'short-lived').id;
    await fetch(`${fx.url}/v1/keys/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${fx.key}` } });
    // The key check is cached 5 s; a reload after that finds the session ended.
    await eventually(async () => (await fetch(`${fx.url}/v1/session`, { headers: { cookie: (await other.cookies()).map((c) => `${c.name}=${c.value}`).join('; ') } })).status === 401, { tries: 100 });
    await p2.reload();
    await p2.getByLabel('API key').waitFor();
    assert.equal(await p2.getByRole('heading', { name: 'Keys' }).count(), 0);
    // Signing out clears the cookie.
    await page.getByRole('button', { name: 'Sign out' }).click();
    await page.getByLabel('API key').waitFor();
    assert.deepEqual(await context.cookies(fx.url), [], 'no cookie left for the console');
    await other.close();
  });
});

