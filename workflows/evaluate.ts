import {
  ApplicationFailure,
  ChildWorkflowFailure,
  defineQuery,
  executeChild,
  isCancellation,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { pool } from './pool';
import type { ControlActivities } from '../activities/control';
import type { PolicyConfig } from '../lib/config';
import type { MctsParams } from '../lib/mcts-params';
import type { EnvOptions, EpisodeInput, EpisodeResult } from '../lib/episode-types';
import { summarizeEval, type EvalEpisodeRecord, type EvalNote, type EvalSkip, type EvalSummary } from '../lib/eval-summary';
import type { RewardWeights } from '../lib/rewards/weights';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { episode } from './episode';

export type EvalModeName = 'qwen3vl_base' | 'qwen3vl_grpo' | 'qwen3vl_mcts' | 'openai_baseline';

/** One mode as the workflow runs it: everything resolved by the client (adapter version, skip decision, sites). */
export interface EvalModePlan {
  /** Unique within the evaluation; part of every episode's workflow id. */
  label: string;
  name: EvalModeName;
  backend: 'colocated' | 'openai';
  /** Greedy: n 1, temperature 0. */
  policy: PolicyConfig;
  /** The episode's runId: the learner's run_id for an adapter version ≥ 1, else the eval id. */
  runId: string;
  /** Colocated: the adapter version the learner samples with (0 = base model). */
  adapterVersion: number;
  /** One line for the summary: which model / adapter this mode evaluated. */
  describe: string;
  /** Test-time MCTS: every step of its episodes is chosen by a search with these parameters. */
  search?: MctsParams;
}

export interface EvaluateInput {
  evalId: string;
  env: 'miniwob' | 'real';
  /** Resolved task names (REAL sites already expanded into their tasks) and the site each belongs to. */
  tasks: { task: string; site: string }[];
  seeds: number[];
  maxSteps: number;
  /** Episodes running at once, over all modes. */
  parallelism: number;
  modes: EvalModePlan[];
  skipped: EvalSkip[];
  notes: EvalNote[];
  controlTaskQueue: string;
  browserTaskQueue: string;
  gpuTaskQueue: string;
  learnerHeartbeatTimeoutMs: number;
  maxSessionRebuilds: number;
  sessionStartTimeoutMs: number;
  heartbeatTimeoutMs: number;
  rewardWeights?: RewardWeights;
  envOptions?: EnvOptions;
}

export interface EvaluateResult {
  evalId: string;
  /** Small per-episode records (trajectories by reference only). */
  episodes: EvalEpisodeRecord[];
  summary: EvalSummary;
  /** What each mode evaluated. */
  modes: { label: string; name: EvalModeName; describe: string }[];
  /** Blob holding `{ evalId, modes, episodes, summary }` (activity `storeJson`). */
  resultsRef: string;
}

export interface EvalProgress {
  evalId: string;
  total: number;
  done: number;
  failed: number;
  running: number;
}

export const evalProgressQuery = defineQuery<EvalProgress>('evalProgress');

/** Deterministic child id: `<evalId>-<mode>-<task>-s<seed>`. */
export function evalEpisodeId(evalId: string, mode: string, task: string, seed: number): string {
  return `${evalId}-${mode}-${task}-s${seed}`;
}

function failureMessage(err: unknown): string {
  if (err instanceof ChildWorkflowFailure) {
    const cause = err.cause;
    return cause ? `${cause.message}` : err.message;
  }
  return err instanceof Error ? err.message : String(err);
}

/**
 * Greedy evaluation: for every mode (skipped ones were decided by the client and are only listed), every task
 * × seed runs as an `episode` child workflow with a deterministic id, at most `parallelism` at once. A failed
 * episode is recorded with its error (a failure in the success rate) rather than failing the evaluation.
 * The results go to the blob store (`storeJson`); the client writes its files from the returned value.
 */
export async function evaluate(input: EvaluateInput): Promise<EvaluateResult> {
  const info = workflowInfo();
  const evalId = input.evalId;
  if (info.workflowId !== evalId) {
    throw ApplicationFailure.nonRetryable(`workflow id ${info.workflowId} must equal the eval id ${evalId}`, 'InvalidConfig');
  }
  const labels = input.modes.map((m) => m.label);
  const dup = labels.find((l, i) => labels.indexOf(l) !== i);
  if (dup) throw ApplicationFailure.nonRetryable(`mode label "${dup}" appears twice`, 'InvalidConfig');
  if (input.seeds.length === 0 || input.tasks.length === 0) {
    throw ApplicationFailure.nonRetryable('an evaluation needs at least one task and one seed', 'InvalidConfig');
  }

  upsertSearchAttributes([
    { key: KIND, value: 'eval' },
    { key: RUN_ID, value: evalId },
    { key: MODE, value: labels.join(',').slice(0, 200) || 'none' },
    { key: TASK, value: `${input.env}/${input.tasks.map((t) => t.task).join(',')}`.slice(0, 200) },
  ]);

  const runs = input.modes.flatMap((mode) =>
    input.tasks.flatMap((t) => input.seeds.map((seed) => ({ mode, task: t.task, site: t.site, seed }))),
  );
  const progress: EvalProgress = { evalId, total: runs.length, done: 0, failed: 0, running: 0 };
  setHandler(evalProgressQuery, () => progress);
  const details = () => setCurrentDetails(`${progress.done}/${progress.total} episodes done${progress.failed ? ` (${progress.failed} failed)` : ''} · ${progress.running} running`);
  details();

  const episodes = await pool(runs, input.parallelism, async (r): Promise<EvalEpisodeRecord> => {
    const workflowId = evalEpisodeId(evalId, r.mode.label, r.task, r.seed);
    const episodeInput: EpisodeInput = {
      task: { env: input.env, task: r.task, seed: r.seed },
      maxSteps: input.maxSteps,
      policy: { ...r.mode.policy, n: 1, temperature: 0 },
      browserTaskQueue: input.browserTaskQueue,
      maxSessionRebuilds: input.maxSessionRebuilds,
      sessionStartTimeoutMs: input.sessionStartTimeoutMs,
      heartbeatTimeoutMs: input.heartbeatTimeoutMs,
      runId: r.mode.runId,
      mode: r.mode.label,
      ...(input.rewardWeights ? { rewardWeights: input.rewardWeights } : {}),
      ...(input.envOptions ? { envOptions: input.envOptions } : {}),
      ...(r.mode.search ? { search: { params: r.mode.search } } : {}),
      ...(r.mode.backend === 'colocated'
        ? {
            adapterVersion: r.mode.adapterVersion,
            gpuTaskQueue: input.gpuTaskQueue,
            learnerHeartbeatTimeoutMs: input.learnerHeartbeatTimeoutMs,
          }
        : {}),
    };
    const base = { mode: r.mode.label, task: r.task, site: r.site, seed: r.seed, workflowId };
    progress.running++;
    details();
    try {
      const res: EpisodeResult = await executeChild(episode, {
        workflowId,
        taskQueue: input.controlTaskQueue,
        args: [episodeInput],
        staticSummary: `eval ${evalId} · ${r.mode.label} (${r.mode.describe}) · ${input.env}/${r.task} seed ${r.seed}`,
      });
      return {
        ...base,
        success: res.success,
        reward: res.reward,
        shapedReturn: res.shapedReturn,
        steps: res.steps,
        validActions: res.validActions,
        actionValidity: res.actionValidity,
        done: res.done,
        reason: res.reason,
        trajectoryRef: res.trajectoryRef,
      };
    } catch (err) {
      if (isCancellation(err)) throw err;
      progress.failed++;
      return {
        ...base,
        success: false,
        reward: 0,
        shapedReturn: 0,
        steps: 0,
        validActions: 0,
        actionValidity: 0,
        done: false,
        reason: null,
        error: failureMessage(err).slice(0, 500),
      };
    } finally {
      progress.running--;
      progress.done++;
      details();
    }
  });

  const modes = input.modes.map((m) => ({ label: m.label, name: m.name, describe: m.describe }));
  const summary = summarizeEval({
    evalId,
    env: input.env,
    modes: labels,
    episodes,
    skipped: input.skipped,
    notes: input.notes,
    modeDetails: modes.map((m) => ({ mode: m.label, describe: m.describe })),
  });
  const control = proxyActivities<ControlActivities>({
    startToCloseTimeout: '2m',
    retry: { initialInterval: '1s', maximumInterval: '30s', maximumAttempts: 20 },
  });
  const { ref } = await control.storeJson({ value: { evalId, modes, episodes, summary } });
  return { evalId, episodes, summary, modes, resultsRef: ref };
}
