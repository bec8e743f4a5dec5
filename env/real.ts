import type { BrowserContext, Page } from 'playwright-core';
import type { BlobStore } from '../blob/store';
import { pngSize } from '../host/png';
import type { Action } from '../lib/model-io/actions';
import { assignPageIds, executePageAction, firstLine, sleep, type PageAction } from './page-actions';
import type { AxTreeOptions } from './page-scripts';
import { UnscorableTaskError, type EvaluateOptions } from './real-eval';
import {
  AGISDK_DEFAULT_TIMEOUT_MS,
  DEFAULT_FINISH_POLL_MS,
  DEFAULT_FINISH_TIMEOUT_MS,
  judgeAsAgisdk,
  judgeFinalState,
  readFinishState,
  unjudgedAtCap,
  type ReadFinishOptions,
  type RealApplyResult,
  type RealStepOutcome,
} from './real-finish';
import { OriginGuard } from './real-guard';
import { AFTER_ACTION_LOAD_TIMEOUT_MS, RealPages } from './real-pages';
import { checkSiteHealth, openOrUnreachable, SiteUnreachableError, type HealthOptions, type HealthResult } from './real-site';
import { readSessionStorage, restoreSessionStorage, type ClientSnapshot } from './real-snapshot';
import { readFinishInCopy, type StateCopyRead } from './real-state-copy';
import { getRealTask, loadRealRegistry, type RealRegistry, type RealTask } from './real-tasks';
import type { ReleaseSlot, SiteLimiter } from './site-limits';
import type { RealScoring } from '../lib/episode/episode-types';
import type { Environment, Observation, RealTaskSpec, TaskSpec } from './types';

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
 * The agent stays on the task's origin (env/real-guard.ts): goto, link clicks, form posts, window.open and
 * main-frame redirects that leave it are blocked (the page stays where it was) and reported as
 * `navigation to <url> blocked: outside <origin>`. The harness endpoints /config, /finish and /submit are
 * blocked for the agent page as well.
 */

export const DEFAULT_REAL_SETTLE_MS = 500;
/** agisdk's pause after an executed action (core/env.py: `time.sleep(0.5)`), before its load waits. */
export const AGISDK_POST_ACTION_MS = 500;
const DEFAULT_NAVIGATION_TIMEOUT_MS = 30_000;
const CONFIG_NETWORK_IDLE_TIMEOUT_MS = 10_000;
/** agisdk's Playwright slow_mo (core/task.py): a 1 s pause after every browser operation, official scoring only. */
export const AGISDK_SLOW_MO_MS = 1_000;
/** agisdk's element actions (core/action/functions.py): `timeout=500` on every click, fill, select. */
export const AGISDK_ELEMENT_TIMEOUT_MS = 500;

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
  /** Wait after each action (the harness: 0.5 s, always under official scoring), then for DOMContentLoaded (≤ 3 s). */
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
  /**
   * official: agisdk's rules (its /finish read and failure rule, dialogs dismissed, `type` into an element
   * replaces its value, its timeouts, no evaluation at the step cap, unscorable tasks run and score 0);
   * training (default): lenient reads and the project's own timeouts. See `real.scoring` in lib/config/config.ts.
   */
  scoring?: RealScoring;
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

/** Where a fork continues: the snapshot's URL, the agent tab's sessionStorage and step count. */
type ResumePoint = Pick<ClientSnapshot, 'url' | 'sessionStorage' | 'steps'>;

export class RealEnv implements Environment {
  readonly context: BrowserContext;
  readonly runId: string;
  readonly evaluateAtCap: boolean;
  readonly maxSteps: number | undefined;
  readonly settleMs: number;
  readonly scoring: RealScoring;
  private readonly blobs: BlobStore;
  private readonly opts: RealEnvOptions;
  private readonly pages: RealPages;
  private readonly guard: OriginGuard;
  private episode: EpisodeState | undefined;
  private slot: { origin: string; release: ReleaseSlot } | undefined;

  constructor(opts: RealEnvOptions) {
    this.opts = opts;
    this.context = opts.context;
    this.blobs = opts.blobs;
    this.runId = opts.runId;
    this.scoring = opts.scoring ?? 'training';
    // agisdk never evaluates a truncated episode.
    this.evaluateAtCap = this.official ? false : (opts.evaluateAtCap ?? false);
    this.maxSteps = opts.maxSteps;
    // agisdk sleeps 0.5 s after every action; training may set its own pause.
    this.settleMs = this.official ? AGISDK_POST_ACTION_MS : (opts.settleMs ?? DEFAULT_REAL_SETTLE_MS);
    if (this.maxSteps !== undefined && !(Number.isInteger(this.maxSteps) && this.maxSteps >= 1)) {
      throw new Error(`maxSteps must be an integer >= 1, got ${this.maxSteps}`);
    }
    this.pages = new RealPages(this.context, !this.official, this.official);
    // agisdk's context.set_default_timeout(5000): every wait the harness does not bound itself.
    if (this.official) this.context.setDefaultTimeout(AGISDK_DEFAULT_TIMEOUT_MS);
    this.guard = new OriginGuard(this.context, this.pages, { navigationTimeoutMs: this.navTimeout, vetRedirects: opts.vetRedirects ?? true });
  }

  /** The agent's page (after reset). */
  get page(): Page {
    return this.pages.page;
  }

  /** The task of the current episode. */
  get task(): RealTask | undefined {
    return this.episode?.task;
  }

  /** The episode has ended (answer or step cap): its result is fixed. */
  get ended(): boolean {
    return this.episode?.final !== undefined;
  }

  /** Subresource and subframe requests to private, loopback or link-local addresses refused (this session). */
  get privateRequestsBlocked(): number {
    return this.guard.privateRequestsBlocked;
  }

  get official(): boolean {
    return this.scoring === 'official';
  }

  private get registry(): RealRegistry {
    return this.opts.registry ?? loadRealRegistry();
  }

  private get navTimeout(): number {
    return this.opts.navigationTimeoutMs ?? (this.official ? AGISDK_DEFAULT_TIMEOUT_MS : DEFAULT_NAVIGATION_TIMEOUT_MS);
  }

  private requireEpisode(): EpisodeState {
    if (!this.episode) throw new Error('RealEnv: call reset() first');
    return this.episode;
  }

  async reset(spec: RealTaskSpec | TaskSpec): Promise<Observation> {
    return this.begin(spec);
  }

  /**
   * Continues an episode in a context created with a snapshot's storage (cookies, localStorage): no
   * /config, which would reset that state; the agent page opens the snapshot's URL with its tab's
   * sessionStorage written back before the site's scripts run.
   */
  async resume(spec: RealTaskSpec | TaskSpec, snap: ResumePoint): Promise<Observation> {
    return this.begin(spec, snap);
  }

  private async begin(spec: RealTaskSpec | TaskSpec, resumeAt?: ResumePoint): Promise<Observation> {
    if (spec.env !== 'real') throw new Error(`RealEnv cannot run env "${String(spec.env)}"`);
    const task = getRealTask(spec.task, this.registry);
    // Officially an unscorable task is played and judged like any other: its empty script finds no SUCCESS.
    if (!task.scorable && !this.official) throw new UnscorableTaskError(task);
    const rootUrl = new URL(this.opts.originOverride ? this.opts.originOverride(task.startUrl) : task.startUrl).href;
    const origin = new URL(rootUrl).origin;

    this.episode = undefined;
    this.guard.allow(origin);
    await this.pages.close();
    try {
      await this.holdSlot(origin);
      await this.guard.install();

      // 1. Background page: fresh storage for the origin, /config, network idle, /finish. A copy (resumeAt) has its
      //    storage already; its /finish is read when the copy is checked.
      const bg = await this.pages.openBackground();
      if (!resumeAt) {
        await this.pages.clearOriginStorage(origin);
        const config = `${origin}/config?run_id=${encodeURIComponent(this.runId)}&task_id=${encodeURIComponent(task.canonicalId)}&latency=0`;
        await this.open(bg, config);
        await bg.waitForLoadState('networkidle', { timeout: this.official ? AGISDK_DEFAULT_TIMEOUT_MS : CONFIG_NETWORK_IDLE_TIMEOUT_MS }).catch(() => undefined);
        await this.open(bg, `${origin}/finish`);
      }

      // 2. Agent page at the site root (a fork: where its snapshot was, with the tab's sessionStorage back).
      const page = await this.pages.openAgent(this.guard.onPopup);
      let startUrl = rootUrl;
      if (resumeAt) {
        if (this.guard.verdict(resumeAt.url) !== null) throw new Error(`cannot resume at ${resumeAt.url}: outside ${origin}`);
        startUrl = resumeAt.url;
        const restore = await page.addInitScript(restoreSessionStorage, { origin, entries: resumeAt.sessionStorage });
        try {
          await this.open(page, startUrl);
        } finally {
          await restore.dispose().catch(() => undefined);
        }
      } else {
        await this.open(page, startUrl);
      }
      this.guard.blocked = [];
      if (this.guard.verdict(page.url()) !== null) {
        throw new SiteUnreachableError(origin, `the site root ${startUrl} left the origin for ${page.url()}`);
      }
      await this.settle();
      await assignPageIds(page).catch(() => undefined);
      this.episode = { task, rootUrl, origin, steps: resumeAt?.steps ?? 0, lastGoodUrl: page.url() };
    } catch (err) {
      // Leave nothing half-open: no site slot, no pages.
      this.releaseSlot();
      await this.pages.close();
      throw err;
    }
    return this.observe();
  }

  private open(page: Page, url: string): Promise<void> {
    return openOrUnreachable(page, url, this.navTimeout, this.guard.blocked);
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

  async apply(action: Action): Promise<RealApplyResult> {
    const ep = this.requireEpisode();
    this.pages.assertUsable();
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
    this.guard.startAction();
    let actionError: string | undefined;
    try {
      actionError =
        action.type === 'goto'
          ? await this.guard.goto(this.page, action.url)
          : await executePageAction(this.page, action as PageAction, this.pages.geometry, this.official ? { fill: true, elementTimeoutMs: AGISDK_ELEMENT_TIMEOUT_MS } : {});
    } catch (err) {
      if (this.pages.isFatal(err)) throw err;
      actionError = firstLine(err);
    }
    await this.settle();
    if (this.guard.busy) {
      await this.guard.drain();
      this.pages.activeCheck();
      await this.page.waitForLoadState('domcontentloaded', { timeout: AFTER_ACTION_LOAD_TIMEOUT_MS }).catch(() => undefined);
    }
    this.pages.activeCheck();
    this.pages.assertUsable();
    ep.lastGoodUrl = await this.guard.afterAction(this.page, ep.lastGoodUrl, () => this.settle());
    if (this.guard.blocked.length > 0) actionError = this.guard.blocked.join('; ');
    await assignPageIds(this.page).catch((err) => {
      if (this.pages.isFatal(err)) throw err;
    });

    let result: RealApplyResult = { reward: 0, done: false, success: false, reason: null };
    if (this.maxSteps !== undefined && ep.steps >= this.maxSteps) result = await this.finishAtCap();
    return actionError === undefined ? result : { ...result, actionError };
  }

  private async settle(): Promise<void> {
    if (this.settleMs > 0) await sleep(this.settleMs);
    // agisdk waits for every page and frame of the context (env.py _wait_dom_loaded); training for the agent page.
    const pages = this.official ? this.context.pages() : [this.pages.agent];
    for (const page of pages) {
      if (!page || page.isClosed()) continue;
      const frames = this.official ? page.frames() : [page.mainFrame()];
      for (const frame of frames) await frame.waitForLoadState('domcontentloaded', { timeout: AFTER_ACTION_LOAD_TIMEOUT_MS }).catch(() => undefined);
    }
  }

  /**
   * The step cap was reached. Official rule (default): reward 0 and no evaluation. With `evaluateAtCap`, the
   * final state is read and judged like after `answer`. Ends the episode either way.
   */
  async finishAtCap(): Promise<RealApplyResult> {
    const ep = this.requireEpisode();
    if (ep.final) return { ...ep.final };
    ep.final = this.evaluateAtCap ? { ...(await this.finishAndEvaluate()), truncated: true } : unjudgedAtCap(ep.steps);
    return { ...ep.final };
  }

  private async finishAndEvaluate(): Promise<RealApplyResult> {
    const ep = this.requireEpisode();
    if (this.official) return judgeAsAgisdk(this.pages.background, ep.origin, ep.task, this.blobs, this.opts.evalOptions);
    const { text } = await this.readFinish();
    return judgeFinalState(ep.task, text, this.blobs, this.opts.evalOptions);
  }

  /**
   * The site's client state as /finish renders it now, read in a copy of the context's storage (the shaped
   * rewards' read): a read beside the agent's tab could change what the eval judges (env/real-state-copy.ts).
   */
  async clientState(): Promise<unknown> {
    return (await this.readCopy()).value;
  }

  /** The /finish JSON text now, read as the eval reads it: in this context's background page. */
  async finalStateText(): Promise<string> {
    return (await this.readFinish()).text;
  }

  /** The /finish JSON text now, read in a copy of the context's storage (a fork's check against its parent). */
  async copiedStateText(): Promise<string> {
    return (await this.readCopy()).text;
  }

  /** The client state a fork needs (see env/real-snapshot.ts), with the /finish it must reproduce. */
  async snapshot(): Promise<ClientSnapshot> {
    const ep = this.requireEpisode();
    this.pages.assertUsable();
    const { storage, text } = await this.readCopy();
    return {
      storage,
      sessionStorage: await readSessionStorage(this.page),
      url: this.page.url(),
      steps: ep.steps,
      finish: text,
    };
  }

  private finishOptions(): ReadFinishOptions {
    return {
      timeoutMs: this.opts.finishTimeoutMs ?? DEFAULT_FINISH_TIMEOUT_MS,
      pollMs: this.opts.finishPollMs ?? DEFAULT_FINISH_POLL_MS,
      navigationTimeoutMs: this.navTimeout,
    };
  }

  private readCopy(): Promise<StateCopyRead> {
    return readFinishInCopy(this.context, this.requireEpisode().origin, this.finishOptions());
  }

  private readFinish(): Promise<{ text: string; value: object }> {
    return readFinishState(this.pages.background, this.requireEpisode().origin, this.finishOptions());
  }

  /** Bounded-retry HTTP check of a site root (default: the current episode's origin). */
  async health(origin?: string, opts?: HealthOptions): Promise<HealthResult> {
    const target = origin ?? this.episode?.origin ?? this.guard.origin;
    if (!target) throw new Error('RealEnv.health: no origin given and no episode');
    return checkSiteHealth(target, opts);
  }

  async observe(): Promise<Observation> {
    const ep = this.requireEpisode();
    this.pages.assertUsable();
    const { viewport } = this.pages.geometry;
    const opts: AxTreeOptions = {
      zoom: 1,
      width: viewport.width,
      height: viewport.height,
      maxLines: this.opts.axtreeMaxLines ?? 200,
      maxChars: this.opts.axtreeMaxChars ?? 8_192,
    };
    const view = await this.pages.readView(opts);
    const png = await this.pages.screenshot(view);
    const size = pngSize(png);
    const screenshotRef = await this.blobs.put(png, 'png');
    return {
      goal: ep.task.goal,
      url: this.page.url(),
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
    await this.pages.close();
    await this.guard.release();
  }
}
