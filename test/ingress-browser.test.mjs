// The ingress as a person uses it: a headless Chromium (Debian's, driven by playwright-core)
// opens the signed link `space expose` prints, gets the HttpOnly cookie for that host, and later
// page loads and a WebSocket from the page work without the token; another browser without the
// link gets 401. `*.localhost` names resolve to loopback in Chromium itself, as in every browser.
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { chromium } from 'playwright-core';
import { eventually, startTestDaemon } from './helpers.mjs';
import { startStreamsServer } from './streams-server.mjs';

const CHROMIUM = process.env.SPACE_CHROMIUM ?? '/usr/bin/chromium';

describe('ingress in a browser (headless Chromium)', () => {
  let fx, sb, p, browser;
  before(async () => {
    fx = await startTestDaemon();
    sb = await fx.create({ template: 'base' });
    await startStreamsServer(sb);
    p = await sb.ports.expose(8080);
    await eventually(async () => (await fetch(`http://127.0.0.1:${new URL(p.url).port}/`, { headers: { host: new URL(p.url).host } }).catch(() => undefined)) !== undefined);
    // (Root in CI: Chromium's own sandbox needs an unprivileged user, so it is off; the page is ours.)
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  });
  after(async () => {
    await browser?.close();
    assert.deepEqual(await fx.close(), []);
  });

  it('the signed link sets an HttpOnly cookie; later loads and a WebSocket work without the token; no link, 401', async () => {
    const context = await browser.newContext();
    const page = await context.newPage();
    // The server starts in the background: 502 until it listens.
    await eventually(async () => (await page.goto(p.signedUrl)).status() === 200);
    assert.equal(new URL(page.url()).pathname, '/', 'redirected to the page');
    assert.equal(await page.textContent('body'), 'streams server');
    const cookies = await context.cookies(p.url);
    assert.deepEqual(cookies.map((c) => [c.name, c.httpOnly, c.domain]), [['space_ingress', true, new URL(p.url).hostname]]);
    assert.equal(await page.evaluate(() => document.cookie), '', 'the page cannot read the pass');

    const again = await page.goto(`${p.url}?second=load`);
    assert.equal(again.status(), 200);
    const echoed = await page.evaluate(
      () =>
        new Promise((resolve, reject) => {
          const ws = new WebSocket(`ws://${location.host}/ws`);
          ws.onopen = () => ws.send('from the browser');
          ws.onmessage = (m) => (ws.close(), resolve(String(m.data)));
          ws.onerror = () => reject(new Error('WebSocket failed'));
        }),
    );
    assert.equal(echoed, 'from the browser', 'the cookie lets the page\'s WebSocket in');

    const stranger = await browser.newContext();
    const r = await (await stranger.newPage()).goto(p.url);
    assert.equal(r.status(), 401);
    assert.match(await r.text(), /INGRESS_UNAUTHENTICATED/, 'a page that says why');
    await stranger.close();
    await context.close();
  });
});
