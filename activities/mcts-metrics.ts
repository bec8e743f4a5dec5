import { ApplicationFailure } from '@temporalio/activity';
import { mkdir, open, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import { z } from 'zod';
import { RunIdSchema, runIdProblem } from '../lib/run-metrics';

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
  const queues = new Map<string, Promise<unknown>>();
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
    return join(runsRoot, runId as string, MCTS_METRICS_FILE);
  }

  async function readOrEmpty(path: string): Promise<Buffer> {
    try {
      return await readFile(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return Buffer.alloc(0);
      throw err;
    }
  }

  function parse(text: string, path: string): MctsMetricsLine[] {
    try {
      return parseMctsMetricsJsonl(text, path);
    } catch (err) {
      if (err instanceof MctsMetricsParseError) {
        throw ApplicationFailure.create({ message: err.message, type: 'InvalidMetricsFile', nonRetryable: true });
      }
      throw err;
    }
  }

  return {
    /** Appends the iteration's line unless the file already has one for that iteration. */
    async appendMctsMetrics(input: AppendMctsMetricsInput): Promise<{ appended: boolean }> {
      const path = fileOf(input?.run_id);
      const parsed = MctsMetricsLineSchema.safeParse({
        run_id: input.run_id,
        iteration: input.iteration,
        time: input.time ?? new Date().toISOString(),
        ...input.metrics,
      });
      if (!parsed.success) {
        throw ApplicationFailure.create({ message: `invalid MCTS metrics: ${issues(parsed.error)}`, type: 'InvalidMetrics', nonRetryable: true });
      }
      const line = parsed.data;
      return serialised(path, async () => {
        await mkdir(join(runsRoot, line.run_id), { recursive: true });
        const buf = await readOrEmpty(path);
        const completeLen = buf.lastIndexOf(0x0a) + 1;
        const existing = parse(buf.subarray(0, completeLen).toString('utf8'), path);
        const fragment = buf.subarray(completeLen).toString('utf8');
        let finished: MctsMetricsLine | null = null;
        if (fragment.trim() !== '') {
          try {
            finished = parseMctsMetricsLine(fragment.trim(), 0);
          } catch {
            finished = null;
          }
        }
        const known = finished ? [...existing, finished] : existing;
        const fh = await open(path, 'a+');
        try {
          let prefix = '';
          if (completeLen < buf.length) {
            if (finished) prefix = '\n';
            else await fh.truncate(completeLen);
          }
          if (known.some((l) => l.iteration === line.iteration)) {
            if (prefix) await fh.write(prefix);
            return { appended: false };
          }
          const bytes = Buffer.from(prefix + JSON.stringify(line) + '\n', 'utf8');
          let off = 0;
          while (off < bytes.length) off += (await fh.write(bytes, off, bytes.length - off)).bytesWritten;
          await fh.datasync();
          return { appended: true };
        } finally {
          await fh.close();
        }
      });
    },

    async readMctsMetrics(input: { run_id: string }): Promise<MctsMetricsLine[]> {
      const path = fileOf(input?.run_id);
      return parse((await readOrEmpty(path)).toString('utf8'), path);
    },
  };
}

export type MctsMetricsActivities = ReturnType<typeof createMctsMetricsActivities>;
