import { ApplicationFailure } from '@temporalio/activity';
import { mkdir, open, readFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { z } from 'zod';
import { runIdProblem } from '../lib/training/run-metrics';

/** What one per-iteration JSONL file needs: its name, its line schema and its parser. */
export interface IterationLogSpec<L extends { run_id: string; iteration: number }> {
  fileName: string;
  /** For error messages: "iteration metrics", "MCTS metrics". */
  what: string;
  schema: z.ZodType<L>;
  /** Parses a whole file; throws a parse error naming the bad line. */
  parseJsonl(text: string, source?: string): L[];
  parseLine(text: string, lineNumber: number): L;
  isParseError(err: unknown): boolean;
}

export interface IterationLogEntry {
  run_id: string;
  iteration: number;
  /** ISO time for the line; default: now (the activity's clock). A workflow may pass its own time. */
  time?: string;
  metrics: object;
}

/**
 * `runs/<run_id>/<fileName>`, one line per iteration, written **exactly once** even when the activity is
 * retried after a crash: the file is read first and a line for that iteration is never appended twice;
 * the line goes out in one write on a file opened for appending and is flushed before the activity
 * completes. A torn last line (a crash mid-write) is repaired on the next append: cut off, or given its
 * missing newline when it is a complete line. Appends are serialised per file within this process.
 */
export function createIterationLog<L extends { run_id: string; iteration: number }>(runsRoot: string, spec: IterationLogSpec<L>) {
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
    return join(runsRoot, runId as string, spec.fileName);
  }

  async function readOrEmpty(path: string): Promise<Buffer> {
    try {
      return await readFile(path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return Buffer.alloc(0);
      throw err; // I/O trouble: let Temporal retry
    }
  }

  function parse(text: string, path: string): L[] {
    try {
      return spec.parseJsonl(text, path);
    } catch (err) {
      if (spec.isParseError(err)) {
        throw ApplicationFailure.create({ message: (err as Error).message, type: 'InvalidMetricsFile', nonRetryable: true });
      }
      throw err;
    }
  }

  /** The fragment after the file's last newline as a line, or null when it is a torn write. */
  function finishedLine(fragment: string): L | null {
    try {
      return spec.parseLine(fragment.trim(), 0);
    } catch {
      return null;
    }
  }

  return {
    /** Appends the iteration's line unless the file already has one for that iteration. */
    async append(input: IterationLogEntry): Promise<{ appended: boolean }> {
      const path = fileOf(input?.run_id);
      // The fixed keys last: a metrics object that happens to carry run_id, iteration or time cannot move the
      // line to another run or iteration than the file and the exactly-once check use.
      const parsed = spec.schema.safeParse({
        ...input.metrics,
        run_id: input.run_id,
        iteration: input.iteration,
        time: input.time ?? new Date().toISOString(),
      });
      if (!parsed.success) {
        const issues = parsed.error.issues
          .slice(0, 5)
          .map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`)
          .join('; ');
        throw ApplicationFailure.create({ message: `invalid ${spec.what}: ${issues}`, type: 'InvalidMetrics', nonRetryable: true });
      }
      const line = parsed.data;
      return serialised(path, async () => {
        await mkdir(join(runsRoot, line.run_id), { recursive: true });
        const buf = await readOrEmpty(path);
        const completeLen = buf.lastIndexOf(0x0a) + 1; // bytes up to and including the last newline
        const existing = parse(buf.subarray(0, completeLen).toString('utf8'), path);
        const fragment = buf.subarray(completeLen).toString('utf8');
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

    /** Every line of the run's file (none when it does not exist yet). */
    async read(runId: string): Promise<L[]> {
      const path = fileOf(runId);
      return parse((await readOrEmpty(path)).toString('utf8'), path);
    },
  };
}
