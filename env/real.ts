import type { BrowserContext, CDPSession, Frame, Page, Request, Route, WebSocketRoute } from 'playwright-core';
import type { BlobStore } from '../blob/store';
import type { Action } from '../lib/actions';
import { DEFAULT_VIEWPORT, egressProxyOf } from './browser';
import {
  assignPageIds,
  captureViewport,
  executePageAction,
  firstLine,
  isFatalPageError,
  pngSize,
  readPageView,
  sleep,
  type PageAction,
  type PageGeometry,
} from './page-actions';
import type { AxTreeOptions, PageView } from './page-scripts';
import { evaluateFinalState, UnscorableTaskError, type EvalResult, type EvaluateOptions } from './real-eval';
import { getRealTask, loadRealRegistry, type RealRegistry, type RealTask } from './real-tasks';
import { isHarnessPath } from './real-paths';
import { readSessionStorage, restoreSessionStorage, type ClientSnapshot } from './real-snapshot';
import type { SiteLimiter, ReleaseSlot } from './site-limits';
import { reachesPrivateNetwork } from './private-network';
import type { ApplyResult, Environment, Observation, StepOutcome, TaskSpec } from './types';

/**
 * REAL v2 (agisdk 0.3.5) episodes in Playwright, following the official harness (webclones/base.py):
 *   1. a background page of the episode's context opens `<origin>/config?run_id=<id>&task_id=v2.<task>&latency=0`,
 *      waits for network idle, then opens `<origin>/finish`;
 *   2. the agent page (1280x720) opens the site root;
 *   3. the agent acts; `answer` (the harness's send_msg_to_user) ends the episode: the background page
 *      reloads `/finish`, the JSON in its `<pre>` is stored in the blob store and judged by the task's eval
 *      script (reward 1 on SUCCESS, else 0);
 *   4. at the step cap the official rule is reward 0 without evaluation (finishAtCap; `evaluateAtCap` changes it).
 * /config and /finish are built from the URL's origin (v2 URLs end with "/", so `url + "/config"` would
 * give `//config`). The site state is client-side (localStorage), so an episode needs its own BrowserContext:
 * never run two episodes in one context at the same time.
 *
 * The agent stays on the task's origin: goto, link clicks, form posts, window.open and main-frame redirects
 * that leave it are blocked (the page stays where it was) and reported as
 * `navigation to <url> blocked: outside <origin>`. The harness endpoints /config, /finish and /submit are
 * blocked for the agent page as well.
 */

import type { RealTaskSpec } from './types';
export type { RealTaskSpec };

export const DEFAULT_REAL_SETTLE_MS = 500;
export const DEFAULT_FINISH_TIMEOUT_MS = 10_000;
export const DEFAULT_FINISH_POLL_MS = 250;
const DEFAULT_NAVIGATION_TIMEOUT_MS = 30_000;
const CONFIG_NETWORK_IDLE_TIMEOUT_MS = 10_000;
const AFTER_ACTION_LOAD_TIMEOUT_MS = 3_000;
const MAX_REDIRECT_HOPS = 10;

export interface RealEnvOptions {
  /** A fresh context per episode (the site state lives in it), created with viewport 1280x720. */
  context: BrowserContext;
  blobs: BlobStore;
  /** Sent to /config as run_id. agisdk uses "0" for "not a leaderboard run". */
  runId: string;
  /** Maps a task's start URL to the URL actually opened (tests: a local fake site). */
  originOverride?: (url: string) => string;
  /** Evaluate the final state when the step cap is reached (default false: reward 0, the official rule). */
  evaluateAtCap?: boolean;
  /** When set, apply() ends the episode through finishAtCap() once this many actions ran. */
  maxSteps?: number;
  /** Default: loadRealRegistry() (the installed agisdk). */
  registry?: RealRegistry;
  /** Wait after each action (the harness: 0.5 s), then for DOMContentLoaded (≤ 3 s). */
  settleMs?: number;
  /** Bound on reading /finish (reload + poll for a JSON `<pre>`). */
  finishTimeoutMs?: number;
  finishPollMs?: number;
  navigationTimeoutMs?: number;
  evalOptions?: EvaluateOptions;
  /** Per-site concurrency cap: a slot for the task's origin is held from reset() to close(). */
  limiter?: SiteLimiter;
  /** The episode this session belongs to: the sessions of one episode share its slot (see env/site-limits.ts). */
  slotHolder?: string;
  limiterTimeoutMs?: number;
  /** Ends a wait for a slot (the session's start was cancelled). */
  signal?: AbortSignal;
  /**
   * Check main-frame redirects of the agent page before the browser follows them (Playwright routes do not
   * see redirect hops): allowed navigations are fetched by the context's request client and fulfilled from
   * it. Default true.
   */
  vetRedirects?: boolean;
  axtreeMaxLines?: number;
  axtreeMaxChars?: number;
}

/** ApplyResult plus what the end of a REAL episode produced. */
export interface RealApplyResult extends ApplyResult {
  /** Blob reference of the /finish JSON (as the site rendered it). */
  finalStateRef?: string;
  evaluation?: EvalResult;
  /** The episode ended at the step cap. */
  truncated?: boolean;
}

export interface RealStepOutcome extends StepOutcome {
  finalStateRef?: string;
  evaluation?: EvalResult;
  truncated?: boolean;
}

/** The site (origin) cannot be reached; callers make this non-retryable for the episode. */
export class SiteUnreachableError extends Error {
  readonly origin: string;
  readonly status?: number;
  constructor(origin: string, detail: string, status?: number) {
    super(`REAL site ${origin} is unreachable: ${detail}`);
    this.name = 'SiteUnreachableError';
    this.origin = origin;
    if (status !== undefined) this.status = status;
  }
}

/** /finish did not render a JSON `<pre>` in time (an infrastructure failure, not a reward of 0). */
export class FinishStateError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FinishStateError';
  }
}

export interface HealthOptions {
  /** Attempts (default 3). */
  attempts?: number;
  /** Per attempt (default 5 s). */
  timeoutMs?: number;
  /** Wait before the second attempt, doubling after (default 500 ms). */
  backoffMs?: number;
}

export interface HealthResult {
  origin: string;
  status: number;
  latencyMs: number;
  attempts: number;
}

/**
 * GET `<origin>/` with bounded retries. Healthy on 2xx/3xx; 429, 5xx and network errors are retried; other
 * 4xx (404 deployment gone, 451 taken down) fail at once. Throws SiteUnreachableError.
 */
export async function checkSiteHealth(originOrUrl: string, opts: HealthOptions = {}): Promise<HealthResult> {
  let origin: string;
  try {
    origin = new URL(originOrUrl).origin;
  } catch {
    throw new SiteUnreachableError(originOrUrl, 'not an http(s) URL');
  }
  const attempts = Math.max(1, opts.attempts ?? 3);
  const timeoutMs = opts.timeoutMs ?? 5_000;
  let backoff = opts.backoffMs ?? 500;
  let last = '';
  let lastStatus: number | undefined;
  for (let i = 1; i <= attempts; i++) {
    const started = Date.now();
    try {
      const res = await fetch(`${origin}/`, { method: 'GET', redirect: 'manual', signal: AbortSignal.timeout(timeoutMs) });
      await res.body?.cancel().catch(() => undefined);
      if (res.status < 400) return { origin, status: res.status, latencyMs: Date.now() - started, attempts: i };
      lastStatus = res.status;
      last = `HTTP ${res.status}${res.statusText ? ` ${res.statusText}` : ''}`;
      if (res.status !== 429 && res.status < 500) {
        throw new SiteUnreachableError(origin, `${last} at ${origin}/ (attempt ${i} of ${attempts}, not retried)`, res.status);
      }
    } catch (err) {
      if (err instanceof SiteUnreachableError) throw err;
      const e = err as Error & { cause?: { code?: string; message?: string } };
      last = e.name === 'TimeoutError' ? `no answer within ${timeoutMs} ms` : (e.cause?.code ?? e.cause?.message ?? e.message);
      lastStatus = undefined;
    }
    if (i < attempts) {
      await sleep(backoff);
      backoff *= 2;
    }
  }
  throw new SiteUnreachableError(origin, `${last} (${attempts} attempts)`, lastStatus);
}

interface EpisodeState {
  task: RealTask;
  /** The site root actually opened (after originOverride). */
  rootUrl: string;
  origin: string;
  steps: number;
  /** Last agent-page URL inside the origin: where a page that escaped is brought back to. */
  lastGoodUrl: string;
  final?: RealApplyResult;
}

const READ_PRE = `(() => { const p = document.querySelector('pre'); return p ? p.innerText : null; })()`;

function clip(s: string, n: number): string {
  return s.length <= n ? s : `${s.slice(0, n - 1)}…`;
}

function evalFirstLine(e: EvalResult): string {
  if (e.error && !e.success) return `eval error: ${e.error}`;
  const line = e.output.split('\n').find((l) => l.trim() !== '');
  return line ? clip(line.trim(), 300) : '(no eval output)';
}

/** `gomail.com/x` → `https://gomail.com/x`; relative paths stay relative. */
function normaliseGotoUrl(raw: string, base: string): URL {
  const s = raw.trim();
  if (!/^[a-z][a-z0-9+.-]*:/i.test(s) && /^[a-z0-9-]+(\.[a-z0-9-]+)+(:\d+)?(\/|\?|#|$)/i.test(s)) return new URL(`https://${s}`);
  return new URL(s, base);
}

export class RealEnv implements Environment {
  readonly context: BrowserContext;
  readonly runId: string;
  readonly evaluateAtCap: boolean;
  readonly maxSteps: number | undefined;
  readonly settleMs: number;
  private readonly blobs: BlobStore;
  private readonly opts: RealEnvOptions;
  private agentPage: Page | undefined;
  private bgPage: Page | undefined;
  private cdp: CDPSession | undefined;
  private crashed = false;
  private routed = false;
  /** WebSockets are routed too (context.route does not see them); there is no unrouteWebSocket: set once. */
  private wsRouted = false;
  /** Takes back this session's permission on the browser's egress proxy for its site's origin. */
  private egressRelease: (() => void) | undefined;
  /** Subresource and subframe requests to private, loopback or link-local addresses refused (this session). */
  privateRequestsBlocked = 0;
  private episode: EpisodeState | undefined;
  /** Allowed origin while an episode is being set up or runs (read by the route handler). */
  private origin: string | undefined;
  /** Navigations blocked since the current action started. */
  private blocked: string[] = [];
  /** Same-origin URL a popup tried to open: followed in the agent page. */
  private popupUrl: string | undefined;
  private slot: { origin: string; release: ReleaseSlot } | undefined;
  /** Navigation decisions and popups still being handled: an action waits for them before it reports. */
  private readonly inflight = new Set<Promise<void>>();

  constructor(opts: RealEnvOptions) {
    this.opts = opts;
    this.context = opts.context;
    this.blobs = opts.blobs;
    this.runId = opts.runId;
    this.evaluateAtCap = opts.evaluateAtCap ?? false;
    this.maxSteps = opts.maxSteps;
    this.settleMs = opts.settleMs ?? DEFAULT_REAL_SETTLE_MS;
    if (this.maxSteps !== undefined && !(Number.isInteger(this.maxSteps) && this.maxSteps >= 1)) {
      throw new Error(`maxSteps must be an integer >= 1, got ${this.maxSteps}`);
    }
  }

  /** The agent's page (after reset). */
  get page(): Page {
    if (!this.agentPage) throw new Error('RealEnv: call reset() first');
    return this.agentPage;
  }

  /** The task of the current episode. */
  get task(): RealTask | undefined {
    return this.episode?.task;
  }

  private get registry(): RealRegistry {
    return this.opts.registry ?? loadRealRegistry();
  }

  private get geometry(): PageGeometry {
    return { zoom: 1, viewport: this.agentPage?.viewportSize() ?? DEFAULT_VIEWPORT };
  }

  private get navTimeout(): number {
    return this.opts.navigationTimeoutMs ?? DEFAULT_NAVIGATION_TIMEOUT_MS;
  }

  private assertUsable(): void {
    if (this.crashed) throw new Error('REAL agent page crashed');
    if (!this.agentPage || this.agentPage.isClosed()) throw new Error('REAL agent page is closed');
  }

  private isFatal(err: unknown): boolean {
    return this.crashed || !this.agentPage || this.agentPage.isClosed() || isFatalPageError(err);
  }

  /** Why a main-frame navigation of the agent page to `url` is refused, or null when it is allowed. */
  private verdict(url: string): string | null {
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

  private block(url: string, why: string): void {
    const msg = `navigation to ${url} blocked: ${why}`;
    if (!this.blocked.includes(msg)) this.blocked.push(msg);
  }

  private track(work: Promise<unknown>): void {
    const p: Promise<void> = work.then(
      () => undefined,
      () => undefined,
    );
    this.inflight.add(p);
    void p.finally(() => this.inflight.delete(p));
  }

  /** Waits (bounded) until every navigation decision and popup of the last action is settled. */
  private async drainInflight(): Promise<void> {
    const deadline = Date.now() + this.navTimeout;
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
      if (page && page === this.bgPage) return await route.fallback();
      const url = request.url();
      const why = this.verdict(url);
      if (page && page === this.agentPage) {
        if (why !== null) {
          this.block(url, why);
          return await route.abort('aborted');
        }
        if (this.opts.vetRedirects === false) return await route.fallback();
        return await this.vetRedirects(route, request);
      }
      // A popup (window.open, target=_blank): never kept; a same-origin one is followed in the agent page.
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
    let response;
    try {
      response = await route.fetch({ maxRedirects: 0, timeout: this.navTimeout });
    } catch {
      // Let the browser try (and fail) on its own: its error is the one to report.
      return route.fallback();
    }
    const status = response.status();
    const location = response.headers()['location'];
    if (status < 300 || status >= 400 || !location) return route.fulfill({ response });
    let next = new URL(location, request.url()).href;
    for (let hop = 0; hop < MAX_REDIRECT_HOPS; hop++) {
      const why = this.verdict(next);
      if (why !== null) {
        this.block(next, why);
        return route.abort('aborted');
      }
      let r;
      try {
        r = await this.context.request.get(next, { maxRedirects: 0, timeout: this.navTimeout });
      } catch {
        break;
      }
      const loc = r.headers()['location'];
      const st = r.status();
      await r.dispose().catch(() => undefined);
      if (st < 300 || st >= 400 || !loc) break;
      next = new URL(loc, next).href;
    }
    return route.fulfill({ response });
  }

  private readonly onPopup = (popup: Page): void => {
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

  private async closePages(): Promise<void> {
    if (this.cdp) {
      await this.cdp.detach().catch(() => undefined);
      this.cdp = undefined;
    }
    for (const p of [this.agentPage, this.bgPage]) {
      if (p && !p.isClosed()) await p.close().catch(() => undefined);
    }
    this.agentPage = undefined;
    this.bgPage = undefined;
    this.crashed = false;
  }

  private async holdSlot(origin: string): Promise<void> {
    const limiter = this.opts.limiter;
    if (!limiter) return;
    if (this.slot?.origin === origin) return;
    this.slot?.release();
    this.slot = undefined;
    const release = await limiter.acquire(origin, { holder: this.opts.slotHolder, timeoutMs: this.opts.limiterTimeoutMs, signal: this.opts.signal });
    this.slot = { origin, release };
  }

  /**
   * Gives the site slot back without touching the browser: for a session whose browser is gone, where page
   * calls would only fail. close() does this too.
   */
  releaseSlot(): void {
    this.slot?.release();
    this.slot = undefined;
  }

  private async gotoOrUnreachable(page: Page, url: string, what: string): Promise<void> {
    let status: number | undefined;
    try {
      const res = await page.goto(url, { waitUntil: 'load', timeout: this.navTimeout });
      status = res?.status();
    } catch (err) {
      if (isFatalPageError(err)) throw err;
      const blocked = this.blocked.length > 0 ? ` (${this.blocked.join('; ')})` : '';
      throw new SiteUnreachableError(new URL(url).origin, `${what} ${url} failed: ${firstLine(err)}${blocked}`);
    }
    if (status !== undefined && status >= 400) {
      throw new SiteUnreachableError(new URL(url).origin, `${what} ${url} answered HTTP ${status}`, status);
    }
  }

  async reset(spec: RealTaskSpec | TaskSpec): Promise<Observation> {
    return this.begin(spec);
  }

  /**
   * Continues an episode in a context created with a snapshot's storage (cookies, localStorage): no
   * /config, which would reset that state; the agent page opens the snapshot's URL with its tab's
   * sessionStorage written back before the site's scripts run.
   */
  async resume(spec: RealTaskSpec | TaskSpec, snap: Pick<ClientSnapshot, 'url' | 'sessionStorage' | 'steps'>): Promise<Observation> {
    return this.begin(spec, snap);
  }

  /** The client state a fork needs (see env/real-snapshot.ts), with the /finish it must reproduce. */
  async snapshot(): Promise<ClientSnapshot> {
    const ep = this.requireEpisode();
    this.assertUsable();
    const finish = (await this.readFinish()).text;
    return {
      storage: await this.context.storageState(),
      sessionStorage: await readSessionStorage(this.page),
      url: this.page.url(),
      steps: ep.steps,
      finish,
    };
  }

  /** The episode has ended (answer or step cap): its result is fixed. */
  get ended(): boolean {
    return this.episode?.final !== undefined;
  }

  /** The /finish JSON text now. */
  async finalStateText(): Promise<string> {
    return (await this.readFinish()).text;
  }

  private async begin(spec: RealTaskSpec | TaskSpec, resumeAt?: Pick<ClientSnapshot, 'url' | 'sessionStorage' | 'steps'>): Promise<Observation> {
    if (spec.env !== 'real') throw new Error(`RealEnv cannot run env "${String(spec.env)}"`);
    const task = getRealTask(spec.task, this.registry);
    if (!task.scorable) throw new UnscorableTaskError(task);
    const rootUrl = new URL(this.opts.originOverride ? this.opts.originOverride(task.startUrl) : task.startUrl).href;
    const origin = new URL(rootUrl).origin;

    this.episode = undefined;
    this.origin = origin;
    // The browser's egress proxy (launchChromium's egressGuard), when it has one, is what enforces the
    // private-network rule for every connection; it lets the site itself through (a mirror or the tests' site
    // may live on a private address).
    this.egressRelease?.();
    this.egressRelease = egressProxyOf(this.context.browser())?.allow(origin);
    this.blocked = [];
    this.popupUrl = undefined;
    await this.closePages();
    try {
      await this.holdSlot(origin);
      if (!this.routed) {
        await this.context.route('**/*', this.onRoute);
        this.routed = true;
      }
      if (!this.wsRouted) {
        await this.context.routeWebSocket(() => true, this.onWebSocket);
        this.wsRouted = true;
      }

      // 1. Background page: fresh storage for the origin, /config, network idle, /finish.
      const bg = await this.context.newPage();
      this.bgPage = bg;
      bg.on('dialog', (d) => {
        d.accept().catch(() => undefined);
      });
      if (!resumeAt) {
        const cdpBg = await this.context.newCDPSession(bg);
        await cdpBg
          .send('Storage.clearDataForOrigin', { origin, storageTypes: 'all' })
          .catch(() => undefined)
          .finally(() => cdpBg.detach().catch(() => undefined));
        const config = `${origin}/config?run_id=${encodeURIComponent(this.runId)}&task_id=${encodeURIComponent(task.canonicalId)}&latency=0`;
        await this.gotoOrUnreachable(bg, config, 'opening');
        await bg.waitForLoadState('networkidle', { timeout: CONFIG_NETWORK_IDLE_TIMEOUT_MS }).catch(() => undefined);
      }
      await this.gotoOrUnreachable(bg, `${origin}/finish`, 'opening');

      // 2. Agent page at the site root.
      const page = await this.context.newPage();
      this.agentPage = page;
      const vp = page.viewportSize();
      if (!vp || vp.width !== DEFAULT_VIEWPORT.width || vp.height !== DEFAULT_VIEWPORT.height) {
        await page.setViewportSize({ ...DEFAULT_VIEWPORT });
      }
      page.on('crash', () => {
        this.crashed = true;
      });
      // The policy cannot see a dialog; it answered one by the click that opened it.
      page.on('dialog', (d) => {
        d.accept().catch(() => undefined);
      });
      page.on('popup', this.onPopup);
      await page.bringToFront();
      let startUrl = rootUrl;
      if (resumeAt) {
        if (this.verdict(resumeAt.url) !== null) throw new Error(`cannot resume at ${resumeAt.url}: outside ${origin}`);
        startUrl = resumeAt.url;
        const restore = await page.addInitScript(restoreSessionStorage, { origin, entries: resumeAt.sessionStorage });
        try {
          await this.gotoOrUnreachable(page, startUrl, 'opening');
        } finally {
          await restore.dispose().catch(() => undefined);
        }
      } else {
        await this.gotoOrUnreachable(page, startUrl, 'opening');
      }
      this.blocked = [];
      if (this.verdict(page.url()) !== null) {
        throw new SiteUnreachableError(origin, `the site root ${startUrl} left the origin for ${page.url()}`);
      }
      await this.settle();
      await assignPageIds(page).catch(() => undefined);
      this.episode = { task, rootUrl, origin, steps: resumeAt?.steps ?? 0, lastGoodUrl: page.url() };
    } catch (err) {
      // Leave nothing half-open: no site slot, no pages.
      this.releaseSlot();
      await this.closePages();
      throw err;
    }
    return this.observe();
  }

  private requireEpisode(): EpisodeState {
    if (!this.episode) throw new Error('RealEnv: call reset() first');
    return this.episode;
  }

  private async settle(): Promise<void> {
    if (this.settleMs > 0) await sleep(this.settleMs);
    if (this.agentPage && !this.agentPage.isClosed()) {
      await this.agentPage.waitForLoadState('domcontentloaded', { timeout: AFTER_ACTION_LOAD_TIMEOUT_MS }).catch(() => undefined);
    }
  }

  async apply(action: Action): Promise<RealApplyResult> {
    const ep = this.requireEpisode();
    this.assertUsable();
    if (ep.final) {
      ep.steps++;
      return { ...ep.final };
    }

    if (action.type === 'answer') {
      const result = await this.finishAndEvaluate();
      ep.steps++;
      ep.final = result;
      return { ...result };
    }

    ep.steps++;
    this.blocked = [];
    this.popupUrl = undefined;
    let actionError: string | undefined;
    try {
      actionError = action.type === 'goto' ? await this.goto(action.url) : await executePageAction(this.page, action as PageAction, this.geometry);
    } catch (err) {
      if (this.isFatal(err)) throw err;
      actionError = firstLine(err);
    }
    await this.settle();
    if (this.inflight.size > 0) {
      await this.drainInflight();
      await this.page.waitForLoadState('domcontentloaded', { timeout: AFTER_ACTION_LOAD_TIMEOUT_MS }).catch(() => undefined);
    }
    this.assertUsable();
    await this.afterNavigation();
    if (this.blocked.length > 0) actionError = this.blocked.join('; ');
    await assignPageIds(this.page).catch((err) => {
      if (this.isFatal(err)) throw err;
    });

    let result: RealApplyResult = { reward: 0, done: false, success: false, reason: null };
    if (this.maxSteps !== undefined && ep.steps >= this.maxSteps) result = await this.finishAtCap();
    return actionError === undefined ? result : { ...result, actionError };
  }

  private async goto(raw: string): Promise<string | undefined> {
    let target: URL;
    try {
      target = normaliseGotoUrl(raw, this.page.url());
    } catch {
      return `invalid URL ${JSON.stringify(clip(raw, 200))}`;
    }
    const why = this.verdict(target.href);
    if (why !== null) return `navigation to ${target.href} blocked: ${why}`;
    try {
      await this.page.goto(target.href, { waitUntil: 'load', timeout: this.navTimeout });
    } catch (err) {
      // A redirect out of the origin was blocked: that is the error to report.
      if (this.blocked.length > 0 && !isFatalPageError(err)) return undefined;
      throw err;
    }
    return undefined;
  }

  /** Follows a same-origin popup in the agent page and brings back a page that left the origin anyway. */
  private async afterNavigation(): Promise<void> {
    const ep = this.requireEpisode();
    const page = this.page;
    if (this.popupUrl !== undefined && this.blocked.length === 0) {
      const url = this.popupUrl;
      this.popupUrl = undefined;
      await page.goto(url, { waitUntil: 'load', timeout: this.navTimeout }).catch((err) => {
        if (isFatalPageError(err)) throw err;
      });
      await this.settle();
    }
    const here = page.url();
    const why = this.verdict(here);
    if (why === null) {
      ep.lastGoodUrl = here;
      return;
    }
    // Should not happen (the route handler blocks first); a safety net for anything that slipped through.
    // An error page after a blocked navigation is already explained by that block.
    const errorPage = here.startsWith('chrome-error:') || here === 'about:blank';
    if (!(errorPage && this.blocked.length > 0)) this.block(here, why);
    await page.goto(ep.lastGoodUrl, { waitUntil: 'load', timeout: this.navTimeout }).catch((err) => {
      if (isFatalPageError(err)) throw err;
    });
    await this.settle();
  }

  /**
   * The step cap was reached. Official rule (default): reward 0 and no evaluation. With `evaluateAtCap`, the
   * final state is read and judged like after `answer`. Ends the episode either way.
   */
  async finishAtCap(): Promise<RealApplyResult> {
    const ep = this.requireEpisode();
    if (ep.final) return { ...ep.final };
    if (!this.evaluateAtCap) {
      ep.final = {
        reward: 0,
        done: true,
        success: false,
        reason: `step cap reached after ${ep.steps} steps: not evaluated (official REAL rule)`,
        truncated: true,
      };
    } else {
      ep.final = { ...(await this.finishAndEvaluate()), truncated: true };
    }
    return { ...ep.final };
  }

  private async finishAndEvaluate(): Promise<RealApplyResult> {
    const ep = this.requireEpisode();
    const { text } = await this.readFinish();
    const finalStateRef = await this.blobs.put(text, 'json');
    const evaluation = await evaluateFinalState(ep.task, text, this.opts.evalOptions);
    return {
      reward: evaluation.success ? 1 : 0,
      done: true,
      success: evaluation.success,
      reason: evalFirstLine(evaluation),
      finalStateRef,
      evaluation,
    };
  }

  /** The site's client state as /finish renders it now (read in the background page). */
  async clientState(): Promise<unknown> {
    return (await this.readFinish()).value;
  }

  /**
   * Reloads /finish in the background page and polls until its first `<pre>` holds a JSON object; reloads
   * again if it stays incomplete; bounded by finishTimeoutMs. Throws FinishStateError.
   */
  private async readFinish(): Promise<{ text: string; value: object }> {
    const ep = this.requireEpisode();
    const bg = this.bgPage;
    if (!bg || bg.isClosed()) throw new FinishStateError('REAL background page is closed');
    const url = `${ep.origin}/finish`;
    const timeoutMs = this.opts.finishTimeoutMs ?? DEFAULT_FINISH_TIMEOUT_MS;
    const pollMs = this.opts.finishPollMs ?? DEFAULT_FINISH_POLL_MS;
    const reloadEveryMs = Math.max(2_000, Math.floor(timeoutMs / 3));
    const deadline = Date.now() + timeoutMs;
    let last = 'nothing read';
    while (Date.now() < deadline) {
      const loadStarted = Date.now();
      try {
        await bg.goto(url, { waitUntil: 'domcontentloaded', timeout: Math.max(1, Math.min(deadline - Date.now(), this.navTimeout)) });
      } catch (err) {
        if (isFatalPageError(err)) throw err;
        last = `loading failed: ${firstLine(err)}`;
        await sleep(Math.min(pollMs, Math.max(0, deadline - Date.now())));
        continue;
      }
      while (Date.now() < deadline && Date.now() - loadStarted < reloadEveryMs) {
        let text: string | null = null;
        try {
          text = (await bg.evaluate(READ_PRE)) as string | null;
        } catch (err) {
          if (isFatalPageError(err)) throw err;
          last = `reading failed: ${firstLine(err)}`;
        }
        if (text === null) {
          if (!last.startsWith('reading failed')) last = 'no <pre> element';
        } else {
          const trimmed = text.trim();
          try {
            const value = JSON.parse(trimmed) as unknown;
            if (value !== null && typeof value === 'object' && !Array.isArray(value)) return { text: trimmed, value };
            last = `<pre> holds JSON that is not an object: ${clip(trimmed, 80)}`;
          } catch {
            last = `<pre> is not JSON yet: ${JSON.stringify(clip(trimmed, 80))}`;
          }
        }
        await sleep(Math.min(pollMs, Math.max(0, deadline - Date.now())));
      }
    }
    throw new FinishStateError(`${url} did not render a JSON <pre> within ${timeoutMs} ms (${last})`);
  }

  /** Bounded-retry HTTP check of a site root (default: the current episode's origin). */
  async health(origin?: string, opts?: HealthOptions): Promise<HealthResult> {
    const target = origin ?? this.episode?.origin ?? this.origin;
    if (!target) throw new Error('RealEnv.health: no origin given and no episode');
    return checkSiteHealth(target, opts);
  }

  async observe(): Promise<Observation> {
    const ep = this.requireEpisode();
    this.assertUsable();
    const page = this.page;
    const geom = this.geometry;
    const opts: AxTreeOptions = {
      zoom: 1,
      width: geom.viewport.width,
      height: geom.viewport.height,
      maxLines: this.opts.axtreeMaxLines ?? 200,
      maxChars: this.opts.axtreeMaxChars ?? 8_192,
    };
    let view: PageView | undefined;
    let lastErr: unknown;
    // A page in the middle of a navigation has no execution context for a moment (BrowserGym retries too).
    for (let attempt = 0; attempt < 4 && !view; attempt++) {
      try {
        view = await readPageView(page, opts);
      } catch (err) {
        if (this.isFatal(err)) throw err;
        lastErr = err;
        await page.waitForLoadState('domcontentloaded', { timeout: AFTER_ACTION_LOAD_TIMEOUT_MS }).catch(() => undefined);
        await sleep(100);
      }
    }
    if (!view) throw new Error(`cannot read the page at ${page.url()}: ${firstLine(lastErr)}`);
    if (!this.cdp) this.cdp = await this.context.newCDPSession(page);
    const png = await captureViewport(this.cdp, geom, view.scrollX, view.scrollY);
    const size = pngSize(png);
    const screenshotRef = await this.blobs.put(png, 'png');
    return {
      goal: ep.task.goal,
      url: page.url(),
      axtree: view.axtree,
      screenshotRef,
      width: size.width,
      height: size.height,
      step: ep.steps,
    };
  }

  async step(action: Action): Promise<RealStepOutcome> {
    const result = await this.apply(action);
    const observation = await this.observe();
    return { observation, ...result };
  }

  async close(): Promise<void> {
    this.episode = undefined;
    // The slot first: closing pages of a browser in trouble may take long, and a closed session puts no load on the site.
    this.releaseSlot();
    await this.closePages();
    if (this.routed) {
      await this.context.unroute('**/*', this.onRoute).catch(() => undefined);
      this.routed = false;
    }
    this.egressRelease?.();
    this.egressRelease = undefined;
    this.origin = undefined;
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
