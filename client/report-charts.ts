// vega-lite's types by path: its package exports are not visible to this project's module resolution.
import type { TopLevelSpec } from 'vega-lite/build/index';
import type { Algorithm, MetricsLine } from '../lib/training/run-metrics';

// The run report's charts as Vega-Lite specs (pure functions of the metrics.jsonl lines), compiled with
// vega-lite and rendered to SVG by vega in Node (no browser), and to PNG by resvg. Each algorithm has its
// charts: the common numbers (success rate, return, loss, …) and its own (GRPO's groups, MCTS's search).

export type ChartId = 'learning_curve' | 'learner' | 'signal' | 'search';

export interface SeriesDef {
  /** The line's key: a metrics field, or a dotted path into one (`eval.success_rate`, `mcts.pairs`). */
  key: string;
  title: string;
  help: string;
  /** Values in [0, 1]: a y axis fixed to [0, 1] and percentages. */
  fraction: boolean;
  /** Left out of the chart when the run has no value for it (optional learner numbers). */
  optional?: boolean;
}

export interface PanelDef {
  title: string;
  series: SeriesDef[];
}

export interface ChartDef {
  id: ChartId;
  title: string;
  help: string;
  panels: PanelDef[];
  /** Panels per row (concat); 1 stacks them. */
  columns: number;
  width: number;
  height: number;
}

const S = {
  success_rate: { key: 'success_rate', title: 'success rate', help: 'fraction of episodes that succeeded', fraction: true },
  action_validity: { key: 'action_validity', title: 'action validity', help: 'fraction of model outputs that parsed into a valid action', fraction: true },
  eval_success: { key: 'eval.success_rate', title: 'held-out success (greedy)', help: 'greedy evaluation on held-out tasks (train.evalEvery)', fraction: true, optional: true },
  mean_reward: { key: 'mean_reward', title: 'mean reward', help: 'mean shaped reward of the iteration', fraction: false },
  loss: { key: 'loss', title: 'loss', help: 'learner loss of the update (missing when no update ran)', fraction: false },
  grad_norm: { key: 'grad_norm', title: 'grad norm', help: 'gradient norm before clipping', fraction: false },
  kl: { key: 'kl', title: 'KL', help: 'KL to the reference policy, per token', fraction: false },
  clip_fraction: { key: 'clip_fraction', title: 'clip fraction', help: 'share of tokens whose importance ratio was clipped', fraction: true, optional: true },
  mean_ratio: { key: 'mean_ratio', title: 'mean ratio', help: 'mean importance ratio new/old policy', fraction: false, optional: true },
  entropy: { key: 'entropy', title: 'entropy', help: 'mean token entropy of the sampled completions', fraction: false, optional: true },
  frac_reward_zero_std: {
    key: 'frac_reward_zero_std',
    title: 'groups with zero reward std',
    help: 'fraction of GRPO groups whose rewards were all equal (no learning signal)',
    fraction: true,
  },
  reward_std: { key: 'reward_std', title: 'reward std', help: 'mean reward standard deviation within a group', fraction: false },
} satisfies Record<string, SeriesDef>;

/** MCTS's series: a search stands for an episode (success and return of its best path), the update is DPO's. */
const M = {
  success_rate: { key: 'success_rate', title: 'best-path success', help: 'fraction of searches whose best path ends in success', fraction: true },
  eval_success: S.eval_success,
  // Runs from before mcts-metrics.jsonl became metrics.jsonl recorded the evaluation's success rate alone.
  legacy_eval_success: { key: 'mcts.eval_success_rate', title: 'held-out success (greedy)', help: 'greedy evaluation (mcts.evalEvery)', fraction: true, optional: true },
  mean_return: { key: 'mean_return', title: 'best-path return', help: "mean terminal reward of the searches' best paths", fraction: false },
  loss: { key: 'loss', title: 'DPO loss', help: 'DPO loss of the update (missing when no pair was collected)', fraction: false },
  grad_norm: S.grad_norm,
  accuracy: { key: 'mcts.accuracy', title: 'preference accuracy', help: 'share of pairs whose implicit reward favours the chosen step (before the update)', fraction: true },
  reward_margin: { key: 'mcts.reward_margin', title: 'reward margin', help: 'mean implicit reward margin β·(log-ratio of chosen − log-ratio of rejected)', fraction: false },
  pairs: { key: 'mcts.pairs', title: 'DPO pairs', help: 'step-level preference pairs collected', fraction: false },
  mean_abs_delta_q: { key: 'mcts.mean_abs_delta_q', title: 'mean |ΔQ|', help: 'mean Q gap of the pairs', fraction: false },
  simulations: { key: 'mcts.simulations', title: 'simulations', help: 'simulations over all searches', fraction: false },
  nodes: { key: 'mcts.nodes', title: 'tree nodes', help: 'nodes of all search trees', fraction: false },
} satisfies Record<string, SeriesDef>;

/** A GRPO run's charts. */
export const REPORT_CHARTS: readonly ChartDef[] = [
  {
    id: 'learning_curve',
    title: 'Learning curve',
    help: 'success rate and action validity of the sampled episodes (and held-out greedy success when evaluated), and the mean shaped reward, per iteration',
    panels: [
      { title: 'success rate and action validity', series: [S.success_rate, S.action_validity, S.eval_success] },
      { title: 'mean reward', series: [S.mean_reward] },
    ],
    columns: 1,
    width: 760,
    height: 230,
  },
  {
    id: 'learner',
    title: 'Learner',
    help: "the update's loss, gradient norm and KL (and clip fraction, importance ratio and entropy when the learner reports them)",
    panels: [S.loss, S.grad_norm, S.kl, S.clip_fraction, S.mean_ratio, S.entropy].map((s) => ({ title: s.title, series: [s] })),
    columns: 3,
    width: 250,
    height: 150,
  },
  {
    id: 'signal',
    title: 'Learning signal',
    help: 'GRPO groups without reward variance carry no gradient; the within-group reward spread',
    panels: [S.frac_reward_zero_std, S.reward_std].map((s) => ({ title: s.title, series: [s] })),
    columns: 2,
    width: 370,
    height: 150,
  },
];

/** An MCTS run's charts. */
export const MCTS_REPORT_CHARTS: readonly ChartDef[] = [
  {
    id: 'learning_curve',
    title: 'Learning curve',
    help: "success rate of the searches' best paths (and held-out greedy success when evaluated), and their mean return, per iteration",
    panels: [
      { title: 'best-path and held-out success', series: [M.success_rate, M.eval_success, M.legacy_eval_success] },
      { title: 'best-path return', series: [M.mean_return] },
    ],
    columns: 1,
    width: 760,
    height: 230,
  },
  {
    id: 'learner',
    title: 'Learner',
    help: "the DPO update's loss, gradient norm, preference accuracy and reward margin",
    panels: [M.loss, M.grad_norm, M.accuracy, M.reward_margin].map((s) => ({ title: s.title, series: [s] })),
    columns: 2,
    width: 370,
    height: 150,
  },
  {
    id: 'search',
    title: 'Search',
    help: 'what the searches produced: DPO pairs and their Q gap, simulations and tree nodes',
    panels: [M.pairs, M.mean_abs_delta_q, M.simulations, M.nodes].map((s) => ({ title: s.title, series: [s] })),
    columns: 2,
    width: 370,
    height: 150,
  },
];

/** The run's algorithm: that of its latest line (GRPO for a run without lines). */
export function runAlgorithm(lines: readonly MetricsLine[]): Algorithm {
  let last: MetricsLine | undefined;
  for (const l of lines) if (!last || l.iteration > last.iteration) last = l;
  return last?.algorithm ?? 'grpo';
}

/** The charts for the run's algorithm. */
export function reportCharts(lines: readonly MetricsLine[]): readonly ChartDef[] {
  return runAlgorithm(lines) === 'mcts' ? MCTS_REPORT_CHARTS : REPORT_CHARTS;
}

/** One data point of a chart: `value` null where the metric is missing (the line breaks there). */
export interface ChartDatum {
  iteration: number;
  metric: string;
  value: number | null;
}

/** The line's value at a key or dotted path (`eval.success_rate`), undefined where there is none. */
export function fieldOf(line: MetricsLine, key: string): unknown {
  return key.split('.').reduce<unknown>((o, k) => (o && typeof o === 'object' ? (o as Record<string, unknown>)[k] : undefined), line);
}

function numericField(line: MetricsLine, key: string): number | null {
  const v = fieldOf(line, key);
  return typeof v === 'number' && Number.isFinite(v) ? v : null;
}

/** The panel's series the run has values for (a required series stays, drawn as "no values"). */
export function seriesWithData(lines: readonly MetricsLine[], series: readonly SeriesDef[]): SeriesDef[] {
  return series.filter((s) => !s.optional || lines.some((l) => numericField(l, s.key) !== null));
}

/** The rows of one panel, in iteration order, one per iteration and series. */
export function panelData(lines: readonly MetricsLine[], series: readonly SeriesDef[]): ChartDatum[] {
  const sorted = [...lines].sort((a, b) => a.iteration - b.iteration);
  return series.flatMap((s) => sorted.map((l) => ({ iteration: l.iteration, metric: s.key, value: numericField(l, s.key) })));
}

const PALETTE = ['#2b6cb0', '#d97706', '#059669', '#9333ea'];

type UnitSpec = Record<string, unknown>;

function panelSpec(lines: readonly MetricsLine[], panel: PanelDef, chart: ChartDef, iterations: [number, number]): UnitSpec | null {
  const series = seriesWithData(lines, panel.series);
  if (series.length === 0) return null;
  const fraction = series.every((s) => s.fraction);
  const values = panelData(lines, series);
  const yTitle = series.length === 1 ? series[0].key : fraction ? 'fraction' : 'value';
  const x = {
    field: 'iteration',
    type: 'quantitative',
    title: 'iteration',
    scale: { domain: iterations[0] === iterations[1] ? [iterations[0] - 1, iterations[1] + 1] : iterations, nice: false },
    axis: { tickMinStep: 1, format: 'd' },
  };
  const y = {
    field: 'value',
    type: 'quantitative',
    title: yTitle,
    ...(fraction ? { scale: { domain: [0, 1] }, axis: { format: '.0%' } } : { scale: valueScale(values), axis: { format: '~g' } }),
  };
  const color = {
    field: 'metric',
    type: 'nominal',
    title: null,
    scale: { domain: series.map((s) => s.key), range: PALETTE.slice(0, series.length) },
    legend: series.length > 1 ? { orient: 'bottom', labelExpr: labelExpr(series), labelLimit: 400 } : null,
  };
  const tooltip = [
    { field: 'metric', type: 'nominal' },
    { field: 'iteration', type: 'quantitative' },
    { field: 'value', type: 'quantitative', format: fraction ? '.1%' : '.4~g' },
  ];
  const hasValue = values.some((d) => d.value !== null);
  const layers: UnitSpec[] = [
    { mark: { type: 'line', strokeWidth: 2, invalid: 'break-paths-show-domains' }, encoding: { x, y, color } },
    { mark: { type: 'point', filled: true, size: 45, invalid: 'filter' }, encoding: { x, y, color, tooltip } },
  ];
  if (!hasValue) layers.push({ data: { values: [{}] }, mark: { type: 'text', text: 'no values', color: '#6b7385', fontSize: 13 }, encoding: {} });
  return {
    title: { text: panel.title, anchor: 'start', fontSize: 13 },
    width: chart.width,
    height: chart.height,
    data: { values },
    layer: layers,
  };
}

/** A value axis around the data (not from zero); a constant series gets a band around its value. */
function valueScale(values: readonly ChartDatum[]): Record<string, unknown> {
  const vs = values.flatMap((d) => (d.value === null ? [] : [d.value]));
  if (vs.length === 0) return { domain: [0, 1] };
  const lo = Math.min(...vs);
  const hi = Math.max(...vs);
  if (hi > lo) return { zero: false, nice: true };
  const pad = lo !== 0 ? Math.abs(lo) * 0.5 : 1;
  return { domain: [lo - pad, hi + pad], nice: true };
}

function labelExpr(series: readonly SeriesDef[]): string {
  return series.map((s) => `datum.label === ${JSON.stringify(s.key)} ? ${JSON.stringify(s.title)} : `).join('') + 'datum.label';
}

/** The chart's Vega-Lite spec, data inline. */
export function chartSpec(lines: readonly MetricsLine[], chart: ChartDef): TopLevelSpec {
  const sorted = [...lines].sort((a, b) => a.iteration - b.iteration);
  const iterations: [number, number] = sorted.length ? [sorted[0].iteration, sorted[sorted.length - 1].iteration] : [0, 0];
  const panels = chart.panels.map((p) => panelSpec(sorted, p, chart, iterations)).filter((p): p is UnitSpec => p !== null);
  return {
    $schema: 'https://vega.github.io/schema/vega-lite/v6.json',
    description: `${chart.title}: ${chart.help}`,
    background: 'white',
    padding: 8,
    config: { font: 'DejaVu Sans, Liberation Sans, Arial, sans-serif', axis: { gridColor: '#eceef2', labelFontSize: 11, titleFontSize: 12 }, view: { stroke: '#dde1e8' } },
    ...(panels.length === 1 ? panels[0] : { columns: chart.columns, concat: panels, resolve: { scale: { color: 'independent', y: 'independent' } } }),
  } as TopLevelSpec;
}

/** The spec rendered to an SVG document (vega's headless renderer). */
export async function renderChartSvg(spec: TopLevelSpec): Promise<string> {
  const vl = (await import('vega-lite' as string)) as typeof import('vega-lite/build/index');
  const vega = await import('vega');
  const view = new vega.View(vega.parse(vl.compile(spec).spec), { renderer: 'none' });
  try {
    return await view.toSVG();
  } finally {
    view.finalize();
  }
}

/** An SVG document as PNG (resvg), `scale` pixels per SVG unit. */
export async function renderSvgPng(svg: string, scale = 2): Promise<Buffer> {
  const { Resvg } = await import('@resvg/resvg-js');
  const r = new Resvg(svg, {
    fitTo: { mode: 'zoom', value: scale },
    background: 'white',
    font: { loadSystemFonts: true, defaultFontFamily: 'DejaVu Sans', sansSerifFamily: 'DejaVu Sans' },
  });
  return r.render().asPng();
}
