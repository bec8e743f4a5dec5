import { ApplicationFailure, proxyActivities } from '@temporalio/workflow';
import type { SessionActivities } from '../activities/session-activities';
import type { Action } from '../lib/model-io/actions';
import type { BrowserWork, EnvOptions, LivedState, ObservationRef, SessionHandle, StepSessionResult, TaskRef } from '../lib/episode/episode-types';
import type { RewardState } from '../lib/rewards/types';
import type { RewardWeights } from '../lib/rewards/weights';
import { isSessionLost } from './session-lost';
import * as profiles from './activity-profiles';

/**
 * Browser sessions that survive their worker. The action path is the state: a session is opened by replaying
 * a path from the task's reset (on any browser worker), works on the worker that holds it, and when that
 * worker dies it is opened again elsewhere from the same path, within a rebuild budget.
 */

export interface SessionSettings {
  task: TaskRef;
  browserTaskQueue: string;
  sessionStartTimeoutMs: number;
  heartbeatTimeoutMs: number;
  rewardWeights: RewardWeights;
  envOptions?: EnvOptions;
  /** Actions every session of this workflow replays first (a test-time search's root); paths count from there. */
  base?: Action[];
}

/** How many times sessions may be lost (shared by whatever the budget covers: an episode, a simulation). */
export interface RebuildBudget {
  used: number;
  max: number;
  /** Appended to the give-up message, e.g. ` in simulation 3`. */
  where?: string;
  onRebuild?: () => void;
}

/** Where a new session should start and the state its path reached when lived (`Sessions.open`). */
export interface OpenAt {
  near?: SessionHandle;
  lived?: LivedState;
}

export class Sessions {
  private pending: Promise<void>[] = [];

  /** REAL forks from a copy of the parent's client state, and those whose copy differed and replayed instead. */
  readonly forks = { snapshot: 0, replayFallback: 0 };

  /**
   * The browser work of these sessions, for comparing methods on it: sessions started (forks and rebuilds
   * included), actions replayed to start or reset them (a snapshot fork replays none), and actions executed
   * as steps of any of them (a step group's candidates included). Counts successes only.
   */
  readonly browser: BrowserWork = { sessions: 0, steps: 0, replayedActions: 0 };

  constructor(readonly settings: SessionSettings) {}

  private opener(summary: string, taskQueue?: string) {
    const s = this.settings;
    return proxyActivities<SessionActivities>(
      taskQueue ? profiles.sessionOpen(taskQueue, s.heartbeatTimeoutMs, summary, s.sessionStartTimeoutMs) : profiles.sessionOpen(s.browserTaskQueue, s.heartbeatTimeoutMs, summary),
    );
  }

  on(handle: SessionHandle, summary: string) {
    const s = this.settings;
    return proxyActivities<SessionActivities>(profiles.onSession(handle.taskQueue, s.sessionStartTimeoutMs, s.heartbeatTimeoutMs, summary));
  }

  /**
   * A new session at the end of `path` (after `base`), on any browser worker, or first on the worker of
   * `at.near` (a step group's forks go where their episode already holds its REAL site slot, so they are
   * admitted with it; if that worker does not pick the start up in time, any worker will do). `at.lived`:
   * the state `path` reached when it was lived, so the replay may skip its settle waits (StartSessionInput).
   */
  async open(path: readonly Action[], episodeId: string, summary: string, at: OpenAt = {}): Promise<DurableSession> {
    if (at.near) {
      try {
        return await this.startOn(path, episodeId, summary, at.lived, at.near.taskQueue);
      } catch (err) {
        if (!isSessionLost(err)) throw err;
      }
    }
    return this.startOn(path, episodeId, summary, at.lived);
  }

  private async startOn(path: readonly Action[], episodeId: string, summary: string, lived?: LivedState, taskQueue?: string): Promise<DurableSession> {
    const s = this.settings;
    const started = await this.opener(summary, taskQueue).startSession({
      spec: s.task,
      replay: [...(s.base ?? []), ...path],
      episodeId,
      rewardWeights: s.rewardWeights,
      envOptions: s.envOptions,
      ...livedInput(lived),
    });
    if (started.fork === 'snapshot') this.forks.snapshot++;
    else if (started.fork === 'replay-fallback') this.forks.replayFallback++;
    this.browser.sessions++;
    if (started.fork !== 'snapshot') this.browser.replayedActions += (s.base?.length ?? 0) + path.length;
    return new DurableSession(this, episodeId, started, started.observation, started.rewardState, [...path]);
  }

  /**
   * An open session (its page and browser context kept) reset by its worker to the end of `path`: a new
   * session's state without a new page. Lost, or an environment that cannot: a session-lost failure.
   */
  async reset(handle: SessionHandle, path: readonly Action[], episodeId: string, summary: string, lived?: LivedState): Promise<DurableSession> {
    const s = this.settings;
    const started = await this.on(handle, summary).resetSession({
      sessionId: handle.sessionId,
      spec: s.task,
      replay: [...(s.base ?? []), ...path],
      episodeId,
      rewardWeights: s.rewardWeights,
      envOptions: s.envOptions,
      ...livedInput(lived),
    });
    this.browser.replayedActions += (s.base?.length ?? 0) + path.length;
    return new DurableSession(this, episodeId, started, started.observation, started.rewardState, [...path]);
  }

  /** The same open session, now working for `episodeId` (its rebuilds, if lost, say so). */
  adopt(session: DurableSession, episodeId: string): DurableSession {
    return new DurableSession(this, episodeId, session.handle, session.observation, session.rewardState, [...session.path]);
  }

  /** Closes a session now; a session whose worker is gone has nothing left to free. */
  async closeQuietly(handle: SessionHandle): Promise<void> {
    try {
      await this.on(handle, 'close session').closeSession({ sessionId: handle.sessionId });
    } catch {
      // The session's worker is gone.
    }
  }

  /**
   * Closes in the background: a session on a worker that died would otherwise hold the caller for the
   * schedule-to-start timeout. `flush` waits for them (before a snapshot, at the end).
   */
  closeLater(handle: SessionHandle): void {
    this.pending.push(this.closeQuietly(handle));
  }

  /** `closeLater` for a session still busy with a background activity: once it is done (undefined: gone already). */
  closeWhenReady(session: Promise<DurableSession | undefined>): void {
    this.pending.push(session.then((s) => (s ? this.closeQuietly(s.handle) : undefined)));
  }

  /**
   * Closes without ever waiting for it: for a session that was lost, whose worker is most likely gone (the
   * close would wait out the schedule-to-start timeout). If the worker lives, the close frees its page and
   * REAL site slot; if not, nothing is left to free.
   */
  closeAndForget(handle: SessionHandle): void {
    void this.closeQuietly(handle);
  }

  async flush(): Promise<void> {
    await Promise.all(this.pending.splice(0));
  }
}

/** One open session and the state it is at: the path since `base`, the latest observation, the shaping state. */
export class DurableSession {
  constructor(
    private readonly sessions: Sessions,
    private readonly episodeId: string,
    public handle: SessionHandle,
    public observation: ObservationRef,
    public rewardState: RewardState,
    public path: Action[],
  ) {}

  /** One step in this session, no rebuild: a lost session is the caller's to handle. */
  async stepOnce(action: Action, summary: string): Promise<StepSessionResult> {
    const out = await this.sessions.on(this.handle, summary).stepSession({
      sessionId: this.handle.sessionId,
      index: (this.sessions.settings.base?.length ?? 0) + this.path.length,
      action,
      rewardState: this.rewardState,
    });
    this.sessions.browser.steps++;
    this.path.push(action);
    this.observation = { ...out.observation, goal: this.observation.goal };
    this.rewardState = out.rewardState;
    return out;
  }

  /**
   * One step; when the session is lost, it is rebuilt from its path (the step is then applied in the new
   * session) until the budget is spent. The step carries its index, so a retried step never acts twice.
   * `onLost`: what to do with the lost session's handle before the rebuild (by default: close it in the
   * background, awaited by `flush`).
   */
  async step(action: Action, summary: string, budget: RebuildBudget, onLost?: (lost: SessionHandle) => void): Promise<StepSessionResult> {
    for (;;) {
      try {
        return await this.stepOnce(action, summary);
      } catch (err) {
        if (!isSessionLost(err)) throw err;
        await this.rebuild(err, budget, onLost ?? ((h) => this.sessions.closeLater(h)));
      }
    }
  }

  private async rebuild(why: unknown, budget: RebuildBudget, onLost: (lost: SessionHandle) => void): Promise<void> {
    if (budget.used >= budget.max) {
      throw ApplicationFailure.nonRetryable(`browser session lost ${budget.used + 1} times${budget.where ?? ''}; giving up (last: ${(why as Error).message})`, 'SessionLost');
    }
    budget.used++;
    budget.onRebuild?.();
    onLost(this.handle);
    const fresh = await this.sessions.open(this.path, this.episodeId, `session lost: rebuild by replaying ${this.path.length} actions`, { lived: this.observation });
    // The shaping state stays the caller's: a rebuilt session continues the same episode's rewards.
    this.handle = fresh.handle;
    this.observation = fresh.observation;
  }

  closeLater(): void {
    this.sessions.closeLater(this.handle);
  }

  closeQuietly(): Promise<void> {
    return this.sessions.closeQuietly(this.handle);
  }
}

/** Only the two fields of a lived state go to the worker (an observation passed as one has more). */
function livedInput(lived: LivedState | undefined): { lived?: LivedState } {
  return lived ? { lived: { stateKey: lived.stateKey, screenshotRef: lived.screenshotRef } } : {};
}
