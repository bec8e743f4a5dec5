/**
 * What a browser operation costs in CPU with full Chromium and with its headless shell, side by side in one run.
 * A REAL session opens a context (from a storage copy when it forks), pages, reads /finish in a copy context
 * (env/real-state-copy.ts: setStorageState, then a load) and takes screenshots; a MiniWoB++ session opens a context
 * and a page. Full Chromium, even headless, opens a browser window with its UI for every context; the headless shell
 * (Debian's chromium-headless-shell, what Playwright launches for headless) does not. Each operation runs `--n`
 * times per binary against the local REAL-protocol site (testing/fake-real-site.ts); the CPU is the browser's
 * whole process tree plus this process (Playwright's client), read from /proc before and after.
 *
 *   node --import tsx bench/browser-launch.ts [--n 10] [--full /usr/bin/chromium] [--shell /usr/lib/chromium/chromium-headless-shell]
 */
import { treeCpuSeconds } from '../testing/process-tree';
import { parseArgs } from 'node:util';
import type { Browser } from 'playwright-core';
import { DEFAULT_CHROMIUM_PATH, DEFAULT_VIEWPORT, HEADLESS_SHELL_PATH, launchChromium } from '../env/browser';
import { captureViewport } from '../env/page-actions';
import { startFakeRealSite, type FakeRealSite } from '../testing/fake-real-site';
import { printBenchHeader, printLoadAtEnd, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '10' },
    full: { type: 'string', default: DEFAULT_CHROMIUM_PATH },
    shell: { type: 'string', default: HEADLESS_SHELL_PATH },
  },
});
const N = Number(values.n);
if (!Number.isInteger(N) || N < 1) throw new Error(`--n must be a positive integer, not ${values.n}`);

type Op = { name: string; run: (b: Browser, site: FakeRealSite) => Promise<() => Promise<void>> };

// Each op's `run` prepares what it needs and returns the operation to repeat.
const OPS: Op[] = [
  {
    name: 'context + page, closed',
    run: async (b) => async () => {
      const c = await b.newContext({ viewport: DEFAULT_VIEWPORT });
      await c.newPage();
      await c.close();
    },
  },
  {
    name: 'context + page + site load, closed',
    run: async (b, site) => async () => {
      const c = await b.newContext({ viewport: DEFAULT_VIEWPORT });
      await (await c.newPage()).goto(`${site.origin}/`);
      await c.close();
    },
  },
  {
    name: 'context from a storage copy, closed',
    run: async (b, site) => {
      const storage = await siteStorage(b, site);
      return async () => {
        const c = await b.newContext({ viewport: DEFAULT_VIEWPORT, storageState: storage });
        await c.close();
      };
    },
  },
  {
    name: 'setStorageState + /finish load (a copy read)',
    run: async (b, site) => {
      const storage = await siteStorage(b, site);
      const c = await b.newContext({ viewport: DEFAULT_VIEWPORT });
      const page = await c.newPage();
      return async () => {
        await page.goto('about:blank');
        await c.setStorageState(storage);
        await page.goto(`${site.origin}/finish`, { waitUntil: 'domcontentloaded' });
      };
    },
  },
  {
    name: 'viewport screenshot (PNG)',
    run: async (b, site) => {
      const c = await b.newContext({ viewport: DEFAULT_VIEWPORT });
      const page = await c.newPage();
      await page.goto(`${site.origin}/`);
      const cdp = await c.newCDPSession(page);
      return async () => {
        await captureViewport(cdp, { zoom: 1, viewport: DEFAULT_VIEWPORT }, 0, 0);
      };
    },
  },
];

/** The site's storage after a task's /config: what a fork's context is created from. */
async function siteStorage(b: Browser, site: FakeRealSite) {
  const c = await b.newContext({ viewport: DEFAULT_VIEWPORT });
  const page = await c.newPage();
  await page.goto(`${site.origin}/config?run_id=bench&task_id=gomail-18&latency=0`);
  await page.goto(`${site.origin}/`);
  const storage = await c.storageState({ indexedDB: true });
  await c.close();
  return storage;
}

/** Milliseconds of CPU per operation for each op, on one freshly launched browser. */
async function measure(executablePath: string, site: FakeRealSite): Promise<number[]> {
  const browser = await launchChromium({ executablePath, hideScrollbars: true });
  try {
    const out: number[] = [];
    for (const op of OPS) {
      const once = await op.run(browser, site);
      await once(); // warm: the first of a kind starts processes the others share
      const before = treeCpuSeconds(process.pid);
      for (let i = 0; i < N; i++) await once();
      await new Promise((r) => setTimeout(r, 500)); // closed contexts' processes wind down
      out.push(((treeCpuSeconds(process.pid) - before) / N) * 1000);
    }
    return out;
  } finally {
    await browser.close();
  }
}

async function main(): Promise<void> {
  printBenchHeader('browser-launch');
  const site = await startFakeRealSite();
  try {
    const full = await measure(values.full, site);
    const shell = await measure(values.shell, site);
    console.log(`\nCPU ms per operation, ${N} each (full: ${values.full}; shell: ${values.shell})\n`);
    console.log('| operation | full Chromium | headless shell | shell / full |');
    console.log('|---|---:|---:|---:|');
    OPS.forEach((op, i) => console.log(`| ${op.name} | ${full[i].toFixed(0)} | ${shell[i].toFixed(0)} | ${(shell[i] / full[i]).toFixed(2)} |`));
  } finally {
    await site.close();
  }
  printLoadAtEnd();
}

runBench(main);
