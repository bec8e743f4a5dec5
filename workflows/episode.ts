import {
  ActivityFailure,
  ApplicationFailure,
  CancellationScope,
  TimeoutFailure,
  proxyActivities,
  setCurrentDetails,
  upsertSearchAttributes,
  workflowInfo,
  defineQuery,
  setHandler,
} from '@temporalio/workflow';
import type { SessionActivities } from '../activities/session';
import type { ControlActivities } from '../activities/control';
import { describeAction, isTerminal, isValidAction, type Action } from '../lib/actions';
import type {
  EpisodeInput,
  EpisodeResult,
  ObservationRef,
  SessionHandle,
  StepRecord,
  StepSessionResult,
} from '../lib/episode-types';
import { actionValidity } from '../lib/episode-stats';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { rewardForUnparsedOutput, roundReward, summarizeBreakdown } from '../lib/rewards/shaping';
import type { RewardState } from '../lib/rewards/types';
import { parseRewardWeights } from '../lib/rewards/weights';

export const episodeProgressQuery = defineQuery<{ step: number; steps: StepRecord[]; sessionRebuilds: number }>(
  'episodeProgress',
);

/** Session errors that mean "this browser session is gone": rebuild it elsewhere from the action prefix. */
function isSessionLost(err: unknown): boolean {
  if (!(err instanceof ActivityFailure)) return false;
  const cause = err.cause;
  if (cause instanceof TimeoutFailure) return true;
  if (cause instanceof ApplicationFailure) return !cause.nonRetryable;
  return false;
}

/**
 * One episode: reset a browser session, then sample → parse → step until the page says done, the agent
 * answers, or maxSteps. The action path is the state: if the session's worker dies, a new session replays
 * the prefix from the same seed and the episode goes on.
 */
export async function episode(input: EpisodeInput): Promise<EpisodeResult> {
  const { task, maxSteps, policy } = input;
  const info = workflowInfo();
  const maxRebuilds = input.maxSessionRebuilds ?? 5;
  const startTimeoutMs = input.sessionStartTimeoutMs ?? 20_000;
  const heartbeatTimeoutMs = input.heartbeatTimeoutMs ?? 10_000;
  const rewardWeights = parseRewardWeights(input.rewardWeights ?? {});

  upsertSearchAttributes([
    { key: KIND, value: 'episode' },
    { key: TASK, value: `${task.env}/${task.task}` },
    { key: RUN_ID, value: input.runId ?? info.workflowId },
    { key: MODE, value: input.mode ?? policy.model },
  ]);

  const control = (summary: string) =>
    proxyActivities<ControlActivities>({
      summary,
      startToCloseTimeout: policy.timeoutMs + 30_000,
      retry: { initialInterval: '1s', backoffCoefficient: 2, maximumInterval: '30s', maximumAttempts: policy.maxAttempts },
    });
  // Any browser worker may open a session; the answer names that worker's own queue.
  const opener = (summary: string) =>
    proxyActivities<SessionActivities>({
      summary,
      taskQueue: input.browserTaskQueue,
      startToCloseTimeout: '5m',
      heartbeatTimeout: heartbeatTimeoutMs,
      retry: { maximumAttempts: 3, initialInterval: '1s' },
    });
  // Session activities go to the one worker holding the page. One attempt: a failure there means the
  // session is suspect, and the episode rebuilds it rather than retrying into a dead queue.
  const onSession = (s: SessionHandle, summary: string) =>
    proxyActivities<SessionActivities>({
      summary,
      taskQueue: s.taskQueue,
      scheduleToStartTimeout: startTimeoutMs,
      startToCloseTimeout: '2m',
      heartbeatTimeout: heartbeatTimeoutMs,
      retry: { maximumAttempts: 1 },
    });

  const steps: StepRecord[] = [];
  const actionPath: Action[] = [];
  let sessionRebuilds = 0;
  setHandler(episodeProgressQuery, () => ({ step: steps.length, steps, sessionRebuilds }));

  const label = `${task.env}/${task.task} seed ${task.seed}`;
  let started = await opener(`reset ${label}`).startSession({
    spec: task,
    replay: [],
    episodeId: info.workflowId,
    rewardWeights,
    envOptions: input.envOptions,
  });
  let session: SessionHandle = started;
  let observation: ObservationRef = started.observation;
  const initialObservation = started.observation;
  // Shaping state lives here, not in the session, so a rebuilt session continues the same episode's rewards.
  let rewardState: RewardState = started.rewardState;

  async function rebuildSession(why: unknown): Promise<void> {
    if (sessionRebuilds >= maxRebuilds) {
      throw ApplicationFailure.nonRetryable(
        `browser session lost ${sessionRebuilds + 1} times; giving up (last: ${(why as Error).message})`,
        'SessionLost',
      );
    }
    sessionRebuilds++;
    started = await opener(`rebuild session: replay ${actionPath.length} actions of ${label}`).startSession({
      spec: task,
      replay: actionPath,
      episodeId: info.workflowId,
      rewardWeights,
      envOptions: input.envOptions,
    });
    session = started;
    observation = started.observation;
  }

  async function stepWithRebuild(action: Action, stepNo: number): Promise<StepSessionResult> {
    for (;;) {
      try {
        return await onSession(session, `step ${stepNo}: ${describeAction(action)} on ${observation.url}`).stepSession({
          sessionId: session.sessionId,
          index: actionPath.length,
          action,
          rewardState,
        });
      } catch (err) {
        if (!isSessionLost(err)) throw err;
        await rebuildSession(err);
      }
    }
  }

  async function closeQuietly(): Promise<void> {
    try {
      await onSession(session, 'close session').closeSession({ sessionId: session.sessionId });
    } catch {
      // The session's worker is gone: nothing is left to free.
    }
  }

  let done = false;
  let success = false;
  let reward = 0;
  let reason: string | null = null;
  try {
    for (let stepNo = 1; stepNo <= maxSteps && !done; stepNo++) {
      // Only what the prompt shows: the activity input (and so the history) stays flat as episodes grow.
      const history = steps.slice(steps.length - Math.min(steps.length, policy.historyLength)).map((s) => ({
        step: s.step,
        action: describeAction(s.action),
        note: s.actionError ?? (s.valid ? undefined : 'invalid'),
      }));
      const last = steps.at(-1);
      const sampleSummary = `sample step ${stepNo} (${policy.model}, n=${policy.n})${last ? ` · last reward ${last.shaped.total}` : ''} · ${observation.url}`;
      const { goal, url, step, screenshotRef, axtreeRef } = observation;
      const sample = await control(sampleSummary).samplePolicy({
        policy,
        observation: { goal, url, step, screenshotRef, axtreeRef },
        history,
      });
      const chosen = sample.candidates[0];
      const record: StepRecord = {
        step: stepNo,
        observation: { url, step, screenshotRef, axtreeRef },
        completion: chosen.preview,
        completionRef: chosen.completionRef,
        action: chosen.action,
        valid: isValidAction(chosen.action),
        reward: 0,
        shaped: { total: 0, summary: '' },
        done: false,
        url: observation.url,
      };
      if (!isValidAction(chosen.action)) {
        const r = rewardForUnparsedOutput(observation.stateKey, rewardState, rewardWeights);
        record.shaped = { total: r.breakdown.total, summary: summarizeBreakdown(r.breakdown) };
        record.breakdown = r.breakdown;
        rewardState = r.state;
      } else {
        const out = await stepWithRebuild(chosen.action, stepNo);
        actionPath.push(chosen.action);
        observation = out.observation;
        record.reward = out.reward;
        record.done = out.done || isTerminal(chosen.action);
        record.url = out.observation.url;
        record.actionError = out.actionError;
        record.shaped = out.shaped;
        record.resultRef = out.resultRef;
        rewardState = out.rewardState;
        done = record.done;
        success = out.success;
        reward = out.reward;
        reason = out.reason;
      }
      steps.push(record);
      setCurrentDetails(
        `step ${stepNo}/${maxSteps} · ${describeAction(chosen.action)} · ${record.shaped.summary} · ${record.url}`,
      );
    }
    if (!done && task.env === 'real') {
      // The step cap: REAL's official rule is reward 0 without evaluation; a switch evaluates instead.
      const fin = await onSession(session, `step cap reached after ${maxSteps} steps`).finishSession({ sessionId: session.sessionId });
      if (fin.done) {
        done = true;
        success = fin.success;
        reward = fin.reward;
        reason = fin.reason;
      }
    }
  } catch (err) {
    // Also when the episode is cancelled: the page must not outlive it.
    await CancellationScope.nonCancellable(closeQuietly);
    throw err;
  }

  const validity = actionValidity(steps);
  const [trajectoryRef] = await Promise.all([
    control('record trajectory').recordTrajectory({
      workflowId: info.workflowId,
      task,
      policyModel: policy.model,
      initial: initialObservation,
      steps: steps.map((r) => ({
        step: r.step,
        completionRef: r.completionRef,
        action: r.action,
        ...(r.resultRef ? { resultRef: r.resultRef } : { shaped: r.breakdown }),
      })),
      success,
      reward,
      reason,
    }),
    closeQuietly(),
  ]);
  return {
    workflowId: info.workflowId,
    task,
    success,
    reward,
    shapedReturn: roundReward(steps.reduce((sum, s) => sum + s.shaped.total, 0)),
    steps: steps.length,
    actionValidity: validity,
    validActions: steps.filter((s) => s.valid).length,
    done,
    reason,
    actionPath,
    sessionRebuilds,
    trajectoryRef,
  };
}
