import { z } from 'zod';
import { RunIdSchema } from '../lib/run-metrics';
import { createIterationLog } from './iteration-log';
import type { CurvesSink, WandbTarget } from '../host/curves';
import { MctsIterationMetricsSchema, type MctsIterationMetrics } from '../lib/mcts-metrics';

/**
 * The MCTS run's metrics file, `<runsRoot>/<run_id>/mcts-metrics.jsonl` (control worker): one JSON line per
 * `trainMcts` iteration. A file of its own because the GRPO line schema (lib/run-metrics.ts) requires GRPO
 * fields (mean_reward, reward_std, …) that a search does not have.
 *
 * Same guarantees as activities/metrics.ts: exactly one line per iteration even when Temporal retries the
 * append (the file is read first; an iteration already there is not written again, `appended: false`); the
 * line goes out in one write and is fsynced; a torn last line (a process killed mid-write) is ignored by
 * readers and repaired by the next append (truncated away, or completed with its newline when it parses).
 * With a curves sink, each append also syncs the run's TensorBoard files (and W&B run) in the background,
 * as activities/metrics.ts does.
 */

const int = z.number().int();

export const MctsMetricsLineSchema = z.object({
  run_id: RunIdSchema,
  iteration: int.min(0),
  time: z.iso.datetime({ offset: true }),
  ...MctsIterationMetricsSchema.shape,
});
export type MctsMetricsLine = z.output<typeof MctsMetricsLineSchema>;

export const MCTS_METRICS_FILE = 'mcts-metrics.jsonl';

export class MctsMetricsParseError extends Error {
  constructor(line: number, detail: string, source = MCTS_METRICS_FILE) {
    super(`${source} line ${line}: ${detail}`);
    this.name = 'MctsMetricsParseError';
  }
}

function issues(err: z.ZodError): string {
  return err.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`)
    .join('; ');
}

export function parseMctsMetricsLine(text: string, lineNumber: number, source?: string): MctsMetricsLine {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new MctsMetricsParseError(lineNumber, `not JSON (${(err as Error).message})`, source);
  }
  const parsed = MctsMetricsLineSchema.safeParse(value);
  if (!parsed.success) throw new MctsMetricsParseError(lineNumber, `not an MCTS metrics line: ${issues(parsed.error)}`, source);
  return parsed.data;
}

/** Lines in file order: blank lines skipped, a torn last line ignored, the first line per iteration wins. */
export function parseMctsMetricsJsonl(text: string, source?: string): MctsMetricsLine[] {
  const rows = text.split('\n');
  const last = rows.length - 1;
  const out: MctsMetricsLine[] = [];
  const seen = new Set<number>();
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i].trim();
    if (row === '') continue;
    let line: MctsMetricsLine;
    if (i === last) {
      try {
        line = parseMctsMetricsLine(row, i + 1, source);
      } catch {
        continue; // torn write
      }
    } else {
      line = parseMctsMetricsLine(row, i + 1, source);
    }
    if (seen.has(line.iteration)) continue;
    seen.add(line.iteration);
    out.push(line);
  }
  return out;
}

export interface AppendMctsMetricsInput {
  run_id: string;
  iteration: number;
  metrics: MctsIterationMetrics;
  /** ISO time; default now. */
  time?: string;
  /** Also log the run's scalars to this Weights & Biases project (the config's `wandb` section). */
  wandb?: WandbTarget;
}

export function createMctsMetricsActivities(runsRoot: string, curves?: CurvesSink) {
  const log = createIterationLog<MctsMetricsLine>(runsRoot, {
    fileName: MCTS_METRICS_FILE,
    what: 'MCTS metrics',
    schema: MctsMetricsLineSchema,
    parseJsonl: parseMctsMetricsJsonl,
    parseLine: parseMctsMetricsLine,
    isParseError: (err) => err instanceof MctsMetricsParseError,
  });
  return {
    /** Appends the iteration's line unless the file already has one for that iteration (exactly once). */
    async appendMctsMetrics(input: AppendMctsMetricsInput): Promise<{ appended: boolean }> {
      const { wandb, ...entry } = input;
      const res = await log.append(entry);
      curves?.schedule(runsRoot, input.run_id, 'mcts', wandb);
      return res;
    },

    async readMctsMetrics(input: { run_id: string }): Promise<MctsMetricsLine[]> {
      return log.read(input?.run_id);
    },
  };
}

export type MctsMetricsActivities = ReturnType<typeof createMctsMetricsActivities>;
