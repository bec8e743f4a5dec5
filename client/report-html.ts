import type { MetricsLine } from '../lib/run-metrics';
import { escapeHtml } from './viewer-html';

// The run report's HTML: one inline SVG line chart per metric (x = iteration), pure functions of the
// metrics.jsonl lines (lib/run-metrics.ts). client/commands/report.ts writes it and screenshots each chart.

export interface ReportMetric {
  key: 'mean_reward' | 'success_rate' | 'frac_reward_zero_std' | 'action_validity' | 'loss';
  title: string;
  /** Values in [0, 1]: the y axis is fixed to [0, 1]. */
  fraction: boolean;
  help: string;
}

export const REPORT_METRICS: readonly ReportMetric[] = [
  { key: 'mean_reward', title: 'Mean reward', fraction: false, help: 'mean shaped reward of the iteration' },
  { key: 'success_rate', title: 'Success rate', fraction: true, help: 'fraction of episodes that succeeded' },
  { key: 'frac_reward_zero_std', title: 'Groups with zero reward std', fraction: true, help: 'fraction of GRPO groups whose rewards were all equal (no learning signal)' },
  { key: 'action_validity', title: 'Action validity', fraction: true, help: 'fraction of model outputs that parsed into a valid action' },
  { key: 'loss', title: 'Loss', fraction: false, help: 'learner loss of the iteration (missing when no update ran)' },
];

export interface ChartPoint {
  iteration: number;
  value: number;
}

export interface ChartGeometry {
  width: number;
  height: number;
  margin: { top: number; right: number; bottom: number; left: number };
}

export const CHART: ChartGeometry = { width: 640, height: 300, margin: { top: 16, right: 20, bottom: 46, left: 64 } };

/**
 * The points of one metric in iteration order, as runs of consecutive lines: an iteration where the metric is
 * null (e.g. no loss when no update ran) is left out and breaks the line.
 */
export function metricSegments(lines: readonly MetricsLine[], key: ReportMetric['key']): ChartPoint[][] {
  const out: ChartPoint[][] = [];
  let run: ChartPoint[] = [];
  for (const l of [...lines].sort((a, b) => a.iteration - b.iteration)) {
    const v = l[key];
    if (typeof v === 'number' && Number.isFinite(v)) run.push({ iteration: l.iteration, value: v });
    else if (run.length) {
      out.push(run);
      run = [];
    }
  }
  if (run.length) out.push(run);
  return out;
}

/** Every point of one metric, in iteration order. */
export function metricPoints(lines: readonly MetricsLine[], key: ReportMetric['key']): ChartPoint[] {
  return metricSegments(lines, key).flat();
}

/** About `count` round ticks covering [lo, hi] (1, 2, 5 × 10^k steps). */
export function niceTicks(lo: number, hi: number, count = 5): number[] {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / Math.max(1, count);
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw) ?? 10 * mag;
  const out: number[] = [];
  const start = Math.ceil(lo / step - 1e-9) * step;
  for (let v = start; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/** The y range: [0, 1] for fractions, else the data range padded and widened to round ticks. */
export function yDomain(values: number[], fraction: boolean): [number, number] {
  if (fraction) return [0, 1];
  if (values.length === 0) return [0, 1];
  let lo = Math.min(...values);
  let hi = Math.max(...values);
  if (hi === lo) {
    const pad = Math.abs(lo) > 0 ? Math.abs(lo) * 0.1 : 1;
    lo -= pad;
    hi += pad;
  } else {
    const pad = (hi - lo) * 0.08;
    lo -= pad;
    hi += pad;
  }
  const ticks = niceTicks(lo, hi);
  const step = ticks.length > 1 ? ticks[1] - ticks[0] : 1;
  return [Math.min(lo, Math.floor(lo / step) * step), Math.max(hi, Math.ceil(hi / step) * step)];
}

function tickLabel(v: number, fraction: boolean): string {
  if (fraction) return `${Math.round(v * 100)}%`;
  const a = Math.abs(v);
  if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(1);
  return String(Number(v.toPrecision(4)));
}

function valueLabel(v: number, fraction: boolean): string {
  return fraction ? `${(v * 100).toFixed(1)}%` : String(Number(v.toPrecision(5)));
}

const r2 = (n: number) => Math.round(n * 100) / 100;

/** One chart: axes with ticks and labels, grid lines, the line and one circle per point. */
export function renderChartSvg(metric: ReportMetric, segments: ChartPoint[][], iterations: [number, number], g: ChartGeometry = CHART): string {
  const points = segments.flat();
  const { width, height, margin: m } = g;
  const pw = width - m.left - m.right;
  const ph = height - m.top - m.bottom;
  let [x0, x1] = iterations;
  if (x1 === x0) {
    x0 -= 1;
    x1 += 1;
  }
  const [y0, y1] = yDomain(points.map((p) => p.value), metric.fraction);
  const sx = (i: number) => r2(m.left + ((i - x0) / (x1 - x0)) * pw);
  const sy = (v: number) => r2(m.top + ph - ((v - y0) / (y1 - y0)) * ph);

  const xt = niceTicks(x0, x1, Math.min(8, Math.max(1, Math.round(x1 - x0)))).filter((t) => Number.isInteger(t));
  const yt = metric.fraction ? [0, 0.25, 0.5, 0.75, 1] : niceTicks(y0, y1, 5);
  const parts: string[] = [];
  parts.push(`<rect class="plot" x="${m.left}" y="${m.top}" width="${pw}" height="${ph}"/>`);
  parts.push(
    `<g class="grid">${yt.map((t) => `<line x1="${m.left}" x2="${m.left + pw}" y1="${sy(t)}" y2="${sy(t)}"/>`).join('')}</g>`,
  );
  parts.push(
    `<g class="axis y-axis"><line x1="${m.left}" x2="${m.left}" y1="${m.top}" y2="${m.top + ph}"/>` +
      yt
        .map(
          (t) =>
            `<g class="tick" data-value="${t}"><line x1="${m.left - 5}" x2="${m.left}" y1="${sy(t)}" y2="${sy(t)}"/>` +
            `<text x="${m.left - 8}" y="${sy(t)}" dy="0.32em" text-anchor="end">${escapeHtml(tickLabel(t, metric.fraction))}</text></g>`,
        )
        .join('') +
      `</g>`,
  );
  parts.push(
    `<g class="axis x-axis"><line x1="${m.left}" x2="${m.left + pw}" y1="${m.top + ph}" y2="${m.top + ph}"/>` +
      xt
        .map(
          (t) =>
            `<g class="tick" data-value="${t}"><line x1="${sx(t)}" x2="${sx(t)}" y1="${m.top + ph}" y2="${m.top + ph + 5}"/>` +
            `<text x="${sx(t)}" y="${m.top + ph + 18}" text-anchor="middle">${t}</text></g>`,
        )
        .join('') +
      `</g>`,
  );
  parts.push(`<text class="axis-label x-label" x="${m.left + pw / 2}" y="${height - 6}" text-anchor="middle">iteration</text>`);
  parts.push(
    `<text class="axis-label y-label" transform="translate(14 ${m.top + ph / 2}) rotate(-90)" text-anchor="middle">${escapeHtml(metric.key)}</text>`,
  );
  if (points.length === 0) {
    parts.push(`<text class="empty" x="${m.left + pw / 2}" y="${m.top + ph / 2}" text-anchor="middle">no values</text>`);
  } else {
    const d = segments.map((seg) => seg.map((p, i) => `${i === 0 ? 'M' : 'L'}${sx(p.iteration)},${sy(p.value)}`).join('')).join('');
    parts.push(`<path class="line" d="${d}"/>`);
    parts.push(
      `<g class="points">${points
        .map(
          (p) =>
            `<circle class="point" cx="${sx(p.iteration)}" cy="${sy(p.value)}" r="3.5" data-iteration="${p.iteration}" data-value="${p.value}">` +
            `<title>iteration ${p.iteration}: ${escapeHtml(valueLabel(p.value, metric.fraction))}</title></circle>`,
        )
        .join('')}</g>`,
    );
  }
  return `<svg xmlns="http://www.w3.org/2000/svg" class="chart-svg" viewBox="0 0 ${width} ${height}" width="${width}" height="${height}" role="img" aria-label="${escapeHtml(metric.title)} by iteration">${parts.join('')}</svg>`;
}

const CSS = `
body { margin:0; padding:20px 28px; font:14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color:#1d2330; background:#f6f7f9; }
h1 { font-size:20px; margin:0 0 4px; }
.meta { color:#6b7385; margin-bottom:16px; }
.charts { display:flex; flex-wrap:wrap; gap:16px; }
figure.chart { margin:0; padding:10px 12px 6px; background:#fff; border:1px solid #dde1e8; border-radius:8px; width:max-content; }
figure.chart figcaption { font-weight:600; margin-bottom:2px; }
figure.chart figcaption .latest { font-weight:400; color:#6b7385; margin-left:8px; }
figure.chart .help { color:#6b7385; font-size:12px; margin-bottom:4px; }
.chart-svg .plot { fill:#fff; }
.chart-svg .grid line { stroke:#eceef2; }
.chart-svg .axis line { stroke:#6b7385; }
.chart-svg text { font:11px system-ui, sans-serif; fill:#3b4252; }
.chart-svg .axis-label { font-size:12px; fill:#1d2330; }
.chart-svg .line { fill:none; stroke:#2b6cb0; stroke-width:2; }
.chart-svg .point { fill:#2b6cb0; stroke:#fff; stroke-width:1; }
.chart-svg .empty { fill:#6b7385; font-size:13px; }
table { border-collapse:collapse; background:#fff; font-size:12.5px; margin-top:8px; }
th, td { padding:3px 8px; border:1px solid #dde1e8; text-align:right; font-variant-numeric:tabular-nums; }
th { background:#f0f2f5; }
details { margin-top:20px; }
`;

/** The whole report page. */
export function renderReportHtml(runId: string, lines: readonly MetricsLine[], metrics: readonly ReportMetric[] = REPORT_METRICS): string {
  const sorted = [...lines].sort((a, b) => a.iteration - b.iteration);
  const iterations: [number, number] = sorted.length ? [sorted[0].iteration, sorted[sorted.length - 1].iteration] : [0, 0];
  const last = sorted[sorted.length - 1];
  const charts = metrics
    .map((mt) => {
      const segs = metricSegments(sorted, mt.key);
      const pts = segs.flat();
      const latest = pts.length ? valueLabel(pts[pts.length - 1].value, mt.fraction) : '—';
      return (
        `<figure class="chart" id="chart-${mt.key}" data-metric="${mt.key}" data-points="${pts.length}">` +
        `<figcaption>${escapeHtml(mt.title)} <code>${mt.key}</code><span class="latest">latest ${escapeHtml(latest)}</span></figcaption>` +
        `<div class="help">${escapeHtml(mt.help)}</div>` +
        renderChartSvg(mt, segs, iterations) +
        `</figure>`
      );
    })
    .join('\n');
  const cols = ['iteration', 'time', ...metrics.map((m) => m.key), 'reward_std', 'episode_length', 'grad_norm', 'adapter_version', 'num_episodes'] as const;
  const cell = (l: MetricsLine, c: (typeof cols)[number]) => {
    const v = (l as unknown as Record<string, unknown>)[c];
    if (v === null || v === undefined) return '—';
    if (typeof v === 'number') return String(Number(v.toPrecision(5)));
    return escapeHtml(String(v));
  };
  const table =
    `<table class="iterations"><thead><tr>${cols.map((c) => `<th>${c}</th>`).join('')}</tr></thead><tbody>` +
    sorted.map((l) => `<tr>${cols.map((c) => `<td>${cell(l, c)}</td>`).join('')}</tr>`).join('') +
    `</tbody></table>`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>run ${escapeHtml(runId)} · report</title>
<style>${CSS}</style>
</head>
<body>
<h1>Run <code>${escapeHtml(runId)}</code></h1>
<div class="meta">${sorted.length} iteration${sorted.length === 1 ? '' : 's'} (${iterations[0]}–${iterations[1]})${
    last ? ` · last at ${escapeHtml(last.time)} · adapter v${last.adapter_version ?? '—'}` : ''
  }</div>
<div class="charts">
${charts}
</div>
<details><summary>All iterations</summary>${table}</details>
</body>
</html>
`;
}
