import { ApplicationFailure, Context, heartbeat } from '@temporalio/activity';
import type { Browser, BrowserContext } from 'playwright-core';
import { randomUUID } from 'node:crypto';
import type { BlobStore } from '../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../env/browser';
import { RealEnv, SiteUnreachableError, checkSiteHealth } from '../env/real';
import { UnscorableTaskError } from '../env/real-eval';
import { UnknownRealTaskError, getRealTask } from '../env/real-tasks';
import { SiteLimiter } from '../env/site-limits';
import { MiniWobEnv } from '../env/miniwob';
import { assertMiniwobTask } from '../env/miniwob-tasks';
import type { Observation, StepOutcome, TaskSpec } from '../env/types';
import { actionKey, type Action } from '../lib/actions';
import { computeReward, initialRewardState, stateKey, summarizeBreakdown } from '../lib/rewards/shaping';
import type { RewardView } from '../lib/rewards/types';
import { parseRewardWeights, type RewardWeights } from '../lib/rewards/weights';
import type {
  ObservationRef,
  StartSessionInput,
  StartSessionResult,
  StepSessionInput,
  StepSessionResult,
  StepResultBlob,
  FinishSessionResult,
} from '../lib/episode-types';

type SessionEnv = MiniWobEnv | RealEnv;

interface Session {
  id: string;
  episodeId: string;
  context: BrowserContext;
  env: SessionEnv;
  applied: number;
  last?: StepSessionResult;
  /** The page as the policy last saw it: the "before" of the next step's reward. */
  view: RewardView;
  weights: RewardWeights;
  site: string | null;
}

export interface SessionDeps {
  blobs: BlobStore;
  miniwobBaseUrl: string;
  miniwobTasks: string[];
  /** This worker's own task queue: session activities after the first are routed here. */
  workerTaskQueue: string;
  workerName: string;
  viewport?: { width: number; height: number };
  /** Serve every REAL task from this origin instead of its own (a local mirror, or the test site). */
  realOriginOverride?: string;
  /** Concurrent REAL episodes per site on this worker. */
  siteConcurrency?: number;
}

/** Known permanent environment errors become non-retryable failures that say what is wrong. */
function permanentEnvError(err: unknown): ApplicationFailure | undefined {
  if (err instanceof UnknownRealTaskError || err instanceof UnscorableTaskError || err instanceof SiteUnreachableError) {
    return ApplicationFailure.nonRetryable((err as Error).message, (err as Error).name);
  }
  return undefined;
}

/**
 * Browser sessions of one worker process. A session is a page in its own browser context; it lives only
 * here, so everything after `startSession` is routed to this worker's own task queue.
 */
export class SessionManager {
  private browser?: Browser;
  private readonly sessions = new Map<string, Session>();
  private readonly siteLimiter: SiteLimiter;

  constructor(private readonly deps: SessionDeps) {
    this.siteLimiter = new SiteLimiter(deps.siteConcurrency ?? 4);
  }

  get size(): number {
    return this.sessions.size;
  }

  private async ensureBrowser(): Promise<Browser> {
    if (this.browser?.isConnected()) return this.browser;
    // A crashed browser takes its sessions with it; their episodes rebuild them from the action path.
    this.sessions.clear();
    this.browser = await launchChromium();
    return this.browser;
  }

  /** A page in a fresh context, reset to the task, with the episode's action prefix replayed. */
  async start(input: StartSessionInput, beat: (d: unknown) => void = () => {}): Promise<StartSessionResult> {
    const site = this.validateTask(input.spec);
    if (input.spec.env === 'real') await this.checkHealth(input.spec.task);
    const browser = await this.ensureBrowser();
    // Service workers would bypass the navigation guard of REAL pages.
    const context = await browser.newContext({ viewport: this.deps.viewport ?? DEFAULT_VIEWPORT, serviceWorkers: 'block' });
    try {
      const env = await this.createEnv(input, context);
      try {
        await env.reset(input.spec);
      } catch (err) {
        throw permanentEnvError(err) ?? err;
      }
      for (const [i, action] of input.replay.entries()) {
        await env.apply(action);
        beat({ replayed: i + 1 });
      }
      const obs = await env.observe();
      const observation = await this.toRef(obs);
      const session: Session = {
        id: randomUUID(),
        episodeId: input.episodeId,
        context,
        env,
        applied: input.replay.length,
        view: await this.rewardView(env, obs),
        weights: parseRewardWeights(input.rewardWeights),
        site,
      };
      this.sessions.set(session.id, session);
      return {
        sessionId: session.id,
        taskQueue: this.deps.workerTaskQueue,
        worker: this.deps.workerName,
        observation,
        replayed: input.replay.length,
        rewardState: initialRewardState(session.view, site),
      };
    } catch (err) {
      await context.close().catch(() => {});
      throw err;
    }
  }

  /** The task's milestone site (REAL), null for MiniWoB; unknown tasks are permanent errors. */
  private validateTask(spec: TaskSpec): string | null {
    try {
      if (spec.env === 'miniwob') {
        assertMiniwobTask(spec.task, this.deps.miniwobTasks);
        return null;
      }
      if (spec.env === 'real') {
        const task = getRealTask(spec.task);
        if (!task.scorable) throw new UnscorableTaskError(task);
        return task.site;
      }
    } catch (err) {
      throw permanentEnvError(err) ?? ApplicationFailure.nonRetryable((err as Error).message, 'UnknownTask');
    }
    throw ApplicationFailure.nonRetryable(`unknown environment ${JSON.stringify((spec as { env: unknown }).env)}`, 'UnknownEnvironment');
  }

  private async checkHealth(taskId: string): Promise<void> {
    const url = this.realUrl(getRealTask(taskId).startUrl);
    try {
      await checkSiteHealth(url);
    } catch (err) {
      throw permanentEnvError(err) ?? err;
    }
  }

  private realUrl(url: string): string {
    const override = this.deps.realOriginOverride;
    if (!override) return url;
    const u = new URL(url);
    return new URL(u.pathname + u.search + u.hash, override).toString();
  }

  private async createEnv(input: StartSessionInput, context: BrowserContext): Promise<SessionEnv> {
    if (input.spec.env === 'real') {
      return new RealEnv({
        context,
        blobs: this.deps.blobs,
        runId: input.envOptions?.realRunId ?? '0',
        evaluateAtCap: input.envOptions?.evaluateAtCap ?? false,
        limiter: this.siteLimiter,
        ...(this.deps.realOriginOverride ? { originOverride: (url: string) => this.realUrl(url) } : {}),
      });
    }
    return new MiniWobEnv({ page: await context.newPage(), baseUrl: this.deps.miniwobBaseUrl, blobs: this.deps.blobs });
  }

  /** What reward detectors see: the page, plus the site's client state where the environment has one. */
  private async rewardView(env: SessionEnv, obs: Observation): Promise<RewardView> {
    if (!(env instanceof RealEnv)) return { url: obs.url, axtree: obs.axtree };
    const clientState = await env.clientState().catch(() => undefined);
    return { url: obs.url, axtree: obs.axtree, clientState };
  }

  /** The step cap: REAL evaluates here only when the episode asked for it (the official rule is reward 0). */
  async finish(sessionId: string): Promise<FinishSessionResult> {
    const s = this.requireSession(sessionId);
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

  async step(input: StepSessionInput): Promise<StepSessionResult> {
    const s = this.requireSession(input.sessionId);
    // A retry of a step that already ran must not act twice.
    if (s.applied === input.index + 1 && s.last) return s.last;
    if (s.applied !== input.index) {
      throw ApplicationFailure.retryable(
        `session ${s.id} has applied ${s.applied} actions, the episode expects ${input.index}`,
        'SessionLost',
      );
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
    s.last = result;
    return result;
  }

  async close(sessionId: string): Promise<void> {
    const s = this.sessions.get(sessionId);
    if (!s) return;
    this.sessions.delete(sessionId);
    // The env first: a REAL env gives back its site slot there.
    await s.env.close().catch(() => {});
    await s.context.close().catch(() => {});
  }

  async shutdown(): Promise<void> {
    for (const id of [...this.sessions.keys()]) await this.close(id);
    await this.browser?.close().catch(() => {});
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

/** Heartbeats every second while `work` runs, so a dead worker is noticed within the heartbeat timeout. */
async function withHeartbeat<T>(work: (beat: (d: unknown) => void) => Promise<T>): Promise<T> {
  let details: unknown;
  const beat = (d: unknown) => {
    details = d;
    heartbeat(d);
  };
  heartbeat();
  const timer = setInterval(() => heartbeat(details), 1000);
  try {
    return await work(beat);
  } finally {
    clearInterval(timer);
  }
}

export function createSessionActivities(manager: SessionManager) {
  return {
    async startSession(input: StartSessionInput): Promise<StartSessionResult> {
      return withHeartbeat((beat) => manager.start(input, beat));
    },
    async stepSession(input: StepSessionInput): Promise<StepSessionResult> {
      Context.current().log.debug('step', { sessionId: input.sessionId, index: input.index });
      return withHeartbeat(() => manager.step(input));
    },
    async finishSession(input: { sessionId: string }): Promise<FinishSessionResult> {
      return withHeartbeat(() => manager.finish(input.sessionId));
    },
    async closeSession(input: { sessionId: string }): Promise<void> {
      await manager.close(input.sessionId);
    },
  };
}

export type SessionActivities = ReturnType<typeof createSessionActivities>;
