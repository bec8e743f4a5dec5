import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createGrpoBatchActivities } from '../../activities/grpo-batch';
import type { LearnerBatchActivities } from '../../activities/learner-batches';
import { asCompletion, isCompletion, PREVIEW_CHARS, UNRECORDED_ACTION, leanCompletion } from '../../lib/training/completion';
import { createControlActivities } from '../../activities/control';
import { clip } from '../../lib/model-io/actions';
import { CompletionSchema, TrajectorySchema, type Completion } from '../../lib/training/experience';
import { readTrajectory } from '../../lib/training/stored-trajectory';

// The one reader of older shapes (lib/training/completion.ts, lib/training/stored-trajectory.ts): every shape a sampled
// completion was ever stored or recorded in becomes today's record, and a version-1 trajectory today's version 2.

const click = { type: 'click_element', id: 5 } as const;
const REF = `sha256:${'a'.repeat(64)}.txt`;
const TOKENS = `sha256:${'b'.repeat(64)}.json`;

test('a completion record passes through the reader unchanged', () => {
  const c: Completion = { ref: REF, preview: 'click', tokensRef: TOKENS, finishReason: 'stop', logprobSum: -1.5, action: click, valid: true };
  assert.equal(isCompletion(c), true);
  assert.equal(asCompletion(c), c);
  assert.equal(CompletionSchema.safeParse(c).success, true);
});

test('the served sampler’s flat candidate of older histories becomes a record', () => {
  const flat = { action: click, preview: 'click', completionRef: REF, finishReason: 'length', tokensRef: TOKENS, logprobSum: -2 };
  assert.equal(isCompletion(flat), false);
  assert.deepEqual(asCompletion(flat), { ref: REF, preview: 'click', tokensRef: TOKENS, finishReason: 'length', logprobSum: -2, action: click, valid: true });
});

test('an old colocated candidate: its inline text is kept whole as the preview, its inline log-probs as their sum', () => {
  const text = 'x'.repeat(PREVIEW_CHARS * 2);
  const c = asCompletion({
    action: { type: 'invalid', reason: 'no tool call', excerpt: 'x' } as never,
    preview: text.slice(0, 10),
    completion: text,
    tokenIds: [1, 2],
    logprobs: [-0.5, -0.25],
  });
  assert.equal(c.ref, undefined);
  assert.equal(c.preview, text, 'no blob holds this text: the record must');
  assert.equal(c.logprobSum, -0.75);
  assert.equal(c.valid, false);
  assert.equal(c.finishReason, null);
  assert.equal('tokenIds' in c, false, 'no legacy field in the live record');
});

test('a text with a blob keeps only its first characters in the record', () => {
  const text = 'y'.repeat(PREVIEW_CHARS + 50);
  const c = asCompletion({ action: click, completion: text, completionRef: REF, valid: true });
  assert.equal(c.ref, REF);
  assert.equal(c.preview.length <= PREVIEW_CHARS + 1, true);
});

test('an old group candidate (validity and reward only, no action) keeps its validity', () => {
  const c = asCompletion({ completionRef: REF, valid: true, finishReason: 'stop' });
  assert.deepEqual(c.action, UNRECORDED_ACTION);
  assert.equal(c.valid, true);
});

const obs = (step: number) => ({ goal: 'g', url: 'http://x/', step, width: 160, height: 160, screenshotRef: `s${step}`, axtreeRef: `a${step}`, stateKey: `k${step}` });
const v1 = () => ({
  version: 1,
  workflowId: 'wf-old',
  task: { env: 'miniwob', task: 'click-test', seed: 3 },
  policyModel: 'm',
  goal: 'g',
  success: true,
  reward: 1,
  reason: null,
  initial: obs(0),
  groups: [
    {
      promptRef: 'p1',
      step: 1,
      chosen: 0,
      candidates: [
        { completionRef: REF, tokenIds: [7, 8, 9], logprobs: [-1, -1, -1], finishReason: 'stop', valid: true, reward: 1 },
        { completion: 'oops', valid: false, reward: -0.1 },
      ],
    },
  ],
  steps: [
    {
      step: 1,
      promptRef: 'p1',
      observation: obs(0),
      completion: 'the whole text',
      completionRef: REF,
      tokenIds: [7, 8, 9],
      logprobs: [-1, -1, -1],
      finishReason: 'stop',
      action: click,
      valid: true,
      shaped: { total: 1, terms: [] },
      reward: 1,
      done: true,
      after: obs(1),
    },
  ],
});

test('a version-1 trajectory reads as version 2, its inline tokens stored as a blob that holds them', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-stored-')));
  const read = await readTrajectory(v1(), (t) => blobs.putJson(t));
  assert.equal(read.success, true);
  const t = read.success ? read.data : assert.fail();
  assert.equal(TrajectorySchema.safeParse(t).success, true, 'the upgraded trajectory is today’s shape');
  assert.equal(t.version, 2);
  const step = t.steps[0].completion;
  assert.equal(step.ref, REF);
  assert.equal(step.preview, 'the whole text');
  assert.equal(step.finishReason, 'stop');
  assert.deepEqual(await blobs.getJson(step.tokensRef!), { token_ids: [7, 8, 9], logprobs: [-1, -1, -1] });
  const [a, b] = t.groups![0].candidates;
  assert.equal(a.completion.tokensRef, step.tokensRef, 'the same tokens, the same blob');
  assert.equal(a.reward, 1);
  assert.deepEqual(
    { ref: b.completion.ref, preview: b.completion.preview, valid: b.completion.valid, reward: b.reward },
    { ref: undefined, preview: 'oops', valid: false, reward: -0.1 },
  );
});

test('a damaged trajectory of either version fails with the field named', async () => {
  const bad1 = v1() as Record<string, unknown>;
  (bad1.steps as Record<string, unknown>[])[0].valid = 'yes';
  const r1 = await readTrajectory(bad1, null);
  assert.equal(r1.success, false);
  assert.match(JSON.stringify(r1.success ? null : r1.error.issues), /valid/);
  const r2 = await readTrajectory({ version: 2, steps: 'none' }, null);
  assert.equal(r2.success, false);
  assert.match(JSON.stringify(r2.success ? null : r2.error.issues), /steps/);
});

test('the GRPO batch builder trains on a version-1 blob as on today’s: text and tokens by reference', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-stored-batch-')));
  const written: unknown[] = [];
  const batches = {
    writeGrpoBatch: async (b: unknown) => {
      written.push(b);
      return `sha256:${'c'.repeat(64)}.json`;
    },
  } as unknown as LearnerBatchActivities;
  const ref = await blobs.putJson(v1());
  const out = await createGrpoBatchActivities(blobs, batches).buildGrpoBatch({ run_id: 'r', iteration: 1, grouping: 'step', trajectory_refs: [ref] });
  assert.equal(out.items, 2);
  const items = (written[0] as { items: { completion_ref: string; tokens_ref: string | null; finish_reason: string | null; advantage: number }[] }).items;
  assert.equal(items[0].completion_ref, REF);
  assert.deepEqual(await blobs.getJson(items[0].tokens_ref!), { token_ids: [7, 8, 9], logprobs: [-1, -1, -1] });
  assert.equal(items[0].finish_reason, 'stop');
  // The inline text of the second candidate was stored: the learner reads it by reference.
  assert.equal((await blobs.get(items[1].completion_ref)).toString('utf8'), 'oops');
  assert.equal(items[1].tokens_ref, null);
  assert.ok(items[0].advantage > 0 && items[1].advantage < 0);
});

test('recordTrajectory takes records sent lean (no preview where a blob holds the text, no action where the result does) and restores them', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-stored-lean-')));
  const text = `<tool_call>${'z'.repeat(PREVIEW_CHARS)}</tool_call>`;
  const ref = await blobs.put(text, 'txt');
  const record: Completion = { ref, preview: text.slice(0, PREVIEW_CHARS), finishReason: 'stop', action: click, valid: true };
  const lean = leanCompletion(record);
  assert.equal('preview' in lean, false);
  assert.deepEqual(lean.action, click, 'a candidate whose action no result holds keeps it');
  assert.equal(leanCompletion({ ...record, ref: undefined }).preview, record.preview, 'no blob: the preview is the text and stays');
  const ran = { type: 'click_element', id: 6 } as const;
  const resultRef = await blobs.putJson({ action: ran, reward: 1, done: true, observation: obs(1), breakdown: { total: 1, terms: [] } });
  assert.equal('action' in leanCompletion(record, true), false);
  const out = await createControlActivities(blobs).recordTrajectory({
    workflowId: 'wf',
    task: { env: 'miniwob', task: 'click-test', seed: 1 },
    policyModel: 'm',
    initial: obs(0),
    steps: [
      { step: 1, promptRef: 'p', completion: lean, shaped: { total: 0, terms: [] } },
      { step: 2, promptRef: 'p', completion: leanCompletion(record, true), resultRef },
    ],
    groups: [{ promptRef: 'p', step: 1, chosen: 0, candidates: [{ completion: lean, reward: 1 }] }],
    success: false,
    reward: 0,
    reason: null,
  });
  const t = TrajectorySchema.parse(await blobs.getJson(out));
  assert.equal(t.steps[0].completion.preview, clip(text, PREVIEW_CHARS));
  assert.deepEqual(t.steps[1].completion.action, ran, 'the action the environment ran, from the result blob');
  assert.deepEqual(t.groups![0].candidates[0].completion, { ...record, preview: clip(text, PREVIEW_CHARS) });
});
