import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, parseConfig } from '../../lib/config/config';
import { dynamicSamplingStats, type BatchStepGroup } from '../../lib/training/grpo';
import { bestNote, betterEval, samplingSeed } from '../../lib/serving/iteration-policy';
import { freshRunSummary, reproducibilityProblems, type FreshRun } from '../../bench/repeat-runs';
import { iterationMetrics } from '../../lib/training/training-metrics';
import { drawKey } from '../../lib/training/training-plan';

const group = (rewards: number[], firstDraw?: number): BatchStepGroup => ({
  promptRef: 'p',
  step: 1,
  chosen: 0,
  ...(firstDraw ? { firstDraw } : {}),
  candidates: rewards.map((reward) => ({ completion: { ref: 'c', preview: 'c', finishReason: 'stop', action: { type: 'wait', seconds: 1 }, valid: true }, reward })),
});

test('dynamic sampling stats: groups that drew more, what they added, the zero-std share of first draws', () => {
  const s = dynamicSamplingStats([group([0.1, 0.1, 0.1, 5], 2), group([0.1, 0.1, 0.1, 0.1], 2), group([0.1, 5])]);
  assert.deepEqual(s, { groups_resampled: 2, extra_candidates: 4, frac_reward_zero_std_first_draw: 0.666666667 });
  const m = iterationMetrics({ groups: [{ rewards: [0.1, 0.1, 0.1, 5] }], episodes: [], phaseSeconds: {}, dynamic: s, noSignal: false });
  assert.equal(m.groups_resampled, 2);
  assert.equal(m.frac_reward_zero_std, 0);
  assert.equal(m.update_without_signal, 0);
});

test('train.dynamicSampling: only with step grouping, and room for at least one extra draw', () => {
  const cfg = (train: Record<string, unknown>) => parseConfig({ train: { numGenerations: 4, ...train } });
  assert.equal(cfg({}).train.dynamicSampling.maxCandidates, 0);
  assert.equal(cfg({ dynamicSampling: { maxCandidates: 8 } }).train.dynamicSampling.explore, 0.5);
  assert.throws(
    () => cfg({ dynamicSampling: { maxCandidates: 6 } }),
    (e: Error) => e instanceof ConfigError && /maxCandidates 6: .* 0 or at least 8/.test(e.message),
  );
  assert.throws(() => cfg({ grouping: 'episode', dynamicSampling: { maxCandidates: 8 } }), /need train.grouping step \(it is episode\)/);
  assert.throws(() => cfg({ dynamicSampling: { explore: 1.5 } }), /train\.dynamicSampling\.explore/);
});

test('draws are seeded by the run seed, iteration, episode, step and draw: never by the run id or the prompt', () => {
  // Two runs of seed 3 with different ids share their pick key, so their episodes draw alike.
  const a = samplingSeed(drawKey('seed-3', 2, 1), 'step 1 draw 0', 4);
  assert.equal(a, samplingSeed(drawKey('seed-3', 2, 1), 'step 1 draw 0', 4));
  const others = [
    samplingSeed(drawKey('seed-4', 2, 1), 'step 1 draw 0', 4),
    samplingSeed(drawKey('seed-3', 3, 1), 'step 1 draw 0', 4),
    samplingSeed(drawKey('seed-3', 2, 2), 'step 1 draw 0', 4),
    samplingSeed(drawKey('seed-3', 2, 1), 'step 2 draw 0', 4),
    samplingSeed(drawKey('seed-3', 2, 1), 'step 1 draw 1', 4),
  ];
  assert.equal(new Set([a, ...others]).size, 6);
});

test('fresh runs: reached over the last five, iterations to the threshold, same seed compared', () => {
  const run = (runId: string, success: number[], adapterHash = 'h'): FreshRun => ({
    runId,
    seed: 1,
    model: 'tiny-random',
    success,
    zeroStdFirstDraw: [],
    zeroStd: [],
    evals: [],
    adapterHash,
    seconds: 1,
  });
  const s = freshRunSummary(run('a', [0, 0.5, 0.75, 1, 1, 1, 0.75, 1]), 0.8);
  assert.equal(s.reached, true);
  assert.equal(s.toThreshold, 2); // iterations 2-6 average 0.85
  assert.equal(freshRunSummary(run('b', [0, 0, 1, 1, 0, 0.5, 1]), 0.8).reached, false);
  assert.deepEqual(reproducibilityProblems([run('a', [0, 1]), run('b', [0, 1])]), []);
  assert.match(reproducibilityProblems([run('a', [0, 1]), run('b', [0.25, 1])])[0], /different curves/);
  assert.match(reproducibilityProblems([run('a', [0, 1]), run('b', [0, 1], 'other')])[0], /different adapters/);
});

test('the best-evaluated adapter: the latest of equals; a finished run names it when the latest scored below it', () => {
  let best = betterEval(undefined, { version: 1, iteration: 1, success: 0.25 });
  best = betterEval(best, { version: 2, iteration: 2, success: 0.75 });
  best = betterEval(best, { version: 3, iteration: 3, success: 0.75 });
  assert.equal(best.version, 3, 'as good as the best: the later one');
  best = betterEval(best, { version: 4, iteration: 4, success: 0.5 });
  assert.deepEqual(best, { version: 3, iteration: 3, success: 0.75 });
  assert.match(bestNote({ adapterVersion: 4, best }) ?? '', /scored adapter v3 \(iteration 3\) best, success 0\.75, above the latest v4/);
  assert.equal(bestNote({ adapterVersion: 3, best }), null);
  assert.equal(bestNote({ adapterVersion: 4 }), null);
});
