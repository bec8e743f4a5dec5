import { ApplicationFailure } from '@temporalio/activity';
import { mkdir, open, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { IterationMetrics } from '../lib/grpo';
import {
  MetricsLineSchema,
  MetricsParseError,
  formatMetricsLine,
  parseMetricsJsonl,
  parseMetricsLine,
  runIdProblem,
  type MetricsLine,
} from '../lib/run-metrics';

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
  const queues = new Map<string, Promise<unknown>>();

  /** Runs `fn` after every earlier call for the same file has finished (in this process). */
  function serialised<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = queues.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    queues.set(key, tail);
    void tail.then(() => {
      if (queues.get(key) === tail) queues.delete(key);
    });
    return next;
  }

  function fileOf(runId: unknown): string {
    const problem = runIdProblem(runId);
    if (problem !== null) throw ApplicationFailure.create({ message: problem, type: 'InvalidRunId', nonRetryable: true });
    return join(runsRoot, runId as string, 'metrics.jsonl');
  }

  async function readOrEmpty(path: string): Promise<Buffer> {
    try {
      return await readFile(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return Buffer.alloc(0);
      throw err; // I/O trouble: let Temporal retry
    }
  }

  function parse(text: string, path: string): MetricsLine[] {
    try {
      return parseMetricsJsonl(text, path);
    } catch (err) {
      if (err instanceof MetricsParseError) {
        throw ApplicationFailure.create({ message: err.message, type: 'InvalidMetricsFile', nonRetryable: true });
      }
      throw err;
    }
  }

  return {
    /** Appends the iteration's line unless the file already has one for that iteration. */
    async appendIterationMetrics(input: AppendIterationMetricsInput): Promise<{ appended: boolean }> {
      const path = fileOf(input?.run_id);
      const parsed = MetricsLineSchema.safeParse({
        run_id: input.run_id,
        iteration: input.iteration,
        time: input.time ?? new Date().toISOString(),
        ...input.metrics,
      });
      if (!parsed.success) {
        const issues = parsed.error.issues
          .slice(0, 5)
          .map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`)
          .join('; ');
        throw ApplicationFailure.create({ message: `invalid iteration metrics: ${issues}`, type: 'InvalidMetrics', nonRetryable: true });
      }
      const line = parsed.data;

      return serialised(path, async () => {
        await mkdir(join(runsRoot, line.run_id), { recursive: true });
        const buf = await readOrEmpty(path);
        const completeLen = buf.lastIndexOf(0x0a) + 1; // bytes up to and including the last newline
        const existing = parse(buf.subarray(0, completeLen).toString('utf8'), path);
        const fragment = buf.subarray(completeLen).toString('utf8');
        // A fragment after the last newline: a finished line that lost only its newline, or a torn write.
        const finished = fragment.trim() === '' ? null : finishedLine(fragment);
        const known = finished ? [...existing, finished] : existing;

        const fh = await open(path, 'a+');
        try {
          let prefix = '';
          if (completeLen < buf.length) {
            if (finished) prefix = '\n';
            else await fh.truncate(completeLen); // drop the torn fragment
          }
          if (known.some((l) => l.iteration === line.iteration)) {
            if (prefix) await fh.write(prefix);
            return { appended: false };
          }
          const bytes = Buffer.from(prefix + formatMetricsLine(line), 'utf8');
          let off = 0;
          while (off < bytes.length) off += (await fh.write(bytes, off, bytes.length - off)).bytesWritten;
          await fh.datasync();
          return { appended: true };
        } finally {
          await fh.close();
        }
      });
    },

    /** Every line of the run's metrics file (none when the file does not exist yet). */
    async readRunMetrics(input: ReadRunMetricsInput): Promise<MetricsLine[]> {
      const path = fileOf(input?.run_id);
      return parse((await readOrEmpty(path)).toString('utf8'), path);
    },
  };
}

/** The fragment after the file's last newline as a line, or null when it is a torn write. */
function finishedLine(fragment: string): MetricsLine | null {
  try {
    return parseMetricsLine(fragment.trim(), 0);
  } catch {
    return null;
  }
}

export type MetricsActivities = ReturnType<typeof createMetricsActivities>;
