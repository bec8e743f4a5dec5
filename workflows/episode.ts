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
// Type only: mcts.ts imports this module (trainMcts runs episodes), so the child is started by name.
import type { mctsSearch, MctsSearchInput } from './mcts';
import type { SessionActivities } from '../activities/session';
import type { ControlActivities } from '../activities/control';
import { clip, describeAction, isTerminal, isValidAction, type Action, type AgentAction } from '../lib/actions';
import { parseAction } from '../lib/parse';
import { chooseCandidate } from '../lib/grpo';
import { learnerActivities } from './learner';
import type {
  EpisodeInput,
  EpisodeResult,
  ObservationRef,
  SessionHandle,
  StartSessionResult,
  StepGroup,
  StepRecord,
  StepSessionResult,
} from '../lib/episode-types';
import { actionValidity } from '../lib/episode-stats';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { fnv1a32, rewardForUnparsedOutput, roundReward, summarizeBreakdown } from '../lib/rewards/shaping';
import type { RewardState } from '../lib/rewards/types';
import { parseRewardWeights } from '../lib/rewards/weights';

export const episodeProgressQuery = defineQuery<{ step: number; steps: StepRecord[]; sessionRebuilds: number }>(
  'episodeProgress',
);

interface Sampled {
  promptRef: string;
  candidates: { action: AgentAction; preview: string; completionRef?: string; completion?: string; tokenIds?: number[]; logprobs?: number[] }[];
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
  const groups: StepGroup[] = [];
  const backgroundCloses: Promise<void>[] = [];
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

  async function closeQuietly(s: SessionHandle = session): Promise<void> {
    try {
      await onSession(s, 'close session').closeSession({ sessionId: s.sessionId });
    } catch {
      // The session's worker is gone: nothing is left to free.
    }
  }

  /** Recent actions as the prompt shows them: the activity input (and so the history) stays flat as episodes grow. */
  function promptHistory() {
    return steps.slice(steps.length - Math.min(steps.length, policy.historyLength)).map((s) => ({
      step: s.step,
      action: describeAction(s.action),
      note: s.actionError ?? (s.valid ? undefined : 'invalid'),
    }));
  }

  /** N candidate actions for the current state from the configured backend, parsed. */
  async function sampleCandidates(n: number, summary: string): Promise<Sampled> {
    const { goal, url, step, screenshotRef, axtreeRef } = observation;
    const obs = { goal, url, step, screenshotRef, axtreeRef };
    if (policy.backend === 'colocated') {
      const promptRef = await control(`prompt for step ${step + 1}`).writePrompt({
        observation: obs,
        history: promptHistory(),
        historyLength: policy.historyLength,
      });
      const out = await learnerActivities({
        taskQueue: input.gpuTaskQueue ?? 'gpu',
        summary,
        startToCloseTimeout: '30m',
        heartbeatTimeout: input.learnerHeartbeatTimeoutMs ?? 60_000,
      }).sampleActions({
        run_id: input.runId ?? info.workflowId,
        version: input.adapterVersion ?? 0,
        prompt_ref: promptRef,
        n,
        temperature: policy.temperature,
        max_tokens: policy.maxTokens,
      });
      return {
        promptRef,
        candidates: out.completions.map((c) => ({
          action: parseAction(c.text),
          preview: clip(c.text, 200),
          completion: c.text,
          tokenIds: c.token_ids,
          logprobs: c.logprobs,
        })),
      };
    }
    const res = await control(summary).samplePolicy({ policy: { ...policy, n }, observation: obs, history: promptHistory() });
    return { promptRef: res.promptRef, candidates: res.candidates };
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
      staticSummary: `test-time MCTS for step ${stepNo} of ${label}: ${params.numSimulations} simulations from ${actionPath.length} actions`,
      args: [
        {
          runId: input.runId ?? info.workflowId,
          task,
          params: { ...params, maxDepth: Math.max(1, Math.min(params.maxDepth, maxSteps - stepNo + 1)), outcome: 'self-evaluation' },
          policy,
          adapterVersion: input.adapterVersion ?? 0,
          browserTaskQueue: input.browserTaskQueue,
          gpuTaskQueue: input.gpuTaskQueue ?? 'gpu',
          learnerHeartbeatTimeoutMs: input.learnerHeartbeatTimeoutMs ?? 60_000,
          maxSessionRebuilds: maxRebuilds,
          sessionStartTimeoutMs: startTimeoutMs,
          heartbeatTimeoutMs,
          ...(input.rewardWeights ? { rewardWeights: input.rewardWeights } : {}),
          ...(input.envOptions ? { envOptions: input.envOptions } : {}),
          rootPath: [...actionPath],
        } satisfies MctsSearchInput,
      ],
    });
    const d = res.decision;
    // Every simulation starts by expanding the root, so a finished search always has a decision.
    if (!d) throw ApplicationFailure.nonRetryable(`test-time search ${workflowId} ended without a decision at its root`, 'SearchFailed');
    return {
      promptRef: d.promptRef,
      candidates: [
        {
          action: d.action,
          preview: d.preview ?? '',
          ...(d.completionRef ? { completionRef: d.completionRef } : {}),
        },
      ],
    };
  }

  /**
   * Step grouping: every valid candidate runs from the current state in a session of its own (replaying the
   * action prefix), so each gets its shaped reward from the same state. The episode continues in the chosen
   * candidate's session; the others are closed.
   */
  async function runGroup(sample: Sampled, stepNo: number) {
    const n = sample.candidates.length;
    const outcomes = await Promise.all(
      sample.candidates.map(async (c, i) => {
        if (!isValidAction(c.action)) return { invalid: rewardForUnparsedOutput(observation.stateKey, rewardState, rewardWeights) };
        for (let attempt = 0; ; attempt++) {
          let fork: StartSessionResult | undefined;
          try {
            fork = await opener(`fork ${i + 1}/${n} at step ${stepNo}: replay ${actionPath.length} actions`).startSession({
              spec: task,
              replay: actionPath,
              episodeId: info.workflowId,
              rewardWeights,
              envOptions: input.envOptions,
            });
            const out = await onSession(fork, `candidate ${i + 1}/${n} step ${stepNo}: ${describeAction(c.action)}`).stepSession({
              sessionId: fork.sessionId,
              index: actionPath.length,
              action: c.action,
              rewardState,
            });
            return { fork, out };
          } catch (err) {
            if (fork) await closeQuietly(fork);
            if (!isSessionLost(err) || attempt >= maxRebuilds) throw err;
            sessionRebuilds++;
          }
        }
      }),
    );
    const rewards = outcomes.map((o) => ('out' in o && o.out ? o.out.shaped.total : o.invalid!.breakdown.total));
    const u = parseInt(fnv1a32(`${info.workflowId}:${stepNo}`), 16) / 2 ** 32;
    const chosen = chooseCandidate(rewards, input.grouping!.choose, u);
    groups.push({
      promptRef: sample.promptRef,
      step: stepNo,
      chosen,
      candidates: sample.candidates.map((c, i) => ({
        ...(c.completionRef ? { completionRef: c.completionRef } : { completion: c.completion ?? '' }),
        ...(c.tokenIds ? { tokenIds: c.tokenIds } : {}),
        ...(c.logprobs ? { logprobs: c.logprobs } : {}),
        valid: isValidAction(c.action),
        reward: rewards[i],
      })),
    });
    const picked = outcomes[chosen];
    const closing: Promise<void>[] = [];
    for (const [i, o] of outcomes.entries()) if (i !== chosen && 'fork' in o && o.fork) closing.push(closeQuietly(o.fork));
    if ('fork' in picked && picked.fork) {
      closing.push(closeQuietly(session));
      session = picked.fork;
    }
    // Not awaited here: a session on a worker that died would hold the episode for the schedule-to-start
    // timeout. The closes finish in the background and the episode waits for them only at its end.
    // Episodes started before this change awaited them here; patched() keeps their histories replayable.
    if (patched('background-session-closes')) backgroundCloses.push(...closing);
    else await Promise.all(closing);
    return { chosen, out: 'out' in picked ? picked.out : undefined, invalid: 'invalid' in picked ? picked.invalid : undefined };
  }

  let done = false;
  let success = false;
  let reward = 0;
  let reason: string | null = null;
  try {
    for (let stepNo = 1; stepNo <= maxSteps && !done; stepNo++) {
      const last = steps.at(-1);
      const n = input.grouping?.n ?? policy.n;
      const sampleSummary = `sample step ${stepNo} (${policy.model}, n=${n})${last ? ` · last reward ${last.shaped.total}` : ''}`;
      const sample = input.search ? await searchStep(stepNo) : await sampleCandidates(n, sampleSummary);
      let chosen = 0;
      let stepOut: StepSessionResult | undefined;
      let invalidReward: ReturnType<typeof rewardForUnparsedOutput> | undefined;
      if (input.grouping) {
        const g = await runGroup(sample, stepNo);
        chosen = g.chosen;
        stepOut = g.out;
        invalidReward = g.invalid;
      } else if (isValidAction(sample.candidates[0].action)) {
        stepOut = await stepWithRebuild(sample.candidates[0].action, stepNo);
      } else {
        invalidReward = rewardForUnparsedOutput(observation.stateKey, rewardState, rewardWeights);
      }
      const c = sample.candidates[chosen];
      const { url, step, screenshotRef, axtreeRef } = observation;
      const record: StepRecord = {
        step: stepNo,
        observation: { url, step, screenshotRef, axtreeRef },
        promptRef: sample.promptRef,
        completion: c.preview,
        ...(c.completionRef ? { completionRef: c.completionRef } : {}),
        action: c.action,
        valid: isValidAction(c.action),
        reward: 0,
        shaped: { total: 0, summary: '' },
        done: false,
        url: observation.url,
      };
      if (stepOut && isValidAction(c.action)) {
        actionPath.push(c.action);
        observation = { ...stepOut.observation, goal: observation.goal };
        record.reward = stepOut.reward;
        record.done = stepOut.done || isTerminal(c.action);
        record.url = stepOut.observation.url;
        record.actionError = stepOut.actionError;
        record.shaped = stepOut.shaped;
        record.resultRef = stepOut.resultRef;
        rewardState = stepOut.rewardState;
        done = record.done;
        success = stepOut.success;
        reward = stepOut.reward;
        reason = stepOut.reason;
      } else if (invalidReward) {
        record.shaped = { total: invalidReward.breakdown.total, summary: summarizeBreakdown(invalidReward.breakdown) };
        record.breakdown = invalidReward.breakdown;
        rewardState = invalidReward.state;
      }
      steps.push(record);
      setCurrentDetails(
        `step ${stepNo}/${maxSteps} · ${describeAction(c.action)} · ${record.shaped.summary} · ${record.url}`,
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
    await CancellationScope.nonCancellable(() => Promise.all([closeQuietly(), ...backgroundCloses]));
    throw err;
  }

  const validity = actionValidity(steps);
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
        ...(r.completionRef ? { completionRef: r.completionRef } : { completion: r.completion }),
        // A valid step's action is in its result blob; only an invalid one (and its reason) exists nowhere else.
        ...(r.resultRef ? { resultRef: r.resultRef } : { action: r.action, shaped: r.breakdown }),
      })),
      success,
      reward,
      reason,
    }),
    closeQuietly(),
    ...backgroundCloses,
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
    groups: groups.length,
  };
}
