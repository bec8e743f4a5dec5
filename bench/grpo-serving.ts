/**
 * GRPO on the served path (policy.backend openai + train.vllmBaseUrl), against the local server that keeps
 * vLLM's contract (testing/fake-vllm-server.ts) answering after a fixed latency: how much of an iteration is
 * orchestration, and how many seconds per iteration go to adapter loading — the load after each update, and
 * the reloads when vLLM restarted and forgot its adapters.
 *
 * Two runs on one private stack (Temporal, control and browser workers, the Python learner with tiny-random
 * for the updates), one after the other:
 * - `served`: vLLM stays up; every iteration loads its new adapter once (`loadAdapterIntoVllm`);
 * - `restarts`: vLLM restarts after every adapter load, so each iteration's first requests for the adapter
 *   get vLLM's 404, and the policy activity loads it again and repeats the request.
 *
 *   node --import tsx bench/grpo-serving.ts [--iterations 3] [--episodes 2] [--parallelism 2] [--n 4]
 *        [--max-steps 2] [--task click-button] [--latency-ms 300]
 *
 * Each run has iterations+1 iterations; the first (warm-up) is printed but left out of the medians.
 */
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseConfig } from '../lib/config/config';
import { parseMetricsJsonl } from '../lib/training/run-metrics';
import { startOrAttachTrain } from '../client/train';
import { startFakeVllmServer, type FakeVllmServer } from '../testing/fake-vllm-server';
import { startTestStack, type TestStack } from '../testing/stack';
import { fmt, load, machine, median } from './bench-run';
import { activityInterval, readChain, readIteration, unionLength, type Interval, type WorkflowRun } from './temporal-history';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '3' },
    episodes: { type: 'string', default: '2' },
    parallelism: { type: 'string', default: '2' },
    n: { type: 'string', default: '4' },
    'max-steps': { type: 'string', default: '2' },
    task: { type: 'string', default: 'click-button' },
    'latency-ms': { type: 'string', default: '300' },
  },
});
const measured = Number(values.iterations);

function config(stack: TestStack, vllm: FakeVllmServer, runId: string) {
  return parseConfig({
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'openai', baseUrl: `${vllm.url}/v1`, model: vllm.baseModel, temperature: 1, maxTokens: 64, timeoutMs: 60_000 },
    episode: { env: 'miniwob', maxSteps: Number(values['max-steps']) },
    train: {
      runId,
      iterations: measured + 1,
      episodesPerIteration: Number(values.episodes),
      parallelism: Number(values.parallelism),
      tasks: [values.task!],
      grouping: 'step',
      numGenerations: Number(values.n),
      learningRate: 1e-3,
      gpuTaskQueue: stack.gpuQueue,
      vllmBaseUrl: `${vllm.url}/v1`,
    },
  });
}

/** `adapterLoad` of every completed samplePolicy in these runs (the reloads after a restart), in ms. */
function reloadMs(runs: WorkflowRun[]): number {
  let total = 0;
  for (const r of runs) {
    for (const e of r.events) {
      const payload = e.activityTaskCompletedEventAttributes?.result?.payloads?.[0]?.data;
      if (!payload) continue;
      try {
        const res = JSON.parse(Buffer.from(payload).toString('utf8')) as { adapterLoad?: { ms: number } };
        total += res.adapterLoad?.ms ?? 0;
      } catch {
        // not JSON: not a samplePolicy result
      }
    }
  }
  return total;
}

interface Row {
  iteration: number;
  wall: number;
  share: number;
  loadS: number;
  reloadS: number;
  policyCalls: number;
}

async function measure(stack: TestStack, vllm: FakeVllmServer, mode: 'served' | 'restarts'): Promise<Row[]> {
  const runId = `bench-serving-${mode}-${Date.now().toString(36)}`;
  const cfg = config(stack, vllm, runId);
  let stop = false;
  // restarts: forget the adapters as soon as each new one is loaded.
  const restarter = (async () => {
    let seen = 0;
    while (!stop && mode === 'restarts') {
      const newest = Math.max(0, ...[...vllm.adapters.keys()].filter((k) => k.startsWith(runId)).map((k) => Number(/-v(\d+)$/.exec(k)?.[1] ?? 0)));
      if (newest > seen) {
        seen = newest;
        vllm.restart();
      }
      await new Promise((r) => setTimeout(r, 50));
    }
  })();
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  const firstRunId = (await handle.describe()).runId;
  await handle.result();
  stop = true;
  await restarter;
  const metrics = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8'));
  const rows: Row[] = [];
  for (const [i, run] of (await readChain(stack.client, runId, firstRunId)).entries()) {
    const it = await readIteration(stack.client, run);
    const { start, end } = it.parent;
    const busy = unionLength(
      it.activities.map((a) => activityInterval(a)).filter((x): x is Interval => !!x),
      start,
      end,
    );
    rows.push({
      iteration: i + 1,
      wall: end - start,
      share: (end - start - busy) / (end - start),
      loadS: metrics[i]?.seconds.load ?? 0,
      reloadS: reloadMs(it.children) / 1000,
      policyCalls: it.activities.filter((a) => a.type === 'samplePolicy').length,
    });
  }
  return rows;
}

function report(mode: string, rows: Row[]) {
  const m = rows.slice(1);
  console.log('');
  console.log(`### ${mode} (iteration 1 = warm-up, left out of the medians)`);
  console.log('');
  console.log('| iteration | wall s | outside activities | policy calls | adapter load s (after the update) | adapter reloads s (after a restart) |');
  console.log('|---|---|---|---|---|---|');
  for (const r of rows) {
    console.log(
      `| ${r.iteration}${r.iteration === 1 ? ' (warm-up)' : ''} | ${fmt(r.wall)} | ${(r.share * 100).toFixed(1)}% | ${r.policyCalls} | ${r.loadS.toFixed(3)} | ${r.reloadS.toFixed(3)} |`,
    );
  }
  console.log(
    `| **median 2..${rows.length}** | ${fmt(median(m.map((r) => r.wall)))} | **${(median(m.map((r) => r.share)) * 100).toFixed(1)}%** | | ${median(m.map((r) => r.loadS)).toFixed(3)} | ${median(m.map((r) => r.reloadS)).toFixed(3)} |`,
  );
}

async function main() {
  console.log(`# grpo-serving: ${new Date().toISOString()}, ${machine()}, load avg at start ${load()}`);
  console.log(`command: node --import tsx bench/grpo-serving.ts ${process.argv.slice(2).join(' ')}`.trim());
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  const vllm = await startFakeVllmServer({ mode: { kind: 'scripted' } });
  vllm.delayMs = Number(values['latency-ms']);
  try {
    console.log('');
    console.log(
      `${values.episodes} episodes/iteration (parallelism ${values.parallelism}), ${values.task}, N=${values.n}, maxSteps ${values['max-steps']}, ` +
        `server latency ${vllm.delayMs} ms per request, learner tiny-random`,
    );
    for (const mode of ['served', 'restarts'] as const) report(mode, await measure(stack, vllm, mode));
  } finally {
    await vllm.close();
    await stack.stop();
  }
  console.log('');
  console.log(`load avg at the end ${load()}`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
