import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseConfig } from '../../lib/config/config';
import { evaluationDue, greedy, samplingPolicy, servedAdapterName, servingOf } from '../../lib/serving/iteration-policy';
import { runContextFromConfig } from '../../lib/episode/run-context';
import { episodeInput, episodeRun, type EpisodeInput } from '../../lib/episode/episode-types';

const served = parseConfig({ policy: { backend: 'openai', model: 'Qwen/Qwen3-VL-8B-Instruct' }, train: { vllmBaseUrl: 'http://127.0.0.1:8000/v1' } });
const colocated = parseConfig({ policy: { backend: 'colocated', model: 'tiny-random' } });

test('openai backend with served adapters: iteration i samples <run>-v<i-1>, the base model first', () => {
  const serving = { baseUrl: 'http://127.0.0.1:8000/v1', adapterPath: '/ckpt/grpo-real/v7' };
  const at = (v: number) => samplingPolicy({ policy: served.policy, runId: 'grpo-real', adapterVersion: v, serving });
  assert.equal(at(0).policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.equal(at(1).policy.model, 'grpo-real-v1');
  assert.equal(at(7).policy.model, servedAdapterName('grpo-real', 7));
  // The server picks the adapter by name; no colocated version travels with it.
  assert.equal(at(7).adapterVersion, 0);
  // Everything else about the policy is kept.
  assert.equal(at(7).policy.baseUrl, served.policy.baseUrl);
  // The adapter's folder travels along, so a restarted server can be given it again.
  assert.deepEqual(at(7).adapter, { base_url: 'http://127.0.0.1:8000/v1', lora_name: 'grpo-real-v7', lora_path: '/ckpt/grpo-real/v7' });
  assert.equal(at(0).adapter, undefined);
});

test('openai backend without served adapters (an OpenAI model, a server the run does not load into): always the configured model', () => {
  const s = samplingPolicy({ policy: served.policy, runId: 'r', adapterVersion: 4 });
  assert.equal(s.policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
});

test('colocated backend: the learner samples with adapter version N, the model name stays', () => {
  const s = samplingPolicy({ policy: colocated.policy, runId: 'grpo-local', adapterVersion: 3, serving: { baseUrl: 'http://x/v1' } });
  assert.deepEqual([s.policy.model, s.adapterVersion], ['tiny-random', 3]);
});

test('greedy keeps the policy and sets temperature 0', () => {
  const g = greedy({ ...colocated.policy, temperature: 1 });
  assert.equal(g.temperature, 0);
  assert.equal(g.model, 'tiny-random');
});

test('one run context from the config, carried whole by the episode input', () => {
  const cfg = parseConfig({
    temporal: { browserTaskQueue: 'b-q' },
    train: { gpuTaskQueue: 'g-q', learnerHeartbeatTimeoutS: 7 },
    episode: { maxSessionRebuilds: 2, sessionStartTimeoutMs: 3000, heartbeatTimeoutMs: 4000 },
    real: { runId: 'real-1', evaluateAtCap: true },
  });
  const run = runContextFromConfig(cfg, 'my-run');
  assert.deepEqual(
    [run.runId, run.browserTaskQueue, run.gpuTaskQueue, run.learnerHeartbeatTimeoutMs, run.maxSessionRebuilds, run.sessionStartTimeoutMs, run.heartbeatTimeoutMs],
    ['my-run', 'b-q', 'g-q', 7000, 2, 3000, 4000],
  );
  assert.deepEqual(run.envOptions, {
    realRunId: 'real-1',
    realForkMode: 'snapshot',
    realScoring: 'training',
    evaluateAtCap: true,
    miniwobTimeLimit: 'raised',
    miniwobReward: 'raw',
  });
  assert.equal(runContextFromConfig(cfg, 'my-eval', 'evaluation').envOptions?.realScoring, 'official');
  assert.equal(runContextFromConfig(parseConfig({ real: { scoring: 'official' } }), 'r').envOptions?.realScoring, 'official');
  const input = episodeInput({ run, task: { env: 'miniwob', task: 'click-button', seed: 1 }, maxSteps: 3, sampling: { policy: cfg.policy, adapterVersion: 2 }, mode: 'grpo' });
  assert.equal(episodeRun(input, 'wf-id'), run);
  assert.equal(input.adapterVersion, 2);
});

test('an episode input written by hand with flat fields still resolves, with the defaults filled in', () => {
  const handWritten: EpisodeInput = { task: { env: 'miniwob', task: 'click-button', seed: 1 }, maxSteps: 3, policy: colocated.policy, browserTaskQueue: 'x' };
  const run = episodeRun(handWritten, 'wf-9');
  assert.deepEqual([run.runId, run.browserTaskQueue, run.gpuTaskQueue, run.maxSessionRebuilds], ['wf-9', 'x', 'gpu', 5]);
});

test('adapters are served only on the openai backend with a vLLM to load them into', () => {
  assert.deepEqual(servingOf(served.policy, 'http://v/v1', '/ckpt/r/v2'), { baseUrl: 'http://v/v1', adapterPath: '/ckpt/r/v2' });
  assert.deepEqual(servingOf(served.policy, 'http://v/v1'), { baseUrl: 'http://v/v1' });
  assert.equal(servingOf(served.policy, undefined, '/ckpt/r/v2'), undefined);
  assert.equal(servingOf(colocated.policy, 'http://v/v1', '/ckpt/r/v2'), undefined);
});

test('evaluationDue: every evalEvery iterations, and after the iterations whose steps pass a multiple of evalEverySteps', () => {
  const due = (iteration: number, evalEvery: number, evalEverySteps: number, stepsBefore: number, stepsAfter: number) =>
    evaluationDue({ iteration, evalEvery, evalEverySteps, stepsBefore, stepsAfter });
  // Without evalEverySteps: the iteration rule alone, whatever the steps (configs without the key decide as before).
  for (let it = 1; it <= 12; it++) assert.equal(due(it, 5, 0, it * 40, it * 40 + 40), it % 5 === 0);
  for (let it = 1; it <= 12; it++) assert.equal(due(it, 0, 0, 0, 1000), false);
  // Every 100 steps (the seeds' cadence): iterations of 45 steps evaluate after passing 100, 200, 300, …
  const steps = [0, 45, 90, 135, 180, 225, 270, 315];
  const evaluated = steps.slice(1).map((after, i) => due(i + 1, 0, 100, steps[i], after));
  assert.deepEqual(evaluated, [false, false, true, false, true, false, true]);
  // Landing on a multiple counts; an iteration that jumps over several multiples evaluates once.
  assert.equal(due(1, 0, 100, 50, 100), true);
  assert.equal(due(2, 0, 100, 100, 150), false);
  assert.equal(due(3, 0, 100, 150, 420), true);
  assert.equal(due(4, 0, 100, 420, 420), false, 'an iteration without steps');
  // Both rules: due by either.
  assert.equal(due(4, 4, 100, 10, 20), true);
  assert.equal(due(3, 4, 100, 90, 110), true);
  assert.equal(due(3, 4, 100, 10, 20), false);
});
