import {
  ApplicationFailure,
  CancellationScope,
  proxyActivities,
  patched,
  setCurrentDetails,
  upsertSearchAttributes,
  workflowInfo,
  defineQuery,
  executeChild,
  setHandler,
} from '@temporalio/workflow';
import { isSessionLost } from './session-lost';
// Type only: mcts-search.ts imports this module's types, so the child is started by name.
import type { mctsSearch, MctsSearchInput } from './mcts-search';
import type { ControlActivities } from '../activities/control';
import { describeAction, isTerminal, isValidAction, type Action } from '../lib/actions';
import { chooseCandidate } from '../lib/grpo';
import {
  episodeRun,
  type EpisodeInput,
  type EpisodeResult,
  type SessionHandle,
  type StepGroup,
  type StepRecord,
  type StepSessionResult,
} from '../lib/episode-types';
import { actionValidity } from '../lib/episode-stats';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { fnv1a32, rewardForUnparsedOutput, roundReward, summarizeBreakdown } from '../lib/rewards/shaping';
import { parseRewardWeights } from '../lib/rewards/weights';
import { Sessions, type DurableSession, type RebuildBudget } from './durable-session';
import { sample, type Sampled } from './sampler';
import * as profiles from './activity-profiles';

export const episodeProgressQuery = defineQuery<{ step: number; steps: StepRecord[]; sessionRebuilds: number }>(
  'episodeProgress',
);

/**
 * One episode: reset a browser session, then sample → parse → step until the page says done, the agent
 * answers, or maxSteps. The action path is the state: if the session's worker dies, a new session replays
 * the prefix from the same seed and the episode goes on.
 */
export async function episode(input: EpisodeInput): Promise<EpisodeResult> {
  const { task, maxSteps, policy } = input;
  const info = workflowInfo();
  const run = episodeRun(input, info.workflowId);
  const rewardWeights = parseRewardWeights(run.rewardWeights ?? {});

  upsertSearchAttributes([
    { key: KIND, value: 'episode' },
    { key: TASK, value: `${task.env}/${task.task}` },
    { key: RUN_ID, value: run.runId },
    { key: MODE, value: input.mode ?? policy.model },
  ]);

  const control = (summary: string) =>
    proxyActivities<ControlActivities>(profiles.modelCall(policy.timeoutMs, policy.maxAttempts, summary));
  const sessions = new Sessions({
    task,
    browserTaskQueue: run.browserTaskQueue,
    sessionStartTimeoutMs: run.sessionStartTimeoutMs,
    heartbeatTimeoutMs: run.heartbeatTimeoutMs,
    rewardWeights,
    envOptions: run.envOptions,
  });
  const sampler = {
    policy,
    adapterVersion: input.adapterVersion ?? 0,
    ...(input.adapter ? { adapter: input.adapter } : {}),
    runId: run.runId,
    ...(run.baseModel ? { baseModel: run.baseModel } : {}),
    gpuTaskQueue: run.gpuTaskQueue,
    learnerHeartbeatTimeoutMs: run.learnerHeartbeatTimeoutMs,
  };

  const steps: StepRecord[] = [];
  const groups: StepGroup[] = [];
  // Shared by the main session and the forks: the episode gives up after this many lost sessions.
  const budget: RebuildBudget = { used: 0, max: run.maxSessionRebuilds };
  setHandler(episodeProgressQuery, () => ({ step: steps.length, steps, sessionRebuilds: budget.used }));

  const label = `${task.env}/${task.task} seed ${task.seed}`;
  let session: DurableSession = await sessions.open([], info.workflowId, `reset ${label}`);
  const initialObservation = session.observation;
  // A lost session used to be left alone; closing it frees its page (and its REAL site slot) if its worker
  // lives. Never waited for: its worker is most likely gone.
  const onLost = (lost: SessionHandle) => {
    if (patched('close-lost-sessions')) sessions.closeAndForget(lost);
  };

  /** Recent actions as the prompt shows them: the activity input (and so the history) stays flat as episodes grow. */
  function promptHistory() {
    return steps.slice(steps.length - Math.min(steps.length, policy.historyLength)).map((s) => ({
      step: s.step,
      action: describeAction(s.action),
      note: s.actionError ?? (s.valid ? undefined : 'invalid'),
    }));
  }

  async function sampleCandidates(n: number, summary: string): Promise<Sampled> {
    const { goal, url, step, screenshotRef, axtreeRef } = session.observation;
    return sample(sampler, { observation: { goal, url, step, screenshotRef, axtreeRef }, history: promptHistory(), n, store: true, summary });
  }

  /**
   * Test-time MCTS: an `mctsSearch` child searches from the current state (the action path so far is its
   * root) with `search.params`, valuing ended states by self-evaluation; the step plays its root decision,
   * recorded with the completion and prompt it came from. Depth is capped at the steps left.
   */
  async function searchStep(stepNo: number): Promise<Sampled> {
    const params = input.search!.params;
    const workflowId = `${info.workflowId}-search${stepNo}`;
    const res = await executeChild<typeof mctsSearch>('mctsSearch', {
      workflowId,
      taskQueue: info.taskQueue,
      staticSummary: `test-time MCTS for step ${stepNo} of ${label}: ${params.numSimulations} simulations from ${session.path.length} actions`,
      args: [
        {
          run,
          task,
          params: { ...params, maxDepth: Math.max(1, Math.min(params.maxDepth, maxSteps - stepNo + 1)), outcome: 'self-evaluation' },
          policy,
          adapterVersion: input.adapterVersion ?? 0,
          ...(input.adapter ? { adapter: input.adapter } : {}),
          rootPath: [...session.path],
        } satisfies MctsSearchInput,
      ],
    });
    const d = res.decision;
    // Every simulation starts by expanding the root, so a finished search always has a decision.
    if (!d) throw ApplicationFailure.nonRetryable(`test-time search ${workflowId} ended without a decision at its root`, 'SearchFailed');
    return {
      promptRef: d.promptRef,
      candidates: [{ action: d.action, preview: d.preview ?? '', ...(d.completionRef ? { completionRef: d.completionRef } : {}) }],
    };
  }

  /**
   * Step grouping: every valid candidate runs from the current state in a session of its own (replaying the
   * action prefix), so each gets its shaped reward from the same state. The episode continues in the chosen
   * candidate's session; the others are closed.
   */
  async function runGroup(sampled: Sampled, stepNo: number) {
    const n = sampled.candidates.length;
    const here = session;
    const settled = await Promise.allSettled(
      sampled.candidates.map(async (c, i) => {
        if (!isValidAction(c.action)) return { invalid: rewardForUnparsedOutput(here.observation.stateKey, here.rewardState, rewardWeights) };
        for (let attempt = 0; ; attempt++) {
          let fork: DurableSession | undefined;
          try {
            fork = await sessions.open(here.path, info.workflowId, `fork ${i + 1}/${n} at step ${stepNo}: replay ${here.path.length} actions`, here.handle);
            // The fork continues this episode's shaping, not the one its replay rebuilt.
            fork.rewardState = here.rewardState;
            fork.observation = { ...fork.observation, goal: here.observation.goal };
            const out = await fork.stepOnce(c.action, `candidate ${i + 1}/${n} step ${stepNo}: ${describeAction(c.action)}`);
            return { fork, out };
          } catch (err) {
            if (fork) await fork.closeQuietly();
            if (!isSessionLost(err) || attempt >= run.maxSessionRebuilds) throw err;
            budget.used++;
          }
        }
      }),
    );
    const failure = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure) {
      // The group is lost with the episode: forks already open must not keep their pages (and site slots).
      for (const r of settled) if (r.status === 'fulfilled' && 'fork' in r.value && r.value.fork) r.value.fork.closeLater();
      throw failure.reason;
    }
    const outcomes = settled.map((r) => (r as PromiseFulfilledResult<Exclude<(typeof settled)[number], PromiseRejectedResult>['value']>).value);
    const rewards = outcomes.map((o) => ('out' in o && o.out ? o.out.shaped.total : o.invalid!.breakdown.total));
    const u = parseInt(fnv1a32(`${info.workflowId}:${stepNo}`), 16) / 2 ** 32;
    const chosen = chooseCandidate(rewards, input.grouping!.choose, u);
    groups.push({
      promptRef: sampled.promptRef,
      ...(sampled.grammarRef ? { grammarRef: sampled.grammarRef } : {}),
      step: stepNo,
      chosen,
      candidates: sampled.candidates.map((c, i) => ({
        ...(c.completionRef ? { completionRef: c.completionRef } : { completion: c.completion ?? '' }),
        ...(c.tokensRef ? { tokensRef: c.tokensRef } : {}),
        ...(c.tokenIds ? { tokenIds: c.tokenIds } : {}),
        ...(c.logprobs ? { logprobs: c.logprobs } : {}),
        valid: isValidAction(c.action),
        reward: rewards[i],
      })),
    });
    const picked = outcomes[chosen];
    const losers = outcomes.flatMap((o, i) => (i !== chosen && 'fork' in o && o.fork ? [o.fork] : []));
    if ('fork' in picked && picked.fork) {
      losers.push(session);
      session = picked.fork;
    }
    // Not awaited here: a session on a worker that died would hold the episode for the schedule-to-start
    // timeout. The closes finish in the background and the episode waits for them only at its end.
    // Episodes started before this change awaited them here; patched() keeps their histories replayable.
    if (patched('background-session-closes')) for (const s of losers) s.closeLater();
    else await Promise.all(losers.map((s) => s.closeQuietly()));
    return { chosen, out: 'out' in picked ? picked.out : undefined, invalid: 'invalid' in picked ? picked.invalid : undefined };
  }

  let done = false;
  let success = false;
  let reward = 0;
  let reason: string | null = null;
  try {
    for (let stepNo = 1; stepNo <= maxSteps && !done; stepNo++) {
      const last = steps.at(-1);
      const n = input.grouping?.n ?? 1;
      const sampleSummary = `sample step ${stepNo} (${policy.model}, n=${n})${last ? ` · last reward ${last.shaped.total}` : ''}`;
      const sampled = input.search ? await searchStep(stepNo) : await sampleCandidates(n, sampleSummary);
      const before = session.observation;
      let chosen = 0;
      let stepOut: StepSessionResult | undefined;
      let invalidReward: ReturnType<typeof rewardForUnparsedOutput> | undefined;
      if (input.grouping) {
        const g = await runGroup(sampled, stepNo);
        chosen = g.chosen;
        stepOut = g.out;
        invalidReward = g.invalid;
      } else if (isValidAction(sampled.candidates[0].action)) {
        const action = sampled.candidates[0].action;
        stepOut = await session.step(action, `step ${stepNo}: ${describeAction(action)} on ${before.url}`, budget, onLost);
      } else {
        invalidReward = rewardForUnparsedOutput(before.stateKey, session.rewardState, rewardWeights);
      }
      const c = sampled.candidates[chosen];
      const { url, step, screenshotRef, axtreeRef } = before;
      const record: StepRecord = {
        step: stepNo,
        observation: { url, step, screenshotRef, axtreeRef },
        promptRef: sampled.promptRef,
        ...(sampled.grammarRef ? { grammarRef: sampled.grammarRef } : {}),
        completion: c.preview,
        ...(c.completionRef ? { completionRef: c.completionRef } : {}),
        ...(c.tokensRef ? { tokensRef: c.tokensRef } : {}),
        ...(c.tokenIds ? { tokenIds: c.tokenIds, ...(c.logprobs ? { logprobs: c.logprobs } : {}) } : {}),
        action: c.action,
        valid: isValidAction(c.action),
        reward: 0,
        shaped: { total: 0, summary: '' },
        done: false,
        url,
      };
      if (stepOut && isValidAction(c.action)) {
        record.reward = stepOut.reward;
        record.done = stepOut.done || isTerminal(c.action);
        record.url = stepOut.observation.url;
        record.actionError = stepOut.actionError;
        record.shaped = stepOut.shaped;
        record.resultRef = stepOut.resultRef;
        done = record.done;
        success = stepOut.success;
        reward = stepOut.reward;
        reason = stepOut.reason;
      } else if (invalidReward) {
        record.shaped = { total: invalidReward.breakdown.total, summary: summarizeBreakdown(invalidReward.breakdown) };
        record.breakdown = invalidReward.breakdown;
        session.rewardState = invalidReward.state;
      }
      steps.push(record);
      setCurrentDetails(`step ${stepNo}/${maxSteps} · ${describeAction(c.action)} · ${record.shaped.summary} · ${record.url}`);
    }
    if (!done && task.env === 'real') {
      // The step cap: REAL's official rule is reward 0 without evaluation; a switch evaluates instead.
      const fin = await sessions.on(session.handle, `step cap reached after ${maxSteps} steps`).finishSession({ sessionId: session.handle.sessionId });
      if (fin.done) {
        done = true;
        success = fin.success;
        reward = fin.reward;
        reason = fin.reason;
      }
    }
  } catch (err) {
    // Also when the episode is cancelled: the page must not outlive it.
    await CancellationScope.nonCancellable(() => Promise.all([session.closeQuietly(), sessions.flush()]));
    throw err;
  }

  const actionPath: Action[] = session.path;
  const [trajectoryRef] = await Promise.all([
    control('record trajectory').recordTrajectory({
      workflowId: info.workflowId,
      task,
      policyModel: policy.model,
      initial: initialObservation,
      ...(groups.length ? { groups } : {}),
      steps: steps.map((r) => ({
        step: r.step,
        promptRef: r.promptRef,
        ...(r.grammarRef ? { grammarRef: r.grammarRef } : {}),
        ...(r.completionRef ? { completionRef: r.completionRef } : { completion: r.completion }),
        ...(r.tokensRef ? { tokensRef: r.tokensRef } : {}),
        ...(r.tokenIds ? { tokenIds: r.tokenIds, ...(r.logprobs ? { logprobs: r.logprobs } : {}) } : {}),
        // A valid step's action is in its result blob; only an invalid one (and its reason) exists nowhere else.
        ...(r.resultRef ? { resultRef: r.resultRef } : { action: r.action, shaped: r.breakdown }),
      })),
      success,
      reward,
      reason,
    }),
    session.closeQuietly(),
    sessions.flush(),
  ]);
  return {
    workflowId: info.workflowId,
    task,
    success,
    reward,
    shapedReturn: roundReward(steps.reduce((sum, s) => sum + s.shaped.total, 0)),
    steps: steps.length,
    actionValidity: actionValidity(steps),
    validActions: steps.filter((s) => s.valid).length,
    done,
    reason,
    actionPath,
    sessionRebuilds: budget.used,
    ...(sessions.forks.snapshot + sessions.forks.replayFallback > 0
      ? { forkSnapshots: sessions.forks.snapshot, forkReplayFallbacks: sessions.forks.replayFallback }
      : {}),
    trajectoryRef,
    groups: groups.length,
  };
}
