import type { Command } from 'commander';
import { existsSync, statSync } from 'node:fs';
import { mkdir, readFile, writeFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { launchChromium } from '../../env/browser';
import type { HaloConfig } from '../../lib/config';
import { parseMetricsJsonl, validateRunId, type MetricsLine } from '../../lib/run-metrics';
import { REPO_ROOT } from '../processes';
import { REPORT_METRICS, renderReportHtml, type ReportMetric } from '../report-html';

// `halo report RUN`: `runs/<RUN>/metrics.jsonl` → `runs/<RUN>/report/report.html` (inline SVG charts) and one
// PNG per metric, rendered by headless Chromium from the same HTML (element screenshots of each chart).

export class NoMetricsError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NoMetricsError';
  }
}

export interface WriteRunReportOptions {
  runId: string;
  /** The run's metrics file (`<home>/<run>/metrics.jsonl`). */
  metricsPath: string;
  /** Output folder (created); default `<dirname(metricsPath)>/report`. */
  outDir?: string;
  /** Skip the PNGs (HTML only). */
  png?: boolean;
  /** Chromium binary (default: HALO_CHROMIUM, /usr/bin/chromium, PATH). */
  chromiumPath?: string;
  metrics?: readonly ReportMetric[];
}

export interface RunReportResult {
  dir: string;
  html: string;
  /** metric key → PNG path. */
  pngs: Record<string, string>;
  iterations: number;
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

/** Writes report.html and one PNG per metric into the output folder. */
export async function writeRunReport(opts: WriteRunReportOptions): Promise<RunReportResult> {
  const metrics = opts.metrics ?? REPORT_METRICS;
  const lines = await readRunMetrics(opts.runId, opts.metricsPath);
  const dir = resolve(opts.outDir ?? join(resolve(opts.metricsPath, '..'), 'report'));
  await mkdir(dir, { recursive: true });
  const html = renderReportHtml(opts.runId, lines, metrics);
  const htmlPath = join(dir, 'report.html');
  await writeFile(htmlPath, html);
  const pngs: Record<string, string> = {};
  if (opts.png !== false) {
    const browser = await launchChromium({ executablePath: opts.chromiumPath });
    try {
      const page = await browser.newPage({ viewport: { width: 1400, height: 900 }, deviceScaleFactor: 2 });
      await page.setContent(html, { waitUntil: 'load' });
      for (const m of metrics) {
        const path = join(dir, `${m.key}.png`);
        await page.locator(`figure.chart[data-metric="${m.key}"]`).screenshot({ path, animations: 'disabled' });
        pngs[m.key] = path;
      }
    } finally {
      await browser.close();
    }
  }
  return { dir, html: htmlPath, pngs, iterations: lines.length };
}

/** RUN is a run id (its folder under stack.home), or a path to a run folder or a metrics.jsonl file. */
export function resolveRunMetrics(cfg: HaloConfig, run: string): { runId: string; metricsPath: string } {
  if (existsSync(run) && (run.includes('/') || run.endsWith('.jsonl'))) {
    const isDir = statSync(run).isDirectory();
    const metricsPath = resolve(isDir ? join(run, 'metrics.jsonl') : run);
    const runId = resolve(metricsPath, '..').split(/[\\/]/).pop() || run;
    return { runId, metricsPath };
  }
  const runId = validateRunId(run);
  return { runId, metricsPath: join(resolve(REPO_ROOT, cfg.stack.home), runId, 'metrics.jsonl') };
}

export function register(program: Command, ctx: { loadConfig: (path?: string) => HaloConfig }): void {
  program
    .command('report')
    .description("write a run's report: report.html with a chart per metric, and one PNG per chart")
    .argument('<run>', 'run id (reads <stack.home>/<run>/metrics.jsonl), or a run folder / metrics.jsonl path')
    .option('--out <dir>', 'output folder (default <stack.home>/<run>/report)')
    .option('--no-png', 'write the HTML only (no Chromium)')
    .action(async (run: string, opts: { out?: string; png?: boolean }) => {
      const cfg = ctx.loadConfig(program.opts().config);
      const { runId, metricsPath } = resolveRunMetrics(cfg, run);
      const res = await writeRunReport({ runId, metricsPath, outDir: opts.out, png: opts.png });
      console.log(res.html);
      for (const p of Object.values(res.pngs)) console.log(p);
    });
}
