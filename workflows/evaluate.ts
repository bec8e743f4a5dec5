import {
  ApplicationFailure,
  continueAsNew,
  defineQuery,
  executeChild,
  isCancellation,
  patched,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { failureMessage, pool } from './pool';
import { RunControl } from './run-control';
import type { ControlActivities } from '../activities/control';
import type { EvalRecordActivities } from '../activities/eval-records';
import { episodeInput, type EpisodeResult } from '../lib/episode/episode-types';
import { summarizeEval, type EvalEpisodeRecord, type EvalSummary } from '../lib/eval/eval-summary';
import { KIND, MODE, RUN_ID, TASK } from '../lib/episode/search-attributes';
import { episode } from './episode';
import { DEFAULT_EVAL_CONTINUE_AS_NEW_EVERY, evalSizeProblem, type EvalCarry, type EvalModeName, type EvalModePlan, type EvaluateInput } from '../lib/eval/eval-types';
import * as profiles from './activity-profiles';

export type { EvalModeName, EvalModePlan, EvaluateInput };

export interface EvaluateResult {
  evalId: string;
  /**
   * Per-episode records inline: only evaluations started before records went to blobs have them; the others
   * name the blob (`recordsRef`), whatever their size.
   */
  episodes?: EvalEpisodeRecord[];
  /** Blob with every per-episode record (trajectories by reference only), one JSON object per line. */
  recordsRef?: string;
  /** Episodes recorded. */
  episodeCount: number;
  summary: EvalSummary;
  /** What each mode evaluated. */
  modes: { label: string; name: EvalModeName; describe: string }[];
  /** Blob holding `{ evalId, modes, summary, recordsRef, episodeCount }` (older evaluations: `episodes` inline). */
  resultsRef: string;
  /** Stopped by the `stop` signal: episodes not started then are left out of the summary. */
  stoppedEarly: boolean;
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

/**
 * Greedy evaluation: for every mode (skipped ones were decided by the client and are only listed), every task
 * × seed runs as an `episode` child workflow with a deterministic id, at most `parallelism` at once. A failed
 * episode is recorded with its error (a failure in the success rate) rather than failing the evaluation.
 * `pause` holds episodes not yet started, `stop` leaves them out.
 *
 * Any size: every `continueAsNewEvery` episodes (a chunk) the chunk's records go to one blob and the workflow
 * continues as new with a small carry (the next index and the chunk refs); at the end an activity assembles
 * the records into one JSON-lines blob and computes the summary. The result names the blobs.
 */
export async function evaluate(input: EvaluateInput): Promise<EvaluateResult> {
  const info = workflowInfo();
  const evalId = input.evalId;
  const carry: EvalCarry = input.carry ?? { next: 0, chunkRefs: [], done: 0, failed: 0, paused: false };
  const total = input.modes.length * input.tasks.length * input.seeds.length;
  const progress: EvalProgress = { evalId, total, done: carry.done, failed: carry.failed, running: 0 };
  const control = new RunControl<EvalProgress & { runId: string }>(evalId, { paused: carry.paused });
  control.describe(() => ({ runId: evalId, ...progress }));
  setHandlerForProgress(progress);
  // Evaluations started before records went to blobs keep running every episode in one history.
  const chunked = patched('eval-record-chunks');

  const tooBig = evalSizeProblem({ modes: input.modes.length, tasks: input.tasks.length, seeds: input.seeds.length, continueAsNewEvery: input.continueAsNewEvery });
  if (tooBig) throw ApplicationFailure.nonRetryable(tooBig, 'InvalidConfig');
  const runs = input.modes.flatMap((mode) => input.tasks.flatMap((t) => input.seeds.map((seed) => ({ mode, task: t.task, site: t.site, seed }))));
  const every = chunked ? (input.continueAsNewEvery ?? DEFAULT_EVAL_CONTINUE_AS_NEW_EVERY) : runs.length;
  const chunk = runs.slice(carry.next, carry.next + every);

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

  const details = () =>
    setCurrentDetails(
      `${progress.done}/${progress.total} episodes done${progress.failed ? ` (${progress.failed} failed)` : ''} · ${progress.running} running` +
        (control.stopping ? ' · stopping' : control.paused ? ' · paused' : ''),
    );
  details();
  control.phase = 'episodes';

  const records = await pool(chunk, input.parallelism, async (r): Promise<EvalEpisodeRecord | null> => {
    if (!(await control.proceed())) return null;
    const workflowId = evalEpisodeId(evalId, r.mode.label, r.task, r.seed);
    const scoring = input.env === 'real' ? (input.run.envOptions?.realScoring ?? 'training') : undefined;
    const base = { mode: r.mode.label, task: r.task, site: r.site, seed: r.seed, workflowId, ...(scoring ? { scoring } : {}) };
    progress.running++;
    details();
    try {
      const res: EpisodeResult = await executeChild(episode, {
        workflowId,
        taskQueue: input.controlTaskQueue,
        args: [
          episodeInput({
            run: { ...input.run, runId: r.mode.runId },
            task: { env: input.env, task: r.task, seed: r.seed },
            maxSteps: input.maxSteps,
            // The client resolved each mode's policy and adapter through lib/serving/iteration-policy.ts. A served
            // adapter's folder rides along (older plans lack it), so a vLLM that forgot the adapter loads it on the 404.
            sampling: {
              policy: { ...r.mode.policy, temperature: 0 },
              adapterVersion: r.mode.backend === 'colocated' ? r.mode.adapterVersion : 0,
              ...(r.mode.backend === 'openai' && r.mode.adapter ? { adapter: r.mode.adapter } : {}),
            },
            mode: r.mode.label,
            ...(r.mode.search ? { search: { params: r.mode.search } } : {}),
          }),
        ],
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
        ...(res.tokenIdsMissing ? { tokenIdsMissing: res.tokenIdsMissing } : {}),
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
  const episodes = records.filter((e): e is EvalEpisodeRecord => e !== null);
  const modes = input.modes.map((m) => ({ label: m.label, name: m.name, describe: m.describe }));
  const store = proxyActivities<ControlActivities & EvalRecordActivities>(profiles.runActivities('2m'));

  if (chunked) {
    control.phase = 'records';
    const chunkRefs = episodes.length > 0 ? [...carry.chunkRefs, (await store.storeJson({ value: episodes })).ref] : carry.chunkRefs;
    const next = carry.next + chunk.length;
    if (!control.stopping && next < runs.length) {
      return continueAsNew<typeof evaluate>({ ...input, carry: { next, chunkRefs, done: progress.done, failed: progress.failed, paused: control.paused } });
    }
    control.phase = 'summary';
    const fin = await store.finishEval({ evalId, env: input.env, modes, chunkRefs, total: runs.length, skipped: input.skipped, notes: input.notes });
    control.phase = 'done';
    return {
      evalId,
      recordsRef: fin.recordsRef,
      episodeCount: fin.episodeCount,
      summary: fin.summary,
      modes,
      resultsRef: fin.resultsRef,
      stoppedEarly: fin.episodeCount < runs.length,
    };
  }

  const notRun = records.length - episodes.length;
  control.phase = 'summary';
  const summary = summarizeEval({
    evalId,
    env: input.env,
    modes: labels,
    episodes,
    skipped: input.skipped,
    notes: notRun > 0 ? [...input.notes, { mode: '*', note: `stopped early: ${notRun} of ${records.length} episodes were not run` }] : input.notes,
    modeDetails: modes.map((m) => ({ mode: m.label, describe: m.describe })),
  });
  const { ref } = await store.storeJson({ value: { evalId, modes, episodes, summary } });
  control.phase = 'done';
  return { evalId, episodes, episodeCount: episodes.length, summary, modes, resultsRef: ref, stoppedEarly: notRun > 0 };
}

function setHandlerForProgress(progress: EvalProgress): void {
  setHandler(evalProgressQuery, () => progress);
}
