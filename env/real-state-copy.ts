import type { Browser, BrowserContext, Page } from 'playwright-core';
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

/** Copy contexts not reading now, per browser: a read takes one (or opens one) and puts it back. */
const idleReaders = new WeakMap<Browser, StateCopyReader[]>();

/**
 * The state of `context`'s site as /finish renders it from a copy of the context's storage, read in a copy context
 * of the same browser kept between reads (of any session): opening a context and a page for every read would cost
 * more than the read.
 */
export async function readFinishInCopy(context: BrowserContext, origin: string, opts: ReadFinishOptions): Promise<StateCopyRead> {
  const browser = context.browser();
  if (!browser) throw new Error('REAL state copy: the episode context has no browser to open a copy in');
  const idle = idleReaders.get(browser) ?? [];
  idleReaders.set(browser, idle);
  const reader = idle.pop() ?? new StateCopyReader(browser);
  try {
    const read = await reader.read(context, origin, opts);
    idle.push(reader);
    return read;
  } catch (err) {
    // A copy in an unknown state is not read in again.
    await reader.close();
    throw err;
  }
}

/**
 * One copy context: each read takes the episode's storage now, moves the copy's page off the site (its app stops),
 * replaces the copy's whole storage with it and loads /finish there.
 */
class StateCopyReader {
  private copy: { context: BrowserContext; page: Page; guard: OriginGuard; origin: string } | undefined;

  constructor(private readonly browser: Browser) {}

  async read(source: BrowserContext, origin: string, opts: ReadFinishOptions): Promise<StateCopyRead> {
    const storage = await source.storageState({ indexedDB: true });
    const copy = await this.open(origin, opts);
    await copy.page.goto('about:blank');
    await copy.context.setStorageState(storage);
    return { storage, ...(await readFinishState(copy.page, origin, opts)) };
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
    // Service workers blocked as in every REAL context: one would serve /finish past the guard.
    const context = await this.browser.newContext({ viewport: DEFAULT_VIEWPORT, serviceWorkers: 'block' });
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
