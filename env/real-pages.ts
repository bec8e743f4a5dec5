import type { BrowserContext, CDPSession, Page } from 'playwright-core';
import { DEFAULT_VIEWPORT } from './browser';
import { captureViewport, firstLine, isFatalPageError, readPageView, sleep, type PageGeometry } from './page-actions';
import type { AxTreeOptions, PageView } from './page-scripts';
import type { GuardedPages } from './real-guard';

export const AFTER_ACTION_LOAD_TIMEOUT_MS = 3_000;

/**
 * The two pages of a REAL episode in its own context: the background page that holds the harness endpoints
 * (/config, /finish) and the agent's page (1280x720) that the policy sees and acts in. With `acceptDialogs`
 * (training) dialogs are accepted on both: the policy cannot see one, and it answered it by the click that
 * opened it. Without it no handler is set, as in agisdk, and Playwright dismisses every dialog (`confirm()`
 * returns false), which is how the benchmark scores an action behind one. With `keepsPopups` (official) a
 * same-origin popup becomes the agent's active tab and the opener stays open behind it; when the active tab
 * closes, the most recent tab still open takes over (agisdk's page history, env.py _active_page_check).
 */
export class RealPages implements GuardedPages {
  agent: Page | undefined;
  background: Page | undefined;
  /** The agent's open tabs, the most recently active last. */
  private tabs: Page[] = [];
  private onPopup: ((popup: Page) => void) | undefined;
  private cdp: CDPSession | undefined;
  private crashed = false;

  constructor(
    private readonly context: BrowserContext,
    private readonly acceptDialogs = true,
    readonly keepsPopups = false,
  ) {}

  isAgentTab(page: Page): boolean {
    return this.tabs.includes(page);
  }

  adopt(popup: Page): void {
    if (!this.keepsPopups || popup.isClosed() || this.tabs.includes(popup)) return;
    this.watch(popup);
    this.tabs.push(popup);
    this.activate(popup);
  }

  /** After an action: if the active tab closed, the most recent tab still open becomes the agent page. */
  activeCheck(): void {
    this.tabs = this.tabs.filter((p) => !p.isClosed());
    const last = this.tabs.at(-1);
    if (this.agent?.isClosed() && last) this.activate(last);
  }

  private activate(page: Page): void {
    if (this.agent === page) return;
    this.agent = page;
    // The screenshot session belongs to the page it was opened on.
    if (this.cdp) this.cdp.detach().catch(() => undefined);
    this.cdp = undefined;
  }

  private watch(page: Page): void {
    page.on('crash', () => {
      if (page === this.agent) this.crashed = true;
    });
    this.onDialogs(page);
    if (this.onPopup) page.on('popup', this.onPopup);
  }

  private onDialogs(page: Page): void {
    if (!this.acceptDialogs) return;
    page.on('dialog', (d) => {
      d.accept().catch(() => undefined);
    });
  }

  /** The agent's page (after reset). */
  get page(): Page {
    if (!this.agent) throw new Error('RealEnv: call reset() first');
    return this.agent;
  }

  get geometry(): PageGeometry {
    return { zoom: 1, viewport: this.agent?.viewportSize() ?? DEFAULT_VIEWPORT };
  }

  assertUsable(): void {
    if (this.crashed) throw new Error('REAL agent page crashed');
    if (!this.agent || this.agent.isClosed()) throw new Error('REAL agent page is closed');
  }

  /** The error leaves the agent page (or the browser) gone: it must propagate, not become an action error. */
  isFatal(err: unknown): boolean {
    // A tab that closed itself during the action (a picker window) leaves the others to act in.
    if (this.agent?.isClosed() && this.tabs.some((p) => !p.isClosed())) return this.crashed;
    return this.crashed || !this.agent || this.agent.isClosed() || isFatalPageError(err);
  }

  async openBackground(): Promise<Page> {
    const bg = await this.context.newPage();
    this.background = bg;
    this.onDialogs(bg);
    return bg;
  }

  /** Drops everything the browser stores for `origin` (a fresh episode's site state). */
  async clearOriginStorage(origin: string): Promise<void> {
    if (!this.background) throw new Error('REAL background page is not open');
    const cdp = await this.context.newCDPSession(this.background);
    await cdp
      .send('Storage.clearDataForOrigin', { origin, storageTypes: 'all' })
      .catch(() => undefined)
      .finally(() => cdp.detach().catch(() => undefined));
  }

  async openAgent(onPopup: (popup: Page) => void): Promise<Page> {
    const page = await this.context.newPage();
    this.agent = page;
    this.tabs = [page];
    this.onPopup = onPopup;
    const vp = page.viewportSize();
    if (!vp || vp.width !== DEFAULT_VIEWPORT.width || vp.height !== DEFAULT_VIEWPORT.height) {
      await page.setViewportSize({ ...DEFAULT_VIEWPORT });
    }
    this.watch(page);
    await page.bringToFront();
    return page;
  }

  /** The agent page's accessibility tree and scroll position. */
  async readView(opts: AxTreeOptions): Promise<PageView> {
    const page = this.page;
    let lastErr: unknown;
    // A page in the middle of a navigation has no execution context for a moment (BrowserGym retries too).
    for (let attempt = 0; attempt < 4; attempt++) {
      try {
        return await readPageView(page, opts);
      } catch (err) {
        if (this.isFatal(err)) throw err;
        lastErr = err;
        await page.waitForLoadState('domcontentloaded', { timeout: AFTER_ACTION_LOAD_TIMEOUT_MS }).catch(() => undefined);
        await sleep(100);
      }
    }
    throw new Error(`cannot read the page at ${page.url()}: ${firstLine(lastErr)}`);
  }

  /** A PNG of the agent page's viewport at the view's scroll position. */
  async screenshot(view: PageView): Promise<Buffer> {
    if (!this.cdp) this.cdp = await this.context.newCDPSession(this.page);
    return captureViewport(this.cdp, this.geometry, view.scrollX, view.scrollY);
  }

  async close(): Promise<void> {
    if (this.cdp) {
      await this.cdp.detach().catch(() => undefined);
      this.cdp = undefined;
    }
    for (const p of new Set([...this.tabs, this.agent, this.background])) {
      if (p && !p.isClosed()) await p.close().catch(() => undefined);
    }
    this.tabs = [];
    this.agent = undefined;
    this.background = undefined;
    this.crashed = false;
  }
}
