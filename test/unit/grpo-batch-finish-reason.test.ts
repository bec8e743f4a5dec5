import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { createGrpoBatchActivities } from '../../activities/grpo-batch';
import { createLearnerBatchActivities } from '../../activities/learner-batches';
import { TrajectorySchema, type Completion, type StepGroup, type Trajectory, type TrajectoryInput } from '../../lib/training/experience';
import { GrpoBatchSchema } from '../../lib/training/learner-types';

// The sampler's finish reason (`length`: no end-of-turn token in the text) from the trajectory into the learner's
// batch, on every grouping: step groups' candidates, and the steps of episode and anchor groups. And anchor keys
// read from the pages' accessibility trees, so that typed text tells states apart.

const store = () => new BlobStore(mkdtempSync(join(tmpdir(), 'halo-finish-reason-')));
const MAIL = 'https://mail.example/compose';
const typed = (to: string) => `[1] button "Send" @(60,120)\n[2] textbox "To" value="${to}" @(400,40)`;

async function fixture() {
  const blobs = store();
  const acts = createGrpoBatchActivities(blobs, createLearnerBatchActivities(blobs));
  const promptRef = await blobs.putJson([{ role: 'user', content: [{ type: 'text', text: 'Goal: write to alice' }] }]);
  const trees = { empty: await blobs.put(typed(''), 'txt'), right: await blobs.put(typed('alice'), 'txt'), wrong: await blobs.put(typed('bob'), 'txt') };
  // Every page carries the same shaping key, as the real ones do: it sees the field only as empty or filled.
  const obs = (step: number, axtreeRef: string) => ({ url: MAIL, step, width: 160, height: 160, screenshotRef: 's', axtreeRef, stateKey: 'k' });
  // A completion as the sampler records it: the text by reference.
  const completion = async (text: string, finishReason: string | null, valid = true): Promise<Completion> => ({
    ref: await blobs.put(text, 'txt'),
    preview: text,
    finishReason,
    action: { type: 'wait', seconds: 1 },
    valid,
  });
  const step = async (k: number, total: number, from: string, finishReason?: string): Promise<Trajectory['steps'][number]> => ({
    step: k,
    promptRef,
    observation: obs(k - 1, from),
    completion: await completion(`completion ${k} ${total}`, finishReason ?? null),
    shaped: { total, terms: [] },
    reward: 0,
    done: false,
    after: obs(k, from),
  });
  const trajectory = async (i: number, steps: Promise<Trajectory['steps'][number]>[], groups?: StepGroup[]): Promise<Trajectory> => ({
    version: 2,
    workflowId: `ep${i}`,
    task: { env: 'real', task: 'gomail-1', seed: 1 },
    policyModel: 'm',
    ...(groups ? { groups } : {}),
    success: false,
    reward: 0,
    reason: null,
    goal: 'write to alice',
    initial: { ...obs(0, trees.empty), goal: 'write to alice' },
    steps: await Promise.all(steps),
  });
  return { blobs, acts, promptRef, trees, completion, step, trajectory };
}

test('step grouping: each candidate’s finish reason reaches the learner’s batch, with and without a signal', async () => {
  const { blobs, acts, promptRef, completion, step, trajectory, trees } = await fixture();
  const group = async (rewards: number[]): Promise<StepGroup> => ({
    promptRef,
    step: 1,
    chosen: 0,
    candidates: [
      { completion: await completion('a', 'stop'), reward: rewards[0] },
      { completion: await completion('{"action": "type", "text": "al', 'length', false), reward: rewards[1] },
      { completion: await completion('c', null), reward: rewards[2] }, // the sampler did not say
    ],
  });
  for (const [rewards, noSignal] of [
    [[1, -0.5, 0], false],
    [[0, 0, 0], true],
  ] as const) {
    const ref = await blobs.putJson(await trajectory(0, [step(1, 0, trees.empty)], [await group([...rewards])]));
    const res = await acts.buildGrpoBatch({ run_id: 'r', iteration: 1, grouping: 'step', trajectory_refs: [ref] });
    assert.equal(res.no_signal, noSignal);
    const batch = GrpoBatchSchema.parse(await blobs.getJson(res.batch_ref));
    assert.deepEqual(
      batch.items.map((it) => [it.completion, it.finish_reason]),
      [
        ['a', 'stop'],
        ['{"action": "type", "text": "al', 'length'],
        ['c', null],
      ],
    );
  }
});

test('anchor and episode grouping: each step’s finish reason reaches the learner’s batch', async () => {
  const { blobs, acts, step, trajectory, trees } = await fixture();
  const refs = [
    await blobs.putJson(await trajectory(0, [step(1, 0, trees.empty, 'stop'), step(2, 1, trees.right, 'length')])),
    await blobs.putJson(await trajectory(1, [step(1, 0, trees.empty, 'length'), step(2, 0, trees.wrong)])),
  ];
  for (const grouping of ['anchor', 'episode'] as const) {
    const res = await acts.buildGrpoBatch({ run_id: 'r', iteration: 1, grouping, trajectory_refs: refs });
    const batch = GrpoBatchSchema.parse(await blobs.getJson(res.batch_ref));
    assert.deepEqual(
      batch.items.map((it) => [it.completion, it.finish_reason]),
      [
        ['completion 1 0', 'stop'],
        ['completion 2 1', 'length'],
        ['completion 1 0', 'length'],
        ['completion 2 0', null],
      ],
      grouping,
    );
  }
});

test('anchor grouping keys the pages by their typed text: the right and the wrong recipient are two states', async () => {
  const { blobs, acts, step, trajectory, trees } = await fixture();
  // Rollouts 0 and 2 typed the right recipient, 1 the wrong one; all three recorded the same shaping key.
  const refs = [
    await blobs.putJson(await trajectory(0, [step(1, 0, trees.empty), step(2, 1, trees.right)])),
    await blobs.putJson(await trajectory(1, [step(1, 0, trees.empty), step(2, 0, trees.wrong)])),
    await blobs.putJson(await trajectory(2, [step(1, 0, trees.empty), step(2, 0.5, trees.right)])),
  ];
  const res = await acts.buildGrpoBatch({ run_id: 'r', iteration: 1, grouping: 'anchor', anchor: { episodeWeight: 0, stepWeight: 1, discount: 1 }, trajectory_refs: refs });
  // Groups: the empty form (3 first steps) and the right recipient (2 second steps); the wrong one stands alone.
  assert.deepEqual(res.anchor, { anchor_groups: 2, anchor_group_size_mean: 2.5, anchor_group_size_max: 3, step_signal_share: 0.833333333 }); // 5 of 6 steps, rounded to 1e-9
  const batch = GrpoBatchSchema.parse(await blobs.getJson(res.batch_ref));
  // Step terms: first steps G = [1, 0, 0.5] − 0.5; second steps of 0 and 2: G = [1, 0.5] − 0.75. Rollout 1's second step: 0, left out.
  assert.deepEqual(
    batch.items.map((it) => [it.completion, it.advantage]),
    [
      ['completion 1 0', 0.5],
      ['completion 2 1', 0.25],
      ['completion 1 0', -0.5],
      ['completion 2 0.5', -0.25],
    ],
  );

  const lost = await blobs.putJson(await trajectory(3, [step(1, 0, `sha256:${'9'.repeat(64)}.txt`)]));
  const err = await acts.buildGrpoBatch({ run_id: 'r', iteration: 2, grouping: 'anchor', trajectory_refs: [refs[0], lost] }).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(err instanceof ApplicationFailure, String(err));
  assert.equal(err.nonRetryable, true);
  assert.match(err.message, /anchor grouping needs the accessibility tree of step 1 of ep3: blob sha256:9+\.txt not found/);
});

test('recordTrajectory keeps the finish reason of each step and of each step group’s candidates', async () => {
  const blobs = store();
  const promptRef = await blobs.putJson([{ role: 'user', content: [{ type: 'text', text: 'x' }] }]);
  const initial = { goal: 'g', url: 'http://x/', step: 0, width: 160, height: 160, screenshotRef: 's', axtreeRef: 'a', stateKey: 'k0' };
  const invalid = { type: 'invalid' as const, reason: 'no tool call', excerpt: 'hm' };
  const shaped = { total: -0.1, terms: [] };
  const input: TrajectoryInput = {
    workflowId: 'wf',
    task: { env: 'miniwob', task: 'click-button', seed: 0 },
    policyModel: 'm',
    initial,
    groups: [
      {
        promptRef,
        step: 1,
        chosen: 0,
        candidates: [
          { completion: { ref: await blobs.put('hm', 'txt'), preview: 'hm', finishReason: 'length', action: invalid, valid: false }, reward: -0.1 },
          { completion: { ref: await blobs.put('ok', 'txt'), preview: 'ok', finishReason: 'stop', action: { type: 'wait', seconds: 1 }, valid: true }, reward: 0.1 },
        ],
      },
    ],
    steps: [
      { step: 1, promptRef, completion: { preview: 'hm', finishReason: 'length', action: invalid, valid: false }, shaped },
      { step: 2, promptRef, completion: { preview: 'hm', finishReason: null, action: invalid, valid: false }, shaped }, // the sampler did not say
    ],
    success: false,
    reward: 0,
    reason: null,
  };
  const t = TrajectorySchema.parse(await blobs.getJson(await createControlActivities(blobs).recordTrajectory(input)));
  assert.deepEqual(
    t.steps.map((s) => s.completion.finishReason),
    ['length', null],
  );
  assert.deepEqual(
    t.groups?.[0].candidates.map((c) => c.completion.finishReason),
    ['length', 'stop'],
  );
});
