import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { temporalBinary } from '../../client/processes';
import { curvesPython, syncCurves } from '../../host/curves';
import { isGrpoMetrics, parseMetricsJsonl } from '../../lib/training/run-metrics';
import { startOrAttachTrain } from '../../client/train';
import { listEpisodes, listRuns } from '../../client/commands/runs';
import type { TrainingResult } from '../../workflows/train-engine';
import { stackGrpoConfig } from '../../testing/grpo-config';
import { startTestStack, type TestStack } from '../../testing/stack';

// A real (tiny) GRPO run: MiniWoB++ pages in Chromium, the colocated tiny-random Qwen3-VL sampling and
// learning in the Python learner, Temporal orchestrating; nothing faked.
let stack: TestStack;
before(async () => {
  stack = await startTestStack({ browserWorkers: 1, learner: true });
});
after(async () => {
  await stack?.stop();
});

function config(runId: string, iterations: number) {
  return stackGrpoConfig(stack, {
    runId,
    iterations,
    maxSteps: 2,
    episode: { sessionStartTimeoutMs: 10_000 },
    train: { heldOutTasks: ['enter-text'], evalEvery: 2 },
  });
}

test('a GRPO run: adapter versions 1..I, one metrics line per iteration, a second start attaches', async () => {
  const cfg = config('grpo-test', 2);
  const first = await startOrAttachTrain(stack.client, cfg);
  assert.equal(first.attached, false);
  const again = await startOrAttachTrain(stack.client, cfg);
  assert.equal(again.attached, true, 'the same run id attaches instead of starting a second run');
  const result = (await first.handle.result()) as TrainingResult;
  const { best, ...ended } = result;
  assert.deepEqual(ended, { runId: 'grpo-test', iterations: 2, adapterVersion: 2, stoppedEarly: false });
  // Its one evaluation (after iteration 2) scored v2: that is the best-evaluated adapter.
  assert.deepEqual(best && { version: best.version, iteration: best.iteration }, { version: 2, iteration: 2 });

  const adapters = readdirSync(join(stack.checkpoints, 'grpo-test'))
    .filter((d) => /^v\d+$/.test(d))
    .sort();
  assert.deepEqual(adapters, ['v1', 'v2']);
  for (const v of adapters) assert.ok(existsSync(join(stack.checkpoints, 'grpo-test', v, 'adapter_model.safetensors')));

  const lines = parseMetricsJsonl(readFileSync(join(stack.home, 'grpo-test', 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
  assert.deepEqual(
    lines.map((l) => l.iteration),
    [1, 2],
  );
  for (const l of lines) {
    assert.equal(l.num_groups > 0, true);
    assert.ok(Number.isFinite(l.loss ?? NaN));
    assert.ok(l.action_validity >= 0 && l.action_validity <= 1);
    // The colocated sampler's tokens (in blobs, by reference) reach the learner: nothing had to be retokenised.
    assert.equal(l.retokenized, 0, `iteration ${l.iteration} retokenised ${l.retokenized} completions`);
  }
  assert.deepEqual(
    lines.map((l) => l.adapter_version),
    [1, 2],
  );
  assert.equal(lines[0].eval, undefined);
  assert.equal(lines[1].eval?.episodes, 1, 'greedy evaluation on the held-out task every 2 iterations');

  // The control worker wrote the same scalars as TensorBoard event files (in the background after each metrics
  // line), read back with TensorBoard's own reader: every iteration once.
  const runDir = join(stack.home, 'grpo-test');
  let scalars: Record<string, [number, number][]> = {};
  for (let i = 0; i < 120; i++) {
    scalars = await readTensorBoard(join(runDir, 'tensorboard'));
    if ((scalars['train/success_rate'] ?? []).length >= 2) break;
    await new Promise((r) => setTimeout(r, 500));
  }
  for (const [tag, key] of [
    ['train/success_rate', 'success_rate'],
    ['train/mean_reward', 'mean_reward'],
    ['train/action_validity', 'action_validity'],
    ['learner/loss', 'loss'],
    ['learner/grad_norm', 'grad_norm'],
  ] as const) {
    assert.deepEqual(
      scalars[tag]?.map(([step]) => step),
      [1, 2],
      `${tag}: one value per iteration`,
    );
    scalars[tag].forEach(([, v], i) => assert.ok(Math.abs(v - (lines[i][key] as number)) < 1e-5, `${tag} at iteration ${i + 1}: ${v}`));
  }
  assert.deepEqual(
    scalars['eval/success_rate']?.map(([step]) => step),
    [2],
  );
  // A later sync (a retried activity, `halo report --tensorboard`) writes nothing again.
  assert.equal((await syncCurves(runDir)).tensorboard.written, 0);

  // After it finished, starting it again still attaches (no second run).
  const late = await startOrAttachTrain(stack.client, cfg);
  assert.equal(late.attached, true);
  assert.deepEqual(await late.handle.result(), result);
  const runs = [];
  for await (const w of stack.client.workflow.list({ query: `WorkflowId = 'grpo-test'` })) runs.push(w.runId);
  assert.equal(runs.length, 2, 'one chain of two runs (continue-as-new), no duplicate run');

  // halo runs / halo episodes: found through the search attributes the workflows set.
  const listed = await listRuns(stack.client, { kind: 'train', mode: 'grpo' });
  assert.deepEqual(
    listed.map((r) => [r.workflowId, r.status]),
    [['grpo-test', 'COMPLETED']],
  );
  const eps = await listEpisodes(stack.client, 'grpo-test');
  assert.deepEqual(eps.map((e) => e.workflowId).sort(), ['grpo-test-it1-ep0', 'grpo-test-it2-ep0', 'grpo-test-it2-eval0']);
});

test('an invalid config fails before anything starts, naming the field', async () => {
  const handle = await stack.client.workflow.start('trainGrpo', {
    taskQueue: stack.controlQueue,
    workflowId: 'bad-config',
    args: [{ config: { train: { runId: 'bad-config', numGenerations: 1 } } }],
  });
  await assert.rejects(handle.result(), (err: unknown) => {
    assert.ok(err instanceof Error);
    assert.match(String((err.cause as Error | undefined)?.message), /train\.numGenerations/);
    return true;
  });
});

test('pause holds the run between iterations, resume continues, stop ends it gracefully keeping the adapter', async () => {
  const cfg = config('grpo-signals', 20);
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  await handle.signal('pause');
  const status = async () => handle.query<{ iteration: number; paused: boolean; phase: string; adapterVersion: number }>('status');
  let st = await status();
  for (let i = 0; i < 600 && st.phase !== 'paused'; i++) {
    await new Promise((r) => setTimeout(r, 200));
    st = await status().catch(() => st);
  }
  assert.equal(st.phase, 'paused');
  const heldAt = st.iteration;
  await new Promise((r) => setTimeout(r, 3000));
  assert.equal((await status()).iteration, heldAt, 'no progress while paused');
  await handle.signal('resume');
  await handle.signal('stop');
  const result = (await handle.result()) as TrainingResult;
  assert.equal(result.stoppedEarly, true);
  assert.ok(result.iterations >= heldAt - 1 && result.iterations < 20);
  // A pause taken before the first update ends the run with no adapter, and no run folder under checkpoints/.
  const dir = join(stack.checkpoints, 'grpo-signals');
  const adapters = existsSync(dir) ? readdirSync(dir).filter((d) => /^v\d+$/.test(d)) : [];
  assert.equal(adapters.length, result.adapterVersion, 'every finished iteration kept its adapter');
});

test("docs/training.md's `temporal workflow start --type trainGrpo` form starts a run", async () => {
  const input = JSON.stringify({
    config: {
      temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      policy: { backend: 'colocated', model: 'tiny-random', temperature: 1, maxTokens: 16 },
      episode: { env: 'miniwob', maxSteps: 1 },
      train: { runId: 'cli-grpo', iterations: 1, episodesPerIteration: 1, tasks: ['click-button'], numGenerations: 2, gpuTaskQueue: stack.gpuQueue },
    },
  });
  const { stdout } = await promisify(execFile)(
    temporalBinary(),
    [
      'workflow',
      'execute',
      '--address',
      stack.address,
      '--type',
      'trainGrpo',
      '--task-queue',
      stack.controlQueue,
      '--workflow-id',
      'cli-grpo',
      '--input',
      input,
      '--output',
      'json',
    ],
    { timeout: 240_000, maxBuffer: 1 << 24 },
  );
  assert.match(stdout, /"adapterVersion":\s*1/);
});

/** Every scalar of a TensorBoard log folder, by tag, as [step, value] pairs (TensorBoard's EventAccumulator). */
async function readTensorBoard(dir: string): Promise<Record<string, [number, number][]>> {
  const script = [
    'import json, sys',
    'from tensorboard.backend.event_processing.event_accumulator import EventAccumulator',
    "acc = EventAccumulator(sys.argv[1], size_guidance={'scalars': 0})",
    'acc.Reload()',
    "print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']}))",
  ].join('\n');
  if (!existsSync(dir)) return {};
  const { stdout } = await promisify(execFile)(curvesPython(), ['-c', script, dir], { timeout: 60_000 });
  return JSON.parse(stdout) as Record<string, [number, number][]>;
}
