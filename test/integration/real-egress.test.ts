import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../../env/browser';
import { RealEnv } from '../../env/real';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';

// What Playwright routes cannot see must not reach this machine either: a subframe whose allowed URL redirects
// to loopback, a WebSocket to loopback, and a name that the guard's check and the browser resolve differently
// (DNS rebinding). The REAL browser is launched with the egress guard (a proxy that vets every connection).
//
// Rebinding, simulated: Chromium is told (--host-resolver-rules) that rebind.test is 127.0.0.1, while this
// process's DNS does not know the name (the route check's lookup says "not private"); the egress proxy resolves
// it through its resolver hook, which answers what DNS answers at connection time: 127.0.0.1.

let browser: Browser;
let site: FakeRealSite;
let internal: Server;
let internalPort: number;
let internalUrl: string;
const internalHits: string[] = [];
let blobRoot: string;
let context: BrowserContext;
let env: RealEnv;
let page: Page;

before(async () => {
  site = await startFakeRealSite({ openRedirect: true });
  internal = createServer((req, res) => {
    internalHits.push(req.url ?? '');
    res.setHeader('access-control-allow-origin', '*');
    res.end('internal secret');
  });
  // A WebSocket endpoint on the internal service: answers the handshake.
  internal.on('upgrade', (req, socket: Socket) => {
    internalHits.push(`ws ${req.url}`);
    const accept = createHash('sha1').update(`${req.headers['sec-websocket-key']}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
  });
  await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
  internalPort = (internal.address() as AddressInfo).port;
  internalUrl = `http://127.0.0.1:${internalPort}`;
  browser = await launchChromium({
    hideScrollbars: true,
    egressGuard: { resolve: async (h: string) => (h === 'rebind.test' ? ['127.0.0.1'] : Promise.reject(new Error('ENOTFOUND'))) },
    // Chromium's Local Network Access checks (a permission prompt, denied when headless) stop some of these
    // today; they are off here so that the test shows the guard itself, not a browser feature that a
    // permission, a policy or another Chromium version turns off.
    extraArgs: ['--host-resolver-rules=MAP rebind.test 127.0.0.1', '--disable-features=LocalNetworkAccessChecks,LocalNetworkAccessChecksWebSockets'],
  });
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-real-egress-'));
  context = await browser.newContext({ viewport: DEFAULT_VIEWPORT, serviceWorkers: 'block' });
  env = new RealEnv({ context, blobs: new BlobStore(blobRoot), runId: 'egress', originOverride: () => `${site.origin}/`, settleMs: 50 });
  await env.reset({ env: 'real', task: 'gomail-18', seed: 0 });
  page = context.pages().find((p) => p.url().startsWith(site.origin) && !/\/(config|finish)/.test(p.url())) as Page;
  assert.ok(
    page,
    `no agent page among ${context
      .pages()
      .map((p) => p.url())
      .join(', ')}`,
  );
});

after(async () => {
  await env?.close().catch(() => undefined);
  await context?.close().catch(() => undefined);
  await browser?.close().catch(() => undefined);
  await site?.close();
  await new Promise((r) => internal?.close(r));
  internal?.closeAllConnections();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

test('an iframe of an allowed URL that redirects to loopback does not reach it', async () => {
  internalHits.length = 0;
  await page.evaluate(async (to) => {
    const frame = document.createElement('iframe');
    frame.src = `/bounce?to=${encodeURIComponent(to)}`;
    document.body.appendChild(frame);
    await new Promise((r) => setTimeout(r, 1_000));
  }, `${internalUrl}/via-redirect`);
  assert.ok(site.hits('/bounce').length > 0, 'the redirecting URL itself was not requested');
  assert.deepEqual(internalHits, [], 'the internal service received the redirected request');
});

test('a WebSocket to loopback is refused', async () => {
  internalHits.length = 0;
  const outcome = await openWebSocket(page, `ws://127.0.0.1:${internalPort}/socket`);
  assert.deepEqual(internalHits, [], `the internal service received the WebSocket handshake (${outcome})`);
  assert.notEqual(outcome, 'open');
});

test('a name that resolves to loopback for the browser (DNS rebinding) does not reach it', async () => {
  internalHits.length = 0;
  const results = await page.evaluate(async (base) => {
    const out: string[] = [];
    const img = document.createElement('img');
    img.src = `${base}/rebind.png`;
    document.body.appendChild(img);
    try {
      out.push(await (await fetch(`${base}/rebind-fetch`)).text());
    } catch (e) {
      out.push(`failed: ${(e as Error).message}`);
    }
    await new Promise((r) => setTimeout(r, 500));
    return out;
  }, `http://rebind.test:${internalPort}`);
  assert.deepEqual(internalHits, [], `the internal service was reached through the rebinding name (${results.join(', ')})`);
});

test('the site itself still works through the guard', async () => {
  const status = await page.evaluate(async () => (await fetch('/?folder=sent')).status);
  assert.equal(status, 200);
});

test('without the egress proxy, the WebSocket route of RealEnv still refuses loopback', async () => {
  const plain = await launchChromium({ hideScrollbars: true, extraArgs: ['--disable-features=LocalNetworkAccessChecks,LocalNetworkAccessChecksWebSockets'] });
  const ctx = await plain.newContext({ viewport: DEFAULT_VIEWPORT, serviceWorkers: 'block' });
  const e = new RealEnv({ context: ctx, blobs: new BlobStore(blobRoot), runId: 'egress-plain', originOverride: () => `${site.origin}/`, settleMs: 50 });
  try {
    await e.reset({ env: 'real', task: 'gomail-18', seed: 0 });
    internalHits.length = 0;
    const outcome = await openWebSocket(e.page, `ws://127.0.0.1:${internalPort}/plain`);
    assert.deepEqual(internalHits, [], `the internal service received the WebSocket handshake (${outcome})`);
    assert.notEqual(outcome, 'open');
    assert.ok(e.privateRequestsBlocked >= 1);
  } finally {
    await e.close().catch(() => undefined);
    await ctx.close().catch(() => undefined);
    await plain.close().catch(() => undefined);
  }
});

/** How a WebSocket the page opens ends: 'open', 'error', 'closed <code>' or 'timeout' (3 s). */
function openWebSocket(p: Page, url: string): Promise<string> {
  return p.evaluate(
    (u) =>
      new Promise<string>((ok) => {
        const ws = new WebSocket(u);
        ws.onopen = () => ok('open');
        ws.onerror = () => ok('error');
        ws.onclose = (ev) => ok(`closed ${ev.code}`);
        setTimeout(() => ok('timeout'), 3_000);
      }),
    url,
  );
}
