import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { createLearnerBatchActivities } from '../../activities/learner-batches';
import { createMctsStoreActivities } from '../../activities/mcts-store';
import type { Action } from '../../lib/model-io/actions';
import { MctsPairSchema, SampledTokensSchema, TrajectorySchema, type Completion, type ObservationRef, type TrajectoryInput } from '../../lib/training/experience';
import { DpoBatchSchema } from '../../lib/training/learner-types';
import { backpropagate, expand, newTree, type NodeData } from '../../lib/search/mcts';
import { snapshotChunks } from '../../lib/search/mcts-search';
import { snapshotManifest } from '../helpers/mcts-snapshot';

// The experience contract (lib/training/experience.ts) at the places that write and read it: the trajectory blob, the
// sampler's token blobs, and the DPO pairs of a search.

const store = () => new BlobStore(mkdtempSync(join(tmpdir(), 'halo-experience-')));
const el = (id: number): Action => ({ type: 'click_element', id });

test('the sampler’s tokens: non-empty ids, one log-prob per id or none', () => {
  assert.deepEqual(SampledTokensSchema.parse({ token_ids: [1, 2] }), { token_ids: [1, 2], logprobs: null, grammar_ref: null, prompt_ref: null });
  assert.equal(SampledTokensSchema.safeParse({ token_ids: [1, 2], logprobs: [-1, -2], grammar_ref: null }).success, true);
  // An unknown log-prob (vLLM's -9999 placeholder) is null at its position, never a number.
  assert.equal(SampledTokensSchema.safeParse({ token_ids: [1, 2], logprobs: [-1, null] }).success, true);
  assert.equal(SampledTokensSchema.safeParse({ token_ids: [1, 2], prompt_ref: 'not-a-ref' }).success, false);
  const bad = SampledTokensSchema.safeParse({ token_ids: [1, 2], logprobs: [-1] });
  assert.equal(bad.success, false);
  assert.match(bad.error!.issues[0].message, /logprobs has 1 entries but token_ids has 2/);
  assert.equal(SampledTokensSchema.safeParse({ token_ids: [] }).success, false);
});

test('recordTrajectory writes a Trajectory with the tokens by reference, inline ones stored as a blob', async () => {
  const blobs = store();
  const tokensRef = await blobs.putJson({ token_ids: [3, 4], logprobs: [-0.5, -0.5], grammar_ref: null });
  const initial: ObservationRef = { goal: 'click OK', url: 'http://x/', step: 0, width: 160, height: 160, screenshotRef: 's', axtreeRef: 'a', stateKey: 'k0' };
  const invalid = { type: 'invalid' as const, reason: 'no tool call', excerpt: 'hm' };
  const shaped = { total: -0.1, terms: [{ term: 'invalid_action', value: -0.1 }] };
  const promptRef = await blobs.putJson([{ role: 'user', content: [{ type: 'text', text: 'x' }] }]);
  const input: TrajectoryInput = {
    workflowId: 'wf',
    task: { env: 'miniwob', task: 'click-button', seed: 0 },
    policyModel: 'm',
    initial,
    steps: [
      { step: 1, promptRef, completion: { preview: 'hm', tokensRef, finishReason: null, action: invalid, valid: false }, shaped },
      // An episode recorded before the sampler stored its tokens (and before the completion record): the step arrives
      // flat, its tokens inline (log-probs that do not pair dropped).
      { step: 2, promptRef, completion: 'hm', tokenIds: [5, 6, 7], logprobs: [-1], action: invalid, shaped } as unknown as TrajectoryInput['steps'][number],
      { step: 3, promptRef, completion: { preview: 'hm', finishReason: null, action: invalid, valid: false }, shaped },
    ],
    success: false,
    reward: 0,
    reason: null,
  };
  const ref = await createControlActivities(blobs).recordTrajectory(input);
  const raw = await blobs.getJson<Record<string, unknown>>(ref);
  const t = TrajectorySchema.parse(raw);
  assert.equal(t.steps[0].completion.tokensRef, tokensRef);
  assert.deepEqual(await blobs.getJson(t.steps[1].completion.tokensRef!), { token_ids: [5, 6, 7], logprobs: null });
  assert.equal(t.steps[2].completion.tokensRef, undefined);
  assert.equal(JSON.stringify(raw).includes('tokenIds'), false, 'no token arrays in a new trajectory');
  assert.deepEqual(
    t.steps.map((s) => s.observation.stateKey),
    ['k0', 'k0', 'k0'],
  );
});

test('a search’s DPO pairs carry the sampler’s token references of both completions into the learner’s batch', async () => {
  const blobs = store();
  const acts = createMctsStoreActivities(blobs, createLearnerBatchActivities(blobs));
  const tree = newTree();
  tree.nodes[0].data = { promptRef: await blobs.putJson([{ role: 'user', content: [{ type: 'text', text: 'Goal: click OK' }] }]) };
  const tokens = [await blobs.putJson({ token_ids: [1], logprobs: [-1] }), await blobs.putJson({ token_ids: [2, 3], logprobs: null })];
  const sampled = async (text: string, action: Action, tokensRef: string): Promise<Completion> => ({
    ref: await blobs.put(text, 'txt'),
    preview: text,
    tokensRef,
    finishReason: 'stop',
    action,
    valid: true,
  });
  const ids = expand(
    tree,
    0,
    [
      { action: el(1), prior: 0.9, data: { completion: await sampled('click 1', el(1), tokens[0]) } },
      { action: el(2), prior: 0.5, data: { completion: await sampled('click 2', el(2), tokens[1]) } },
      // A node from a tree stored before nodes kept their tokens (and before the completion record: its parts flat).
      { action: el(3), prior: 0.1, data: { completionRef: await blobs.put('click 3', 'txt'), preview: 'click 3' } as unknown as NodeData },
    ],
    3,
  );
  // Composite Q (α 0.5, the prior as the critic's part): 0.95, 0.25, 0.15.
  backpropagate(tree, ids[0], 1);
  backpropagate(tree, ids[1], 0);
  backpropagate(tree, ids[2], 0.2);
  const manifest = snapshotManifest(tree, await Promise.all(snapshotChunks(tree).map((c) => blobs.putJson(c))));
  const summary = await acts.collectMctsPairs({ snapshot_ref: await blobs.putJson(manifest) });
  const pairs = MctsPairSchema.array().parse(await blobs.getJson(summary.ref!));
  const byNodes = new Map(pairs.map((p) => [`${p.chosen}>${p.rejected}`, p]));
  assert.deepEqual([...byNodes.keys()].sort(), [`${ids[0]}>${ids[1]}`, `${ids[0]}>${ids[2]}`, `${ids[1]}>${ids[2]}`].sort());
  const pair = byNodes.get(`${ids[0]}>${ids[1]}`)!;
  assert.deepEqual([pair.chosen_tokens_ref, pair.rejected_tokens_ref], tokens);

  const { batch_ref } = await acts.writeMctsDpoBatch({ pairs_refs: [summary.ref!] });
  const batch = DpoBatchSchema.parse(await blobs.getJson(batch_ref));
  const refsOf = (chosen: string, rejected: string) => {
    const p = batch.pairs.find((q) => q.chosen === chosen && q.rejected === rejected)!;
    return [p.chosen_tokens_ref, p.rejected_tokens_ref];
  };
  assert.deepEqual(refsOf('click 1', 'click 2'), tokens);
  assert.deepEqual(refsOf('click 1', 'click 3'), [tokens[0], null]);
  assert.deepEqual(refsOf('click 2', 'click 3'), [tokens[1], null]);

  // A pair blob that breaks the contract fails the batch for good, naming the field.
  const broken = await blobs.putJson([{ ...pairs[0], delta_q: 'large' }]);
  const err = await acts.writeMctsDpoBatch({ pairs_refs: [broken] }).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(err instanceof ApplicationFailure, String(err));
  assert.equal(err.nonRetryable, true);
  assert.match(err.message, /0\.delta_q/);
});
