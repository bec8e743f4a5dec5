import { ApplicationFailure, executeChild, patched, setCurrentDetails } from '@temporalio/workflow';
import type { mctsSearch, MctsSearchInput } from './mcts-search';
import { describeAction, isTerminal, isValidAction, type Action } from '../lib/model-io/actions';
import type { EpisodeInput, ObservationRef, SessionHandle, StepSessionResult } from '../lib/episode/episode-types';
import type { Completion, StepGroup, StepRecord } from '../lib/training/experience';
import { asCompletion, type FlatCompletion } from '../lib/training/completion';
import type { RunContext } from '../lib/episode/run-context';
import { rewardForUnparsedOutput, summarizeBreakdown } from '../lib/rewards/shaping';
import type { RewardWeights } from '../lib/rewards/weights';
import type { DurableSession, RebuildBudget, Sessions } from './durable-session';
import { runGroup } from './episode-group';
import { sample, type Sampled, type SamplerSettings } from './sampler';

/**
 * The steps of one episode (workflows/episode.ts). Every activity, child workflow and patched() call they
 * make is in the histories of episodes already run, so their order is part of the contract: replays of
 * those histories (test/integration/replay.test.ts) must find the same commands in the same order.
 */

/** What the steps of one episode work with: its input and run, where its sessions and samples come from, the record so far. */
export interface EpisodeContext {
  input: EpisodeInput;
  workflowId: string;
  /** The task queue the episode runs on: a test-time search child runs there too. */
  taskQueue: string;
  run: RunContext;
  rewardWeights: RewardWeights;
  /** `env/task seed N`, for summaries. */
  label: string;
  sessions: Sessions;
  sampler: SamplerSettings;
  /** The session the episode goes on in; a step group moves it to the chosen candidate's fork. */
  session: DurableSession;
  steps: StepRecord[];
  groups: StepGroup[];
  /** Shared by the main session and the forks: the episode gives up after this many lost sessions. */
  budget: RebuildBudget;
}

/** How the episode ended (so far): set by every valid step, and by the step cap's evaluation on REAL. */
export interface EpisodeOutcome {
  done: boolean;
  success: boolean;
  reward: number;
  reason: string | null;
}

export type InvalidOutputReward = ReturnType<typeof rewardForUnparsedOutput>;

/** A step's sampled action run: which candidate the episode goes on with, and its result (or the reward of its unparseable output). */
export interface PlayedStep {
  chosen: number;
  out?: StepSessionResult;
  invalid?: InvalidOutputReward;
}

/** One step: the next action sampled (or searched), run (alone or as a step group), recorded. */
export async function playStep(ep: EpisodeContext, stepNo: number, outcome: EpisodeOutcome): Promise<void> {
  const sampled = ep.input.search ? await searchStep(ep, stepNo) : await sampleCandidates(ep, stepNo);
  const before = ep.session.observation;
  const played = await runStep(ep, sampled, stepNo, before);
  const c = sampled.candidates[played.chosen];
  const record = stepRecord(stepNo, before, sampled, c);
  if (played.out && isValidAction(c.action)) {
    applyStepResult(record, c.action, played.out, outcome);
  } else if (played.invalid) {
    record.shaped = { total: played.invalid.breakdown.total, summary: summarizeBreakdown(played.invalid.breakdown) };
    record.breakdown = played.invalid.breakdown;
    ep.session.rewardState = played.invalid.state;
  }
  ep.steps.push(record);
  setCurrentDetails(`step ${stepNo}/${ep.input.maxSteps} · ${describeAction(c.action)} · ${record.shaped.summary} · ${record.url}`);
}

/**
 * n candidates (the step group's size, else 1) from the policy at the session's state. Draw 0 is the step's own;
 * later draws are dynamic sampling's extra candidates for a group whose candidates all scored the same, drawn
 * with the group's exploration.
 */
async function sampleCandidates(ep: EpisodeContext, stepNo: number, draw = 0): Promise<Sampled> {
  const { policy, grouping } = ep.input;
  const last = ep.steps.at(-1);
  const n = grouping?.n ?? 1;
  const explore = draw > 0 ? (grouping?.explore ?? 0) : 0;
  const what = draw > 0 ? `extra draw ${draw} for step ${stepNo}${explore ? ` (ε ${explore})` : ''}` : `sample step ${stepNo}`;
  const summary = `${what} (${policy.model}, n=${n})${last ? ` · last reward ${last.shaped.total}` : ''}`;
  const { goal, url, step, screenshotRef, axtreeRef } = ep.session.observation;
  return sample(ep.sampler, {
    observation: { goal, url, step, screenshotRef, axtreeRef },
    history: promptHistory(ep),
    n,
    store: true,
    summary,
    seedKey: `step ${stepNo} draw ${draw}`,
    ...(explore ? { explore } : {}),
  });
}

/** Recent actions as the prompt shows them: the activity input (and so the history) stays flat as episodes grow. */
function promptHistory(ep: EpisodeContext) {
  const { steps } = ep;
  return steps.slice(steps.length - Math.min(steps.length, ep.input.policy.historyLength)).map((s) => ({
    step: s.step,
    action: describeAction(s.completion.action),
    note: s.actionError ?? (s.completion.valid ? undefined : 'invalid'),
  }));
}

/**
 * Test-time MCTS: an `mctsSearch` child searches from the current state (the action path so far is its
 * root) with `search.params`, valuing ended states by self-evaluation; the step plays its root decision,
 * recorded with the completion and prompt it came from. Depth is capped at the steps left.
 */
async function searchStep(ep: EpisodeContext, stepNo: number): Promise<Sampled> {
  const { input, session } = ep;
  const params = input.search!.params;
  const workflowId = `${ep.workflowId}-search${stepNo}`;
  const res = await executeChild<typeof mctsSearch>('mctsSearch', {
    workflowId,
    taskQueue: ep.taskQueue,
    staticSummary: `test-time MCTS for step ${stepNo} of ${ep.label}: ${params.numSimulations} simulations from ${session.path.length} actions`,
    args: [
      {
        run: ep.run,
        task: input.task,
        params: { ...params, maxDepth: Math.max(1, Math.min(params.maxDepth, input.maxSteps - stepNo + 1)), outcome: 'self-evaluation' },
        policy: input.policy,
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
    // A decision recorded before the completion record carries its parts flat (`completionRef`, `preview`).
    candidates: [d.completion ?? asCompletion({ ...(d as FlatCompletion), action: d.action, preview: (d as FlatCompletion).preview ?? '' })],
  };
}

/** Runs the step's sampled action: as a step group, alone in the session, or not at all when unparseable. */
async function runStep(ep: EpisodeContext, sampled: Sampled, stepNo: number, before: ObservationRef): Promise<PlayedStep> {
  if (ep.input.grouping) return runGroup(ep, sampled, stepNo, (draw) => sampleCandidates(ep, stepNo, draw));
  const action = sampled.candidates[0].action;
  if (!isValidAction(action)) return { chosen: 0, invalid: rewardForUnparsedOutput(before.stateKey, ep.session.rewardState, ep.rewardWeights) };
  const out = await ep.session.step(action, `step ${stepNo}: ${describeAction(action)} on ${before.url}`, ep.budget, (lost) => closeLost(ep, lost));
  return { chosen: 0, out };
}

/**
 * A lost session used to be left alone; closing it frees its page (and its REAL site slot) if its worker
 * lives. Never waited for: its worker is most likely gone.
 */
function closeLost(ep: EpisodeContext, lost: SessionHandle): void {
  if (patched('close-lost-sessions')) ep.sessions.closeAndForget(lost);
}

/** The step as sampled, before its action ran: an unparseable or not yet run action is worth nothing and ends nothing. */
function stepRecord(stepNo: number, before: ObservationRef, sampled: Sampled, completion: Completion): StepRecord {
  const { url, step, screenshotRef, axtreeRef } = before;
  return {
    step: stepNo,
    observation: { url, step, screenshotRef, axtreeRef },
    promptRef: sampled.promptRef,
    ...(sampled.grammarRef ? { grammarRef: sampled.grammarRef } : {}),
    completion,
    reward: 0,
    shaped: { total: 0, summary: '' },
    done: false,
    url,
  };
}

/** A run action's result into its step's record and the episode's outcome. */
function applyStepResult(record: StepRecord, action: Action, out: StepSessionResult, outcome: EpisodeOutcome): void {
  record.reward = out.reward;
  record.done = out.done || isTerminal(action);
  record.url = out.observation.url;
  record.actionError = out.actionError;
  record.shaped = out.shaped;
  record.resultRef = out.resultRef;
  outcome.done = record.done;
  outcome.success = out.success;
  outcome.reward = out.reward;
  outcome.reason = out.reason;
}
