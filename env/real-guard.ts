import type { APIResponse, BrowserContext, Frame, Page, Request, Route, WebSocketRoute } from 'playwright-core';
import { clip } from '../lib/model-io/actions';
import { egressProxyOf } from './browser';
import { isFatalPageError } from './page-actions';
import { reachesPrivateNetwork } from './private-network';
import { isHarnessPath } from './real-paths';

/**
 * Keeps a REAL episode's agent on its task's origin. Main-frame navigations of the agent page (goto, link
 * clicks, form posts, redirects) that leave the origin or reach the harness endpoints (/config, /finish,
 * /submit) are aborted and remembered as `navigation to <url> blocked: <why>` (the page stays where it was);
 * popups are closed (a same-origin one is followed in the agent page after the action), or, where the pages
 * keep popups (official scoring), a same-origin one becomes the agent's active tab. Subresources,
 * subframes and WebSockets of any page of the context may go anywhere on the web but not to this machine or
 * its networks.
 */

const MAX_REDIRECT_HOPS = 10;

/** The episode's pages, as the guard tells them apart. */
export interface GuardedPages {
  readonly agent: Page | undefined;
  readonly background: Page | undefined;
  /**
   * Keep a same-origin popup as a tab of the agent and act in it, as agisdk's harness does (official scoring);
   * otherwise popups are closed and a same-origin one is followed in the agent page.
   */
  readonly keepsPopups?: boolean;
  /** The page is one of the agent's tabs (the active one or one it left open). */
  isAgentTab?(page: Page): boolean;
  /** Makes a kept popup the agent's active tab. */
  adopt?(popup: Page): void;
}

export interface OriginGuardOptions {
  navigationTimeoutMs: number;
  /**
   * Check main-frame redirects of the agent page before the browser follows them (Playwright routes do not
   * see redirect hops): allowed navigations are fetched by the context's request client and fulfilled from it.
   */
  vetRedirects: boolean;
}

export class OriginGuard {
  /** The allowed origin while an episode is being set up or runs. */
  origin: string | undefined;
  /** Navigations blocked since the current action started. */
  blocked: string[] = [];
  /** Same-origin URL a popup tried to open: the episode follows it in the agent page. */
  popupUrl: string | undefined;
  /** Subresource and subframe requests to private, loopback or link-local addresses refused. */
  privateRequestsBlocked = 0;
  private routed = false;
  /** WebSockets are routed too (context.route does not see them); there is no unrouteWebSocket: set once. */
  private wsRouted = false;
  /** Takes back the permission on the browser's egress proxy for the origin. */
  private egressRelease: (() => void) | undefined;
  /** Navigation decisions and popups still being handled: an action waits for them before it reports. */
  private readonly inflight = new Set<Promise<void>>();

  constructor(
    private readonly context: BrowserContext,
    private readonly pages: GuardedPages,
    private readonly opts: OriginGuardOptions,
  ) {}

  /** Guards `origin` from now on (its pages' routes follow with install()). */
  allow(origin: string): void {
    this.origin = origin;
    // The browser's egress proxy (launchChromium's egressGuard), when it has one, is what enforces the
    // private-network rule for every connection; it lets the site itself through (a mirror or the tests' site
    // may live on a private address).
    this.egressRelease?.();
    this.egressRelease = egressProxyOf(this.context.browser())?.allow(origin);
    this.startAction();
  }

  /** Routes the context's requests and WebSockets through the guard (once). */
  async install(): Promise<void> {
    if (!this.routed) {
      await this.context.route('**/*', this.onRoute);
      this.routed = true;
    }
    if (!this.wsRouted) {
      await this.context.routeWebSocket(() => true, this.onWebSocket);
      this.wsRouted = true;
    }
  }

  /** Gives the origin up: the context's routes and the egress permission go. */
  async release(): Promise<void> {
    if (this.routed) {
      await this.context.unroute('**/*', this.onRoute).catch(() => undefined);
      this.routed = false;
    }
    this.egressRelease?.();
    this.egressRelease = undefined;
    this.origin = undefined;
  }

  /** Forgets the blocks and the popup of the previous action. */
  startAction(): void {
    this.blocked = [];
    this.popupUrl = undefined;
  }

  /** Why a main-frame navigation of the agent page to `url` is refused, or null when it is allowed. */
  verdict(url: string): string | null {
    const origin = this.origin;
    if (!origin) return 'no episode';
    let u: URL;
    try {
      u = new URL(url);
    } catch {
      return `outside ${origin}`;
    }
    if (u.origin !== origin) return `outside ${origin}`;
    if (isHarnessPath(u.pathname)) return `${u.pathname} is reserved for the harness`;
    return null;
  }

  block(url: string, why: string): void {
    const msg = `navigation to ${url} blocked: ${why}`;
    if (!this.blocked.includes(msg)) this.blocked.push(msg);
  }

  /** The `goto` action: an error text for a URL that is invalid or refused; a redirect blocked on the way is in `blocked`. */
  async goto(page: Page, raw: string): Promise<string | undefined> {
    let target: URL;
    try {
      target = normaliseGotoUrl(raw, page.url());
    } catch {
      return `invalid URL ${JSON.stringify(clip(raw, 200))}`;
    }
    const why = this.verdict(target.href);
    if (why !== null) return `navigation to ${target.href} blocked: ${why}`;
    try {
      await page.goto(target.href, { waitUntil: 'load', timeout: this.opts.navigationTimeoutMs });
    } catch (err) {
      // A redirect out of the origin was blocked: that is the error to report.
      if (this.blocked.length > 0 && !isFatalPageError(err)) return undefined;
      throw err;
    }
    return undefined;
  }

  /**
   * After an action of the agent page: follows a same-origin popup in it, and brings a page that left the
   * origin anyway back to `lastGoodUrl`. Returns the last URL inside the origin.
   */
  async afterAction(page: Page, lastGoodUrl: string, settle: () => Promise<void>): Promise<string> {
    const timeout = this.opts.navigationTimeoutMs;
    if (this.popupUrl !== undefined && this.blocked.length === 0) {
      const url = this.popupUrl;
      this.popupUrl = undefined;
      await page.goto(url, { waitUntil: 'load', timeout }).catch((err) => {
        if (isFatalPageError(err)) throw err;
      });
      await settle();
    }
    const here = page.url();
    const why = this.verdict(here);
    if (why === null) return here;
    // Should not happen (the route handler blocks first); a safety net for anything that slipped through.
    // An error page after a blocked navigation is already explained by that block.
    const errorPage = here.startsWith('chrome-error:') || here === 'about:blank';
    if (!(errorPage && this.blocked.length > 0)) this.block(here, why);
    await page.goto(lastGoodUrl, { waitUntil: 'load', timeout }).catch((err) => {
      if (isFatalPageError(err)) throw err;
    });
    await settle();
    return lastGoodUrl;
  }

  /** Navigation decisions or popups of the last action are still being handled. */
  get busy(): boolean {
    return this.inflight.size > 0;
  }

  /** Waits (bounded) until every navigation decision and popup of the last action is settled. */
  async drain(): Promise<void> {
    const deadline = Date.now() + this.opts.navigationTimeoutMs;
    while (this.inflight.size > 0 && Date.now() < deadline) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        Promise.all([...this.inflight]),
        new Promise<void>((ok) => {
          timer = setTimeout(ok, Math.max(0, deadline - Date.now()));
        }),
      ]);
      if (timer) clearTimeout(timer);
    }
  }

  /** For the agent page's 'popup' event. */
  readonly onPopup = (popup: Page): void => {
    if (this.pages.keepsPopups && this.pages.adopt) {
      this.track(this.keepPopup(popup));
      return;
    }
    // Its navigation is aborted by the route handler (which closes it when it knows the page); close it
    // anyway after a moment, whatever it does.
    this.track(
      new Promise<void>((ok) => {
        const timer = setTimeout(() => {
          if (!popup.isClosed()) popup.close().catch(() => undefined);
          ok();
        }, 1_000);
        popup.once('close', () => {
          clearTimeout(timer);
          ok();
        });
      }),
    );
  };

  /** agisdk follows a new page (its init script makes it the active one) and leaves the opener open. */
  private async keepPopup(popup: Page): Promise<void> {
    await popup.waitForLoadState('domcontentloaded', { timeout: this.opts.navigationTimeoutMs }).catch(() => undefined);
    if (popup.isClosed()) return;
    if (this.verdict(popup.url()) === null) {
      this.pages.adopt?.(popup);
      return;
    }
    // Off the origin (its navigation was blocked), or a page that never loaded anything.
    await popup.close().catch(() => undefined);
  }

  private track(work: Promise<unknown>): void {
    const p: Promise<void> = work.then(
      () => undefined,
      () => undefined,
    );
    this.inflight.add(p);
    void p.finally(() => this.inflight.delete(p));
  }

  private readonly onRoute = async (route: Route, request: Request): Promise<void> => {
    // Subresources and subframes (a page's images, scripts, fetches, iframes) of any page of the episode may
    // go anywhere on the web but not to this machine or its networks; the site's own origin stays reachable
    // (a mirror or the tests' site may live on one). Main-frame navigations are judged by origin below.
    if (!request.isNavigationRequest() || isSubframeRequest(request)) {
      const url = request.url();
      if (!this.isSiteOrigin(url) && (await reachesPrivateNetwork(url).catch(() => true))) {
        this.privateRequestsBlocked++;
        await route.abort('blockedbyclient').catch(() => undefined);
        return;
      }
    }
    if (!request.isNavigationRequest()) {
      await route.fallback().catch(() => undefined);
      return;
    }
    const work = this.routeNavigation(route, request);
    this.track(work);
    await work;
  };

  /** A WebSocket of any page of the episode: refused, like a subresource, when it would reach a private address. */
  private readonly onWebSocket = async (ws: WebSocketRoute): Promise<void> => {
    const url = ws.url();
    const httpUrl = url.replace(/^ws(s?):/i, 'http$1:');
    if (!this.isSiteOrigin(httpUrl) && (await reachesPrivateNetwork(url).catch(() => true))) {
      this.privateRequestsBlocked++;
      await ws.close({ code: 1008, reason: 'blocked: private network' }).catch(() => undefined);
      return;
    }
    ws.connectToServer();
  };

  private isSiteOrigin(url: string): boolean {
    try {
      return this.origin !== undefined && new URL(url).origin === this.origin;
    } catch {
      return false;
    }
  }

  private async routeNavigation(route: Route, request: Request): Promise<void> {
    try {
      let frame: Frame | undefined;
      try {
        frame = request.frame();
      } catch {
        // A navigation issued before its frame exists: the first navigation of a popup.
        frame = undefined;
      }
      if (frame && frame.parentFrame() !== null) return await route.fallback();
      const page = frame?.page();
      if (page && page === this.pages.background) return await route.fallback();
      const url = request.url();
      const why = this.verdict(url);
      if (page && (page === this.pages.agent || this.pages.isAgentTab?.(page))) {
        if (why !== null) {
          this.block(url, why);
          return await route.abort('aborted');
        }
        if (!this.opts.vetRedirects) return await route.fallback();
        return await this.vetRedirects(route, request);
      }
      // A popup (window.open, target=_blank): kept where the pages keep popups (onPopup adopts it), otherwise
      // closed and a same-origin one followed in the agent page.
      if (this.pages.keepsPopups && why === null) return await route.fallback();
      if (why === null) this.popupUrl ??= url;
      else this.block(url, why);
      await route.abort('aborted');
      if (page && !page.isClosed()) await page.close().catch(() => undefined);
    } catch {
      // The page went away, or something unexpected: never leave a request hanging.
      await route.abort('failed').catch(() => undefined);
    }
  }

  /**
   * Fetches an allowed main-frame navigation without following redirects; a redirect chain that leaves the
   * origin is blocked before the browser sees it, an allowed one is handed to the browser unchanged.
   */
  private async vetRedirects(route: Route, request: Request): Promise<void> {
    const timeout = this.opts.navigationTimeoutMs;
    let response: APIResponse;
    try {
      response = await route.fetch({ maxRedirects: 0, timeout });
    } catch {
      // Let the browser try (and fail) on its own: its error is the one to report.
      return route.fallback();
    }
    const status = response.status();
    const location = response.headers().location;
    if (status < 300 || status >= 400 || !location) return route.fulfill({ response });
    let next = new URL(location, request.url()).href;
    for (let hop = 0; hop < MAX_REDIRECT_HOPS; hop++) {
      const why = this.verdict(next);
      if (why !== null) {
        this.block(next, why);
        return route.abort('aborted');
      }
      let r: APIResponse;
      try {
        r = await this.context.request.get(next, { maxRedirects: 0, timeout });
      } catch {
        break;
      }
      const loc = r.headers().location;
      const st = r.status();
      await r.dispose().catch(() => undefined);
      if (st < 300 || st >= 400 || !loc) break;
      next = new URL(loc, next).href;
    }
    return route.fulfill({ response });
  }
}

/** A navigation of a frame inside a page (an iframe), not of a page itself. */
function isSubframeRequest(request: Request): boolean {
  try {
    const frame = request.frame();
    return frame.parentFrame() !== null;
  } catch {
    return false;
  }
}

/** `gomail.com/x` → `https://gomail.com/x`; relative paths stay relative. */
function normaliseGotoUrl(raw: string, base: string): URL {
  const s = raw.trim();
  if (!/^[a-z][a-z0-9+.-]*:/i.test(s) && /^[a-z0-9-]+(\.[a-z0-9-]+)+(:\d+)?(\/|\?|#|$)/i.test(s)) return new URL(`https://${s}`);
  return new URL(s, base);
}
