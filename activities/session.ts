import { ApplicationFailure } from '@temporalio/activity';
import type { Browser, BrowserContext } from 'playwright-core';
import { randomUUID } from 'node:crypto';
import { DEFAULT_VIEWPORT, launchChromium } from '../env/browser';
import { AGISDK_SLOW_MO_MS, RealEnv } from '../env/real';
import { type Look, type ReplayCounters, Replays } from './session-replay';
import { sameFinalState, sameView, type ClientSnapshot, type ForkCounters } from '../env/real-snapshot';
import { getRealTask } from '../env/real-tasks';
import { SiteLimiter, siteSlotTimeoutFromEnv, slotHolder } from '../env/site-limits';
import { ForkMismatch, sessionStartFailure } from './session-errors';
import { checkRealTaskSite, realUrl, validateTask } from './session-tasks';
import { MiniWobEnv } from '../env/miniwob';
import type { Observation, StepOutcome } from '../env/types';
import type { SessionDeps } from './session-deps';
import { type BrowserKind, browserKind, type Session, type SessionEnv } from './session-types';
import { DEFAULT_WARM_IDLE_MS, closeWarm, pageKey, WarmPages, warmKey } from './warm-pages';
import { RealStartStates } from './real-start-states';
import { actionKey, type Action } from '../lib/model-io/actions';
import { computeReward, initialRewardState, stateKey, summarizeBreakdown } from '../lib/rewards/shaping';
import type { RewardView } from '../lib/rewards/types';
import { parseRewardWeights } from '../lib/rewards/weights';
import type {
  ObservationRef,
  ResetSessionInput,
  StartSessionInput,
  StartSessionResult,
  StepSessionInput,
  StepSessionResult,
  StepResultBlob,
  FinishSessionResult,
} from '../lib/episode/episode-types';

export const DEFAULT_SESSION_IDLE_MS = 60 * 60_000;

export interface StartOptions {
  /** The activity was cancelled or timed out: stop waiting, keep nothing. */
  signal?: AbortSignal;
  /** The longest wait for a site slot that still leaves the activity time to reset and replay. */
  maxSlotWaitMs?: number;
}

/**
 * Browser sessions of one worker process. A session is a page in its own browser context; it lives only
 * here, so everything after `startSession` is routed to this worker's own task queue.
 */
export class SessionManager {
  /**
   * One browser per environment kind: MiniWoB++ renders with scrollbars, REAL (like agisdk) without, and REAL
   * under official scoring paces every Playwright call as agisdk does (slow_mo is a launch option).
   */
  private readonly browsers = new Map<BrowserKind, Browser>();
  private readonly sessions = new Map<string, Session>();
  private readonly siteLimiter: SiteLimiter;
  private readonly slotTimeoutMs: number;
  private readonly idleMs: number;
  private readonly sweeper: NodeJS.Timeout;
  private readonly forks: ForkCounters = { fork_snapshots: 0, fork_replay_fallbacks: 0 };
  private readonly warm: WarmPages;
  private readonly replayer: Replays;
  private readonly startStates: RealStartStates;

  /** Replays without settle waits that reached their lived state, and those replayed again with them. */
  get replays(): Readonly<ReplayCounters> {
    return this.replayer.counters;
  }

  constructor(private readonly deps: SessionDeps) {
    this.siteLimiter = new SiteLimiter(deps.siteConcurrency ?? 4);
    this.slotTimeoutMs = deps.siteSlotTimeoutMs ?? siteSlotTimeoutFromEnv();
    this.idleMs = deps.sessionIdleMs ?? DEFAULT_SESSION_IDLE_MS;
    this.warm = new WarmPages(deps.warmPages ?? 0, deps.warmIdleMs ?? DEFAULT_WARM_IDLE_MS);
    this.replayer = new Replays(deps.fastReplay !== false);
    this.startStates = new RealStartStates(deps.realStartStates ?? 0, deps.realStartStateTtlMs);
    const sweepMs = Math.min(60_000, Math.max(1_000, Math.min(this.idleMs, deps.warmIdleMs ?? DEFAULT_WARM_IDLE_MS) / 4));
    this.sweeper = setInterval(() => void this.closeIdle(), sweepMs);
    this.sweeper.unref();
  }

  /** Site slots of this worker for an origin: in use, episodes waiting, the limit. */
  siteSlots(origin: string): { active: number; waiting: number; limit: number } {
    return this.siteLimiter.stats(origin);
  }

  get size(): number {
    return this.sessions.size;
  }

  /** Forks of this worker that copied their parent's client state, and those that had to replay after all. */
  forkCounters(): ForkCounters {
    return { ...this.forks };
  }

  /** REAL starts from a kept copy of their task's start state, copies that differed, tasks kept. */
  startStateCounters(): { start_state_copies: number; start_state_misses: number; start_states: number } {
    return { ...this.startStates.counters, start_states: this.startStates.size };
  }

  /** MiniWoB++ starts served by a kept page, starts that loaded their page, and kept pages that could not serve. */
  warmCounters(): { warm_starts: number; cold_starts: number; warm_misses: number; warm_pages: number } {
    return { ...this.warm.counters, warm_pages: this.warm.size };
  }

  private async ensureBrowser(kind: BrowserKind): Promise<Browser> {
    const current = this.browsers.get(kind);
    if (current?.isConnected()) return current;
    const real = kind !== 'miniwob';
    const browser = await launchChromium({ hideScrollbars: real, egressGuard: real, ...(kind === 'real-official' ? { slowMo: AGISDK_SLOW_MO_MS } : {}) });
    // A crashed browser takes its sessions with it (their episodes rebuild them from the action path), and
    // their site slots at once: episodes waiting for one must not wait for the sessions' closes.
    browser.on('disconnected', () => {
      this.dropSessionsOf(browser);
      void this.warm.sweep(Date.now(), browser);
    });
    this.browsers.set(kind, browser);
    return browser;
  }

  private dropSessionsOf(browser: Browser): void {
    for (const s of [...this.sessions.values()]) {
      if (s.browser !== browser) continue;
      this.sessions.delete(s.id);
      if (s.env instanceof RealEnv) s.env.releaseSlot();
      void s.env.close().catch(() => {});
    }
  }

  /**
   * Safety net for sessions nobody will close (a workflow terminated, a start whose result was lost): they
   * would hold their episode's site slot for the life of this worker. A session still wanted after this long
   * idle is rebuilt by its episode like any lost session.
   */
  private async closeIdle(now = Date.now()): Promise<void> {
    for (const s of [...this.sessions.values()]) {
      if (s.busy === 0 && now - s.lastUsed > this.idleMs) await this.close(s.id);
    }
    await this.warm.sweep(now);
  }

  /**
   * A page in a fresh context at the end of the episode's action prefix. A REAL fork whose parent session
   * (same episode, same path) lives here copies the parent's client state instead of replaying, and keeps
   * the copy only if its /finish equals the parent's; otherwise, and everywhere else, reset and replay.
   */
  async start(input: StartSessionInput, beat: (d: unknown) => void = () => {}, opts: StartOptions = {}): Promise<StartSessionResult> {
    const site = validateTask(input.spec, this.deps.miniwobTasks, input.envOptions?.realScoring);
    if (input.spec.env === 'real') await checkRealTaskSite(input.spec.task, this.deps.realOriginOverride);
    const browser = await this.ensureBrowser(browserKind(input));
    const parent = this.forkParent(input);
    if (!parent) return this.startByReplay(input, site, browser, beat, opts);
    const forked = await this.startFromSnapshot(input, () => this.parentSnapshot(parent), [], site, browser, beat, opts);
    if (forked) {
      this.forks.fork_snapshots++;
      return { ...forked, fork: 'snapshot' };
    }
    this.forks.fork_replay_fallbacks++;
    return { ...(await this.startByReplay(input, site, browser, beat, opts)), fork: 'replay-fallback' };
  }

  /** The live REAL session this start forks, if it is on this worker and snapshot forks are on. */
  private forkParent(input: StartSessionInput): (Session & { env: RealEnv }) | undefined {
    if (input.spec.env !== 'real' || input.replay.length === 0) return undefined;
    if ((input.envOptions?.realForkMode ?? 'snapshot') !== 'snapshot' || input.envOptions?.realScoring === 'official') return undefined;
    const path = input.replay.map((a) => JSON.stringify(a));
    for (const s of this.sessions.values()) {
      if (s.episodeId !== input.episodeId || !(s.env instanceof RealEnv) || s.env.ended) continue;
      if (s.env.task?.id !== getRealTask(input.spec.task).id || s.applied !== path.length) continue;
      if (s.path.every((a, i) => a === path[i])) return s as Session & { env: RealEnv };
    }
    return undefined;
  }

  /** One snapshot per parent state: the forks of a step group start together and share it. */
  private parentSnapshot(parent: Session & { env: RealEnv }): Promise<ClientSnapshot> {
    if (parent.snapshot?.applied !== parent.applied) {
      const view = parent.view.axtree;
      const value = this.using(parent, async () => ({ ...(await parent.env.snapshot()), view }));
      value.catch(() => {
        if (parent.snapshot?.value === value) parent.snapshot = undefined;
      });
      parent.snapshot = { applied: parent.applied, value };
    }
    return parent.snapshot.value;
  }

  /**
   * A REAL session from a copy of a client state (a fork's parent, or its task's start state) and then `replay`,
   * or undefined when that state cannot be copied (the caller resets and replays).
   */
  private async startFromSnapshot(
    input: StartSessionInput,
    snapshot: () => Promise<ClientSnapshot>,
    replay: readonly Action[],
    site: string | null,
    browser: Browser,
    beat: (d: unknown) => void,
    opts: StartOptions,
  ): Promise<StartSessionResult | undefined> {
    let snap: ClientSnapshot;
    try {
      snap = await snapshot();
    } catch {
      return undefined;
    }
    const context = await browser.newContext({ viewport: this.deps.viewport ?? DEFAULT_VIEWPORT, serviceWorkers: 'block', storageState: snap.storage });
    let env: RealEnv | undefined;
    try {
      const real = (await this.createEnv(input, context, opts)) as RealEnv;
      env = real;
      const resumed = await real.resume(input.spec, snap);
      // The eval reads /finish: a copy that renders anything else is no fork; nor is one whose page differs from
      // what the parent's policy saw (state kept only in page scripts shows there, and reaches no storage copy).
      const finish = await real.copiedStateText();
      if (!sameFinalState(finish, snap.finish) || real.page.url() !== snap.url) throw new ForkMismatch();
      if (snap.view !== undefined && !sameView(resumed.axtree, snap.view)) throw new ForkMismatch();
      const look = await this.replayer.replayAndLook(real, { ...input, replay: [...replay] }, beat, () => this.look(real));
      // Nothing replayed: the /finish just read is the state the session starts in (no second read).
      return await this.register(input, context, real, site, browser, replay.length, opts, replay.length === 0 ? { ...look, clientState: JSON.parse(finish) } : look);
    } catch {
      await env?.close().catch(() => {});
      await context.close().catch(() => {});
      // A cancelled start is not a reason to replay; anything else (a mismatch, a page that failed) is.
      opts.signal?.throwIfAborted();
      return undefined;
    }
  }

  private async startByReplay(input: StartSessionInput, site: string | null, browser: Browser, beat: (d: unknown) => void, opts: StartOptions): Promise<StartSessionResult> {
    const warm = (await this.startWarm(input, site, browser, beat, opts)) ?? (await this.startFromStartState(input, site, browser, beat, opts));
    if (warm) return warm;
    if (input.spec.env === 'miniwob') this.warm.counters.cold_starts++;
    // Service workers would bypass the navigation guard of REAL pages.
    const context = await browser.newContext({ viewport: this.deps.viewport ?? DEFAULT_VIEWPORT, serviceWorkers: 'block' });
    let env: SessionEnv | undefined;
    try {
      const fresh = await this.createEnv(input, context, opts);
      env = fresh;
      try {
        await fresh.reset(input.spec);
      } catch (err) {
        throw sessionStartFailure(err);
      }
      if (fresh instanceof RealEnv) await this.keepStartState(input, fresh);
      const look = await this.replayer.replayAndLook(fresh, input, beat, (shot) => this.look(fresh, shot));
      return await this.register(input, context, fresh, site, browser, input.replay.length, opts, look);
    } catch (err) {
      // The env first: a REAL env gives back its site slot there.
      await env?.close().catch(() => {});
      await context.close().catch(() => {});
      throw err;
    }
  }

  /** A REAL start from its task's kept start state (then the replay); undefined when none is kept or it differed. */
  private async startFromStartState(
    input: StartSessionInput,
    site: string | null,
    browser: Browser,
    beat: (d: unknown) => void,
    opts: StartOptions,
  ): Promise<StartSessionResult | undefined> {
    const key = this.startStates.key(input);
    const snap = key === undefined ? undefined : this.startStates.get(key);
    if (key === undefined || snap === undefined) return undefined;
    const started = await this.startFromSnapshot(input, async () => snap, input.replay, site, browser, beat, opts);
    if (started) {
      this.startStates.counters.start_state_copies++;
      return { ...started, startState: 'copy' };
    }
    this.startStates.counters.start_state_misses++;
    this.startStates.refuse(key);
    return undefined;
  }

  /** A REAL page just through /config: its client state for the task's later starts, if none is kept. */
  private async keepStartState(input: StartSessionInput, env: RealEnv): Promise<void> {
    const key = this.startStates.key(input);
    // A refused task's state would not be kept: no snapshot (a /finish load and the storage) for nothing.
    if (key === undefined || !this.startStates.wants(key)) return;
    // Only a faster later start depends on it: a page that cannot be copied now just starts without.
    const snap = await env.snapshot().catch(() => undefined);
    if (snap) this.startStates.put(key, snap);
  }

  /**
   * A start on a kept page of the same task: a new episode in place, then the replay. Undefined when no kept
   * page can serve it (the caller loads a page); a kept page that fails to restart is closed. A failure after
   * the restart is the start's own, as on a loaded page.
   */
  private async startWarm(
    input: StartSessionInput,
    site: string | null,
    browser: Browser,
    beat: (d: unknown) => void,
    opts: StartOptions,
  ): Promise<StartSessionResult | undefined> {
    const key = warmKey(input.spec, input.envOptions);
    if (key === undefined) return undefined;
    for (let page = this.warm.take(key); page; page = this.warm.take(key)) {
      if (page.browser !== browser) {
        await closeWarm(page);
        continue;
      }
      let restarted = false;
      try {
        await page.env.thaw();
        restarted = await page.env.restartInPlace(input.spec, this.replayer.restartOptions(input));
      } catch {
        // A kept page that cannot start again is just gone.
      }
      if (!restarted) {
        this.warm.counters.warm_misses++;
        await closeWarm(page);
        continue;
      }
      try {
        const look = await this.replayer.replayAndLook(page.env, input, beat, (shot) => this.look(page.env, shot));
        const started = await this.register(input, page.context, page.env, site, browser, input.replay.length, opts, look);
        this.warm.counters.warm_starts++;
        return started;
      } catch (err) {
        await closeWarm(page);
        throw err;
      }
    }
    return undefined;
  }

  /**
   * A session's page back at the task's reset for a new seed and path, keeping its browser context: MiniWoB++
   * starts a new episode on the loaded page (no navigation), falling back to a full reset when the page cannot.
   * REAL has no such reset (its state lives in the site's client storage too): the session is closed and the
   * caller opens a new one. The session then answers like a new one at `replay.length` actions.
   */
  async reset(input: ResetSessionInput, beat: (d: unknown) => void = () => {}): Promise<StartSessionResult> {
    const s = this.requireSession(input.sessionId);
    if (!(s.env instanceof MiniWobEnv) || input.spec.env !== 'miniwob') {
      await this.close(s.id);
      throw ApplicationFailure.retryable(`session ${s.id} cannot be reset in place (${input.spec.env}): open a new one`, 'SessionLost');
    }
    const env = s.env;
    validateTask(input.spec, this.deps.miniwobTasks);
    return this.using(s, async () => {
      // Until it is observed again the session is at no known path: a step meanwhile must not run.
      s.applied = -1;
      s.path = [];
      s.last = undefined;
      s.snapshot = undefined;
      try {
        await env.restart(input.spec, this.replayer.restartOptions(input));
        const { obs, observation, fastReplay } = await this.replayer.replayAndLook(env, input, beat, (shot) => this.look(env, shot));
        s.view = await this.rewardView(env, obs);
        s.applied = input.replay.length;
        s.path = input.replay.map((a) => JSON.stringify(a));
        s.episodeId = input.episodeId;
        s.weights = parseRewardWeights(input.rewardWeights);
        return {
          sessionId: s.id,
          taskQueue: this.deps.workerTaskQueue,
          worker: this.deps.workerName,
          observation,
          replayed: input.replay.length,
          rewardState: initialRewardState(s.view, s.site),
          ...(fastReplay ? { fastReplay } : {}),
        };
      } catch (err) {
        // Half reset is no state to keep: the caller opens a new session.
        await this.close(s.id);
        throw err;
      }
    });
  }

  private async look(env: SessionEnv, screenshotRef?: string): Promise<Look> {
    const obs = await (env instanceof MiniWobEnv ? env.observe({ screenshotRef }) : env.observe());
    return { obs, observation: await this.toRef(obs) };
  }

  /** Observes a started session (unless `look` did) and keeps it. */
  private async register(
    input: StartSessionInput,
    context: BrowserContext,
    env: SessionEnv,
    site: string | null,
    browser: Browser,
    replayed: number,
    opts: StartOptions,
    look?: Look,
  ): Promise<StartSessionResult> {
    const { obs, observation, fastReplay } = look ?? (await this.look(env));
    const view = await this.rewardView(env, obs, look?.clientState);
    // Nobody would ever close a session whose start was given up on: it would keep its site slot.
    opts.signal?.throwIfAborted();
    const session: Session = {
      id: randomUUID(),
      episodeId: input.episodeId,
      context,
      env,
      applied: input.replay.length,
      path: input.replay.map((a) => JSON.stringify(a)),
      view,
      weights: parseRewardWeights(input.rewardWeights),
      site,
      browser,
      lastUsed: Date.now(),
      busy: 0,
    };
    this.sessions.set(session.id, session);
    return {
      sessionId: session.id,
      taskQueue: this.deps.workerTaskQueue,
      worker: this.deps.workerName,
      observation,
      replayed,
      rewardState: initialRewardState(session.view, site),
      ...(fastReplay ? { fastReplay } : {}),
    };
  }

  private async createEnv(input: StartSessionInput, context: BrowserContext, opts: StartOptions): Promise<SessionEnv> {
    if (input.spec.env === 'real') {
      return new RealEnv({
        context,
        blobs: this.deps.blobs,
        runId: input.envOptions?.realRunId ?? '0',
        evaluateAtCap: input.envOptions?.evaluateAtCap ?? false,
        scoring: input.envOptions?.realScoring ?? 'training',
        limiter: this.siteLimiter,
        slotHolder: slotHolder(input.episodeId),
        limiterTimeoutMs: Math.min(this.slotTimeoutMs, opts.maxSlotWaitMs ?? Infinity),
        ...(opts.signal ? { signal: opts.signal } : {}),
        ...(this.deps.realOriginOverride ? { originOverride: (url: string) => realUrl(url, this.deps.realOriginOverride) } : {}),
      });
    }
    return new MiniWobEnv({
      page: await context.newPage(),
      baseUrl: this.deps.miniwobBaseUrl,
      blobs: this.deps.blobs,
      timeLimit: input.envOptions?.miniwobTimeLimit,
      settleMs: this.deps.miniwobSettleMs,
      reward: input.envOptions?.miniwobReward,
    });
  }

  /** What reward detectors see: the page, plus the site's client state where the environment has one. */
  /** `known`: the site's client state at `obs` when it was read already (not read again). */
  private async rewardView(env: SessionEnv, obs: Observation, known?: unknown): Promise<RewardView> {
    // Officially the site's state is read only where agisdk reads it: each read boots the app in a second tab.
    if (!(env instanceof RealEnv) || env.official) return { url: obs.url, axtree: obs.axtree };
    const clientState = known ?? (await env.clientState().catch(() => undefined));
    return { url: obs.url, axtree: obs.axtree, clientState };
  }

  /** The step cap: REAL evaluates here only when the episode asked for it (the official rule is reward 0). */
  async finish(sessionId: string): Promise<FinishSessionResult> {
    const s = this.requireSession(sessionId);
    return this.using(s, () => this.finishIn(s));
  }

  private async finishIn(s: Session): Promise<FinishSessionResult> {
    if (!(s.env instanceof RealEnv)) {
      return { done: false, reward: 0, success: false, reason: 'step cap', evaluated: false };
    }
    const r = await s.env.finishAtCap();
    return {
      done: true,
      reward: r.reward,
      success: r.success,
      reason: r.reason,
      evaluated: r.evaluation !== undefined,
      ...(r.finalStateRef ? { finalStateRef: r.finalStateRef } : {}),
    };
  }

  private requireSession(sessionId: string): Session {
    const s = this.sessions.get(sessionId);
    if (!s) throw ApplicationFailure.retryable(`session ${sessionId} is not on worker ${this.deps.workerName}`, 'SessionLost');
    return s;
  }

  /** Marks a session in use while `work` runs, so the idle sweep leaves it alone. */
  private async using<T>(s: Session, work: () => Promise<T>): Promise<T> {
    s.busy++;
    try {
      return await work();
    } finally {
      s.busy--;
      s.lastUsed = Date.now();
    }
  }

  async step(input: StepSessionInput): Promise<StepSessionResult> {
    const s = this.requireSession(input.sessionId);
    return this.using(s, () => this.stepIn(s, input));
  }

  private async stepIn(s: Session, input: StepSessionInput): Promise<StepSessionResult> {
    // A retry of a step that already ran must not act twice.
    if (s.applied === input.index + 1 && s.last) return s.last;
    if (s.applied !== input.index) {
      throw ApplicationFailure.retryable(`session ${s.id} has applied ${s.applied} actions, the episode expects ${input.index}`, 'SessionLost');
    }
    const out: StepOutcome & { finalStateRef?: string } = await s.env.step(input.action as Action);
    const after = await this.rewardView(s.env, out.observation);
    const shaped = computeReward(
      {
        site: s.site,
        valid: !out.actionError,
        actionKey: actionKey(input.action),
        before: s.view,
        after,
        taskSuccess: out.done ? out.success : null,
        envReward: out.reward,
      },
      input.rewardState,
      s.weights,
    );
    const { goal: _goal, ...observation } = await this.toRef(out.observation);
    const body: Omit<StepSessionResult, 'resultRef'> = {
      observation,
      reward: out.reward,
      done: out.done,
      success: out.success,
      reason: out.reason,
      ...(out.actionError ? { actionError: out.actionError } : {}),
      ...(out.finalStateRef ? { finalStateRef: out.finalStateRef } : {}),
      shaped: { total: shaped.breakdown.total, summary: summarizeBreakdown(shaped.breakdown) },
      rewardState: shaped.state,
    };
    const blob: StepResultBlob = { index: input.index, action: input.action, ...body, breakdown: shaped.breakdown };
    const result: StepSessionResult = { ...body, resultRef: await this.deps.blobs.putJson(blob) };
    s.view = after;
    s.applied++;
    s.path.push(JSON.stringify(input.action));
    s.last = result;
    return result;
  }

  /**
   * Ends a session. A MiniWoB++ page nothing runs on any more is kept loaded for the next session of its task
   * (the pool's limit permitting); everything else is closed.
   */
  async close(sessionId: string): Promise<void> {
    const s = this.sessions.get(sessionId);
    if (!s) return;
    this.sessions.delete(sessionId);
    const env = s.env;
    if (env instanceof MiniWobEnv && s.busy === 0 && this.warm.limit > 0) {
      const key = pageKey(env);
      const keep = () => key !== undefined && this.warm.put({ key, context: s.context, env, browser: s.browser });
      if (key !== undefined && (await env.freeze().then(keep, () => false))) return;
    }
    // The env first: a REAL env gives back its site slot there.
    await s.env.close().catch(() => {});
    await s.context.close().catch(() => {});
  }

  async shutdown(): Promise<void> {
    clearInterval(this.sweeper);
    for (const id of [...this.sessions.keys()]) await this.close(id);
    await this.warm.closeAll();
    for (const browser of this.browsers.values()) await browser.close().catch(() => {});
  }

  private async toRef(obs: Observation): Promise<ObservationRef> {
    return {
      goal: obs.goal,
      url: obs.url,
      step: obs.step,
      width: obs.width,
      height: obs.height,
      screenshotRef: obs.screenshotRef,
      axtreeRef: await this.deps.blobs.put(obs.axtree, 'txt'),
      stateKey: stateKey({ url: obs.url, axtree: obs.axtree }),
    };
  }
}
