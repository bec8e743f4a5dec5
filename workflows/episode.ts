import { CancellationScope, defineQuery, proxyActivities, setHandler, upsertSearchAttributes, workflowInfo } from '@temporalio/workflow';
import type { ControlActivities } from '../activities/control';
import type { Action } from '../lib/model-io/actions';
import { episodeRun, type EpisodeInput, type EpisodeResult, type ObservationRef } from '../lib/episode/episode-types';
import type { StepRecord } from '../lib/training/experience';
import { leanCompletion } from '../lib/training/completion';
import { actionValidity } from '../lib/episode/episode-stats';
import { KIND, MODE, RUN_ID, TASK } from '../lib/episode/search-attributes';
import { roundReward } from '../lib/rewards/shaping';
import { parseRewardWeights } from '../lib/rewards/weights';
import { Sessions, type RebuildBudget } from './durable-session';
import { playStep, type EpisodeContext, type EpisodeOutcome } from './episode-steps';
import * as profiles from './activity-profiles';

export const episodeProgressQuery = defineQuery<{ step: number; steps: StepRecord[]; sessionRebuilds: number }>('episodeProgress');

/**
 * One episode: reset a browser session, then sample → parse → step until the page says done, the agent
 * answers, or maxSteps. The action path is the state: if the session's worker dies, a new session replays
 * the prefix from the same seed and the episode goes on. The steps are in workflows/episode-steps.ts.
 */
export async function episode(input: EpisodeInput): Promise<EpisodeResult> {
  const ep = await startEpisode(input);
  const initialObservation = ep.session.observation;
  const outcome = await playEpisode(ep);
  const actionPath: Action[] = ep.session.path;
  const [trajectoryRef] = await Promise.all([recordTrajectory(ep, initialObservation, outcome), ep.session.closeQuietly(), ep.sessions.flush()]);
  const { steps, sessions } = ep;
  const tokenIdsMissing = input.policy.tokenIdsOptional ? steps.filter((s) => !s.completion.tokensRef).length : 0;
  return {
    workflowId: ep.workflowId,
    task: input.task,
    success: outcome.success,
    reward: outcome.reward,
    shapedReturn: roundReward(steps.reduce((sum, s) => sum + s.shaped.total, 0)),
    steps: steps.length,
    actionValidity: actionValidity(steps),
    validActions: steps.filter((s) => s.completion.valid).length,
    done: outcome.done,
    reason: outcome.reason,
    actionPath,
    sessionRebuilds: ep.budget.used,
    ...(sessions.forks.snapshot + sessions.forks.replayFallback > 0 ? { forkSnapshots: sessions.forks.snapshot, forkReplayFallbacks: sessions.forks.replayFallback } : {}),
    browser: { ...sessions.browser },
    ...(tokenIdsMissing ? { tokenIdsMissing } : {}),
    trajectoryRef,
    groups: ep.groups.length,
  };
}

/** The episode's search attributes, its progress query, and a browser session reset to the task's start. */
async function startEpisode(input: EpisodeInput): Promise<EpisodeContext> {
  const { task, policy } = input;
  const info = workflowInfo();
  const run = episodeRun(input, info.workflowId);
  const rewardWeights = parseRewardWeights(run.rewardWeights ?? {});
  upsertSearchAttributes([
    { key: KIND, value: 'episode' },
    { key: TASK, value: `${task.env}/${task.task}` },
    { key: RUN_ID, value: run.runId },
    { key: MODE, value: input.mode ?? policy.model },
  ]);
  const steps: StepRecord[] = [];
  const budget: RebuildBudget = { used: 0, max: run.maxSessionRebuilds };
  setHandler(episodeProgressQuery, () => ({ step: steps.length, steps, sessionRebuilds: budget.used }));
  const sessions = new Sessions({
    task,
    browserTaskQueue: run.browserTaskQueue,
    sessionStartTimeoutMs: run.sessionStartTimeoutMs,
    heartbeatTimeoutMs: run.heartbeatTimeoutMs,
    rewardWeights,
    envOptions: run.envOptions,
  });
  const label = `${task.env}/${task.task} seed ${task.seed}`;
  const session = await sessions.open([], info.workflowId, `reset ${label}`);
  const sampler = {
    policy,
    adapterVersion: input.adapterVersion ?? 0,
    ...(input.adapter ? { adapter: input.adapter } : {}),
    runId: run.runId,
    ...(run.baseModel ? { baseModel: run.baseModel } : {}),
    gpuTaskQueue: run.gpuTaskQueue,
    learnerHeartbeatTimeoutMs: run.learnerHeartbeatTimeoutMs,
    ...(input.drawKey ? { drawKey: input.drawKey } : {}),
  };
  return { input, workflowId: info.workflowId, taskQueue: info.taskQueue, run, rewardWeights, label, sessions, sampler, session, steps, groups: [], budget };
}

/** The steps until the episode is done or at maxSteps (then, on REAL, the step cap's rule). */
async function playEpisode(ep: EpisodeContext): Promise<EpisodeOutcome> {
  const outcome: EpisodeOutcome = { done: false, success: false, reward: 0, reason: null };
  try {
    for (let stepNo = 1; stepNo <= ep.input.maxSteps && !outcome.done; stepNo++) await playStep(ep, stepNo, outcome);
    if (!outcome.done && ep.input.task.env === 'real') await finishAtStepCap(ep, outcome);
  } catch (err) {
    // Also when the episode is cancelled: the page must not outlive it.
    await CancellationScope.nonCancellable(() => Promise.all([ep.session.closeQuietly(), ep.sessions.flush()]));
    throw err;
  }
  return outcome;
}

/** The step cap on REAL: the official rule is reward 0 without evaluation; a switch evaluates instead. */
async function finishAtStepCap(ep: EpisodeContext, outcome: EpisodeOutcome): Promise<void> {
  const { handle } = ep.session;
  const fin = await ep.sessions.on(handle, `step cap reached after ${ep.input.maxSteps} steps`).finishSession({ sessionId: handle.sessionId });
  if (fin.done) Object.assign(outcome, { done: true, success: fin.success, reward: fin.reward, reason: fin.reason });
}

/** The trajectory to the blob store; returns its reference. Scheduled at once, so it runs beside the closes. */
function recordTrajectory(ep: EpisodeContext, initial: ObservationRef, outcome: EpisodeOutcome): Promise<string> {
  const { policy } = ep.input;
  const control = proxyActivities<ControlActivities>(profiles.modelCall(policy.timeoutMs, policy.maxAttempts, 'record trajectory'));
  return control.recordTrajectory({
    workflowId: ep.workflowId,
    task: ep.input.task,
    policyModel: policy.model,
    initial,
    ...(ep.groups.length ? { groups: ep.groups.map((g) => ({ ...g, candidates: g.candidates.map((c) => ({ ...c, completion: leanCompletion(c.completion) })) })) } : {}),
    steps: ep.steps.map((r) => ({
      step: r.step,
      promptRef: r.promptRef,
      ...(r.grammarRef ? { grammarRef: r.grammarRef } : {}),
      completion: leanCompletion(r.completion, r.resultRef !== undefined),
      // A valid step's outcome is in its result blob; only an invalid one's reward (and its reason) exists nowhere else.
      ...(r.resultRef ? { resultRef: r.resultRef } : { shaped: r.breakdown }),
    })),
    success: outcome.success,
    reward: outcome.reward,
    reason: outcome.reason,
  });
}
