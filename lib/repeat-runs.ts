// How repeatable a method is: K training runs of one config, each read through its periodic greedy held-out
// evaluations (bench/repeats.ts). One table row tells a user choosing between methods what a single run
// cannot: in how many runs the method got there, and at what cost in browser sessions and env steps. Pure.

import { median } from './eval-summary';
import type { Method, MethodRow } from './methods-table';

export interface RepeatRun {
  runId: string;
  failed: string | null;
  /** Held-out success at each evaluation, in iteration order, with the counts where the metrics have them. */
  evals: { iteration: number; successRate: number; episodes: number | null }[];
  sessionsToThreshold: number | null;
  stepsToThreshold: number | null;
  /** Browser sessions and env steps of the whole run. */
  sessions: number | null;
  envSteps: number;
}

export interface Spread {
  median: number;
  min: number;
  max: number;
  /** How many runs the numbers are of. */
  n: number;
}

export interface RepeatSummary {
  method: Method;
  runs: RepeatRun[];
  /** Runs with an evaluation at or above the threshold. */
  reached: number;
  /** Runs whose last evaluation is at or above it. */
  endedAbove: number;
  /** Of the runs that reached it and counted their sessions (env steps) up to there. */
  sessionsToThreshold: Spread | null;
  stepsToThreshold: Spread | null;
}

export interface RepeatsReport {
  command: string;
  threshold: number;
  tasks: string[];
  seeds: number[];
  summaries: RepeatSummary[];
  notes: string[];
}

const AT_LEAST = 1e-9; // rates are ratios of small counts

function spread(values: readonly (number | null)[]): Spread | null {
  const xs = values.filter((v): v is number => v !== null);
  const m = median(xs);
  return m === null ? null : { median: m, min: Math.min(...xs), max: Math.max(...xs), n: xs.length };
}

/** One run as the summary reads it; `row` is the methods table's row of that run (lib/methods-table.ts). */
export function repeatRun(row: MethodRow): RepeatRun {
  if (!row.runId) throw new RangeError(`a repeat of ${row.method} without a run id`);
  return {
    runId: row.runId,
    failed: row.failed,
    evals: row.curve.map((p) => ({ iteration: p.iteration, successRate: p.successRate, episodes: p.episodes })),
    sessionsToThreshold: row.sessionsToThreshold,
    stepsToThreshold: row.stepsToThreshold,
    sessions: row.browserSessions,
    envSteps: row.envSteps,
  };
}

export function repeatSummary(method: Method, runs: readonly RepeatRun[], threshold: number): RepeatSummary {
  const ok = runs.filter((r) => !r.failed);
  const reachedRuns = ok.filter((r) => r.evals.some((e) => e.successRate >= threshold - AT_LEAST));
  return {
    method,
    runs: [...runs],
    reached: reachedRuns.length,
    endedAbove: ok.filter((r) => (r.evals.at(-1)?.successRate ?? -1) >= threshold - AT_LEAST).length,
    sessionsToThreshold: spread(reachedRuns.map((r) => r.sessionsToThreshold)),
    stepsToThreshold: spread(reachedRuns.map((r) => r.stepsToThreshold)),
  };
}

const spreadCell = (s: Spread | null, of: number) => (s === null ? '–' : `${round(s.median)} (${round(s.min)}–${round(s.max)})${s.n < of ? `, ${s.n} of ${of} recorded` : ''}`);
const round = (x: number) => String(Math.round(x));

/** A run's evaluations: successes of n where counted ("0 8 8"), else percentages. */
export function evalsCell(run: RepeatRun): string {
  if (run.failed) return `failed: ${run.failed.replace(/\|/g, '\\|')}`;
  if (run.evals.length === 0) return 'not evaluated';
  const counted = run.evals.every((e) => e.episodes !== null);
  const n = counted ? run.evals[0].episodes : null;
  if (counted && run.evals.every((e) => e.episodes === n)) return `${run.evals.map((e) => Math.round(e.successRate * n!)).join(' ')} of ${n}`;
  return run.evals.map((e) => `${Math.round(e.successRate * 100)}%`).join(' ');
}

export function repeatsMarkdown(report: RepeatsReport): string {
  const t = String(report.threshold);
  const head = [
    'method',
    'runs',
    `reached ${t} at an evaluation`,
    `at ${t} at the last evaluation`,
    `browser sessions to ${t}: median (range)`,
    `env steps to ${t}: median (range)`,
    'held-out successes per evaluation, run by run',
  ];
  const lines = [report.command, '', `| ${head.join(' | ')} |`, `|${head.map((_, i) => (i === 0 || i === head.length - 1 ? '---' : '---:')).join('|')}|`];
  for (const s of report.summaries) {
    const of = s.runs.length;
    const cells = [
      s.method,
      String(of),
      `${s.reached} of ${of}`,
      `${s.endedAbove} of ${of}`,
      spreadCell(s.sessionsToThreshold, s.reached),
      spreadCell(s.stepsToThreshold, s.reached),
      s.runs.map((r) => `${r.runId}: ${evalsCell(r)}`).join('; '),
    ];
    lines.push(`| ${cells.join(' | ')} |`);
  }
  lines.push('');
  lines.push(
    `Each run's own greedy evaluations (train.evalEvery / evalEverySteps) on ${report.tasks.join(', ')} × seeds ${report.seeds.join(', ')}. Browser sessions (env steps) to ${t}: opened (taken) in training up to the first evaluation at or above ${t}, over the runs that reached it.`,
  );
  for (const n of report.notes) lines.push(`Note: ${n}`);
  return lines.join('\n') + '\n';
}
