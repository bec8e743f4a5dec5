// How repeatable a method is: K training runs of one config, each read through its periodic greedy held-out
// evaluations (bench/repeats.ts). One table row tells a user choosing between methods what a single run
// cannot: in how many runs the method got there, and at what cost in browser sessions and env steps. Pure.

import { median } from '../lib/eval/eval-summary';
import { mean } from '../lib/training/grpo';
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

/** One run as the summary reads it; `row` is the methods table's row of that run (bench/methods-table.ts). */
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

// ---- runs of one config on fresh stacks (bench/fresh-repeats.ts) ---------------------------------------

/** One training run of bench/fresh-repeats.ts, on a stack started for it alone. */
export interface FreshRun {
  runId: string;
  seed: number;
  /** The tiny model it trained (tiny-random, tiny-random-s<seed>): other init seeds, other random preferences. */
  model: string;
  /** Training success per iteration. */
  success: number[];
  /** Zero-std share of the step groups' first draws, and after dynamic sampling's extra draws, per iteration. */
  zeroStdFirstDraw: number[];
  zeroStd: number[];
  /** Greedy held-out evaluations (train.heldOutTasks), in order. */
  evals: { iteration: number; success: number }[];
  /** sha256 (16 hex) of the last adapter's weights. */
  adapterHash: string | null;
  seconds: number;
  error?: string;
}

export interface FreshRunSummary {
  /** Mean training success over the last five iterations. */
  lastFive: number;
  reached: boolean;
  /** First iteration from which the mean of it and the next four (or fewer, at the end) is ≥ the threshold. */
  toThreshold: number | null;
  lastEval: number | null;
}

/** What a run's training curve says against the threshold (a failed run never reached it). */
export function freshRunSummary(r: Pick<FreshRun, 'success' | 'evals' | 'error'>, threshold: number): FreshRunSummary {
  const lastFive = mean(r.success.slice(-5));
  let toThreshold: number | null = null;
  for (let i = 0; i < r.success.length && toThreshold === null; i++) if (mean(r.success.slice(i, i + 5)) >= threshold) toThreshold = i + 1;
  return { lastFive, reached: !r.error && lastFive >= threshold, toThreshold, lastEval: r.evals.at(-1)?.success ?? null };
}

/** Runs of the same seed whose curves or last adapters differ: a run is not a function of its config and seed. */
export function reproducibilityProblems(runs: readonly FreshRun[]): string[] {
  const bySeed = new Map<string, FreshRun[]>();
  for (const r of runs) {
    const key = `${r.model} seed ${r.seed}`;
    bySeed.set(key, [...(bySeed.get(key) ?? []), r]);
  }
  const out: string[] = [];
  for (const [key, same] of bySeed) {
    for (const r of same.slice(1)) {
      const a = same[0];
      if (a.success.join() !== r.success.join()) out.push(`${key}: ${a.runId} and ${r.runId} have different curves`);
      else if (a.adapterHash !== r.adapterHash) out.push(`${key}: ${a.runId} and ${r.runId} end with different adapters (${a.adapterHash} vs ${r.adapterHash})`);
    }
  }
  return out;
}

export function freshRunsMarkdown(runs: readonly FreshRun[], threshold: number, meta: { command: string; config: string }): string {
  const sums = runs.map((r) => freshRunSummary(r, threshold));
  const reached = sums.filter((s) => s.reached).length;
  const iters = sums.flatMap((s) => (s.toThreshold === null ? [] : [s.toThreshold])).sort((a, b) => a - b);
  const median = iters.length ? iters[Math.floor((iters.length - 1) / 2)] : null;
  const rows = runs.map((r, i) => {
    const s = sums[i];
    const curve = r.success.map((x) => x.toFixed(2)).join(' ');
    const zs = `${mean(r.zeroStdFirstDraw).toFixed(2)} → ${mean(r.zeroStd).toFixed(2)}`;
    const ev = s.lastEval === null ? '–' : s.lastEval.toFixed(2);
    return `| ${r.runId} | ${r.model} | ${r.seed} | ${curve} | ${s.lastFive.toFixed(2)} | ${s.reached ? 'yes' : r.error ? `failed: ${r.error}` : 'no'} | ${s.toThreshold ?? '–'} | ${ev} | ${zs} | ${r.adapterHash ?? '–'} | ${r.seconds} |`;
  });
  const repro = reproducibilityProblems(runs);
  const twice = runs.length - new Set(runs.map((r) => `${r.model} seed ${r.seed}`)).size;
  return [
    `\`${meta.command}\` (${meta.config})`,
    '',
    `Reached ≥ ${threshold} mean training success over the last five iterations: **${reached} of ${runs.length}** runs; median iterations to it: ${median ?? '–'}.`,
    twice ? (repro.length ? `Same seed, different result: ${repro.join('; ')}.` : `Every seed run twice gave the same curve and the same last adapter (${twice} pairs).`) : '',
    '',
    '| run | model | seed | training success per iteration | last five | reached | iterations to it | last held-out | zero-std groups (first draw → after) | last adapter | seconds |',
    '|---|---|---:|---|---:|---|---:|---:|---|---|---:|',
    ...rows,
    '',
  ].join('\n');
}

// ---- repeated runs of test files (bench/test-repeats.ts) ----------------------------------------------------

export interface TestRun {
  file: string;
  passed: boolean;
  exitCode: number | null;
  seconds: number;
  startedAt: string;
  commit: string;
  loadAtEnd: string;
  /** What the file printed about its seeds and its greedy comparison, and the first failure line if any. */
  lines: string[];
}

/** Lines worth keeping from a test file's output: its per-seed verdicts, the greedy comparison, the failure. */
export function keptLines(output: string): string[] {
  const out: string[] = [];
  for (const raw of output.split('\n')) {
    const l = raw.trim();
    if (/^(seed \d+|base\b|trained\b|held[- ]out\b)/i.test(l) || /greedy held-out/i.test(l)) out.push(l);
    else if (/^(error|AssertionError)/i.test(l) && out.every((x) => !/^(error|AssertionError)/i.test(x))) out.push(l.slice(0, 300));
  }
  return out;
}

/** Per file: runs, passed, failed, median and range of seconds. */
export function testRepeatsMarkdown(runs: TestRun[], command: string): string {
  const files = [...new Set(runs.map((r) => r.file))];
  const rows = files.map((f) => {
    const rs = runs.filter((r) => r.file === f);
    const secs = rs.map((r) => r.seconds);
    const failed = rs.filter((r) => !r.passed).length;
    return `| ${f} | ${rs.length} | ${rs.length - failed} | ${failed} | ${(median(secs) ?? Number.NaN).toFixed(0)} | ${Math.min(...secs).toFixed(0)}–${Math.max(...secs).toFixed(0)} |`;
  });
  const each = runs.map(
    (r, i) =>
      `| ${i + 1} | ${r.file} | ${r.passed ? 'passed' : `**failed** (exit ${r.exitCode})`} | ${r.seconds.toFixed(0)} | ${r.startedAt} | ${r.commit} | ${r.loadAtEnd} | ${r.lines.join('<br>').replace(/\|/g, '\\|')} |`,
  );
  return [
    `# Repeated runs of test files`,
    '',
    `\`${command}\` (runs add up across invocations with the same --tag)`,
    '',
    '| file | runs | passed | failed | median s | range s |',
    '|---|---:|---:|---:|---:|---:|',
    ...rows,
    '',
    '| # | file | verdict | seconds | started (UTC) | commit | load avg at end | what it printed |',
    '|---:|---|---|---:|---|---|---|---|',
    ...each,
    '',
  ].join('\n');
}
