import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startOrAttachTrain } from '../../client/train';
import { loadConfigFile } from '../../host/config-file';
import { parseConfig } from '../../lib/config/config';
import { freshRunSummary } from '../../bench/repeat-runs';
import { isGrpoMetrics, parseMetricsJsonl } from '../../lib/training/run-metrics';
import { startTestStack, type TestStack } from '../../testing/stack';
import { greedyBaseVsTrained } from '../helpers/greedy-eval';

// The default job learns, on the real stack: MiniWoB++'s click-test and focus-text in Chromium, the tiny random
// Qwen3-VL sampling under the action grammar in the learner, GRPO updates with dynamic sampling, every iteration
// sampling from the new adapter. It is configs/default.yaml as shipped (its queues aside), trained for its first 12
// iterations with four seeds: a run is a function of its config and seed, so the verdict does not change between
// runs of one commit on one machine, and four seeds make it a statement about the method rather than one draw. A
// seed passes when its training success over its last five iterations averages ≥ 0.8 (bench/fresh-repeats.ts's
// rule); the test needs 2 of 4 and trains no more seeds once the verdict is settled. bench/RESULTS.md ("The
// default job, ten seeds on fresh stacks") measured how often one seed passes, and with that rate the chance of
// failing a working commit is below 1 in 100. Then the last adapter of the first seed must beat the base model
// greedily on held-out seeds of the training tasks.
// HALO_LEARNING_TEST_LR overrides the learning rate (a near-zero one makes this test fail).

const ITERATIONS = 12;
// Seeds bench/fresh-repeats.ts ran with this model: each reached 1.00 by its twelfth iteration there.
const SEEDS = [1, 4, 5, 8];
const NEEDED = 2;
const LR = Number(process.env.HALO_LEARNING_TEST_LR ?? 6e-3);
// Training seeds are below 100,000 (lib/training/training-plan.ts pickTasks): these were never trained on.
const HELD_OUT = [100_000, 100_001, 100_002, 100_003];

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

function runConfig(seed: number) {
  const file = loadConfigFile('configs/default.yaml');
  return parseConfig({
    ...file,
    temporal: { ...file.temporal, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    stack: { ...file.stack, home: stack.home },
    episode: { ...file.episode, sessionStartTimeoutMs: 20_000 },
    train: { ...file.train, runId: `learn-s${seed}`, seed, iterations: ITERATIONS, learningRate: LR, gpuTaskQueue: stack.gpuQueue, heldOutTasks: [], evalEvery: 0 },
  });
}

// About 2 minutes a seed on 2 cores; launch.sh gives each test file 30 minutes, and so does this test's own limit.
test('GRPO, the default job with four seeds: two reach 0.8 training success, the trained adapter beats the base model', { timeout: 1_800_000 }, async () => {
  const verdicts: string[] = [];
  let passed = 0;
  for (const [i, seed] of SEEDS.entries()) {
    // The verdict is settled once NEEDED seeds passed or too few are left to get there: the seeds after it cannot
    // change it (a passing commit trains two seeds, not four).
    if (passed >= NEEDED || passed + SEEDS.length - i < NEEDED) break;
    const cfg = runConfig(seed);
    const { handle } = await startOrAttachTrain(stack.client, cfg);
    await handle.result();
    const lines = parseMetricsJsonl(readFileSync(join(stack.home, cfg.train.runId, 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
    assert.equal(lines.length, ITERATIONS);
    for (const l of lines) assert.equal(l.action_validity, 1, 'constrained decoding: every sample is a valid action');
    const success = lines.map((l) => l.success_rate);
    const s = freshRunSummary({ success, evals: [] }, 0.8);
    if (s.reached) passed++;
    verdicts.push(`seed ${seed}: ${success.map((x) => x.toFixed(2)).join(' ')} (last five ${s.lastFive.toFixed(2)})`);
    console.log(verdicts.at(-1));
  }
  assert.ok(passed >= NEEDED, `${passed} of ${verdicts.length} seeds reached 0.8 over their last five iterations, ${NEEDED} needed:\n${verdicts.join('\n')}`);

  const first = runConfig(SEEDS[0]);
  const { base, trained } = await greedyBaseVsTrained(stack, first, out, {
    runId: 'learn-eval',
    tasks: first.train.tasks,
    seeds: HELD_OUT,
    maxSteps: 1,
    parallelism: 4,
    trained: { name: 'qwen3vl_grpo', run: first.train.runId, version: ITERATIONS },
  });
  console.log(`greedy on ${HELD_OUT.length * first.train.tasks.length} held-out episodes: base ${base}, trained ${trained}`);
  assert.ok(trained >= base + 3 && trained >= 6, `greedy held-out successes: base ${base}, trained v${ITERATIONS} ${trained} (${verdicts[0]})`);
});
