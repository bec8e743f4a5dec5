import { access } from 'node:fs/promises';
import { join } from 'node:path';
import {
  LEGACY_MCTS_METRICS_FILE,
  METRICS_FILE,
  MetricsLineSchema,
  MetricsParseError,
  parseMetricsJsonl,
  parseMetricsLine,
  type MetricsLine,
  type TrainingMetrics,
} from '../lib/training/run-metrics';
import { createIterationLog } from './iteration-log';
import type { CurvesSink, WandbTarget } from '../host/curves';

/**
 * The run's metrics file, `<runsRoot>/<run_id>/metrics.jsonl` (control worker): one line per iteration of
 * every training run, whatever its algorithm (lib/training/run-metrics.ts).
 *
 * Exactly one line per iteration, even when Temporal retries `appendIterationMetrics` (a worker that died
 * after writing but before reporting completion, a timeout): the activity reads the file first and appends
 * nothing when a line for that iteration is already there (the first write wins, `appended: false`).
 *
 * No half lines: the whole line (newline included) goes out in one `write` on a file opened for appending,
 * then is fsynced before the activity completes. A process killed mid-write can still leave a torn last
 * line without its newline; readers ignore it (lib/training/run-metrics.ts) and the next append repairs the file
 * first: it truncates the fragment away, or, when the fragment is a complete line that only lost its
 * newline, keeps it (it counts as written) and adds the newline.
 *
 * Concurrency: appends to one file are serialised within this process (two attempts of the same activity
 * on one worker). Two workers appending the same iteration at the same instant could both pass the check;
 * readers then keep the first line per iteration, so the run's metrics are still one per iteration.
 *
 * Curves: with a sink (host/curves.ts; the control worker passes one), every append, including one that found
 * its line already there (a retry after a crash may have written the line but not the curves), also starts a
 * background sync of the run's TensorBoard files (and W&B run, when `wandb` is given) from this file. The sync
 * writes only iterations not written yet, so each iteration's scalars land there once.
 *
 * Old MCTS runs wrote `mcts-metrics.jsonl` instead; `readRunMetrics` reads that file (converted to this
 * schema) when the run has no metrics.jsonl. Nothing appends to it any more.
 */

export interface AppendIterationMetricsInput {
  run_id: string;
  iteration: number;
  metrics: TrainingMetrics;
  /** ISO time for the line; default: now (the activity's clock). A workflow may pass its own time. */
  time?: string;
  /** Also log the run's scalars to this Weights & Biases project (the config's `wandb` section). */
  wandb?: WandbTarget;
}

export interface ReadRunMetricsInput {
  run_id: string;
}

export function createMetricsActivities(runsRoot: string, curves?: CurvesSink) {
  const spec = {
    schema: MetricsLineSchema,
    parseJsonl: parseMetricsJsonl,
    parseLine: parseMetricsLine,
    isParseError: (err: unknown) => err instanceof MetricsParseError,
  };
  const log = createIterationLog<MetricsLine>(runsRoot, { ...spec, fileName: METRICS_FILE, what: 'iteration metrics' });
  const legacy = createIterationLog<MetricsLine>(runsRoot, { ...spec, fileName: LEGACY_MCTS_METRICS_FILE, what: 'MCTS metrics' });
  const exists = (path: string) =>
    access(path).then(
      () => true,
      () => false,
    );
  return {
    /** Appends the iteration's line unless the file already has one for that iteration (exactly once). */
    async appendIterationMetrics(input: AppendIterationMetricsInput): Promise<{ appended: boolean }> {
      const { wandb, ...entry } = input;
      const res = await log.append(entry);
      curves?.schedule(runsRoot, input.run_id, wandb);
      return res;
    },

    /** Every line of the run's metrics file (none when the run has none yet). */
    async readRunMetrics(input: ReadRunMetricsInput): Promise<MetricsLine[]> {
      const lines = await log.read(input?.run_id); // validates the run id before any path is built from it
      if (lines.length > 0 || (await exists(join(runsRoot, input.run_id, METRICS_FILE)))) return lines;
      return legacy.read(input.run_id);
    },
  };
}

export type MetricsActivities = ReturnType<typeof createMetricsActivities>;
