import {
  ApplicationFailure,
  defineQuery,
  executeChild,
  isCancellation,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { failureMessage, pool } from './pool';
import { RunControl } from './run-control';
import type { ControlActivities } from '../activities/control';
import { episodeInput, type EpisodeResult } from '../lib/episode-types';
import { summarizeEval, type EvalEpisodeRecord, type EvalSummary } from '../lib/eval-summary';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { episode } from './episode';
import type { EvalModeName, EvalModePlan, EvaluateInput } from '../lib/eval-types';
import * as profiles from './activity-profiles';

export type { EvalModeName, EvalModePlan, EvaluateInput };

export interface EvaluateResult {
  evalId: string;
  /** Small per-episode records (trajectories by reference only). */
  episodes: EvalEpisodeRecord[];
  summary: EvalSummary;
  /** What each mode evaluated. */
  modes: { label: string; name: EvalModeName; describe: string }[];
  /** Blob holding `{ evalId, modes, episodes, summary }` (activity `storeJson`). */
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
 * `pause` holds episodes not yet started, `stop` leaves them out. The results go to the blob store
 * (`storeJson`); the client writes its files from the returned value.
 */
export async function evaluate(input: EvaluateInput): Promise<EvaluateResult> {
  const info = workflowInfo();
  const evalId = input.evalId;
  const runs = input.modes.flatMap((mode) =>
    input.tasks.flatMap((t) => input.seeds.map((seed) => ({ mode, task: t.task, site: t.site, seed }))),
  );
  const progress: EvalProgress = { evalId, total: runs.length, done: 0, failed: 0, running: 0 };
  const control = new RunControl<EvalProgress & { runId: string }>(evalId);
  control.describe(() => ({ runId: evalId, ...progress }));
  setHandlerForProgress(progress);

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

  const records = await pool(runs, input.parallelism, async (r): Promise<EvalEpisodeRecord | null> => {
    if (!(await control.proceed())) return null;
    const workflowId = evalEpisodeId(evalId, r.mode.label, r.task, r.seed);
    const base = { mode: r.mode.label, task: r.task, site: r.site, seed: r.seed, workflowId };
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
            // The client resolved each mode's policy and adapter through lib/iteration-policy.ts.
            sampling: { policy: { ...r.mode.policy, temperature: 0 }, adapterVersion: r.mode.backend === 'colocated' ? r.mode.adapterVersion : 0 },
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
  const notRun = records.length - episodes.length;

  control.phase = 'summary';
  const modes = input.modes.map((m) => ({ label: m.label, name: m.name, describe: m.describe }));
  const summary = summarizeEval({
    evalId,
    env: input.env,
    modes: labels,
    episodes,
    skipped: input.skipped,
    notes: notRun > 0 ? [...input.notes, { mode: '*', note: `stopped early: ${notRun} of ${records.length} episodes were not run` }] : input.notes,
    modeDetails: modes.map((m) => ({ mode: m.label, describe: m.describe })),
  });
  const store = proxyActivities<ControlActivities>(profiles.runActivities('2m'));
  const { ref } = await store.storeJson({ value: { evalId, modes, episodes, summary } });
  control.phase = 'done';
  return { evalId, episodes, summary, modes, resultsRef: ref, stoppedEarly: notRun > 0 };
}

function setHandlerForProgress(progress: EvalProgress): void {
  setHandler(evalProgressQuery, () => progress);
}
