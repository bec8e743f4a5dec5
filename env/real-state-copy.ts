import type { BrowserContext, Page } from 'playwright-core';
import { DEFAULT_VIEWPORT } from './browser';
import { readFinishState, type ReadFinishOptions } from './real-finish';
import { OriginGuard } from './real-guard';

/**
 * The site's state as /finish renders it, read without touching the episode: /finish boots the site's app, and an
 * app booted beside the agent's tab in the same storage may write its rehydrated state back (a persisted-state app
 * returning an undo-send outbox to drafts, say), changing what the eval judges. So the reads that only inform the
 * project (shaped rewards, snapshots, fork checks) open /finish in a context of their own holding a copy of the
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

/**
 * Reads the state from a copy, in one throwaway context kept for the episode's session: each read takes the
 * episode's storage now, moves the copy's page off the site (its app stops), replaces the copy's whole storage
 * with it and loads /finish there. Reusing the context spares a context and a page per read.
 */
export class StateCopyReader {
  private copy: { context: BrowserContext; page: Page; guard: OriginGuard; origin: string } | undefined;

  constructor(private readonly context: BrowserContext) {}

  async read(origin: string, opts: ReadFinishOptions): Promise<StateCopyRead> {
    const storage = await this.context.storageState({ indexedDB: true });
    try {
      const copy = await this.open(origin, opts);
      await copy.page.goto('about:blank');
      await copy.context.setStorageState(storage);
      return { storage, ...(await readFinishState(copy.page, origin, opts)) };
    } catch (err) {
      // A copy in an unknown state is not read again: the next read opens a new one.
      await this.close();
      throw err;
    }
  }

  private async open(origin: string, opts: ReadFinishOptions): Promise<NonNullable<StateCopyReader['copy']>> {
    if (this.copy && !this.copy.page.isClosed()) {
      if (this.copy.origin !== origin) {
        this.copy.guard.allow(origin);
        this.copy.origin = origin;
      }
      return this.copy;
    }
    await this.close();
    const browser = this.context.browser();
    if (!browser) throw new Error('REAL state copy: the episode context has no browser to open a copy in');
    // Service workers blocked as in every REAL context: one would serve /finish past the guard.
    const context = await browser.newContext({ viewport: DEFAULT_VIEWPORT, serviceWorkers: 'block' });
    const pages: { agent: undefined; background: Page | undefined } = { agent: undefined, background: undefined };
    const guard = new OriginGuard(context, pages, { navigationTimeoutMs: opts.navigationTimeoutMs, vetRedirects: false });
    try {
      guard.allow(origin);
      await guard.install();
      pages.background = await context.newPage();
    } catch (err) {
      await guard.release().catch(() => undefined);
      await context.close().catch(() => undefined);
      throw err;
    }
    this.copy = { context, page: pages.background, guard, origin };
    return this.copy;
  }

  async close(): Promise<void> {
    const copy = this.copy;
    this.copy = undefined;
    if (!copy) return;
    await copy.guard.release().catch(() => undefined);
    await copy.context.close().catch(() => undefined);
  }
}
