import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createLearnerBatchActivities, type GrpoBatchRequest } from '../../activities/learner-batches';
import { GrpoBatchSchema, GrpoItemSchema, type GrpoBatch } from '../../lib/learner-types';
import { MetricsLineSchema } from '../../lib/run-metrics';
import {
  chooseCandidate,
  episodeGroup,
  groupAdvantages,
  groupsToBatchItems,
  isZeroStdGroup,
  iterationMetrics,
  shouldWarnZeroStd,
  type BatchStepGroup,
} from '../../lib/grpo';

const close = (a: number, b: number, eps = 1e-9): void => assert.ok(Math.abs(a - b) <= eps, `${a} ≉ ${b}`);
const sum = (xs: number[]): number => xs.reduce((s, x) => s + x, 0);

test('advantages are mean-centred rewards, no std division, summing to 0', () => {
  // mean 0.5 → 1-0.5, 0-0.5, 0.5-0.5
  assert.deepEqual(groupAdvantages([1, 0, 0.5]), [0.5, -0.5, 0]);
  // mean 0.3 (rounded to 1e-9, so no 0.30000000000000004 leaks out)
  assert.deepEqual(groupAdvantages([0.1, 0.2, 0.6]), [-0.2, -0.1, 0.3]);
  // std of [10, 0] is 5: a std-normalised GRPO would give [1, -1]; Dr. GRPO keeps the scale
  assert.deepEqual(groupAdvantages([10, 0]), [5, -5]);
  // mean of [11.1, -0.5, 0.1, 0.1] = 10.8 / 4 = 2.7
  const a = groupAdvantages([11.1, -0.5, 0.1, 0.1]);
  assert.deepEqual(a, [8.4, -3.2, -2.6, -2.6]);
  for (const g of [[1, 0, 0.5], [0.1, 0.2, 0.6], [11.1, -0.5, 0.1, 0.1], [3, 7, -2, 0.25, 1e-3]]) close(sum(groupAdvantages(g)), 0, 1e-8);
});

test('a group of one, and a group of equal rewards, get zero advantages', () => {
  assert.deepEqual(groupAdvantages([4.2]), [0]);
  assert.deepEqual(groupAdvantages([0.3, 0.3, 0.3]), [0, 0, 0]);
  assert.deepEqual(groupAdvantages([0.1 + 0.2, 0.3]), [0, 0]); // equal within 1e-9
  assert.deepEqual(groupAdvantages([]), []);
  assert.equal(isZeroStdGroup([1]), true);
  assert.equal(isZeroStdGroup([1, 1.5]), false);
  assert.throws(() => groupAdvantages([1, Number.NaN]), /rewards\[1\] is not a finite number/);
});

test('episode groups compare returns the same way', () => {
  assert.deepEqual(episodeGroup([11.3, 0.4, -0.3]), { returns: [11.3, 0.4, -0.3], mean: 3.8, advantages: [7.5, -3.4, -4.1], zeroStd: false });
  assert.deepEqual(episodeGroup([2, 2]), { returns: [2, 2], mean: 2, advantages: [0, 0], zeroStd: true });
});

test('chooseCandidate best: argmax, ties to the lowest index, u ignored', () => {
  assert.equal(chooseCandidate([0.1, 0.5, -1], 'best', 0.99), 1);
  assert.equal(chooseCandidate([1, 3, 3], 'best', 0), 1);
  assert.equal(chooseCandidate([2, 2, 2], 'best', 0.7), 0);
  assert.equal(chooseCandidate([-5], 'best', 0.5), 0);
});

test('chooseCandidate sampled: softmax with the given uniform, deterministic', () => {
  // p = softmax([0, ln 3]) = [1/4, 3/4]
  const r = [0, Math.log(3)];
  assert.equal(chooseCandidate(r, 'sampled', 0), 0);
  assert.equal(chooseCandidate(r, 'sampled', 0.24), 0);
  assert.equal(chooseCandidate(r, 'sampled', 0.26), 1);
  assert.equal(chooseCandidate(r, 'sampled', 0.999999), 1);
  for (let i = 0; i < 5; i++) assert.equal(chooseCandidate(r, 'sampled', 0.24), 0);
  // temperature 2 on [0, 2 ln 3] is the same distribution
  assert.equal(chooseCandidate([0, 2 * Math.log(3)], 'sampled', 0.24, 2), 0);
  assert.equal(chooseCandidate([0, 2 * Math.log(3)], 'sampled', 0.26, 2), 1);
  // three candidates, p = [1/6, 2/6, 3/6] from rewards ln 1, ln 2, ln 3
  const r3 = [0, Math.log(2), Math.log(3)];
  assert.equal(chooseCandidate(r3, 'sampled', 0.16), 0);
  assert.equal(chooseCandidate(r3, 'sampled', 0.17), 1);
  assert.equal(chooseCandidate(r3, 'sampled', 0.49), 1);
  assert.equal(chooseCandidate(r3, 'sampled', 0.51), 2);
  // a low temperature is nearly greedy; huge rewards do not overflow
  assert.equal(chooseCandidate([0, 1], 'sampled', 0.999, 0.01), 1);
  assert.equal(chooseCandidate([1000, 0], 'sampled', 0.5), 0);
});

test('chooseCandidate rejects what it cannot sample from', () => {
  assert.throws(() => chooseCandidate([], 'best', 0), /no candidates/);
  assert.throws(() => chooseCandidate([1, 2], 'sampled', 1), /u must be in \[0, 1\)/);
  assert.throws(() => chooseCandidate([1, 2], 'sampled', -0.1), /u must be/);
  assert.throws(() => chooseCandidate([1, 2], 'sampled', 0.5, 0), /temperature must be > 0/);
  assert.throws(() => chooseCandidate([1, Number.POSITIVE_INFINITY], 'best', 0.5), /not a finite number/);
});

test('iteration metrics of a hand-made iteration', () => {
  const m = iterationMetrics({
    groups: [{ rewards: [1, 0, 0.5] }, { rewards: [0.2, 0.2] }, { rewards: [-1] }],
    episodes: [
      { success: true, steps: 4, validActions: 3, shapedReturn: 11.2 },
      { success: false, steps: 6, validActions: 6, shapedReturn: -0.4 },
    ],
    update: { loss: 0.12, grad_norm: 0.8, version: 3, tokens: 512 },
    phaseSeconds: { update: 12, rollout: 30.5 },
  });
  // all rewards [1, 0, 0.5, 0.2, 0.2, -1]: sum 0.9, n 6 → mean 0.15;
  // squared deviations .7225 + .0225 + .1225 + .0025 + .0025 + 1.3225 = 2.195 → std sqrt(2.195 / 6)
  close(m.mean_reward, 0.15);
  close(m.reward_std, Math.sqrt(2.195 / 6));
  close(m.frac_reward_zero_std, 2 / 3); // [0.2, 0.2] and the group of one
  assert.equal(m.episode_length, 5); // (4 + 6) / 2
  assert.equal(m.success_rate, 0.5);
  assert.equal(m.action_validity, 0.9); // 9 valid / 10 steps
  assert.equal(m.mean_return, 5.4); // (11.2 - 0.4) / 2
  assert.equal(m.loss, 0.12);
  assert.equal(m.grad_norm, 0.8);
  assert.equal(m.adapter_version, 3);
  assert.equal(m.tokens, 512);
  assert.deepEqual(m.seconds, { rollout: 30.5, update: 12 });
  assert.equal(m.num_groups, 3);
  assert.equal(m.num_episodes, 2);
});

test('iteration metrics carry the learner\'s retokenisation counts when it reports them', () => {
  const base = { groups: [{ rewards: [1, 0] }], episodes: [], phaseSeconds: {} };
  const m = iterationMetrics({ ...base, update: { loss: 0.1, grad_norm: 0.5, version: 2, tokens: 40, retokenized: 3, token_mismatch_rate: 1 / 3 } });
  assert.equal(m.retokenized, 3);
  assert.equal(m.token_mismatch_rate, 0.333333333);
  assert.deepEqual(MetricsLineSchema.parse({ run_id: 'r', iteration: 1, time: '2026-01-01T00:00:00Z', ...m }).retokenized, 3);
  // An older learner (no counts) and an iteration without update: the keys are absent, not zero.
  const old = iterationMetrics({ ...base, update: { loss: 0.1, grad_norm: 0.5, version: 2, tokens: 40 } });
  assert.ok(!('retokenized' in old) && !('token_mismatch_rate' in old));
  assert.ok(!('retokenized' in iterationMetrics(base)));
});

test('iteration metrics of an empty iteration are zeros and nulls, never NaN', () => {
  const m = iterationMetrics({ groups: [], episodes: [], phaseSeconds: {} });
  assert.deepEqual(m, {
    mean_reward: 0,
    reward_std: 0,
    frac_reward_zero_std: 0,
    episode_length: 0,
    success_rate: 0,
    mean_return: 0,
    action_validity: 0,
    loss: null,
    grad_norm: null,
    adapter_version: null,
    tokens: 0,
    seconds: {},
    num_groups: 0,
    num_episodes: 0,
  });
  // episodes of zero steps: validity 0, not NaN
  const z = iterationMetrics({ groups: [{ rewards: [] }], episodes: [{ success: false, steps: 0, validActions: 0, shapedReturn: 0 }], phaseSeconds: {} });
  assert.equal(z.action_validity, 0);
  assert.equal(z.frac_reward_zero_std, 1);
  assert.equal(z.mean_reward, 0);
  assert.throws(() => iterationMetrics({ groups: [], episodes: [], phaseSeconds: { x: Number.NaN } }), /phaseSeconds\.x/);
});

test('frac_reward_zero_std counts groups with all rewards equal', () => {
  const f = (groups: number[][]): number => iterationMetrics({ groups: groups.map((rewards) => ({ rewards })), episodes: [], phaseSeconds: {} }).frac_reward_zero_std;
  assert.equal(f([[0, 0, 0], [1, 1], [0, 1]]), 0.666666667);
  assert.equal(f([[0, 1], [2, 3]]), 0);
  assert.equal(f([[-0.1, -0.1, -0.1, -0.1]]), 1);
  assert.equal(f([[1, 0], [0.5, 0.5], [3], [0.1, 0.7]]), 0.5);
});

test('the zero-std warning needs the whole window above the threshold', () => {
  assert.equal(shouldWarnZeroStd([0.9, 0.8, 0.6]), true);
  assert.equal(shouldWarnZeroStd([0.9, 0.8]), false); // shorter than the window
  assert.equal(shouldWarnZeroStd([0.9, 0.4, 0.9, 0.9]), false); // the last three include 0.4
  assert.equal(shouldWarnZeroStd([0.4, 0.9, 0.9, 0.9]), true);
  assert.equal(shouldWarnZeroStd([0.9, 0.9, 0.5]), false); // at the threshold is not above it
  assert.equal(shouldWarnZeroStd([0.2, 0.7], 1), true);
  assert.equal(shouldWarnZeroStd([0.95, 0.95, 0.95, 0.95, 0.85], 5, 0.9), false);
  assert.equal(shouldWarnZeroStd([], 3), false);
  assert.throws(() => shouldWarnZeroStd([1], 0), /window/);
});

const ref = (hex: string, ext: string): string => `sha256:${hex.repeat(64)}.${ext}`;

function sampleGroups(promptRef: string, completions: string[]): BatchStepGroup[] {
  return [
    {
      promptRef,
      step: 0,
      chosen: 0,
      candidates: [
        { completionRef: completions[0], tokenIds: [11, 12, 13], logprobs: [-0.1, -0.2, -0.3], finishReason: 'stop', valid: true, reward: 1.1 },
        { completionRef: completions[1], tokenIds: [21, 22], logprobs: [-0.5], valid: true, reward: 0.1 }, // logprobs do not pair: dropped
        { completionRef: completions[2], valid: false, reward: -0.5 }, // invalid: no token ids, kept
      ],
    },
    {
      promptRef,
      step: 1,
      chosen: 1,
      candidates: [
        { completionRef: completions[0], tokenIds: [1], logprobs: [-1], valid: true, reward: 0.1 },
        { completionRef: completions[1], tokenIds: [2], logprobs: [-1], valid: true, reward: 0.1 },
      ],
    }, // zero std: skipped
    { promptRef, step: 2, chosen: 0, candidates: [{ completionRef: completions[0], tokenIds: [], valid: true, reward: 3 }] }, // one: skipped
    {
      promptRef,
      step: 3,
      chosen: 1,
      candidates: [
        { completionRef: completions[0], tokenIds: [], logprobs: [], finishReason: 'length', valid: true, reward: 0 },
        { completionRef: completions[0], tokenIds: [5, 6], logprobs: null, valid: true, reward: 0.2 },
      ],
    },
  ];
}

test('groupsToBatchItems: advantages per group, zero-std groups skipped, invalid candidates kept', () => {
  const p = ref('a', 'json');
  const c = [ref('b', 'txt'), ref('c', 'txt'), ref('d', 'txt')];
  const items = groupsToBatchItems(sampleGroups(p, c));
  // group 0: mean (1.1 + 0.1 - 0.5) / 3 = 0.7 / 3; group 3: mean 0.1
  assert.equal(items.length, 5);
  close(items[0].advantage, 1.1 - 0.7 / 3);
  close(items[1].advantage, 0.1 - 0.7 / 3);
  close(items[2].advantage, -0.5 - 0.7 / 3);
  assert.deepEqual(items[0], { prompt_ref: p, completion_ref: c[0], completion_token_ids: [11, 12, 13], old_logprobs: [-0.1, -0.2, -0.3], advantage: items[0].advantage, finish_reason: 'stop' });
  assert.equal(items[1].old_logprobs, null);
  assert.deepEqual(items[1].completion_token_ids, [21, 22]);
  assert.deepEqual([items[2].completion_token_ids, items[2].old_logprobs, items[2].finish_reason], [null, null, null]);
  assert.deepEqual(items.slice(3).map((i) => [i.completion_token_ids, i.old_logprobs, i.advantage, i.finish_reason]), [
    [null, null, -0.1, 'length'],
    [[5, 6], null, 0.1, null],
  ]);
  assert.deepEqual(groupsToBatchItems([sampleGroups(p, c)[1]]), []);
});

test('groupsToBatchItems output is a GrpoBatch the learner accepts (through writeGrpoBatch)', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-grpo-')));
  const promptRef = await blobs.putJson([
    { role: 'system', content: [{ type: 'text', text: 'You are a browser agent.' }] },
    { role: 'user', content: [{ type: 'image', ref: ref('e', 'png') }, { type: 'text', text: 'Goal: click OK' }] },
  ]);
  const completions = [await blobs.put('<tool_call>click 1 2</tool_call>', 'txt'), await blobs.put('<tool_call>wait</tool_call>', 'txt'), await blobs.put('gibberish', 'txt')];
  const items = groupsToBatchItems(sampleGroups(promptRef, completions));
  const request: GrpoBatchRequest = { items }; // type-level: the items are what writeGrpoBatch takes
  const batchRef = await createLearnerBatchActivities(blobs).writeGrpoBatch(request);
  const stored = await blobs.getJson<GrpoBatch>(batchRef);
  const batch = GrpoBatchSchema.parse(stored);
  assert.equal(batch.items.length, 5);
  assert.equal(batch.items[2].completion, 'gibberish');
  assert.deepEqual(batch.items.map((i) => i.advantage), items.map((i) => i.advantage));
  // and each item, inlined by hand, passes the item schema directly
  for (const it of items) {
    const { prompt_ref: _p, completion_ref: _c, ...rest } = it;
    const inline = { ...rest, prompt: await blobs.getJson(it.prompt_ref), completion: (await blobs.get(it.completion_ref)).toString('utf8') };
    assert.equal(GrpoItemSchema.safeParse(inline).success, true);
  }
});
