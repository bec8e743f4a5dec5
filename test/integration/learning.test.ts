import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startOrAttachTrain } from '../../client/train';
import { isGrpoMetrics, parseMetricsJsonl } from '../../lib/run-metrics';
import type { TrainingResult } from '../../workflows/train-engine';
import { stackGrpoConfig } from '../../testing/grpo-config';
import { startTestStack, type TestStack } from '../../testing/stack';
import { greedyBaseVsTrained } from '../helpers/greedy-eval';

// The loop learns, on the real stack: MiniWoB++'s click-test in Chromium, the tiny random Qwen3-VL sampling
// under the action grammar in the learner, GRPO updates, and every iteration sampling from the new adapter.
// Then the trained adapter and the base model play the same held-out seeds greedily (the `evaluate` workflow):
// the trained one must win clearly. Nothing in the task is known to the code: only the reward says which
// action was right. HALO_LEARNING_TEST_LR overrides the learning rate (a near-zero one makes this test fail);
// HALO_LEARNING_TEST_STALENESS=1 runs the same check with pipelined iterations (train.maxStaleness 1).

const ITERATIONS = 16;
const LR = Number(process.env.HALO_LEARNING_TEST_LR ?? 6e-3);
const MAX_STALENESS = Number(process.env.HALO_LEARNING_TEST_STALENESS ?? 0);
// Training seeds are below 100,000 (train-grpo's pickTasks): these were never trained on.
const HELD_OUT = Array.from({ length: 8 }, (_, i) => 100_000 + i);

let stack: TestStack;
let out: string;
before(async () => {
  stack = await startTestStack({ browserWorkers: 1, learner: true });
  out = mkdtempSync(join(tmpdir(), 'halo-learning-'));
});
after(async () => {
  await stack?.stop();
  rmSync(out, { recursive: true, force: true });
});

// About 10 minutes on 2 cores; launch.sh gives each test file 30 minutes, and so does this test's own limit.
test('GRPO on click-test: greedy success on held-out seeds clearly above the base model', { timeout: 1_800_000 }, async () => {
  const cfg = stackGrpoConfig(stack, {
    runId: 'learn-test',
    iterations: ITERATIONS,
    maxSteps: 1,
    policy: { constrained: true, maxTokens: 128, temperature: 1 },
    episode: { sessionStartTimeoutMs: 20_000 },
    train: {
      tasks: ['click-test'],
      episodesPerIteration: 4,
      parallelism: 4,
      numGenerations: 8,
      choose: 'sampled',
      learningRate: LR,
      klCoef: 0,
      maxStaleness: MAX_STALENESS,
    },
  });
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  const result = (await handle.result()) as TrainingResult;
  assert.equal(result.adapterVersion, ITERATIONS);
  const lines = parseMetricsJsonl(readFileSync(join(stack.home, 'learn-test', 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
  assert.deepEqual(
    lines.map((l) => l.iteration),
    Array.from({ length: ITERATIONS }, (_, i) => i + 1),
  );
  for (const l of lines) assert.equal(l.action_validity, 1, 'constrained decoding: every sample is a valid action');

  // The stack's home: the evaluation's records are read back from its blob store.
  const stackCfg = { ...cfg, stack: { ...cfg.stack, home: stack.home } };
  const { base, trained } = await greedyBaseVsTrained(stack, stackCfg, out, {
    runId: 'learn-eval',
    tasks: ['click-test'],
    seeds: HELD_OUT,
    maxSteps: 1,
    parallelism: 4,
    trained: { name: 'qwen3vl_grpo', run: 'learn-test', version: ITERATIONS },
  });
  const curve = lines.map((l) => l.success_rate.toFixed(2)).join(' ');
  const rewards = lines.map((l) => l.mean_reward.toFixed(2)).join(' ');
  console.log(`training success rate per iteration: ${curve}; mean candidate reward: ${rewards}; greedy held-out: base ${base}, trained ${trained}`);
  assert.ok(
    trained >= base + 3 && trained >= 5,
    `greedy successes on ${HELD_OUT.length} held-out seeds: base ${base}, trained v${ITERATIONS} ${trained} (training success rate per iteration: ${curve}; mean candidate reward: ${rewards})`,
  );
});
