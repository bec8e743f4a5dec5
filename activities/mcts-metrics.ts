import { z } from 'zod';
import { RunIdSchema } from '../lib/run-metrics';
import { createIterationLog } from './iteration-log';

/**
 * The MCTS run's metrics file, `<runsRoot>/<run_id>/mcts-metrics.jsonl` (control worker): one JSON line per
 * `trainMcts` iteration. A file of its own because the GRPO line schema (lib/run-metrics.ts) requires GRPO
 * fields (mean_reward, reward_std, …) that a search does not have.
 *
 * Same guarantees as activities/metrics.ts: exactly one line per iteration even when Temporal retries the
 * append (the file is read first; an iteration already there is not written again, `appended: false`); the
 * line goes out in one write and is fsynced; a torn last line (a process killed mid-write) is ignored by
 * readers and repaired by the next append (truncated away, or completed with its newline when it parses).
 */

const finite = z.number();
const int = z.number().int();
const fraction = finite.min(0).max(1);

export const MctsIterationMetricsSchema = z.object({
  /** Searches (one per task) in the iteration. */
  searches: int.min(0),
  /** Simulations over all searches (each counted once). */
  simulations: int.min(0),
  nodes: int.min(0),
  /** Fraction of searches whose best path ends in a successful terminal state. */
  best_path_success_rate: fraction,
  /** Step-level DPO pairs collected. */
  pairs: int.min(0),
  /** Mean composite-Q gap of the pairs; null without pairs. */
  mean_abs_delta_q: finite.min(0).nullable(),
  /** Pairs that carry the sampler's reference log-probs (the others use the adapter-disabled reference). */
  pairs_with_ref_logprobs: int.min(0),
  dpo_loss: finite.nullable(),
  reward_margin: finite.nullable(),
  accuracy: fraction.nullable(),
  grad_norm: finite.min(0).nullable(),
  /** The adapter after this iteration (unchanged when the update was skipped). */
  adapter_version: int.min(0),
  /** True when no pair was collected, so no update ran. */
  update_skipped: z.boolean(),
  candidates: int.min(0),
  /** Unparseable candidates (terminal children with reward 0). */
  invalid_candidates: int.min(0),
  critic_calls: int.min(0),
  /** Critic answers that were unusable (neutral verdict, `ok: false`). */
  critic_failures: int.min(0),
  session_rebuilds: int.min(0),
  /** Greedy evaluation with the new adapter (mcts.evalEvery), else null. */
  eval_success_rate: fraction.nullable(),
  seconds: z.record(z.string(), finite.min(0)),
});
export type MctsIterationMetrics = z.output<typeof MctsIterationMetricsSchema>;

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
}

export function createMctsMetricsActivities(runsRoot: string) {
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
      return log.append(input);
    },

    async readMctsMetrics(input: { run_id: string }): Promise<MctsMetricsLine[]> {
      return log.read(input?.run_id);
    },
  };
}

export type MctsMetricsActivities = ReturnType<typeof createMctsMetricsActivities>;
