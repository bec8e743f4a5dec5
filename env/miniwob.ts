import type { CDPSession, Page } from 'playwright-core';
import type { BlobStore } from '../blob/store';
import type { Action } from '../lib/model-io/actions';
import { DEFAULT_VIEWPORT } from './browser';
import { PAGE_SCRIPT, type AxTreeOptions, type PageEpisodeState, type PageView } from './page-scripts';
import type { ApplyResult, Environment, Observation, StepOutcome, TaskSpec } from './types';
import { captureViewport, executePageAction, firstLine, isFatalPageError, sleep } from './page-actions';
import { pngSize } from '../host/png';
import { episodeMaxTimeMs, miniwobSuccess, RAISED_EPISODE_MAX_TIME_MS, reportedReward, type MiniwobRewardMode, type MiniwobTimeLimit } from './miniwob-scoring';

/**
 * Magnification of the MiniWoB task (160x210 CSS px in the page's top-left corner).
 *
 * How: the page is NOT zoomed. Each screenshot captures the top-left (viewport / zoom) CSS px of the page
 * and renders it at `zoom` device pixels per CSS px (CDP Page.captureScreenshot with clip.scale, which
 * re-rasterises, so text stays sharp), giving a 1280x720 image. The 0-1000 grid spans that image; a grid
 * point maps to screenshot pixel (x/1000*1280, y/1000*720), i.e. to CSS px (that / zoom) for page.mouse.
 *
 * Why not CSS `zoom` on the page: checked in Chromium 156, under CSS zoom mouse events still report
 * pageX/clientX in unzoomed viewport px while offsetWidth / SVG geometry stay in zoomed-element px, so
 * every task that scores `event.pageX` against its own layout (circle-center, bisect-angle, right-angle,
 * find-midpoint, hot-cold, the jQuery UI drag tasks...) would read positions off by the zoom factor.
 * Why not deviceScaleFactor: with a 1280x720 viewport it would make 3840x2160 screenshots, and shrinking the
 * CSS viewport instead means changing the caller's context. Capture-time scaling changes nothing the page can
 * observe, so the task's own coordinate logic is untouched.
 *
 * 3.2 shows 400x225 CSS px: the 210 px task fills 672 of 720 px and both sizes are whole numbers.
 */
export const DEFAULT_MINIWOB_ZOOM = 3.2;
export const DEFAULT_EPISODE_MAX_TIME_MS = RAISED_EPISODE_MAX_TIME_MS;
export const DEFAULT_SETTLE_MS = 60;

/** `HALO_MINIWOB_SETTLE_MS`: the wait after each action before the page is read (unset: DEFAULT_SETTLE_MS). */
export function settleMsFromEnv(value = process.env.HALO_MINIWOB_SETTLE_MS): number {
  if (value === undefined || value === '') return DEFAULT_SETTLE_MS;
  const n = Number(value);
  if (!(Number.isInteger(n) && n >= 0 && n <= 10_000))
    throw new Error(`HALO_MINIWOB_SETTLE_MS must be a whole number of milliseconds from 0 to 10000, got ${JSON.stringify(value)}`);
  return n;
}

const AXTREE_MAX_LINES = 200;
const AXTREE_MAX_CHARS = 8_192;

/**
 * The origin observations name MiniWoB++ pages by, whatever port the local server listens on: a URL enters the
 * prompt and the state key, and a run must see the same prompt on every stack (the port is picked at random).
 */
export const MINIWOB_SHOWN_ORIGIN = 'http://miniwob.local';

/** `url` as an observation shows it: the local server's origin replaced by MINIWOB_SHOWN_ORIGIN. */
export function miniwobShownUrl(url: string, baseUrl: string): string {
  return url === baseUrl || url.startsWith(`${baseUrl}/`) ? MINIWOB_SHOWN_ORIGIN + url.slice(baseUrl.length) : url;
}

export interface MiniWobEnvOptions {
  /** Created by the caller from a BrowserContext with viewport 1280x720. The env owns it from now on. */
  page: Page;
  /** Static server root, e.g. http://127.0.0.1:41234 (task pages under /miniwob/). */
  baseUrl: string;
  blobs: BlobStore;
  /**
   * Episode time limit (config `miniwob.timeLimit`): raised (default; MiniWoB's 10 s is far too short for a
   * VLM policy), official (each task's own) or ms.
   */
  timeLimit?: MiniwobTimeLimit;
  /** Same as `timeLimit: <ms>`; kept for callers that set the limit in ms. */
  episodeMaxTimeMs?: number;
  /** Reward reported (config `miniwob.reward`): raw (default) or official (time-scaled). Success is raw 1 either way. */
  reward?: MiniwobRewardMode;
  /** Screenshot magnification; see DEFAULT_MINIWOB_ZOOM. */
  zoom?: number;
  /** Wait after each action before reading the reward (plus one animation frame). */
  settleMs?: number;
}

export { toPlaywrightKeys } from './page-actions';

interface EpisodeState {
  task: string;
  seed: number;
  url: string;
  goal: string;
  steps: number;
  /** Set once the page reported the end of the episode (or the agent answered): later applies return it. */
  final?: ApplyResult;
}

/** How an in-place restart may cut its waits (`MiniWobEnv.restartInPlace`); both default to true. */
export interface RestartOptions {
  frame?: boolean;
  pointer?: boolean;
}

/**
 * One MiniWoB++ task page driven through Playwright. Observations are a 1280x720 screenshot of the
 * magnified task (see DEFAULT_MINIWOB_ZOOM), the URL and a compact accessibility tree whose element ids
 * (`data-halo-id`) are stable across observations and reproducible from the same resets and actions.
 */
export class MiniWobEnv implements Environment {
  readonly page: Page;
  readonly baseUrl: string;
  readonly zoom: number;
  /** core.EPISODE_MAX_TIME set at reset; null keeps the task's own limit. */
  readonly episodeMaxTimeMs: number | null;
  readonly rewardMode: MiniwobRewardMode;
  readonly settleMs: number;
  private readonly blobs: BlobStore;
  private cdp: CDPSession | undefined;
  private crashed = false;
  private episode: EpisodeState | undefined;

  constructor(opts: MiniWobEnvOptions) {
    this.page = opts.page;
    this.baseUrl = opts.baseUrl.replace(/\/+$/, '');
    this.blobs = opts.blobs;
    this.zoom = opts.zoom ?? DEFAULT_MINIWOB_ZOOM;
    this.episodeMaxTimeMs = episodeMaxTimeMs(opts.episodeMaxTimeMs ?? opts.timeLimit);
    this.rewardMode = opts.reward ?? 'raw';
    this.settleMs = opts.settleMs ?? DEFAULT_SETTLE_MS;
    if (!(this.zoom > 0 && Number.isFinite(this.zoom))) throw new Error(`invalid zoom ${this.zoom}`);
    this.page.on('crash', () => {
      this.crashed = true;
    });
    // No task uses dialogs; an unexpected one would block every later call.
    this.page.on('dialog', (d) => {
      d.dismiss().catch(() => undefined);
    });
  }

  /** The task of the episode on the page (done or not); undefined before a reset and after a failed one. */
  get loadedTask(): string | undefined {
    return this.episode?.task;
  }

  private get viewport(): { width: number; height: number } {
    return this.page.viewportSize() ?? DEFAULT_VIEWPORT;
  }

  private assertUsable(): void {
    if (this.crashed) throw new Error('MiniWoB page crashed');
    if (this.page.isClosed()) throw new Error('MiniWoB page is closed');
  }

  private isFatal(err: unknown): boolean {
    return this.crashed || this.page.isClosed() || isFatalPageError(err);
  }

  async reset(spec: TaskSpec): Promise<Observation> {
    if (spec.env !== 'miniwob') throw new Error(`MiniWobEnv cannot run env "${String(spec.env)}"`);
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(spec.task)) throw new Error(`invalid MiniWoB task name ${JSON.stringify(spec.task)}`);
    if (!Number.isSafeInteger(spec.seed)) throw new Error(`MiniWoB seed must be an integer, got ${spec.seed}`);
    this.assertUsable();
    this.episode = undefined;
    const url = `${this.baseUrl}/miniwob/${spec.task}.html`;
    const response = await this.page.goto(url, { waitUntil: 'load', timeout: 30_000 });
    if (!response?.ok()) {
      throw new Error(`MiniWoB task page ${url} answered HTTP ${response ? response.status() : 'nothing'}`);
    }
    await this.page.evaluate(PAGE_SCRIPT);
    // core.startEpisode() (from window.onload) creates the START cover that startEpisodeReal() needs.
    await this.page.waitForFunction('typeof core !== "undefined" && core.cover_div != null', undefined, { timeout: 10_000 });
    await this.begin(spec, url, 'start');
    return this.observe();
  }

  /**
   * The same reset without reloading the page: a new episode of the task already loaded (MiniWoB's own
   * environment does this between episodes), saving the page load. Undefined when the page is not that
   * task's or its script cannot start again; the caller then resets with `reset`.
   */
  async resetInPlace(spec: TaskSpec): Promise<Observation | undefined> {
    return (await this.restartInPlace(spec)) ? this.observe() : undefined;
  }

  /**
   * `resetInPlace` without the observation, for a caller that acts (replays) before it looks. For a replay whose
   * end state is checked against the one it reached when lived (activities/session-replay.ts), `frame: false`
   * gives the ids without waiting for a frame (~15 ms), and `pointer: false` leaves the pointer where it is
   * (~10 ms) when the replay's first action moves it anyway. A state that differs for it is caught by that check.
   */
  async restartInPlace(spec: TaskSpec, opts: RestartOptions = {}): Promise<boolean> {
    const ep = this.episode;
    if (spec.env !== 'miniwob' || !ep || ep.task !== spec.task || !Number.isSafeInteger(spec.seed)) return false;
    this.assertUsable();
    if (this.page.url().split('#')[0] !== ep.url) return false;
    const ok = await this.page.evaluate('!!(window.__halo && window.__halo.restartable && window.__halo.restartable())').catch(() => false);
    if (!ok) return false;
    this.episode = undefined;
    // A fresh page has never seen the pointer: hovering whatever the last action left it over would show.
    if (opts.pointer !== false) await this.page.mouse.move(0, 0);
    await this.begin(spec, ep.url, 'restart', opts.frame !== false);
    return true;
  }

  /** A new episode of the task: in place where the page allows it, else by loading the page again. */
  async restart(spec: TaskSpec, opts: RestartOptions = {}): Promise<void> {
    if (!(await this.restartInPlace(spec, opts))) await this.reset(spec);
  }

  /** `frame`: the ids are given after the next frame (the task's first timers have run), as after an action. */
  private async begin(spec: TaskSpec, url: string, how: 'start' | 'restart', frame = true): Promise<void> {
    // The seed goes in as a number, as MiniWoB's Python driver and BrowserGym pass it, so a seed gives the
    // same problem here as there.
    // One round trip when the task is ready at once (most are): the goal read and the ids given in the same call.
    const opts = JSON.stringify({ seed: spec.seed, maxTimeMs: this.episodeMaxTimeMs });
    let goal = (await this.page.evaluate(
      `(async () => { await window.__halo.${how}(${opts}); if (window.WOB_TASK_READY !== true) return null; const goal = window.__halo.utterance(); ${frame ? 'await window.__halo.afterAction()' : 'window.__halo.assignIds()'}; return goal; })()`,
    )) as string | null;
    if (goal === null) {
      await this.page.waitForFunction('window.WOB_TASK_READY === true', undefined, { timeout: 10_000 });
      goal = (await this.page.evaluate('window.__halo.utterance()')) as string;
      await this.page.evaluate('window.__halo.afterAction()');
    }
    this.episode = { task: spec.task, seed: spec.seed, url, goal, steps: 0 };
  }

  private requireEpisode(): EpisodeState {
    if (!this.episode) throw new Error('MiniWobEnv: call reset() first');
    return this.episode;
  }

  /**
   * `settle: false` reads the page's state right after the action instead of after the settle wait, and
   * `frame: false` without waiting for the next frame either, and `force` clicks elements without Playwright's
   * actionability checks: for a replay whose end state is checked against the one it reached when it was lived.
   */
  async apply(action: Action, opts: { settle?: boolean; frame?: boolean; force?: boolean } = {}): Promise<ApplyResult> {
    const ep = this.requireEpisode();
    this.assertUsable();
    ep.steps++;
    if (ep.final) return { ...ep.final };

    if (action.type === 'answer') {
      // The agent ends the episode; MiniWoB scores only through the page, so take what the page says now.
      const st = (await this.page.evaluate('window.__halo.state()')) as PageEpisodeState;
      const reward = st.done ? reportedReward(st, this.rewardMode) : 0;
      ep.final = { reward, done: true, success: st.done && miniwobSuccess(st.raw), reason: st.reason ?? 'answered' };
      return { ...ep.final };
    }

    let actionError: string | undefined;
    try {
      actionError = await this.execute(action, opts.force === true);
    } catch (err) {
      if (this.isFatal(err)) throw err;
      actionError = firstLine(err);
    }
    if (this.settleMs > 0 && opts.settle !== false) await sleep(this.settleMs);
    this.assertUsable();

    let st: PageEpisodeState | null;
    if (this.page.url().split('#')[0] !== ep.url) {
      st = null;
    } else {
      const after = opts.frame === false ? 'afterActionNow' : 'afterAction';
      st = (await this.page.evaluate(`window.__halo ? window.__halo.${after}() : null`)) as PageEpisodeState | null;
    }
    let result: ApplyResult;
    if (st === null) {
      // Something navigated away from the task page: the episode cannot be scored any more.
      result = { reward: 0, done: true, success: false, reason: 'navigated away from the task page' };
    } else {
      result = {
        reward: st.done ? reportedReward(st, this.rewardMode) : 0,
        done: st.done,
        success: st.done && miniwobSuccess(st.raw),
        reason: st.reason,
      };
    }
    if (result.done) ep.final = { ...result };
    return actionError === undefined ? result : { ...result, actionError };
  }

  /** Runs the action; returns an error text for actions that cannot run (Playwright errors are thrown). */
  private async execute(action: Exclude<Action, { type: 'answer' }>, force: boolean): Promise<string | undefined> {
    if (action.type === 'goto') return 'navigation is not allowed in MiniWoB';
    return executePageAction(this.page, action, { zoom: this.zoom, viewport: this.viewport }, { force });
  }

  /**
   * `opts.screenshotRef`: a screenshot of this state taken before (a replay checked against the state it
   * reached when lived), used instead of taking one; it has the viewport's size, as every capture here does.
   */
  async observe(opts: { screenshotRef?: string } = {}): Promise<Observation> {
    const ep = this.requireEpisode();
    this.assertUsable();
    const { width, height } = this.viewport;
    const axOpts: AxTreeOptions = { zoom: this.zoom, width, height, maxLines: AXTREE_MAX_LINES, maxChars: AXTREE_MAX_CHARS };
    const view = (await this.page.evaluate(`window.__halo ? window.__halo.view(${JSON.stringify(axOpts)}) : null`)) as PageView | null;
    let shot = { screenshotRef: opts.screenshotRef ?? '', width, height };
    if (opts.screenshotRef === undefined) {
      const png = await this.capture(view?.scrollX ?? 0, view?.scrollY ?? 0);
      shot = { screenshotRef: await this.blobs.put(png, 'png'), ...pngSize(png) };
    }
    return { goal: ep.goal, url: miniwobShownUrl(this.page.url(), this.baseUrl), axtree: view?.axtree ?? '', ...shot, step: ep.steps };
  }

  /** PNG of the top-left (viewport / zoom) CSS px of the visual viewport, rendered at `zoom`. */
  private async capture(scrollX: number, scrollY: number): Promise<Buffer> {
    return captureViewport(await this.cdpSession(), { zoom: this.zoom, viewport: this.viewport }, scrollX, scrollY);
  }

  private async cdpSession(): Promise<CDPSession> {
    if (!this.cdp) this.cdp = await this.page.context().newCDPSession(this.page);
    return this.cdp;
  }

  /**
   * Stops the page's timers and scripts while it waits unused (a task's clock and animations would keep
   * running): Chromium's frozen lifecycle state. `thaw` before anything else runs on it.
   */
  async freeze(): Promise<void> {
    this.assertUsable();
    await (await this.cdpSession()).send('Page.setWebLifecycleState', { state: 'frozen' });
  }

  async thaw(): Promise<void> {
    this.assertUsable();
    await (await this.cdpSession()).send('Page.setWebLifecycleState', { state: 'active' });
  }

  async step(action: Action): Promise<StepOutcome> {
    const result = await this.apply(action);
    const observation = await this.observe();
    return { observation, ...result };
  }

  async close(): Promise<void> {
    this.episode = undefined;
    if (this.cdp) {
      await this.cdp.detach().catch(() => undefined);
      this.cdp = undefined;
    }
    if (!this.page.isClosed()) await this.page.close();
  }
}
