// vega-lite's types by path: its package exports are not visible to this project's module resolution.
import type { TopLevelSpec } from 'vega-lite/build/index';
import type { Algorithm, MetricsLine } from '../lib/training/run-metrics';
import { fieldOf, runAlgorithm, type ChartDef } from './report-charts';
import { escapeHtml } from './viewer-html';

// The run report's HTML page: each chart as the SVG vega rendered from its Vega-Lite spec (so the page needs
// no script and no network), the spec itself beside it (data inline: paste it into any Vega-Lite editor),
// and a table of every iteration. client/commands/report.ts renders the charts and writes the files.

export interface RenderedChart {
  def: ChartDef;
  spec: TopLevelSpec;
  svg: string;
  /** The PNG's file name next to report.html, when one was written. */
  png?: string;
}

const CSS = `
body { margin:0; padding:20px 28px; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:#1d2330; background:#f6f7f9; }
h1 { font-size:20px; margin:0 0 4px; }
.meta { color:#6b7385; margin-bottom:16px; }
.latest { display:flex; gap:18px; flex-wrap:wrap; margin-bottom:14px; }
.latest div { background:#fff; border:1px solid #dde1e8; border-radius:8px; padding:6px 12px; }
.latest b { display:block; font-size:18px; font-variant-numeric:tabular-nums; }
.charts { display:flex; flex-direction:column; gap:16px; }
figure.chart { margin:0; padding:10px 12px 6px; background:#fff; border:1px solid #dde1e8; border-radius:8px; width:max-content; max-width:100%; overflow-x:auto; }
figure.chart figcaption { font-weight:600; margin-bottom:2px; }
figure.chart figcaption a { font-weight:400; font-size:12px; margin-left:8px; }
figure.chart .help { color:#6b7385; font-size:12px; margin-bottom:4px; }
figure.chart details { margin-top:4px; font-size:12px; }
figure.chart pre { max-height:240px; overflow:auto; background:#f6f7f9; padding:6px; }
table { border-collapse:collapse; background:#fff; font-size:12.5px; margin-top:8px; }
th, td { padding:3px 8px; border:1px solid #dde1e8; text-align:right; font-variant-numeric:tabular-nums; }
th { background:#f0f2f5; }
details.all { margin-top:20px; }
`;

/** JSON that can sit inside a <script> element (no `</script>`, no `<!--`). */
export function scriptJson(value: unknown, indent?: number): string {
  return JSON.stringify(value, null, indent).replace(/</g, '\\u003c');
}

/** The SVG document vega wrote, without anything before its root element. */
function inlineSvg(svg: string): string {
  const at = svg.indexOf('<svg');
  return at >= 0 ? svg.slice(at) : svg;
}

const GRPO_COLUMNS = [
  'iteration',
  'time',
  'success_rate',
  'action_validity',
  'mean_reward',
  'reward_std',
  'frac_reward_zero_std',
  'episode_length',
  'loss',
  'grad_norm',
  'kl',
  'clip_fraction',
  'mean_ratio',
  'entropy',
  'adapter_version',
  'num_episodes',
] as const;

const MCTS_COLUMNS = [
  'iteration',
  'time',
  'success_rate',
  'mean_return',
  'eval.success_rate',
  'loss',
  'grad_norm',
  'mcts.accuracy',
  'mcts.reward_margin',
  'mcts.pairs',
  'mcts.mean_abs_delta_q',
  'mcts.simulations',
  'mcts.nodes',
  'adapter_version',
  'num_episodes',
] as const;

const TABLE_COLUMNS: Record<Algorithm, readonly string[]> = { grpo: GRPO_COLUMNS, mcts: MCTS_COLUMNS };

/** The headline numbers, first iteration → last: [label, key, fraction]. */
const HEADLINE: Record<Algorithm, readonly [string, string, boolean][]> = {
  grpo: [
    ['success rate', 'success_rate', true],
    ['action validity', 'action_validity', true],
    ['mean reward', 'mean_reward', false],
  ],
  mcts: [
    ['best-path success', 'success_rate', true],
    ['best-path return', 'mean_return', false],
    ['DPO pairs', 'mcts.pairs', false],
  ],
};

function fmt(v: unknown): string {
  if (v === null || v === undefined) return '—';
  if (typeof v === 'number') return String(Number(v.toPrecision(5)));
  return escapeHtml(String(v));
}

const pct = (v: unknown) => (typeof v === 'number' ? `${(v * 100).toFixed(1)}%` : '—');

/** The whole report page. */
export function renderReportHtml(runId: string, lines: readonly MetricsLine[], charts: readonly RenderedChart[]): string {
  const sorted = [...lines].sort((a, b) => a.iteration - b.iteration);
  const first = sorted[0];
  const last = sorted[sorted.length - 1];
  const algorithm = runAlgorithm(sorted);
  const columns = TABLE_COLUMNS[algorithm];
  const figures = charts
    .map(
      (c) =>
        `<figure class="chart" id="chart-${c.def.id}" data-chart="${c.def.id}">` +
        `<figcaption>${escapeHtml(c.def.title)}${c.png ? ` <a href="${escapeHtml(c.png)}">PNG</a>` : ''}</figcaption>` +
        `<div class="help">${escapeHtml(c.def.help)}</div>` +
        `<div class="vega-svg">${inlineSvg(c.svg)}</div>` +
        `<details><summary>Vega-Lite spec</summary><pre>${escapeHtml(JSON.stringify(c.spec, null, 1))}</pre></details>` +
        `<script type="application/vnd.vegalite+json" class="vega-lite-spec" data-chart="${c.def.id}">${scriptJson(c.spec)}</script>` +
        `</figure>`,
    )
    .join('\n');
  const table =
    `<table class="iterations"><thead><tr>${columns.map((c) => `<th>${c}</th>`).join('')}</tr></thead><tbody>` +
    sorted.map((l) => `<tr>${columns.map((c) => `<td>${fmt(fieldOf(l, c))}</td>`).join('')}</tr>`).join('') +
    `</tbody></table>`;
  const latest = last
    ? `<div class="latest">` +
      HEADLINE[algorithm]
        .map(([label, key, fraction]) => {
          const show = fraction ? pct : fmt;
          return `<div>${label}<b data-metric="${key}">${show(fieldOf(first, key))} → ${show(fieldOf(last, key))}</b></div>`;
        })
        .join('') +
      `</div>`
    : '';
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>run ${escapeHtml(runId)} · report</title>
<style>${CSS}</style>
</head>
<body>
<h1>Run <code>${escapeHtml(runId)}</code></h1>
<div class="meta">${algorithm.toUpperCase()} · ${sorted.length} iteration${sorted.length === 1 ? '' : 's'}${
    first ? ` (${first.iteration}–${last.iteration}) · last at ${escapeHtml(last.time)} · adapter v${last.adapter_version ?? '—'}` : ''
  } · TensorBoard: <code>tensorboard --logdir &lt;runs&gt;/${escapeHtml(runId)}/tensorboard</code></div>
${latest}
<div class="charts">
${figures}
</div>
<details class="all"><summary>All iterations</summary>${table}</details>
</body>
</html>
`;
}
