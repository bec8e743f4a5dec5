/**
 * Rollout time of the default job with and without the browser worker's warm pages (HALO_WARM_PAGES) and the
 * learner's batched sampling (HALO_SAMPLE_BATCH): the job of configs/default.yaml as `./launch.sh` runs it
 * (colocated tiny-random learner on the CPU, MiniWoB++ in Chromium), on a private stack per run, in turn:
 *   - `cold`: HALO_WARM_PAGES=0: every session opens a context and loads its page (the code path before the pool);
 *   - `warm`: today's defaults (the pool; on the CPU the learner samples one call at a time);
 *   - `batched`: the defaults with HALO_SAMPLE_BATCH=8, as a learner on a GPU samples.
 * Reports per mode the rollout seconds per iteration (metrics `seconds.rollout`, the first iteration left out:
 * fresh processes), sessions opened, the success rate over the last five iterations (the learning curve must not
 * change), how many calls each learner sampling call shared its batch with (from the histories), and the ratios
 * of the medians.
 *
 *   node --import tsx bench/rollout-speed.ts [--iterations 18] [--rounds 1] [--modes cold,warm,batched] [--config configs/default.yaml]
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { Client } from '@temporalio/client';
import { startOrAttachTrain } from '../client/train';
import { loadConfigFile } from '../host/config-file';
import { parseConfig } from '../lib/config/config';
import { isGrpoMetrics, parseMetricsJsonl } from '../lib/training/run-metrics';
import { startTestStack } from '../testing/stack';
import { load, median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '18' },
    rounds: { type: 'string', default: '1' },
    modes: { type: 'string', default: 'cold,warm,batched' },
    config: { type: 'string', default: 'configs/default.yaml' },
  },
});
const iterations = Number(values.iterations);
const rounds = Number(values.rounds);
/** Each mode's worker and learner settings (both read them at start; the stack's processes take this process's environment). */
const MODE_ENV = {
  cold: { HALO_WARM_PAGES: '0', HALO_SAMPLE_BATCH: '' },
  warm: { HALO_WARM_PAGES: '', HALO_SAMPLE_BATCH: '' },
  batched: { HALO_WARM_PAGES: '', HALO_SAMPLE_BATCH: '8' },
} as const;
type Mode = keyof typeof MODE_ENV;
const modes = values.modes!.split(',').map((m): Mode => {
  if (!(m in MODE_ENV)) throw new Error(`--modes: ${Object.keys(MODE_ENV).join(', ')}, got ${JSON.stringify(m)}`);
  return m as Mode;
});
if (!(iterations >= 2)) throw new Error('--iterations: at least 2 (the first is left out)');

interface RunResult {
  mode: Mode;
  round: number;
  rollout: number[];
  sessions: number[];
  success: number[];
  wallS: number;
  load: string;
  /** Per learner `sample_actions` call of the run: how many calls its batch held. */
  batchCalls: number[];
}

/** `batch_calls` of every completed sample_actions activity in the run's workflows (1 when a learner did not say). */
async function batchSizes(client: Client, runId: string): Promise<number[]> {
  const out: number[] = [];
  for await (const w of client.workflow.list({ query: `HaloRunId = '${runId}'` })) {
    const history = await client.workflow.getHandle(w.workflowId, w.runId).fetchHistory();
    const types = new Map<string, string>();
    for (const e of history.events ?? []) {
      const s = e.activityTaskScheduledEventAttributes;
      if (s) types.set(String(e.eventId), s.activityType?.name ?? '');
      const done = e.activityTaskCompletedEventAttributes;
      if (!done || types.get(String(done.scheduledEventId)) !== 'sample_actions') continue;
      const data = done.result?.payloads?.[0]?.data;
      out.push(data ? ((JSON.parse(Buffer.from(data).toString('utf8')) as { batch_calls?: number }).batch_calls ?? 1) : 1);
    }
  }
  return out;
}

async function runOnce(mode: Mode, round: number): Promise<RunResult> {
  Object.assign(process.env, MODE_ENV[mode]);
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  try {
    const base = loadConfigFile(values.config!);
    const runId = `rollout-${mode}-${round}`;
    const cfg = parseConfig({
      ...base,
      temporal: { ...base.temporal, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      train: { ...base.train, runId, iterations, gpuTaskQueue: stack.gpuQueue },
    });
    const t0 = Date.now();
    const { handle } = await startOrAttachTrain(stack.client, cfg);
    await handle.result();
    const wallS = (Date.now() - t0) / 1000;
    const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
    const r: RunResult = {
      mode,
      round,
      rollout: lines.map((l) => l.seconds?.rollout ?? NaN),
      sessions: lines.map((l) => l.sessions_opened ?? NaN),
      success: lines.map((l) => l.success_rate),
      wallS,
      load: load(),
      batchCalls: await batchSizes(stack.client, runId),
    };
    console.error(
      `${mode} round ${round}: ${iterations} iterations in ${wallS.toFixed(0)} s, rollout s ${r.rollout.map((x) => x.toFixed(1)).join(' ')}, success ${r.success.map((x) => x.toFixed(2)).join(' ')}`,
    );
    return r;
  } finally {
    await stack.stop();
  }
}

const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;

async function main() {
  printBenchHeader('rollout-speed');
  const results: RunResult[] = [];
  for (let round = 1; round <= rounds; round++) for (const mode of modes) results.push(await runOnce(mode, round));

  console.log('');
  console.log(`${values.config}, ${iterations} iterations per run; rollout = metrics seconds.rollout, iteration 1 (fresh processes) left out`);
  console.log('');
  console.log(
    '| mode | round | rollout s / iteration, median (min-max) | sessions opened / iteration | success, last 5 iterations | learner sampling calls (mean calls in the batch of each) | run wall s | load avg at its end |',
  );
  console.log('|---|---|---|---|---|---|---|---|');
  for (const r of results) {
    const ro = r.rollout.slice(1);
    console.log(
      `| ${r.mode} | ${r.round} | ${median(ro).toFixed(2)} (${Math.min(...ro).toFixed(2)}-${Math.max(...ro).toFixed(2)}) | ${median(r.sessions.slice(1))} | ${mean(r.success.slice(-5)).toFixed(2)} | ${r.batchCalls.length} (${mean(r.batchCalls).toFixed(2)}) | ${r.wallS.toFixed(0)} | ${r.load} |`,
    );
  }
  const of = (mode: string) => median(results.filter((r) => r.mode === mode).flatMap((r) => r.rollout.slice(1)));
  console.log('');
  if (modes.includes('cold') && modes.includes('warm')) {
    const ratio = of('warm') / of('cold');
    console.log(
      `warm / cold rollout seconds per iteration (medians over all rounds): ${of('warm').toFixed(2)} / ${of('cold').toFixed(2)} = ${ratio.toFixed(2)} (target <= 0.50: ${ratio <= 0.5 ? 'MET' : 'NOT MET'})`,
    );
  }
  if (modes.includes('batched') && modes.includes('warm')) {
    console.log(`batched / warm (HALO_SAMPLE_BATCH=8 against the default): ${of('batched').toFixed(2)} / ${of('warm').toFixed(2)} = ${(of('batched') / of('warm')).toFixed(2)}`);
  }
  printLoadAtEnd();
}

runBench(main);
