import type { IterationMetrics } from '../lib/grpo';
import { MetricsLineSchema, MetricsParseError, parseMetricsJsonl, parseMetricsLine, type MetricsLine } from '../lib/run-metrics';
import { createIterationLog } from './iteration-log';

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
 */

export interface AppendIterationMetricsInput {
  run_id: string;
  iteration: number;
  metrics: IterationMetrics;
  /** ISO time for the line; default: now (the activity's clock). A workflow may pass its own time. */
  time?: string;
}

export interface ReadRunMetricsInput {
  run_id: string;
}

export function createMetricsActivities(runsRoot: string) {
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
      return log.append(input);
    },

    /** Every line of the run's metrics file (none when the file does not exist yet). */
    async readRunMetrics(input: ReadRunMetricsInput): Promise<MetricsLine[]> {
      return log.read(input?.run_id);
    },
  };
}

export type MetricsActivities = ReturnType<typeof createMetricsActivities>;
