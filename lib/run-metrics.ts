import { z } from 'zod';
import type { IterationMetrics } from './grpo';

// The run's metrics file, `<runsRoot>/<run_id>/metrics.jsonl`: one JSON object per line, one line per
// iteration, written by the `appendIterationMetrics` activity (activities/metrics.ts) and read by the CLI
// and the workflow's metrics query. Pure: no I/O, so workflows and tests can use it too.
//
// Line: `{ run_id, iteration, time, ...IterationMetrics }` (snake_case, like the learner payloads).
// Reading:
//   - blank lines are skipped;
//   - a complete line (ending with a newline) that is not a valid line is an error naming its line number;
//   - a last line without a newline that does not parse is a torn write (the process died mid-append) and
//     is ignored; the next append truncates it away;
//   - should an iteration appear twice (only two processes racing on one file could do that), the first
//     line wins, as it does for the writer.
// Unknown keys are dropped (not rejected), so files written by a newer version with extra metrics still read.

const finite = z.number(); // zod 4 rejects NaN and ±Infinity
const int = z.number().int();
const fraction = finite.min(0).max(1);

export const RUN_ID_PATTERN = /^[A-Za-z0-9._-]+$/;
export const MAX_RUN_ID_LENGTH = 200;

/** Why a run id cannot name a folder under the runs root, or null when it can. */
export function runIdProblem(runId: unknown): string | null {
  if (typeof runId !== 'string' || runId.length === 0) return 'run_id must be a non-empty string';
  if (runId.length > MAX_RUN_ID_LENGTH) return `run_id is longer than ${MAX_RUN_ID_LENGTH} characters`;
  if (!RUN_ID_PATTERN.test(runId)) {
    return `run_id ${JSON.stringify(runId)} may contain only letters, digits, ".", "_" and "-" (no path separators)`;
  }
  if (runId.includes('..') || runId === '.') return `run_id ${JSON.stringify(runId)} must not be "." or contain ".."`;
  return null;
}

/** Returns the run id, or throws an Error saying what is wrong with it. */
export function validateRunId(runId: unknown): string {
  const problem = runIdProblem(runId);
  if (problem !== null) throw new Error(problem);
  return runId as string;
}

export const RunIdSchema = z.string().superRefine((v, ctx) => {
  const problem = runIdProblem(v);
  if (problem !== null) ctx.addIssue({ code: 'custom', message: problem });
});

export const IterationMetricsSchema = z.object({
  mean_reward: finite,
  reward_std: finite.min(0),
  frac_reward_zero_std: fraction,
  episode_length: finite.min(0),
  success_rate: fraction,
  mean_return: finite,
  action_validity: fraction,
  loss: finite.nullable(),
  grad_norm: finite.min(0).nullable(),
  adapter_version: int.min(0).nullable(),
  tokens: int.min(0),
  /** Items the update retokenised (no sampler token ids) and the share of them that may differ from what was sampled. */
  retokenized: int.min(0).optional(),
  token_mismatch_rate: fraction.optional(),
  kl: finite.optional(),
  clip_fraction: fraction.optional(),
  mean_ratio: finite.optional(),
  entropy: finite.optional(),
  /** Episodes of the iteration that failed (left out of the batch). */
  failed_episodes: int.min(1).optional(),
  /** Grouping `anchor`: step groups of ≥ 2 members, their mean / max size, and the share of steps in one. */
  anchor_groups: int.min(0).optional(),
  anchor_group_size_mean: finite.min(0).optional(),
  anchor_group_size_max: int.min(0).optional(),
  step_signal_share: fraction.optional(),
  /** REAL step groups (`real.forkMode: snapshot`): forks from a state copy, and copies that differed and replayed. */
  fork_snapshots: int.min(0).optional(),
  fork_replay_fallbacks: int.min(0).optional(),
  /** Pipelined runs (train.maxStaleness ≥ 1): the adapter the batch sampled from, updates behind the on-policy one. */
  sampled_adapter_version: int.min(0).optional(),
  staleness: int.min(0).optional(),
  seconds: z.record(z.string(), finite.min(0)),
  num_groups: int.min(0),
  num_episodes: int.min(0),
  /** Greedy evaluation on held-out tasks, on the iterations that ran one (train.evalEvery). */
  eval: z.object({ success_rate: fraction, mean_return: finite, episodes: int.min(0) }).optional(),
});

export const MetricsLineSchema = z.object({
  run_id: RunIdSchema,
  iteration: int.min(0),
  /** ISO 8601, supplied by the writer (the activity's clock, or workflow time passed in). */
  time: z.iso.datetime({ offset: true }),
  ...IterationMetricsSchema.shape,
});

export type MetricsLine = z.output<typeof MetricsLineSchema>;

// The schema and the interface of lib/grpo.ts must describe the same object.
type Same<A, B> = [A] extends [B] ? ([B] extends [A] ? true : false) : false;
const sameShape: Same<z.output<typeof IterationMetricsSchema>, IterationMetrics> = true;
void sameShape;

/** A bad line of a metrics file: `metrics.jsonl line 3: not JSON (…)`. */
export class MetricsParseError extends Error {
  constructor(
    readonly line: number,
    detail: string,
    source = 'metrics.jsonl',
  ) {
    super(`${source} line ${line}: ${detail}`);
    this.name = 'MetricsParseError';
  }
}

function describeIssues(err: z.ZodError): string {
  return err.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`)
    .join('; ');
}

/** One line (without its newline), validated; throws MetricsParseError naming the line number. */
export function parseMetricsLine(text: string, lineNumber: number, source?: string): MetricsLine {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new MetricsParseError(lineNumber, `not JSON (${(err as Error).message})`, source);
  }
  const parsed = MetricsLineSchema.safeParse(value);
  if (!parsed.success) throw new MetricsParseError(lineNumber, `not a metrics line: ${describeIssues(parsed.error)}`, source);
  return parsed.data;
}

/**
 * The lines of a metrics file, in file order (see the reading rules at the top of this file: blank lines
 * skipped, a torn last line ignored, first line per iteration wins). Throws MetricsParseError on a bad
 * complete line. `source` names the file in error messages.
 */
export function parseMetricsJsonl(text: string, source?: string): MetricsLine[] {
  const rows = text.split('\n');
  const last = rows.length - 1; // text.split: the part after the last newline ('' when text ends with one)
  const out: MetricsLine[] = [];
  const seen = new Set<number>();
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i].trim();
    if (row === '') continue;
    let line: MetricsLine;
    if (i === last) {
      try {
        line = parseMetricsLine(row, i + 1, source);
      } catch {
        continue; // torn write: no newline yet, so never a finished line
      }
    } else {
      line = parseMetricsLine(row, i + 1, source);
    }
    if (seen.has(line.iteration)) continue;
    seen.add(line.iteration);
    out.push(line);
  }
  return out;
}

/** The line of the highest iteration, or null when there is none. */
export function latestMetrics(lines: readonly MetricsLine[]): MetricsLine | null {
  let best: MetricsLine | null = null;
  for (const l of lines) if (best === null || l.iteration > best.iteration) best = l;
  return best;
}

/** The text of one line, newline included: exactly what the writer appends. */
export function formatMetricsLine(line: MetricsLine): string {
  return JSON.stringify(line) + '\n';
}
