import { ApplicationFailure, Context, heartbeat } from '@temporalio/activity';
import type { Browser, BrowserContext } from 'playwright-core';
import { randomUUID } from 'node:crypto';
import type { BlobStore } from '../blob/store';
import { launchChromium } from '../env/browser';
import { MiniWobEnv } from '../env/miniwob';
import { assertMiniwobTask } from '../env/miniwob-tasks';
import type { Observation } from '../env/types';
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
} from '../lib/episode-types';

interface Session {
  id: string;
  episodeId: string;
  context: BrowserContext;
  env: MiniWobEnv;
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
}

/**
 * Browser sessions of one worker process. A session is a page in its own browser context; it lives only
 * here, so everything after `startSession` is routed to this worker's own task queue.
 */
export class SessionManager {
  private browser?: Browser;
  private readonly sessions = new Map<string, Session>();

  constructor(private readonly deps: SessionDeps) {}

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

  async start(input: StartSessionInput, beat: (d: unknown) => void = () => {}): Promise<StartSessionResult> {
    if (input.spec.env !== 'miniwob') {
      throw ApplicationFailure.nonRetryable(`unknown environment ${JSON.stringify(input.spec.env)}`, 'UnknownEnvironment');
    }
    try {
      assertMiniwobTask(input.spec.task, this.deps.miniwobTasks);
    } catch (err) {
      throw ApplicationFailure.nonRetryable((err as Error).message, 'UnknownTask');
    }
    const browser = await this.ensureBrowser();
    const context = await browser.newContext({ viewport: this.deps.viewport ?? { width: 1280, height: 720 } });
    try {
      const page = await context.newPage();
      const env = new MiniWobEnv({ page, baseUrl: this.deps.miniwobBaseUrl, blobs: this.deps.blobs });
      await env.reset(input.spec);
      for (const [i, action] of input.replay.entries()) {
        await env.apply(action);
        beat({ replayed: i + 1 });
      }
      const obs = await env.observe();
      const observation = await this.toRef(obs);
      const site = null; // MiniWoB has no milestones: general shaping plus its own reward
      const session: Session = {
        id: randomUUID(),
        episodeId: input.episodeId,
        context,
        env,
        applied: input.replay.length,
        view: { url: obs.url, axtree: obs.axtree },
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

  async step(input: StepSessionInput): Promise<StepSessionResult> {
    const s = this.sessions.get(input.sessionId);
    if (!s) {
      throw ApplicationFailure.retryable(`session ${input.sessionId} is not on worker ${this.deps.workerName}`, 'SessionLost');
    }
    // A retry of a step that already ran must not act twice.
    if (s.applied === input.index + 1 && s.last) return s.last;
    if (s.applied !== input.index) {
      throw ApplicationFailure.retryable(
        `session ${s.id} has applied ${s.applied} actions, the episode expects ${input.index}`,
        'SessionLost',
      );
    }
    const out = await s.env.step(input.action as Action);
    const after: RewardView = { url: out.observation.url, axtree: out.observation.axtree };
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
    const body: Omit<StepSessionResult, 'resultRef'> = {
      observation: await this.toRef(out.observation),
      reward: out.reward,
      done: out.done,
      success: out.success,
      reason: out.reason,
      ...(out.actionError ? { actionError: out.actionError } : {}),
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
    async closeSession(input: { sessionId: string }): Promise<void> {
      await manager.close(input.sessionId);
    },
  };
}

export type SessionActivities = ReturnType<typeof createSessionActivities>;
