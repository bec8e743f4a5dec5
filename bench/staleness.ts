/**
 * Pipelined iterations: how much faster does a GRPO run go with train.maxStaleness 1 (iteration i+1's rollouts
 * beside the update on iteration i) than strictly on-policy (0), and does it still learn? A real stack
 * (Temporal dev server, control and browser workers, the Python learner with the colocated tiny-random
 * Qwen3-VL), on the default job's shape (configs/default.yaml: click-test and focus-text, 4 step groups of
 * N = 4 per iteration, one-action episodes, constrained decoding, learning rate 6e-3). The two settings run
 * alternately on the same stack; each run's wall time is from its start to its result.
 *
 *   node --import tsx bench/staleness.ts [--iterations 8] [--repeats 1] [--staleness 0,1] [--tasks click-test,focus-text]
 *        [--served --latency-ms 300]
 *
 * `--served`: the production path's shape instead (policy.backend openai against the local server that keeps
 * vLLM's contract, testing/fake-vllm-server.ts, answering with its scripted policy after a fixed latency; every
 * new adapter loaded into it), where sampling does not wait for the learner. No learning curve there: the
 * scripted policy does not learn.
 *
 * Prints per run: wall time, seconds per iteration, the success rate of every iteration's rollouts (the
 * curve: what each iteration sampled, from the adapter it was given) and the staleness recorded in each
 * metrics row; then the ratio of the medians. With the colocated backend the learner process both samples
 * and updates, one call at a time: the overlap covers the browser's share of a rollout, not the sampling.
 */
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startOrAttachTrain } from '../client/train';
import { parseMetricsJsonl, type MetricsLine } from '../lib/training/run-metrics';
import { stackGrpoConfig } from '../testing/grpo-config';
import { startTestStack } from '../testing/stack';
import { startFakeVllmServer, type FakeVllmServer } from '../testing/fake-vllm-server';
import { load, median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';
import { tinyModelDir } from '../testing/model-prompt-ids';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '8' },
    repeats: { type: 'string', default: '1' },
    staleness: { type: 'string', default: '0,1' },
    tasks: { type: 'string', default: 'click-test,focus-text' },
    verbose: { type: 'boolean', default: false },
    served: { type: 'boolean', default: false },
    'latency-ms': { type: 'string', default: '300' },
  },
});
const iterations = Number(values.iterations);
const repeats = Number(values.repeats);
const settings = values.staleness!.split(',').map(Number);

interface Row {
  maxStaleness: number;
  wall: number;
  lines: MetricsLine[];
  load: string;
}

async function main() {
  printBenchHeader('staleness');
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  let vllm: FakeVllmServer | undefined;
  if (values.served) {
    vllm = await startFakeVllmServer({ mode: { kind: 'scripted' }, tokenizer: join(tinyModelDir(stack.home), 'tokenizer.json') });
    vllm.delayMs = Number(values['latency-ms']);
  }
  const served = vllm
    ? { policy: { backend: 'openai' as const, baseUrl: `${vllm.url}/v1`, model: vllm.baseModel, temperature: 1, maxTokens: 64 }, vllmBaseUrl: `${vllm.url}/v1` }
    : undefined;
  const rows: Row[] = [];
  try {
    for (let r = 0; r < repeats; r++) {
      for (const maxStaleness of settings) {
        const runId = `bench-stale${maxStaleness}-${r}-${Date.now().toString(36)}`;
        const cfg = stackGrpoConfig(stack, {
          runId,
          iterations,
          maxSteps: 1,
          policy: served ? served.policy : { constrained: true, maxTokens: 128, temperature: 1 },
          episode: { sessionStartTimeoutMs: 20_000 },
          train: {
            tasks: values.tasks!.split(','),
            episodesPerIteration: 4,
            parallelism: 4,
            numGenerations: 4,
            grouping: 'step',
            choose: 'sampled',
            learningRate: 6e-3,
            klCoef: 0,
            maxStaleness,
            ...(served ? { vllmBaseUrl: served.vllmBaseUrl } : {}),
          },
        });
        const t0 = Date.now();
        const { handle } = await startOrAttachTrain(stack.client, cfg);
        await handle.result();
        const wall = (Date.now() - t0) / 1000;
        const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8'));
        rows.push({ maxStaleness, wall, lines, load: load() });
        console.error(`maxStaleness ${maxStaleness}: ${iterations} iterations in ${wall.toFixed(1)} s`);
        if (values.verbose) for (const l of lines) console.error(JSON.stringify(l));
      }
    }
  } finally {
    await vllm?.close();
    await stack.stop();
  }

  console.log('');
  console.log(
    `${iterations} iterations per run; default job's shape (4 step groups of N=4 per iteration, maxSteps 1); ` +
      (vllm ? `policy from the local vLLM-contract server (${vllm.delayMs} ms per request), updates by the tiny-random learner` : 'learner tiny-random colocated'),
  );
  console.log('');
  console.log('| maxStaleness | wall s | s per iteration | rollout success per iteration | staleness per iteration | mean ratio to the sampler per update | load avg at end |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const success = r.lines.map((l) => l.success_rate.toFixed(2)).join(' ');
    const stale = r.lines.map((l) => l.staleness ?? 0).join(' ');
    const ratio = r.lines.map((l) => (l.mean_ratio ?? NaN).toFixed(2)).join(' ');
    console.log(`| ${r.maxStaleness} | ${r.wall.toFixed(1)} | ${(r.wall / iterations).toFixed(2)} | ${success} | ${stale} | ${ratio} | ${r.load} |`);
  }
  const wall = (s: number) => median(rows.filter((r) => r.maxStaleness === s).map((r) => r.wall));
  const half = Math.floor(iterations / 2);
  const lateSuccess = (s: number) => median(rows.filter((r) => r.maxStaleness === s).map((r) => r.lines.slice(half).reduce((a, l) => a + l.success_rate, 0) / (iterations - half)));
  console.log('');
  for (const s of settings) {
    console.log(`maxStaleness ${s}: median wall ${wall(s).toFixed(1)} s, mean rollout success over iterations ${half + 1}..${iterations} ${lateSuccess(s).toFixed(2)}`);
  }
  if (settings.includes(0) && settings.includes(1)) {
    console.log(`iteration throughput, maxStaleness 1 vs 0: ${(wall(0) / wall(1)).toFixed(2)}x`);
  }
  printLoadAtEnd();
}

runBench(main);
