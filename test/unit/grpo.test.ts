import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { ApplicationFailure } from '@temporalio/common';
import { createGrpoBatchActivities } from '../../activities/grpo-batch';
import { createLearnerBatchActivities, type GrpoBatchRequest } from '../../activities/learner-batches';
import type { Trajectory } from '../../lib/training/experience';
import { GrpoBatchSchema, GrpoItemSchema, type GrpoBatch } from '../../lib/training/learner-types';
import { chooseCandidate, episodeGroup, groupAdvantages, groupsToBatchItems, isZeroStdGroup, shouldWarnZeroStd, type BatchStepGroup } from '../../lib/training/grpo';

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
  for (const g of [
    [1, 0, 0.5],
    [0.1, 0.2, 0.6],
    [11.1, -0.5, 0.1, 0.1],
    [3, 7, -2, 0.25, 1e-3],
  ])
    close(sum(groupAdvantages(g)), 0, 1e-8);
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

/** A step group candidate: its completion (text and tokens by reference) and its reward. */
function cand(completionRef: string, tokensRef: string | null, valid: boolean, reward: number, finishReason: string | null = null): BatchStepGroup['candidates'][number] {
  const action = valid ? { type: 'wait' as const, seconds: 1 } : { type: 'invalid' as const, reason: 'no tool call', excerpt: '' };
  return { completion: { ref: completionRef, preview: '', ...(tokensRef ? { tokensRef } : {}), finishReason, action, valid }, reward };
}

function sampleGroups(promptRef: string, completions: string[], tokens: string[]): BatchStepGroup[] {
  return [
    {
      promptRef,
      step: 0,
      chosen: 0,
      candidates: [
        cand(completions[0], tokens[0], true, 1.1, 'stop'),
        cand(completions[1], tokens[1], true, 0.1),
        cand(completions[2], null, false, -0.5), // invalid: no tokens, kept
      ],
    },
    {
      promptRef,
      step: 1,
      chosen: 1,
      candidates: [cand(completions[0], tokens[0], true, 0.1), cand(completions[1], tokens[1], true, 0.1)],
    }, // zero std: skipped
    { promptRef, step: 2, chosen: 0, candidates: [cand(completions[0], tokens[0], true, 3)] }, // one: skipped
    {
      promptRef,
      step: 3,
      chosen: 1,
      candidates: [cand(completions[0], null, true, 0, 'length'), cand(completions[0], tokens[2], true, 0.2)],
    },
  ];
}

test('groupsToBatchItems: advantages per group, zero-std groups skipped, invalid candidates kept, tokens by reference', () => {
  const p = ref('a', 'json');
  const c = [ref('b', 'txt'), ref('c', 'txt'), ref('d', 'txt')];
  const t = [ref('1', 'json'), ref('2', 'json'), ref('3', 'json')];
  const items = groupsToBatchItems(sampleGroups(p, c, t));
  // group 0: mean (1.1 + 0.1 - 0.5) / 3 = 0.7 / 3; group 3: mean 0.1
  assert.equal(items.length, 5);
  close(items[0].advantage, 1.1 - 0.7 / 3);
  close(items[1].advantage, 0.1 - 0.7 / 3);
  close(items[2].advantage, -0.5 - 0.7 / 3);
  assert.deepEqual(items[0], { prompt_ref: p, completion_ref: c[0], tokens_ref: t[0], advantage: items[0].advantage, finish_reason: 'stop' });
  assert.deepEqual([items[1].tokens_ref, items[1].finish_reason], [t[1], null]);
  assert.deepEqual([items[2].tokens_ref, items[2].finish_reason], [null, null]);
  assert.deepEqual(
    items.slice(3).map((i) => [i.tokens_ref, i.advantage, i.finish_reason]),
    [
      [null, -0.1, 'length'],
      [t[2], 0.1, null],
    ],
  );
  for (const it of items) assert.equal('completion_token_ids' in it || 'old_logprobs' in it, false, 'no token arrays in a batch');
  assert.deepEqual(groupsToBatchItems([sampleGroups(p, c, t)[1]]), []);
});

test('groupsToBatchItems output is a GrpoBatch the learner accepts (through writeGrpoBatch)', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-grpo-')));
  const promptRef = await blobs.putJson([
    { role: 'system', content: [{ type: 'text', text: 'You are a browser agent.' }] },
    {
      role: 'user',
      content: [
        { type: 'image', ref: ref('e', 'png') },
        { type: 'text', text: 'Goal: click OK' },
      ],
    },
  ]);
  const completions = [await blobs.put('<tool_call>click 1 2</tool_call>', 'txt'), await blobs.put('<tool_call>wait</tool_call>', 'txt'), await blobs.put('gibberish', 'txt')];
  const tokens = [
    await blobs.putJson({ token_ids: [11, 12, 13], logprobs: [-0.1, -0.2, -0.3] }),
    await blobs.putJson({ token_ids: [21, 22], logprobs: null }),
    await blobs.putJson({ token_ids: [5, 6], logprobs: [-1, -2], grammar_ref: null }),
  ];
  const items = groupsToBatchItems(sampleGroups(promptRef, completions, tokens));
  const request: GrpoBatchRequest = { items }; // type-level: the items are what writeGrpoBatch takes
  const batchRef = await createLearnerBatchActivities(blobs).writeGrpoBatch(request);
  const stored = await blobs.getJson<GrpoBatch>(batchRef);
  const batch = GrpoBatchSchema.parse(stored);
  assert.equal(batch.items.length, 5);
  assert.equal(batch.items[2].completion, 'gibberish');
  assert.deepEqual(
    batch.items.map((i) => i.advantage),
    items.map((i) => i.advantage),
  );
  assert.deepEqual(
    batch.items.map((i) => i.tokens_ref),
    [tokens[0], tokens[1], null, null, tokens[2]],
  );
  // and each item, inlined by hand, passes the item schema directly
  for (const it of items) {
    const { prompt_ref: _p, completion_ref: _c, ...rest } = it;
    const inline = { ...rest, prompt: await blobs.getJson(it.prompt_ref), completion: (await blobs.get(it.completion_ref)).toString('utf8') };
    assert.equal(GrpoItemSchema.safeParse(inline).success, true);
  }
});

test('buildGrpoBatch reads trajectories through the experience contract: tokens by reference, a bad blob names its field', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-grpo-batch-')));
  const acts = createGrpoBatchActivities(blobs, createLearnerBatchActivities(blobs));
  const promptRef = await blobs.putJson([{ role: 'user', content: [{ type: 'text', text: 'Goal: click OK' }] }]);
  const tokensRef = await blobs.putJson({ token_ids: [7, 8], logprobs: [-0.5, -0.25], grammar_ref: null });
  const obs = { url: 'http://x/', step: 0, width: 160, height: 160, screenshotRef: ref('e', 'png'), axtreeRef: ref('f', 'txt'), stateKey: 's0' };
  const completionRef = await blobs.put('completion 1', 'txt');
  const step = (k: number, total: number, tokens: { tokensRef?: string }): Trajectory['steps'][number] => ({
    step: k,
    promptRef,
    observation: { ...obs, step: k - 1 },
    completion: { ref: completionRef, preview: 'completion 1', ...tokens, finishReason: 'stop', action: { type: 'wait', seconds: 1 }, valid: true },
    shaped: { total, terms: [] },
    reward: 0,
    done: false,
    after: { ...obs, step: k },
  });
  const trajectory = (i: number, steps: Trajectory['steps']): Trajectory => ({
    version: 2,
    workflowId: `ep${i}`,
    task: { env: 'miniwob', task: 'click-button', seed: 1 },
    policyModel: 'm',
    success: false,
    reward: 0,
    reason: null,
    goal: 'click OK',
    initial: { ...obs, goal: 'click OK' },
    steps,
  });
  // A version-1 trajectory (before the completion record): the step's completion flat, its text inline.
  const legacy = (i: number, tokens: { tokensRef?: string; tokenIds?: number[]; logprobs?: number[] }) => {
    const { completion: _c, ...rest } = step(1, 0, {});
    return {
      ...trajectory(i, []),
      version: 1,
      steps: [{ ...rest, completion: 'completion 1', ...tokens, action: { type: 'wait', seconds: 1 }, valid: true }],
    };
  };
  const refs = [
    await blobs.putJson(trajectory(0, [step(1, 1, { tokensRef })])),
    // Written before the tokens went by reference: inline ids (their log-probs do not pair) are stored as a blob here.
    await blobs.putJson(legacy(1, { tokenIds: [9, 10, 11], logprobs: [-1] })),
    await blobs.putJson(trajectory(2, [step(1, 0.5, {})])),
  ];
  const res = await acts.buildGrpoBatch({ run_id: 'r', iteration: 1, grouping: 'episode', trajectory_refs: refs, max_completion_len: 8 });
  const batch = GrpoBatchSchema.parse(await blobs.getJson(res.batch_ref));
  assert.deepEqual(
    batch.items.map((it) => it.advantage),
    [0.5, -0.5],
  );
  assert.equal(batch.items[0].tokens_ref, tokensRef);
  assert.deepEqual(await blobs.getJson(batch.items[1].tokens_ref!), { token_ids: [9, 10, 11], logprobs: null });
  assert.deepEqual(
    batch.items.map((it) => it.completion),
    ['completion 1', 'completion 1'],
    'the legacy inline text reaches the batch',
  );
  assert.equal(JSON.stringify(await blobs.getJson(res.batch_ref)).includes('token_ids'), false, 'the batch carries references, never token arrays');

  const broken = trajectory(3, [step(1, 0, {})]) as unknown as { steps: { shaped: { total: unknown } }[] };
  broken.steps[0].shaped.total = 'high';
  for (const [bad, re] of [
    [await blobs.putJson(broken), /steps\.0\.shaped\.total/],
    [await blobs.putJson(trajectory(4, [step(1, 0, { tokensRef: 'sha256:nope.json' })])), /steps\.0\.completion\.tokensRef: not a blob reference/],
    [await blobs.putJson(legacy(5, { tokensRef: 'sha256:nope.json' })), /steps\.0\.tokensRef: not a blob reference/],
    [ref('9', 'json'), /not found/],
  ] as const) {
    const err = await acts.buildGrpoBatch({ run_id: 'r', iteration: 2, grouping: 'episode', trajectory_refs: [refs[0], bad] }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.ok(err instanceof ApplicationFailure, String(err));
    assert.equal(err.nonRetryable, true);
    assert.match(err.message, re);
  }
});
