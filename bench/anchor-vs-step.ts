/**
 * Rollout wall time of one GRPO iteration at equal sampled actions: grouping `step` against grouping `anchor`.
 * One private stack (Temporal dev server, control and browser workers, the Python learner with the tiny-random
 * Qwen3-VL for the update); actions from the instant scripted policy (testing/fake-policy-server.ts), which
 * answers a valid `wait 0` on tasks it cannot solve, so every step runs to maxSteps.
 *
 * - `step`: one episode of T steps; at each step N candidates, each executed in a session forked by replaying
 *   the action prefix (MiniWoB++ has no snapshot), so the forks cost grows with the step index.
 * - `anchor`: N ordinary episodes of T steps of the same task + seed; step groups are formed afterwards from
 *   equal states. No forks.
 * Both sample N × T actions. The rollout time is the `rollout` phase of the run's metrics row.
 *
 *   node --import tsx bench/anchor-vs-step.ts [--steps 10] [--n 8] [--parallelism 8] [--task click-checkboxes]
 *        [--iterations 1]
 *
 * With --iterations > 1 the first iteration (fresh processes) is a warm-up left out of the median.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startOrAttachTrain } from '../client/train';
import { isGrpoMetrics, parseMetricsJsonl } from '../lib/training/run-metrics';
import { startFakePolicyServer } from '../testing/fake-policy-server';
import { scriptedPolicy, stackGrpoConfig } from '../testing/grpo-config';
import { startTestStack } from '../testing/stack';
import { median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';
import { stackPromptIds } from '../testing/model-prompt-ids';

const { values } = parseArgs({
  options: {
    steps: { type: 'string', default: '10' },
    n: { type: 'string', default: '8' },
    parallelism: { type: 'string', default: '8' },
    task: { type: 'string', default: 'click-checkboxes' },
    iterations: { type: 'string', default: '1' },
  },
});
const T = Number(values.steps);
const N = Number(values.n);
const iterations = Number(values.iterations);

async function main() {
  printBenchHeader('anchor-vs-step');
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  const fake = await startFakePolicyServer({ kind: 'scripted' }, { promptIds: stackPromptIds(stack.home) });
  const rows: { grouping: string; rollout: number[]; episodes: number; steps: number; anchorGroups?: number }[] = [];
  try {
    for (const grouping of ['step', 'anchor'] as const) {
      const runId = `bench-anchor-${grouping}-${Date.now().toString(36)}`;
      const cfg = stackGrpoConfig(stack, {
        runId,
        iterations,
        maxSteps: T,
        policy: scriptedPolicy(fake.url),
        train: { grouping, numGenerations: N, parallelism: Number(values.parallelism), tasks: [values.task!], episodesPerIteration: 1 },
      });
      const { handle } = await startOrAttachTrain(stack.client, cfg);
      await handle.result();
      const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
      const measured = lines.length > 1 ? lines.slice(1) : lines;
      const last = lines[lines.length - 1];
      rows.push({
        grouping,
        rollout: measured.map((l) => l.seconds.rollout),
        episodes: last.num_episodes,
        steps: Math.round(last.episode_length * last.num_episodes),
        anchorGroups: last.anchor_groups,
      });
      console.error(`${grouping}: rollout s per iteration ${lines.map((l) => l.seconds.rollout.toFixed(2)).join(', ')}`);
    }
  } finally {
    await fake.close();
    await stack.stop();
  }
  const [step, anchor] = rows;
  const ms = median(step.rollout);
  const ma = median(anchor.rollout);
  console.log('');
  console.log(`task ${values.task}, T = ${T} (maxSteps), N = ${N}, parallelism ${values.parallelism}, scripted policy, 1 browser worker; sampled actions N × T = ${N * T} in both`);
  console.log('');
  console.log('| grouping | episodes | episode steps | rollout s (median) | anchor groups |');
  console.log('|---|---|---|---|---|');
  for (const r of rows) console.log(`| ${r.grouping} | ${r.episodes} | ${r.steps} | ${median(r.rollout).toFixed(2)} | ${r.anchorGroups ?? '-'} |`);
  console.log('');
  console.log(`rollout speed-up anchor vs step: ${(ms / ma).toFixed(2)}× (target ≥ 5× at T=10, N=8)`);
  printLoadAtEnd();
}

runBench(main);
