import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { DEFAULT_VIEWPORT, HEADLESS_SHELL_PATH, launchChromium } from '../../env/browser';
import { captureViewport } from '../../env/page-actions';
import { startFakeRealSite } from '../../testing/fake-real-site';
import { cmdline, descendants } from '../../testing/process-tree';

// A renderer exploit reads /proc/self/environ: Chromium and every process under it must hold none of the
// worker's secrets, whatever the worker's own environment holds.

const SECRETS = {
  OPENAI_API_KEY: 'sk-openai-browser-probe',
  HALO_POLICY_API_KEY: 'hp-browser-probe',
  TEMPORAL_API_KEY: 'tk-browser-probe',
  AWS_SECRET_ACCESS_KEY: 'aws-browser-probe',
  HF_TOKEN: 'hf-browser-probe',
};

test('Chromium and its renderers start with an allow-listed environment: no key of the worker in any of them', async () => {
  const saved = { ...process.env };
  Object.assign(process.env, SECRETS);
  try {
    const browser = await launchChromium();
    try {
      const page = await browser.newPage();
      await page.setContent('<p>a page from the web</p>');
      const pids = descendants(process.pid).filter((p) => /chrom/i.test(cmdline(p) ?? ''));
      assert.ok(pids.length >= 2, `expected the browser and a renderer under this process, found ${pids.length}`);
      let read = 0;
      let withPath = 0;
      for (const pid of pids) {
        let environ: string;
        try {
          environ = readFileSync(`/proc/${pid}/environ`, 'utf8');
        } catch {
          continue; // exited meanwhile, or a sandboxed process this user may not read
        }
        read++;
        for (const [name, value] of Object.entries(SECRETS)) {
          assert.ok(!environ.includes(value), `${name} is in the environment of Chromium process ${pid}`);
        }
        if (environ.split('\0').some((kv) => kv.startsWith('PATH='))) withPath++;
      }
      assert.ok(read >= 2, `only ${read} Chromium environments could be read`);
      assert.ok(withPath >= 1, 'the browser got no PATH: the allow-list is not what it was started with');
    } finally {
      await browser.close();
    }
  } finally {
    for (const k of Object.keys(SECRETS)) if (!(k in saved)) delete process.env[k];
    Object.assign(process.env, saved);
  }
});

// Full Chromium opens a browser window with its UI for every context, a WebUI renderer beside each page's
// (bench/browser-launch.ts: about 4x the CPU of a context); the headless shell has no UI.
test('a headless launch runs the headless shell where it is installed: no browser-UI renderer beside the pages', async (t) => {
  if (!existsSync(HEADLESS_SHELL_PATH)) return t.skip(`${HEADLESS_SHELL_PATH} is not installed (./launch.sh setup installs it on Debian)`);
  if (process.env.HALO_CHROMIUM) return t.skip('HALO_CHROMIUM names the binary');
  const browser = await launchChromium();
  try {
    for (let i = 0; i < 2; i++) await (await browser.newContext()).newPage();
    const cmdlines = descendants(process.pid).flatMap((p) => cmdline(p) ?? []);
    assert.ok(
      cmdlines.some((c) => c.startsWith(HEADLESS_SHELL_PATH) && !c.includes('--type=')),
      `the browser process is not ${HEADLESS_SHELL_PATH}:\n${cmdlines.join('\n')}`,
    );
    assert.ok(cmdlines.filter((c) => c.includes('--type=renderer')).length >= 2, 'a renderer per page');
    assert.deepEqual(
      cmdlines.filter((c) => c.includes('--top-chrome-webui')),
      [],
      'no browser-UI renderers',
    );
  } finally {
    await browser.close();
  }
});

test('the first screenshot after a navigation is taken: a page with no frame yet is waited for, not an error', async () => {
  // Without the wait, about one in seven of these captures failed in the headless shell ("Unable to capture screenshot").
  const site = await startFakeRealSite();
  const browser = await launchChromium({ hideScrollbars: true });
  try {
    for (let i = 0; i < 20; i++) {
      const context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
      const page = await context.newPage();
      const cdp = await context.newCDPSession(page);
      await page.goto(`${site.origin}/`);
      const png = await captureViewport(cdp, { zoom: 1, viewport: DEFAULT_VIEWPORT }, 0, 0);
      assert.equal(png.subarray(1, 4).toString(), 'PNG', `capture ${i}`);
      await context.close();
    }
  } finally {
    await browser.close();
    await site.close();
  }
});
