import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startOrAttachMcts } from '../../client/commands/mcts';
import { parseConfig } from '../../lib/config/config';
import { isMctsMetrics, parseMetricsJsonl } from '../../lib/training/run-metrics';
import type { TrainingResult } from '../../workflows/train-engine';
import { startTestStack, type TestStack } from '../../testing/stack';
import { greedyBaseVsTrained } from '../helpers/greedy-eval';

// Agent Q learns, on the real stack: MiniWoB++'s click-test and focus-text in Chromium, the tiny random Qwen3-VL
// sampling under the action grammar in the learner, one search per task and iteration (K = 16 candidates at the
// root, each run once in the browser), the step-level DPO pairs of siblings whose outcomes differ in update_dpo,
// and every iteration searching with the adapter the previous one wrote. Then the trained adapter and the base
// model play the same held-out seeds greedily (the `evaluate` workflow): the trained one must win clearly. Only
// the environment's success says which action was right. HALO_MCTS_LEARNING_TEST_LR overrides the learning rate
// (a near-zero one makes this test fail: the adapter stays the base model).

// Nine iterations: the first often finds no pair (the base model seldom succeeds), and the local job needs about six
// to be greedy-perfect; five left the adapter at 6 of 16 in one run, and seven at 10 of 16 in one full-suite run.
const ITERATIONS = 9;
const LR = Number(process.env.HALO_MCTS_LEARNING_TEST_LR ?? 3e-3);
const TASKS = ['click-test', 'focus-text'];
// Search seeds are below 100,000 (lib/search/mcts-search.ts searchSeed): these were never searched.
const HELD_OUT = Array.from({ length: 8 }, (_, i) => 100_000 + i);
const RUN_ID = 'mcts-learn-test';

let stack: TestStack;
let out: string;
before(async () => {
  stack = await startTestStack({ browserWorkers: 1, learner: true });
  out = mkdtempSync(join(tmpdir(), 'halo-mcts-learning-'));
});
after(async () => {
  await stack?.stop();
  rmSync(out, { recursive: true, force: true });
});

// About 5 minutes on 2 cores; a loaded machine can take twice that, so it sets its own limit.
test('MCTS + DPO on click-test and focus-text: greedy success on held-out seeds clearly above the base model', { timeout: 1_800_000 }, async () => {
  const cfg = parseConfig({
    temporal: { address: stack.address, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    stack: { home: stack.home },
    policy: { backend: 'colocated', model: 'tiny-random', constrained: true, maxTokens: 128, temperature: 1, timeoutMs: 120_000 },
    episode: { env: 'miniwob', maxSteps: 1, sessionStartTimeoutMs: 20_000 },
    train: { gpuTaskQueue: stack.gpuQueue, learnerHeartbeatTimeoutS: 60 },
    mcts: {
      runId: RUN_ID,
      iterations: ITERATIONS,
      tasks: TASKS,
      parallelism: 2,
      numSimulations: 16,
      maxChildren: 16,
      maxDepth: 1,
      critic: { backend: 'none' },
      learningRate: LR,
      beta: 0.5,
    },
  });
  const { handle } = await startOrAttachMcts(stack.client, cfg);
  const result = (await handle.result()) as TrainingResult;
  const lines = parseMetricsJsonl(readFileSync(join(stack.home, RUN_ID, 'metrics.jsonl'), 'utf8')).filter(isMctsMetrics);
  assert.deepEqual(
    lines.map((l) => l.iteration),
    Array.from({ length: ITERATIONS }, (_, i) => i + 1),
  );
  for (const l of lines) assert.equal(l.mcts.invalid_candidates, 0, `iteration ${l.iteration}: constrained decoding makes every candidate a valid action`);
  assert.ok(result.adapterVersion >= 1, 'at least one iteration found pairs and updated the adapter');

  const { base, trained } = await greedyBaseVsTrained(stack, cfg, out, {
    runId: 'mcts-learn-eval',
    tasks: TASKS,
    seeds: HELD_OUT,
    maxSteps: 1,
    parallelism: 2,
    trained: { name: 'qwen3vl_mcts', run: RUN_ID, version: result.adapterVersion },
  });
  const total = TASKS.length * HELD_OUT.length;
  const pairs = lines.map((l) => l.mcts.pairs).join(' ');
  const found = lines.map((l) => l.success_rate.toFixed(2)).join(' ');
  console.log(`pairs per iteration: ${pairs}; searches ending in success: ${found}; greedy held-out (of ${total}): base ${base}, trained v${result.adapterVersion} ${trained}`);
  assert.ok(
    trained >= base + 8 && trained >= 12,
    `greedy successes on ${total} held-out episodes: base ${base}, trained v${result.adapterVersion} ${trained} (DPO pairs per iteration: ${pairs}; searches ending in success: ${found})`,
  );
});
