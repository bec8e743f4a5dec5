/**
 * Streaming rollouts against synchronous and pipelined iterations, with REAL-like long-tailed episode lengths
 * (2–25 steps, median 5).
 *
 *   node --import tsx bench/streaming.ts [--latency 0.3,2] [--slots 4,8] [--batch 8] [--updates 200] [--env-seconds 0.5]
 *        [--update-seconds 10] [--seeds 1,2,3]
 *   node --import tsx bench/streaming.ts --stack [--latency-ms 300] [--stack-updates 6] [--modes iterations,stream1,stream2]
 *
 * Default: simulated time (bench/streaming-sim.ts: the stream under the workflow's own rules,
 * lib/training/rollout-stream.ts), step grouping (one episode per group), per setting the median over the seeds of groups
 * per hour, environment utilisation (busy slot-seconds over slots × wall), the mean staleness of the batches and
 * the groups dropped for staleness; ratios against synchronous iterations side by side.
 *
 * `--stack`: the same comparison on a real stack (Temporal dev server, workers, Chromium, MiniWoB++ pages, the
 * tiny-random learner writing each adapter into the local server that keeps vLLM's contract). The served policy
 * moves the mouse until its episode's length (drawn from the same distribution, keyed by the goal text) and then
 * answers, after `--latency-ms` per request; episode grouping (2 rollouts per group), 4 groups per update,
 * 4 episodes at once. Reported: wall time, groups per hour and its ratio to iterations, staleness and drops.
 */
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startOrAttachTrain } from '../client/train';
import { fnv1a32 } from '../lib/rewards/shaping';
import { parseMetricsJsonl } from '../lib/training/run-metrics';
import { toolCall } from '../testing/fake-policy-server';
import { startFakeVllmServer } from '../testing/fake-vllm-server';
import { stackGrpoConfig } from '../testing/grpo-config';
import { tinyModelDir } from '../testing/model-prompt-ids';
import { startTestStack } from '../testing/stack';
import { load, median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';
import { longTailedLengths, simulate, type SimMode, type SimResult } from './streaming-sim';

const { values } = parseArgs({
  options: {
    latency: { type: 'string', default: '0.3,2' },
    slots: { type: 'string', default: '4,8' },
    batch: { type: 'string', default: '8' },
    updates: { type: 'string', default: '200' },
    'env-seconds': { type: 'string', default: '0.5' },
    'update-seconds': { type: 'string', default: '10' },
    seeds: { type: 'string', default: '1,2,3' },
    stack: { type: 'boolean', default: false },
    'latency-ms': { type: 'string', default: '300' },
    'stack-updates': { type: 'string', default: '6' },
    modes: { type: 'string', default: 'iterations,stream1,stream2' },
  },
});
const list = (s: string | undefined) => s!.split(',').map(Number);

const MODES: { name: string; mode: SimMode }[] = [
  { name: 'iterations', mode: { kind: 'iterations', pipelined: false } },
  { name: 'iterations, pipelined (k = 1)', mode: { kind: 'iterations', pipelined: true } },
  { name: 'stream k = 0', mode: { kind: 'stream', k: 0 } },
  { name: 'stream k = 1', mode: { kind: 'stream', k: 1 } },
  { name: 'stream k = 2', mode: { kind: 'stream', k: 2 } },
];

function simulated(): void {
  const batch = Number(values.batch);
  const updates = Number(values.updates);
  const envSeconds = Number(values['env-seconds']);
  const updateSeconds = Number(values['update-seconds']);
  console.log(
    `Simulated: step grouping, ${batch} groups per update, ${updates} updates, a step = one policy call + ${envSeconds} s in the browser, ` +
      `an update ${updateSeconds} s; episode lengths log-normal, median 5, clipped to 2–25 steps; median of seeds ${values.seeds}.`,
  );
  console.log('');
  console.log('| policy s per call | slots | mode | groups per hour | vs iterations | env utilisation | mean staleness | groups dropped (stale) |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const latency of list(values.latency)) {
    for (const slots of list(values.slots)) {
      const rows = MODES.map(({ name, mode }) => {
        const runs: SimResult[] = list(values.seeds).map((seed) =>
          simulate(mode, { slots, batchUnits: batch, unitSize: 1, updates, policySeconds: latency, envSeconds, updateSeconds, length: longTailedLengths(seed) }),
        );
        return {
          name,
          gph: median(runs.map((r) => r.groupsPerHour)),
          util: median(runs.map((r) => r.envUtilisation)),
          stale: median(runs.map((r) => r.meanStaleness)),
          dropped: median(runs.map((r) => r.droppedStale)),
        };
      });
      const base = rows[0].gph;
      for (const r of rows) {
        console.log(
          `| ${latency} | ${slots} | ${r.name} | ${r.gph.toFixed(0)} | ${(r.gph / base).toFixed(2)}× | ${r.util.toFixed(2)} | ${r.stale.toFixed(2)} | ${r.dropped} of ${updates * batch} |`,
        );
      }
    }
  }
}

async function onStack(): Promise<void> {
  const latencyMs = Number(values['latency-ms']);
  const updates = Number(values['stack-updates']);
  const lengthOf = longTailedLengths(7);
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  const vllm = await startFakeVllmServer({
    tokenizer: join(tinyModelDir(stack.home), 'tokenizer.json'),
    mode: {
      kind: 'custom',
      // Moves the mouse until the episode's drawn length, then answers (which ends a MiniWoB++ episode).
      answer: ({ goal, previous, choice }) =>
        previous.length + 1 >= lengthOf(parseInt(fnv1a32(goal), 16), 0)
          ? toolCall({ action: 'answer', text: 'done' })
          : toolCall({ action: 'mouse_move', coordinate: [100 + 10 * previous.length + choice, 200] }),
    },
  });
  vllm.delayMs = latencyMs;
  const rows: { mode: string; wall: number; stale: number[]; dropped: number; retried: number }[] = [];
  try {
    for (const mode of values.modes!.split(',')) {
      const k = mode.startsWith('stream') ? Number(mode.slice('stream'.length)) : 0;
      const runId = `bench-stream-${mode}-${Date.now().toString(36)}`;
      const cfg = stackGrpoConfig(stack, {
        runId,
        iterations: updates,
        maxSteps: 25,
        // The stand-in counts steps from the history in its prompt: the whole episode's.
        policy: { backend: 'openai', baseUrl: `${vllm.url}/v1`, model: vllm.baseModel, temperature: 1, maxTokens: 64, historyLength: 25 },
        episode: { sessionStartTimeoutMs: 30_000 },
        train: {
          seed: 11,
          tasks: ['click-button', 'click-link', 'enter-text', 'focus-text'],
          episodesPerIteration: 4,
          parallelism: 4,
          grouping: 'episode',
          numGenerations: 2,
          vllmBaseUrl: `${vllm.url}/v1`,
          ...(mode.startsWith('stream') ? { rollout: 'stream', maxStaleness: k } : { maxStaleness: mode === 'pipelined' ? 1 : 0 }),
        },
      });
      const t0 = Date.now();
      const { handle } = await startOrAttachTrain(stack.client, cfg);
      await handle.result();
      const wall = (Date.now() - t0) / 1000;
      const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8'));
      const sum = (key: 'groups_dropped_stale' | 'episodes_retried') => lines.reduce((n, l) => n + (l.stream?.[key] ?? 0), 0);
      rows.push({ mode, wall, stale: lines.map((l) => l.staleness ?? 0), dropped: sum('groups_dropped_stale'), retried: sum('episodes_retried') });
      console.error(`${mode}: ${updates} updates in ${wall.toFixed(1)} s (load ${load()})`);
    }
  } finally {
    await vllm.close();
    await stack.stop();
  }
  console.log('');
  console.log(
    `Real stack: ${updates} updates of 4 episode groups (2 rollouts each), 4 episodes at once, policy ${latencyMs} ms per request (local vLLM-contract server), tiny-random learner; episode lengths 2–25 keyed by the goal.`,
  );
  console.log('');
  console.log('| mode | wall s | groups per hour | vs iterations | staleness per update | groups dropped (stale) |');
  console.log('|---|---|---|---|---|---|');
  const base = rows.find((r) => r.mode === 'iterations');
  for (const r of rows) {
    const gph = (updates * 4 * 3600) / r.wall;
    const ratio = base ? `${(base.wall / r.wall).toFixed(2)}×` : '–';
    console.log(`| ${r.mode} | ${r.wall.toFixed(1)} | ${gph.toFixed(0)} | ${ratio} | ${r.stale.join(' ')} | ${r.dropped} |`);
  }
}

async function main() {
  printBenchHeader('streaming');
  if (values.stack) await onStack();
  else simulated();
  printLoadAtEnd();
}

runBench(main);
