import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../../env/browser';
import { RealEnv } from '../../env/real';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';

// A page of the REAL site must not reach this machine's other services or the cloud metadata address through
// its subresources and subframes: images, scripts, fetches and iframes to loopback (another port), private and
// link-local ranges are refused; the site's own origin keeps working.

let browser: Browser;
let site: FakeRealSite;
let internal: Server;
let internalUrl: string;
const internalHits: string[] = [];
let blobRoot: string;
let context: BrowserContext;

before(async () => {
  site = await startFakeRealSite();
  // A service on this machine (another port of 127.0.0.1) that pages must not reach.
  internal = createServer((req, res) => {
    internalHits.push(req.url ?? '');
    res.setHeader('access-control-allow-origin', '*');
    res.end('internal secret');
  });
  await new Promise<void>((r) => internal.listen(0, '127.0.0.1', r));
  internalUrl = `http://127.0.0.1:${(internal.address() as AddressInfo).port}`;
  browser = await launchChromium();
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-real-private-'));
});

after(async () => {
  await context?.close().catch(() => undefined);
  await browser?.close().catch(() => undefined);
  await site?.close();
  await new Promise((r) => internal?.close(r));
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

test('subresources and subframes to loopback, private and link-local addresses are blocked; the site itself is not', async () => {
  context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
  const env = new RealEnv({ context, blobs: new BlobStore(blobRoot), runId: 'private-net', originOverride: () => `${site.origin}/`, settleMs: 50 });
  await env.reset({ env: 'real', task: 'gomail-18', seed: 0 });
  const page = context.pages().find((p) => p.url().startsWith(site.origin) && !/\/(config|finish)/.test(p.url())) as Page;
  assert.ok(
    page,
    `no agent page among ${context
      .pages()
      .map((p) => p.url())
      .join(', ')}`,
  );

  const failed: { url: string; error: string }[] = [];
  context.on('requestfailed', (r) => failed.push({ url: r.url(), error: r.failure()?.errorText ?? '' }));
  const before = site.requests.length;
  const targets = [`${internalUrl}/img.png`, 'http://169.254.169.254/latest/meta-data/', 'http://10.11.12.13/x.js', 'http://[::1]:8001/x', 'http://localhost:8001/x'];
  const results = await page.evaluate(
    async ({ targets, internalUrl }) => {
      const out: Record<string, string> = {};
      for (const t of targets) {
        const img = document.createElement('img');
        img.src = t;
        document.body.appendChild(img);
      }
      const frame = document.createElement('iframe');
      frame.src = `${internalUrl}/frame`;
      document.body.appendChild(frame);
      const script = document.createElement('script');
      script.src = `${internalUrl}/script.js`;
      document.body.appendChild(script);
      for (const t of [`${internalUrl}/fetch`, 'http://169.254.169.254/latest/meta-data/iam']) {
        try {
          out[t] = await (await fetch(t)).text();
        } catch (e) {
          out[t] = `failed: ${(e as Error).message}`;
        }
      }
      // The site's own origin: still reachable (a same-origin fetch, and a same-origin redirect target).
      out.own = String((await fetch('/?folder=sent')).status);
      await new Promise((r) => setTimeout(r, 500));
      return out;
    },
    { targets, internalUrl },
  );
  assert.deepEqual(internalHits, [], 'the internal service received a request');
  for (const [t, r] of Object.entries(results)) if (t !== 'own') assert.match(r, /^failed/, `${t} answered: ${r}`);
  assert.equal(results.own, '200');
  assert.ok(site.requests.length > before, 'the site got its own request');
  const blockedUrls = failed.filter((f) => /ERR_BLOCKED_BY_CLIENT/.test(f.error)).map((f) => f.url);
  for (const t of [...targets, `${internalUrl}/frame`, `${internalUrl}/script.js`, `${internalUrl}/fetch`]) {
    assert.ok(
      blockedUrls.some((u) => u.startsWith(t.replace(/\/$/, ''))),
      `${t} not blocked by the guard (failed: ${JSON.stringify(failed)})`,
    );
  }
  assert.ok(env.privateRequestsBlocked >= targets.length + 3);

  // A same-origin URL that redirects to another port of this machine: the redirect target is not reached.
  const viaRedirect = await page.evaluate(async () => {
    try {
      return String((await fetch('/go-out')).status);
    } catch (e) {
      return `failed: ${(e as Error).message}`;
    }
  });
  assert.equal(site.externalRequests.length, 0, `the redirect reached the other port (${viaRedirect})`);
  await env.close();
});
