import type { HaloConfig } from '../lib/config/config';
import { formatSuccess, type EvalSummaryRow, type WilsonInterval } from '../lib/eval/eval-summary';
import { isMctsMetrics, type MetricsLine } from '../lib/training/run-metrics';

// The methods comparison (bench/methods.ts) as pure functions: which methods, whether one config can compare
// them fairly, and, from each run's metrics rows and the final evaluation's summary rows, the table's numbers,
// its Markdown and two Vega-Lite charts. Env steps are the training's browser actions (rollouts, forks, MCTS
// simulations); the per-iteration and final evaluations are not counted in them.

export const METHODS = ['base', 'grpo-episode', 'grpo-step', 'grpo-anchor', 'mcts-dpo'] as const;
export type Method = (typeof METHODS)[number];
export type MethodAlgorithm = 'none' | 'grpo' | 'mcts';

/** Held-out greedy success a method must reach for "env steps to threshold". */
export const SUCCESS_THRESHOLD = 0.8;

/** The GRPO grouping a method trains with; undefined for the others. */
export function groupingOf(method: Method): 'episode' | 'step' | 'anchor' | undefined {
  return method === 'grpo-episode' ? 'episode' : method === 'grpo-step' ? 'step' : method === 'grpo-anchor' ? 'anchor' : undefined;
}

export function algorithmOf(method: Method): MethodAlgorithm {
  return method === 'base' ? 'none' : method === 'mcts-dpo' ? 'mcts' : 'grpo';
}

/** `--rows base,grpo-step`: known names, each once, in the order given. */
/** `a, b,,c` → ['a', 'b', 'c']: a flag's comma-separated items, blanks dropped. */
const commaItems = (text: string) =>
  text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);

export function parseMethods(text: string): Method[] {
  const names = commaItems(text);
  if (names.length === 0) throw new Error(`--rows: name at least one of ${METHODS.join(', ')}`);
  const out: Method[] = [];
  for (const n of names) {
    if (!(METHODS as readonly string[]).includes(n)) throw new Error(`--rows: unknown row "${n}" (rows: ${METHODS.join(', ')})`);
    if (out.includes(n as Method)) throw new Error(`--rows: "${n}" is listed twice`);
    out.push(n as Method);
  }
  return out;
}

/**
 * `--row-config grpo-anchor=configs/multistep-anchor.yaml,…`: rows that train with a config file of their own
 * instead of --config's. Only trained rows of `methods`; each at most once.
 */
export function parseRowConfigs(text: string, methods: readonly Method[]): Map<Method, string> {
  const out = new Map<Method, string>();
  for (const part of commaItems(text)) {
    const eq = part.indexOf('=');
    const row = part.slice(0, eq).trim();
    const file = part.slice(eq + 1).trim();
    if (eq <= 0 || !file) throw new Error(`--row-config: "${part}" is not ROW=FILE`);
    if (!(methods as readonly string[]).includes(row)) throw new Error(`--row-config: row "${row}" is not among --rows (${methods.join(', ')})`);
    if (row === 'base') throw new Error('--row-config: row base trains nothing');
    if (out.has(row as Method)) throw new Error(`--row-config: row "${row}" is given twice`);
    out.set(row as Method, file);
  }
  return out;
}

const sameSet = <T>(a: readonly T[], b: readonly T[]) => a.length === b.length && a.every((x) => b.includes(x));
const list = (xs: readonly (string | number)[]) => `[${xs.join(', ')}]`;

/**
 * Why this config cannot compare `methods` on one list of tasks and held-out seeds: the comparison's tasks are
 * train.heldOutTasks and its seeds train.evalSeeds (what GRPO runs evaluate on every evalEvery iterations), and
 * the MCTS run must train on train.tasks and evaluate on the same tasks and seeds. Empty when it can.
 */
export function comparisonProblems(cfg: HaloConfig, methods: readonly Method[]): string[] {
  const t = cfg.train;
  const m = cfg.mcts;
  const out: string[] = [];
  if (t.heldOutTasks.length === 0) {
    out.push(
      `train.heldOutTasks is empty: GRPO runs evaluate on heldOutTasks only, and the comparison evaluates every method on them; list the tasks to evaluate (e.g. the same as train.tasks ${list(t.tasks)}, with held-out seeds)`,
    );
  }
  if (!t.evalSeeds) out.push('train.evalSeeds is not set: the comparison needs fixed held-out seeds, the same for every method and every evaluation');
  const trained = methods.filter((x) => x !== 'base');
  if (trained.some((x) => algorithmOf(x) === 'grpo') && t.evalEvery === 0 && t.evalEverySteps === 0) {
    out.push('train.evalEvery and train.evalEverySteps are 0: GRPO runs would never evaluate, so there is no learning curve (set train.evalEvery, e.g. 1)');
  }
  if (methods.includes('mcts-dpo')) {
    if (!sameSet(m.tasks, t.tasks)) out.push(`mcts.tasks ${list(m.tasks)} differ from train.tasks ${list(t.tasks)}: every method must train on the same tasks`);
    const mctsEvalTasks = m.heldOutTasks.length > 0 ? m.heldOutTasks : m.tasks;
    if (t.heldOutTasks.length > 0 && !sameSet(mctsEvalTasks, t.heldOutTasks)) {
      out.push(
        `the MCTS run evaluates on ${list(mctsEvalTasks)} (mcts.heldOutTasks, else mcts.tasks), train.heldOutTasks is ${list(t.heldOutTasks)}: every method must be evaluated on the same tasks`,
      );
    }
    if (t.evalSeeds && !sameSet(m.evalSeeds, t.evalSeeds))
      out.push(`mcts.evalSeeds ${list(m.evalSeeds)} differ from train.evalSeeds ${list(t.evalSeeds)}: every method must be evaluated on the same seeds`);
    if (m.evalEvery === 0 && m.evalEverySteps === 0)
      out.push('mcts.evalEvery and mcts.evalEverySteps are 0: the MCTS run would never evaluate, so there is no learning curve (set mcts.evalEvery, e.g. 1)');
  }
  return out;
}

/**
 * Why a row's own config (`--row-config`) cannot stand in the comparison: it must train the same policy on the
 * same environment and tasks, and be evaluated on the same tasks and seeds as the shared config. Empty when it can.
 */
export function rowConfigProblems(shared: HaloConfig, row: HaloConfig, method: Method): string[] {
  const out: string[] = [];
  const differs = (what: string, a: unknown, b: unknown, same = JSON.stringify(a) === JSON.stringify(b)) => {
    if (!same) out.push(`${what} ${JSON.stringify(a)} differs from --config's ${JSON.stringify(b)}`);
  };
  const tasks = (what: string, a: readonly string[], b: readonly string[]) => differs(what, a, b, sameSet(a, b));
  differs('episode.env', row.episode.env, shared.episode.env);
  differs('episode.maxSteps', row.episode.maxSteps, shared.episode.maxSteps);
  differs('policy.model', row.policy.model, shared.policy.model);
  differs('policy.actions', row.policy.actions, shared.policy.actions);
  if (algorithmOf(method) === 'grpo') tasks('train.tasks', row.train.tasks, shared.train.tasks);
  else tasks('mcts.tasks', row.mcts.tasks, shared.mcts.tasks);
  tasks('train.heldOutTasks', row.train.heldOutTasks, shared.train.heldOutTasks);
  differs('train.evalSeeds', row.train.evalSeeds, shared.train.evalSeeds);
  out.push(...comparisonProblems(row, [method]));
  return out;
}

// ---- numbers of one run --------------------------------------------------------------------------------

/** Counts a newer writer adds to each row; rows from before it lack them. */
type CountKey = 'env_steps' | 'sessions_opened' | 'replayed_actions';

function countOf(row: MetricsLine, key: CountKey): number | undefined {
  const v: unknown = (row as Record<string, unknown>)[key];
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined;
}

/**
 * One iteration's training env steps: `env_steps` when the row has it, else an estimate that leaves out forks
 * and replays (GRPO: episode_length × num_episodes, the episodes' own steps; MCTS: one step per simulation).
 */
export function iterationEnvSteps(row: MetricsLine): { steps: number; estimated: boolean } {
  const measured = countOf(row, 'env_steps');
  if (measured !== undefined) return { steps: measured, estimated: false };
  if (isMctsMetrics(row)) return { steps: row.mcts.simulations, estimated: true };
  return { steps: Math.round((row.episode_length ?? 0) * row.num_episodes), estimated: true };
}

export interface CurvePoint {
  iteration: number;
  /** Training env steps up to and including this iteration. */
  envSteps: number;
  /** Some iteration up to here had no `env_steps` (see iterationEnvSteps). */
  estimated: boolean;
  successRate: number;
  /** Evaluation episodes (null for old MCTS rows, which recorded the rate alone). */
  episodes: number | null;
}

const byIteration = (rows: readonly MetricsLine[]) => [...rows].sort((a, b) => a.iteration - b.iteration);

/** Cumulative training env steps after each iteration. */
export function cumulativeEnvSteps(rows: readonly MetricsLine[]): { iteration: number; envSteps: number; estimated: boolean }[] {
  let envSteps = 0;
  let estimated = false;
  return byIteration(rows).map((r) => {
    const s = iterationEnvSteps(r);
    envSteps += s.steps;
    estimated ||= s.estimated;
    return { iteration: r.iteration, envSteps, estimated };
  });
}

/** The per-iteration held-out evaluations against cumulative env steps. */
export function evalCurve(rows: readonly MetricsLine[]): CurvePoint[] {
  const sorted = byIteration(rows);
  const cumulative = cumulativeEnvSteps(sorted);
  return sorted.flatMap((r, i) => {
    const rate = r.eval?.success_rate ?? r.mcts?.eval_success_rate;
    if (rate === undefined) return [];
    return [{ ...cumulative[i], successRate: rate, episodes: r.eval?.episodes ?? null }];
  });
}

/** The first point at or above the threshold, or null. Rates are ratios of small counts: a hair of rounding is allowed. */
export function firstReaching<P extends { successRate: number }>(points: readonly P[], threshold: number): P | null {
  return points.find((p) => p.successRate >= threshold - 1e-9) ?? null;
}

/** One per-iteration evaluation episode, attributed to its task. */
export interface TaskEvalEpisode {
  iteration: number;
  task: string;
  success: boolean;
}

export interface TaskThreshold {
  task: string;
  /** Env steps at the first evaluation where this task's success reached the threshold; null: never. */
  envSteps: number | null;
  estimated: boolean;
}

/** Per task: env steps at the first evaluation whose episodes of that task reached the threshold. */
export function taskThresholds(rows: readonly MetricsLine[], episodes: readonly TaskEvalEpisode[], threshold: number): TaskThreshold[] {
  const cumulative = new Map(cumulativeEnvSteps(rows).map((c) => [c.iteration, c]));
  const tasks = [...new Set(episodes.map((e) => e.task))].sort();
  return tasks.map((task) => {
    const mine = episodes.filter((e) => e.task === task);
    const iterations = [...new Set(mine.map((e) => e.iteration))].sort((a, b) => a - b);
    const points = iterations.flatMap((it) => {
      const at = mine.filter((e) => e.iteration === it);
      const c = cumulative.get(it);
      return c ? [{ ...c, successRate: at.filter((e) => e.success).length / at.length }] : [];
    });
    const hit = firstReaching(points, threshold);
    return { task, envSteps: hit?.envSteps ?? null, estimated: hit?.estimated ?? points.some((p) => p.estimated) };
  });
}

// ---- the table -----------------------------------------------------------------------------------------

/** What the bench knows about one method. */
export interface MethodInput {
  method: Method;
  runId?: string;
  /** The run's metrics rows (none for base, or for a run that wrote none). */
  metrics: readonly MetricsLine[];
  /** Why this method has no greedy result: its run failed, its adapter is missing, it was not evaluated. */
  failed?: string;
  /** The final evaluation's summary row of its greedy mode, and of its test-time MCTS mode. */
  greedy?: EvalSummaryRow;
  search?: EvalSummaryRow;
  /** Why the test-time MCTS mode has no result (when search was asked for). */
  searchFailed?: string;
  /** Its per-iteration evaluation episodes by task, when they could be attributed. */
  taskEpisodes?: readonly TaskEvalEpisode[];
}

export interface SuccessNumbers {
  successRate: number;
  successes: number;
  n: number;
  errors: number;
  ci95: WilsonInterval;
}

export interface MethodRow {
  method: Method;
  algorithm: MethodAlgorithm;
  runId: string | null;
  failed: string | null;
  greedy: SuccessNumbers | null;
  search: SuccessNumbers | null;
  searchFailed: string | null;
  iterations: number;
  /** GRPO episodes, MCTS searches. */
  trainingEpisodes: number;
  envSteps: number;
  envStepsEstimated: boolean;
  /** Sum of `sessions_opened`; null when no row has it; partial when only some do (a lower bound). */
  browserSessions: number | null;
  browserSessionsPartial: boolean;
  replayedActions: number | null;
  /** Sums of every phase's seconds, and of `update` (the learner), over the run's rows. */
  wallSeconds: number;
  learnerSeconds: number;
  /** Env steps at the first evaluation that reached the threshold. */
  stepsToThreshold: number | null;
  stepsToThresholdEstimated: boolean;
  /** Browser sessions opened up to that evaluation's iteration; null when not reached or not recorded by every iteration up to it. */
  sessionsToThreshold: number | null;
  /** No evaluation point at all: "not evaluated" rather than "not reached". */
  evaluated: boolean;
  curve: CurvePoint[];
  taskThresholds: TaskThreshold[] | null;
}

const successOf = (r: EvalSummaryRow | undefined): SuccessNumbers | null =>
  r ? { successRate: r.successRate, successes: r.successes, n: r.n, errors: r.errors, ci95: { ...r.ci95 } } : null;

/** Sum of `sessions_opened` over the iterations up to `iteration`; null when one of them lacks it. */
function sessionsUpTo(rows: readonly MetricsLine[], iteration: number): number | null {
  let total = 0;
  for (const r of rows) {
    if (r.iteration > iteration) continue;
    const n = countOf(r, 'sessions_opened');
    if (n === undefined) return null;
    total += n;
  }
  return total;
}

function sumCount(rows: readonly MetricsLine[], key: CountKey): { total: number | null; partial: boolean } {
  const present = rows.map((r) => countOf(r, key)).filter((v): v is number => v !== undefined);
  if (present.length === 0) return { total: null, partial: false };
  return { total: present.reduce((a, b) => a + b, 0), partial: present.length < rows.length };
}

export function methodRow(input: MethodInput, threshold = SUCCESS_THRESHOLD): MethodRow {
  const rows = input.metrics;
  const cumulative = cumulativeEnvSteps(rows);
  const last = cumulative.at(-1);
  const curve = evalCurve(rows);
  const hit = firstReaching(curve, threshold);
  const sessions = sumCount(rows, 'sessions_opened');
  return {
    method: input.method,
    algorithm: algorithmOf(input.method),
    runId: input.runId ?? null,
    failed: input.failed ?? null,
    greedy: input.failed ? null : successOf(input.greedy),
    search: successOf(input.search),
    searchFailed: input.searchFailed ?? null,
    iterations: rows.length,
    trainingEpisodes: rows.reduce((n, r) => n + r.num_episodes, 0),
    envSteps: last?.envSteps ?? 0,
    envStepsEstimated: last?.estimated ?? false,
    browserSessions: sessions.total,
    browserSessionsPartial: sessions.partial,
    replayedActions: sumCount(rows, 'replayed_actions').total,
    wallSeconds: rows.reduce((s, r) => s + Object.values(r.seconds).reduce((a, b) => a + b, 0), 0),
    learnerSeconds: rows.reduce((s, r) => s + (r.seconds.update ?? 0), 0),
    stepsToThreshold: hit?.envSteps ?? null,
    stepsToThresholdEstimated: hit?.estimated ?? false,
    sessionsToThreshold: hit ? sessionsUpTo(rows, hit.iteration) : null,
    evaluated: curve.length > 0,
    curve,
    taskThresholds: input.taskEpisodes ? taskThresholds(rows, input.taskEpisodes, threshold) : null,
  };
}

/** Everything the table and charts show. */
export interface MethodsReport {
  /** The command that made it: `node --import tsx bench/methods.ts …`. */
  command: string;
  env: string;
  tasks: string[];
  seeds: number[];
  threshold: number;
  /** Test-time MCTS of the final evaluation (simulations per step), or null when it did not run. */
  search: { simulations: number } | null;
  rows: MethodRow[];
  /** Whether the per-iteration evaluations could be split by task, and if not, why. */
  perTask: { ok: true } | { ok: false; reason: string };
  notes: string[];
}

const cell = (s: string) => s.replace(/\|/g, '\\|').replace(/\s*\n\s*/g, ' ');
const seconds = (x: number) => x.toFixed(1);
const approx = (n: number, estimated: boolean) => `${estimated ? '~' : ''}${Math.round(n)}`;

function successCell(s: SuccessNumbers | null, failed: string | null): string {
  if (failed) return `failed: ${failed}`;
  if (!s) return '–';
  return `${formatSuccess(s)}, ${s.successes}/${s.n}${s.errors ? ` (${s.errors} episodes failed)` : ''}`;
}

/** A "… to the threshold" cell: '–', 'not evaluated', 'not reached', or `reached` (the count when it was). */
function thresholdCell(r: MethodRow, reached: () => string): string {
  if (r.algorithm === 'none') return '–';
  if (!r.evaluated) return 'not evaluated';
  return r.stepsToThreshold === null ? 'not reached' : reached();
}

function sessionsCell(r: MethodRow): string {
  if (r.algorithm === 'none') return '–';
  if (r.browserSessions === null) return 'not recorded';
  return `${r.browserSessionsPartial ? '≥' : ''}${r.browserSessions}`;
}

/** table.md: the command on the first line, then the table and what its numbers mean. */
export function methodsMarkdown(report: MethodsReport): string {
  const t = String(report.threshold);
  const searchHead = report.search ? [`with test-time MCTS (${report.search.simulations} sims/step)`] : [];
  const head = [
    'method',
    'greedy success on held-out seeds (95% CI)',
    ...searchHead,
    'training episodes',
    'env steps',
    'browser sessions',
    'wall time (s)',
    'learner time (s)',
    `env steps to ${t} success`,
    `browser sessions to ${t} success`,
  ];
  const lines = [report.command, '', `| ${head.join(' | ')} |`, `|${head.map((_, i) => (i === 0 ? '---' : i <= 1 + searchHead.length ? '---' : '---:')).join('|')}|`];
  for (const r of report.rows) {
    const trained = r.algorithm !== 'none';
    const episodes = !trained ? '–' : r.algorithm === 'mcts' ? `${r.trainingEpisodes} searches` : `${r.trainingEpisodes}`;
    const searchCell = report.search ? [successCell(r.search, r.failed ?? r.searchFailed)] : [];
    const cells = [
      r.method,
      successCell(r.greedy, r.failed),
      ...searchCell,
      episodes,
      trained ? approx(r.envSteps, r.envStepsEstimated) : '–',
      sessionsCell(r),
      trained ? seconds(r.wallSeconds) : '–',
      trained ? seconds(r.learnerSeconds) : '–',
      thresholdCell(r, () => approx(r.stepsToThreshold!, r.stepsToThresholdEstimated)),
      thresholdCell(r, () => (r.sessionsToThreshold === null ? 'not recorded' : String(r.sessionsToThreshold))),
    ];
    lines.push(`| ${cells.map(cell).join(' | ')} |`);
  }
  lines.push('');
  lines.push(
    `Held-out evaluation: greedy (temperature 0), ${report.env} tasks ${report.tasks.join(', ')} × seeds ${report.seeds.join(', ')}; the same episodes for every method. Success with its 95% Wilson interval.`,
  );
  if (report.search) lines.push(`Test-time MCTS: ${report.search.simulations} simulations before every step (mcts.maxChildren), no critic.`);
  lines.push(
    `Env steps: browser actions of the training (rollouts, forks, MCTS simulations), evaluations not counted. Env steps (browser sessions) to ${t}: cumulative env steps (sessions opened) at the first per-iteration evaluation with held-out success ≥ ${t}.`,
  );
  if (report.rows.some((r) => r.envStepsEstimated || r.stepsToThresholdEstimated)) {
    lines.push(
      '~: estimated, from iterations whose metrics rows have no `env_steps` (GRPO: episode_length × num_episodes; MCTS: one step per simulation); forks and replays are left out, so it is a lower bound.',
    );
  }
  lines.push('Wall time: sum of the phases of every iteration (evaluations included; phases that overlap in a pipelined run count twice). Learner time: sum of `update`.');
  if (report.rows.some((r) => r.browserSessionsPartial)) lines.push('≥: only some iterations recorded `sessions_opened`.');
  for (const n of report.notes) lines.push(`Note: ${n}`);
  return lines.join('\n') + '\n';
}

// ---- charts --------------------------------------------------------------------------------------------

const VL_SCHEMA = 'https://vega.github.io/schema/vega-lite/v6.json';
const VL_STYLE = {
  background: 'white',
  padding: 8,
  config: { font: 'DejaVu Sans, Liberation Sans, Arial, sans-serif', axis: { gridColor: '#eceef2', labelFontSize: 11, titleFontSize: 12 }, view: { stroke: '#dde1e8' } },
};

const trainedRows = (report: MethodsReport) => report.rows.filter((r) => r.algorithm !== 'none');

function estimatedNote(rows: readonly MethodRow[]): string[] {
  const est = rows.filter((r) => r.envStepsEstimated).map((r) => r.method);
  return est.length ? [`env steps estimated (no env_steps in the metrics) for ${est.join(', ')}`] : [];
}

/** curve.vl.json: per-iteration held-out success against cumulative training env steps, one line per method. */
export function curveSpec(report: MethodsReport): Record<string, unknown> {
  const rows = trainedRows(report);
  const values = rows.flatMap((r) =>
    r.curve.map((p) => ({ method: r.method, iteration: p.iteration, env_steps: p.envSteps, success_rate: p.successRate, episodes: p.episodes, estimated: p.estimated })),
  );
  const x = { field: 'env_steps', type: 'quantitative', title: 'cumulative env steps (training)' };
  const y = { field: 'success_rate', type: 'quantitative', title: 'held-out success (greedy)', scale: { domain: [0, 1] }, axis: { format: '.0%' } };
  const color = { field: 'method', type: 'nominal', title: 'method', scale: { domain: rows.map((r) => r.method) } };
  const tooltip = [
    { field: 'method', type: 'nominal' },
    { field: 'iteration', type: 'quantitative' },
    { field: 'env_steps', type: 'quantitative', title: 'env steps' },
    { field: 'success_rate', type: 'quantitative', format: '.1%', title: 'success' },
    { field: 'estimated', type: 'nominal', title: 'env steps estimated' },
  ];
  const layer: Record<string, unknown>[] = [
    { mark: { type: 'line', strokeWidth: 2, point: { filled: true, size: 45 } }, encoding: { x, y, color, tooltip } },
    {
      data: { values: [{ threshold: report.threshold }] },
      mark: { type: 'rule', strokeDash: [4, 4], color: '#6b7385' },
      encoding: { y: { field: 'threshold', type: 'quantitative' } },
    },
  ];
  if (values.length === 0) layer.push({ data: { values: [{}] }, mark: { type: 'text', text: 'no per-iteration evaluation', color: '#6b7385', fontSize: 13 }, encoding: {} });
  return {
    $schema: VL_SCHEMA,
    description: 'Held-out greedy success of each training method against the environment steps its training took',
    ...VL_STYLE,
    title: {
      text: 'Held-out greedy success against training env steps',
      subtitle: [`${report.tasks.join(', ')} × ${report.seeds.length} seeds; dashed: ${report.threshold}`, ...estimatedNote(rows)],
      anchor: 'start',
    },
    width: 640,
    height: 320,
    data: { values },
    layer,
  };
}

/**
 * sample-efficiency.vl.json: env steps to the threshold per method and task (bars; "not reached" or "not
 * evaluated" written where there is none), or per method over all tasks when the evaluations could not be
 * split by task (the title says so and why).
 */
export function sampleEfficiencySpec(report: MethodsReport): Record<string, unknown> {
  const rows = trainedRows(report);
  const perTask = report.perTask.ok && rows.every((r) => r.taskThresholds !== null);
  const missing = (r: MethodRow) => (r.evaluated ? 'not reached' : 'not evaluated');
  const values = rows.flatMap((r) =>
    perTask
      ? // Every task of the comparison gets a mark, also one a failed run never evaluated.
        [...new Set([...report.tasks, ...r.taskThresholds!.map((t) => t.task)])].map((task) => {
          const t = r.taskThresholds!.find((x) => x.task === task);
          const steps = t?.envSteps ?? null;
          return { method: r.method, task, env_steps: steps, estimated: t?.estimated ?? false, label: steps === null ? (t ? missing(r) : 'not evaluated') : '' };
        })
      : [{ method: r.method, task: 'all tasks', env_steps: r.stepsToThreshold, estimated: r.stepsToThresholdEstimated, label: r.stepsToThreshold === null ? missing(r) : '' }],
  );
  const x = { field: 'method', type: 'nominal', title: 'method', sort: rows.map((r) => r.method), axis: { labelAngle: 0 } };
  const xOffset = { field: 'task', type: 'nominal' };
  const color = { field: 'task', type: 'nominal', title: 'task' };
  const why = report.perTask.ok ? 'per-task results missing for some method' : report.perTask.reason;
  const text = `Env steps to ${report.threshold} held-out greedy success, ${perTask ? 'per method and task' : 'per method over all tasks'}`;
  const tasks = perTask ? new Set(values.map((v) => v.task)).size : 1;
  return {
    $schema: VL_SCHEMA,
    description: perTask ? text : `${text} (not per task: ${why})`,
    ...VL_STYLE,
    title: { text, subtitle: [...(perTask ? [] : [`not per task: ${why}`]), `${report.tasks.join(', ')} × ${report.seeds.length} seeds`, ...estimatedNote(rows)], anchor: 'start' },
    width: Math.max(360, rows.length * (tasks * 36 + 40)),
    height: 300,
    data: { values },
    layer: [
      {
        transform: [{ filter: 'datum.env_steps !== null' }],
        mark: { type: 'bar' },
        encoding: {
          x,
          xOffset,
          color,
          y: { field: 'env_steps', type: 'quantitative', title: `env steps to ${report.threshold} success` },
          tooltip: [
            { field: 'method', type: 'nominal' },
            { field: 'task', type: 'nominal' },
            { field: 'env_steps', type: 'quantitative', title: 'env steps' },
            { field: 'estimated', type: 'nominal', title: 'estimated' },
          ],
        },
      },
      {
        transform: [{ filter: 'datum.env_steps === null' }],
        mark: { type: 'text', angle: 270, align: 'left', baseline: 'middle', dx: 4, fontSize: 10, color: '#6b7385' },
        encoding: { x, xOffset, y: { datum: 0 }, text: { field: 'label' } },
      },
    ],
  };
}
