import type { IterationMetrics } from '../lib/grpo';
import { MetricsLineSchema, MetricsParseError, parseMetricsJsonl, parseMetricsLine, type MetricsLine } from '../lib/run-metrics';
import { createIterationLog } from './iteration-log';
import type { CurvesSink, WandbTarget } from '../host/curves';

/**
 * The run's metrics file, `<runsRoot>/<run_id>/metrics.jsonl` (control worker).
 *
 * Exactly one line per iteration, even when Temporal retries `appendIterationMetrics` (a worker that died
 * after writing but before reporting completion, a timeout): the activity reads the file first and appends
 * nothing when a line for that iteration is already there (the first write wins, `appended: false`).
 *
 * No half lines: the whole line (newline included) goes out in one `write` on a file opened for appending,
 * then is fsynced before the activity completes. A process killed mid-write can still leave a torn last
 * line without its newline; readers ignore it (lib/run-metrics.ts) and the next append repairs the file
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
 */

export interface AppendIterationMetricsInput {
  run_id: string;
  iteration: number;
  metrics: IterationMetrics;
  /** ISO time for the line; default: now (the activity's clock). A workflow may pass its own time. */
  time?: string;
  /** Also log the run's scalars to this Weights & Biases project (the config's `wandb` section). */
  wandb?: WandbTarget;
}

export interface ReadRunMetricsInput {
  run_id: string;
}

export function createMetricsActivities(runsRoot: string, curves?: CurvesSink) {
  const log = createIterationLog<MetricsLine>(runsRoot, {
    fileName: 'metrics.jsonl',
    what: 'iteration metrics',
    schema: MetricsLineSchema,
    parseJsonl: parseMetricsJsonl,
    parseLine: parseMetricsLine,
    isParseError: (err) => err instanceof MetricsParseError,
  });
  return {
    /** Appends the iteration's line unless the file already has one for that iteration (exactly once). */
    async appendIterationMetrics(input: AppendIterationMetricsInput): Promise<{ appended: boolean }> {
      const { wandb, ...entry } = input;
      const res = await log.append(entry);
      curves?.schedule(runsRoot, input.run_id, 'grpo', wandb);
      return res;
    },

    /** Every line of the run's metrics file (none when the file does not exist yet). */
    async readRunMetrics(input: ReadRunMetricsInput): Promise<MetricsLine[]> {
      return log.read(input?.run_id);
    },
  };
}

export type MetricsActivities = ReturnType<typeof createMetricsActivities>;
