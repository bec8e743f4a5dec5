import type { Command } from 'commander';
import { existsSync, statSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { syncCurves, type CurvesSyncResult } from '../../host/curves';
import { runMetricsFile } from '../../host/run-metrics-file';
import type { HaloConfig } from '../../lib/config/config';
import { parseMetricsJsonl, validateRunId, type MetricsLine } from '../../lib/training/run-metrics';
import { REPO_ROOT } from '../processes';
import { chartSpec, renderChartSvg, renderSvgPng, reportCharts, type ChartDef } from '../report-charts';
import { renderReportHtml, type RenderedChart } from '../report-html';

// `halo report RUN`: `runs/<RUN>/metrics.jsonl` → `runs/<RUN>/report/report.html` and one PNG per chart, for
// any algorithm (an MCTS run from before metrics.jsonl was shared: its mcts-metrics.jsonl). The charts are
// Vega-Lite specs (client/report-charts.ts) compiled by vega-lite, rendered to SVG by vega and to PNG by
// resvg, all in this process: no browser.

export class NoMetricsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NoMetricsError';
  }
}

export interface WriteRunReportOptions {
  runId: string;
  /** The run's metrics file (`<home>/<run>/metrics.jsonl`, see `resolveRunMetrics`). */
  metricsPath: string;
  /** Output folder (created); default `<dirname(metricsPath)>/report`. */
  outDir?: string;
  /** Skip the PNGs (HTML only). */
  png?: boolean;
  /** Default: the charts of the run's algorithm. */
  charts?: readonly ChartDef[];
  /** Also bring the run's TensorBoard files up to date (python -m halo_learner.curves). */
  tensorboard?: boolean;
}

export interface RunReportResult {
  dir: string;
  html: string;
  /** chart id → PNG path. */
  pngs: Record<string, string>;
  iterations: number;
  /** The TensorBoard sync's result, when asked for. */
  tensorboard?: CurvesSyncResult['tensorboard'];
}

/** Reads and validates the metrics file; a clear error when the run has none. */
export async function readRunMetrics(runId: string, metricsPath: string): Promise<MetricsLine[]> {
  if (!existsSync(metricsPath)) {
    throw new NoMetricsError(
      `run ${runId} has no metrics file: ${metricsPath} does not exist (a run writes it after its first iteration; check the run id and --config's stack.home)`,
    );
  }
  const lines = parseMetricsJsonl(await readFile(metricsPath, 'utf8'), metricsPath);
  if (lines.length === 0) throw new NoMetricsError(`run ${runId} has no metrics yet: ${metricsPath} has no complete line`);
  return lines;
}

/** Writes report.html and one PNG per chart into the output folder. */
export async function writeRunReport(opts: WriteRunReportOptions): Promise<RunReportResult> {
  const lines = await readRunMetrics(opts.runId, opts.metricsPath);
  const defs = opts.charts ?? reportCharts(lines);
  const dir = resolve(opts.outDir ?? join(resolve(opts.metricsPath, '..'), 'report'));
  await mkdir(dir, { recursive: true });
  const charts: RenderedChart[] = [];
  const pngs: Record<string, string> = {};
  for (const def of defs) {
    const spec = chartSpec(lines, def);
    const svg = await renderChartSvg(spec);
    const chart: RenderedChart = { def, spec, svg };
    if (opts.png !== false) {
      const path = join(dir, `${def.id}.png`);
      await writeFile(path, await renderSvgPng(svg));
      pngs[def.id] = path;
      chart.png = `${def.id}.png`;
    }
    charts.push(chart);
  }
  const htmlPath = join(dir, 'report.html');
  await writeFile(htmlPath, renderReportHtml(opts.runId, lines, charts));
  const res: RunReportResult = { dir, html: htmlPath, pngs, iterations: lines.length };
  if (opts.tensorboard) res.tensorboard = (await syncCurves(dirname(resolve(opts.metricsPath)))).tensorboard;
  return res;
}

/**
 * RUN is a run id (its folder under stack.home), or a path to a run folder or a metrics file. A folder's
 * metrics file is its metrics.jsonl, or an old MCTS run's mcts-metrics.jsonl when that is all it has.
 */
export function resolveRunMetrics(cfg: HaloConfig, run: string): { runId: string; metricsPath: string } {
  if (existsSync(run) && (run.includes('/') || run.endsWith('.jsonl'))) {
    const isDir = statSync(run).isDirectory();
    const metricsPath = resolve(isDir ? runMetricsFile(run) : run);
    const runId = resolve(metricsPath, '..').split(/[\\/]/).pop() || run;
    return { runId, metricsPath };
  }
  const runId = validateRunId(run);
  return { runId, metricsPath: runMetricsFile(join(resolve(REPO_ROOT, cfg.stack.home), runId)) };
}

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('report')
    .description("write a run's report: report.html with its learning curve and learner charts (Vega-Lite), and one PNG per chart")
    .argument('<run>', 'run id (reads <stack.home>/<run>/metrics.jsonl), or a run folder / metrics.jsonl path')
    .option('--out <dir>', 'output folder (default <stack.home>/<run>/report)')
    .option('--no-png', 'write the HTML only')
    .option('--tensorboard', "also bring the run's TensorBoard event files up to date (<run>/tensorboard; the control worker writes them after every iteration)")
    .action(async (run: string, opts: { out?: string; png?: boolean; tensorboard?: boolean }) => {
      const cfg = ctx.loadConfig(program.opts().config);
      const { runId, metricsPath } = resolveRunMetrics(cfg, run);
      const res = await writeRunReport({ runId, metricsPath, outDir: opts.out, png: opts.png, tensorboard: opts.tensorboard });
      console.log(res.html);
      for (const p of Object.values(res.pngs)) console.log(p);
      if (res.tensorboard) console.log(`${res.tensorboard.dir} (${res.tensorboard.written} iteration${res.tensorboard.written === 1 ? '' : 's'} written)`);
    });
}
