import type { BrowserContext } from 'playwright-core';
import { DEFAULT_VIEWPORT } from './browser';
import { readFinishState, type ReadFinishOptions } from './real-finish';
import { OriginGuard } from './real-guard';

/**
 * The site's state as /finish renders it, read without touching the episode: /finish boots the site's app, and an
 * app booted beside the agent's tab in the same storage may write its rehydrated state back (a persisted-state app
 * returning an undo-send outbox to drafts, say), changing what the eval judges. So the reads that only inform the
 * project (shaped rewards, snapshots, fork checks) open /finish in a throwaway context holding a copy of the
 * episode context's storage (cookies, localStorage, IndexedDB): whatever that app writes stays in the copy.
 * What it cannot see is state held only in the agent page's scripts; agisdk's own reads (setup and the final
 * evaluation) stay in the episode's context.
 */

export type StorageCopy = Awaited<ReturnType<BrowserContext['storageState']>>;

export interface StateCopyRead {
  /** The storage the read was made from (a fork's context is created from it). */
  storage: StorageCopy;
  text: string;
  value: object;
}

export async function readFinishInCopy(context: BrowserContext, origin: string, opts: ReadFinishOptions): Promise<StateCopyRead> {
  const browser = context.browser();
  if (!browser) throw new Error('REAL state copy: the episode context has no browser to open a copy in');
  const storage = await context.storageState({ indexedDB: true });
  // Service workers blocked as in every REAL context: one would serve /finish past the guard.
  const copy = await browser.newContext({ viewport: DEFAULT_VIEWPORT, serviceWorkers: 'block', storageState: storage });
  const pages: { agent: undefined; background: Awaited<ReturnType<BrowserContext['newPage']>> | undefined } = { agent: undefined, background: undefined };
  const guard = new OriginGuard(copy, pages, { navigationTimeoutMs: opts.navigationTimeoutMs, vetRedirects: false });
  try {
    guard.allow(origin);
    await guard.install();
    pages.background = await copy.newPage();
    return { storage, ...(await readFinishState(pages.background, origin, opts)) };
  } finally {
    await guard.release().catch(() => undefined);
    await copy.close().catch(() => undefined);
  }
}
