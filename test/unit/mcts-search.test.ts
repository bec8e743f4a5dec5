import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createLearnerBatchActivities } from '../../activities/learner-batches';
import { createMctsStoreActivities } from '../../activities/mcts-store';
import type { Action, AgentAction } from '../../lib/model-io/actions';
import { parseConfig } from '../../lib/config/config';
import { loadConfigFile } from '../../host/config-file';
import { backpropagate, expand, markTerminal, newTree, select, setCriticValue, type Tree } from '../../lib/search/mcts';
import { parseAction } from '../../lib/model-io/parse';
import { TrainingMetricsSchema } from '../../lib/training/run-metrics';
import { mctsIterationMetrics } from '../../lib/training/training-metrics';
import { renderTree } from '../../client/commands/mcts';
import {
  asTreeAction,
  bestPathView,
  collectPairs,
  criticText,
  emptyCounters,
  distinctActions,
  historyOf,
  isInvalidNode,
  proposedActions,
  joinSnapshot,
  snapshotChunks,
  meanAbsDeltaQ,
  pairsSummary,
  refLogprob,
  rootDecision,
  searchSeed,
  searchWorkflowId,
  type MctsSnapshotChunk,
  type MctsTreeView,
} from '../../lib/search/mcts-search';
import { mctsParams } from '../../lib/search/mcts-params';
import { samplingPolicy } from '../../lib/serving/iteration-policy';
import { snapshotManifest } from '../helpers/mcts-snapshot';

const el = (id: number): Action => ({ type: 'click_element', id });
const ref = (c: string, ext = 'txt') => `sha256:${c.repeat(64)}.${ext}`;
const close = (a: number, b: number) => assert.ok(Math.abs(a - b) < 1e-12, `expected ${b}, got ${a}`);
const record = (r: string, action: AgentAction, preview = 'p') => ({ ref: r, preview, finishReason: 'stop', action, valid: action.type !== 'invalid' });

test('refLogprob: the sampler sum only at temperature 1 for completions that stopped on their own', () => {
  close(refLogprob([-0.5, -1.25, -0.25], 1, 'stop')!, -2);
  assert.equal(refLogprob([-0.5], 0.7, 'stop'), null, 'temperature-scaled log-probs are not the learner’s');
  assert.equal(refLogprob([-0.5], 1, 'length'), null, 'the learner appends an end-of-turn token the sampler never produced');
  assert.equal(refLogprob([], 1, 'stop'), null);
  assert.equal(refLogprob(undefined, 1, 'stop'), null);
  assert.equal(refLogprob([-Infinity], 1, 'stop'), null);
  // The sampler's sum, as the learner and the openai path now send it (tokens stored as blobs).
  close(refLogprob(-2, 1, 'stop')!, -2);
  assert.equal(refLogprob(-2, 0.7, 'stop'), null);
});

/** Root with three children: a valid click and two unparseable outputs, as the workflow builds them. */
function searchTree(): { tree: Tree; ids: number[] } {
  const tree = newTree();
  tree.nodes[0].data = { promptRef: ref('p', 'json') };
  const garbage1 = parseAction('lorem ipsum');
  const garbage2 = parseAction('{"nothing": 1}');
  assert.equal(garbage1.type, 'invalid');
  assert.equal(garbage2.type, 'invalid');
  const ids = expand(
    tree,
    0,
    [
      { action: asTreeAction(garbage1), prior: 0.5 },
      { action: el(3), prior: 1 },
      { action: asTreeAction(garbage2), prior: 0 },
      { action: asTreeAction(parseAction('lorem ipsum')), prior: 0.9 }, // the same output again: merged
    ],
    5,
  );
  assert.equal(ids.length, 3, 'equal unparseable outputs are merged like equal actions');
  const [a, b, c] = ids; // by prior: click 1, garbage1 0.5 (0.9 of its duplicate wins), garbage2 0
  assert.deepEqual(tree.nodes[a].action, el(3));
  tree.nodes[a].data = { completion: record(ref('a'), el(3)), refLogprob: -3 };
  tree.nodes[b].data = { completion: record(ref('b'), asTreeAction(garbage1)), refLogprob: -7 };
  tree.nodes[c].data = { completion: record(ref('c'), asTreeAction(garbage2)), refLogprob: null };
  for (const id of [b, c]) markTerminal(tree, id, 0);
  return { tree, ids };
}

/** A copy of the tree with node `id`'s data replaced. */
function withData(tree: Tree, id: number, data: Tree['nodes'][number]['data']): Tree {
  const copy: Tree = structuredClone(tree);
  copy.nodes[id].data = data;
  return copy;
}

test('unparseable candidates: terminal children with reward 0; selection visits them without a browser; pairs form', () => {
  const { tree, ids } = searchTree();
  const [a, b, c] = ids;
  assert.equal(isInvalidNode(tree, a), false);
  assert.ok(isInvalidNode(tree, b) && isInvalidNode(tree, c));
  assert.equal(tree.nodes[b].prior, 0.9, 'the merged duplicate kept the higher prior');
  // Simulation 1 evaluated the click (value 1); the next selections reach the terminal children in prior order.
  backpropagate(tree, a, 1);
  assert.equal(select(tree, 1.414, 0.5), b);
  backpropagate(tree, b, 0);
  assert.equal(select(tree, 1.414, 0.5), c);
  backpropagate(tree, c, 0);
  // α = 0.5: a = 0.5·1 + 0.5·1 = 1; b = 0 + 0.5·0.9 = 0.45; c = 0.
  const pairs = collectPairs(tree, 0.5, 0.1);
  assert.deepEqual(
    pairs.map((p) => [p.chosen, p.rejected, p.ref_chosen_logprob, p.ref_rejected_logprob]),
    [
      [a, c, null, null], // c has no logged log-prob: neither side carries one
      [a, b, -3, -7],
      [b, c, null, null],
    ],
  );
  close(pairs[0].delta_q, 1);
  close(pairs[1].delta_q, 0.55);
  for (const p of pairs) {
    assert.equal(p.prompt_ref, ref('p', 'json'));
    assert.equal(p.parent, 0);
  }
  close(meanAbsDeltaQ(pairs)!, (1 + 0.55 + 0.45) / 3);
  assert.equal(meanAbsDeltaQ([]), null);
  // A pair whose texts or prompt are unknown is left out.
  assert.equal(collectPairs(withData(tree, 0, {}), 0.5, 0.1).length, 0);
  assert.deepEqual(
    collectPairs(withData(tree, b, {}), 0.5, 0.1).map((p) => [p.chosen, p.rejected]),
    [[a, c]],
  );
});

test('best path view: success only at a terminal node with reward 1', () => {
  const { tree, ids } = searchTree();
  const [a] = ids;
  backpropagate(tree, a, 1);
  backpropagate(tree, a, 1);
  let v = bestPathView(tree, 0.5);
  assert.deepEqual(v.nodeIds, [a]);
  assert.deepEqual(v.actions, ['click element [3]']);
  assert.equal(v.success, false, 'not terminal yet');
  markTerminal(tree, a, 1);
  v = bestPathView(tree, 0.5);
  assert.equal(v.success, true);
  assert.deepEqual(bestPathView(newTree(), 0.5), { nodeIds: [], actions: [], success: false, terminal: false, reward: null });
});

test('root decision: the first action of the best path with its completion and the root prompt', () => {
  const { tree, ids } = searchTree();
  const [a, b] = ids;
  assert.equal(rootDecision(newTree(), 0.5), null, 'no children: no decision');
  assert.equal(rootDecision(withData(tree, 0, {}), 0.5), null, 'a root without its prompt cannot be played');
  // Unvisited children tie at 0 visits: the higher composite Q (its prior) wins, the valid click.
  assert.deepEqual(rootDecision(tree, 0.5), { nodeId: a, action: el(3), completion: record(ref('a'), el(3)), promptRef: ref('p', 'json'), visits: 0, q: 0.5 });
  // Most visits decide, even against a higher Q: what the search explored most is what it plays.
  backpropagate(tree, b, 0);
  backpropagate(tree, b, 0);
  backpropagate(tree, a, 1);
  const d = rootDecision(tree, 0.5)!;
  assert.equal(d.nodeId, b);
  assert.equal(d.action.type, 'invalid');
  assert.equal(d.visits, 2);
});

test('merged candidates: the first of each action, counted, the most proposed first (ties in sampling order)', () => {
  const cands = [el(1), el(2), el(2), el(3), el(2), el(3), el(4)].map((action, i) => ({ completion: { action: action as AgentAction, preview: `c${i}` } }));
  assert.deepEqual(
    distinctActions(cands).map((c) => c.completion.preview),
    ['c0', 'c1', 'c3', 'c6'],
  );
  assert.deepEqual(
    proposedActions(cands).map((c) => [c.completion.preview, c.proposals]),
    [
      ['c1', 3],
      ['c3', 2],
      ['c0', 1],
      ['c6', 1],
    ],
  );
  assert.deepEqual(proposedActions([]), []);
});

test('prompt history and critic texts', () => {
  const path: Action[] = [el(1), { type: 'type', text: 'hello', id: 2 }, el(3)];
  assert.deepEqual(historyOf(path, 2), [
    { step: 2, action: 'type "hello" into [2]' },
    { step: 3, action: 'click element [3]' },
  ]);
  assert.deepEqual(historyOf(path, 0), []);
  assert.equal(criticText(el(4), 'whatever'), 'click element [4]');
  const bad: AgentAction = parseAction('I would click\nsomething');
  assert.match(criticText(bad, 'I would click\nsomething'), /^\(unparseable output, .*\) "I would click something"$/);
});

test('search ids and seeds are deterministic', () => {
  assert.equal(searchWorkflowId('mcts-local', 3, 'click-button'), 'mcts-local-it3-click-button');
  assert.equal(searchSeed('r', 1, 'click-button'), searchSeed('r', 1, 'click-button'));
  assert.notEqual(searchSeed('r', 1, 'click-button'), searchSeed('r', 2, 'click-button'));
  assert.ok(searchSeed('r', 1, 'x') >= 0 && searchSeed('r', 1, 'x') < 100_000);
  // A task's further searches (mcts.searchesPerTask) get ids and seeds of their own; the first keeps the old ones.
  assert.equal(searchSeed('r', 1, 'x', 0), searchSeed('r', 1, 'x'));
  assert.equal(searchWorkflowId('mcts-local', 3, 'click-button', 0), 'mcts-local-it3-click-button');
  assert.equal(searchWorkflowId('mcts-local', 3, 'click-button', 1), 'mcts-local-it3-click-button-2');
  const seeds = new Set([0, 1, 2, 3].map((r) => searchSeed('r', 1, 'x', r)));
  assert.equal(seeds.size, 4);
});

test('config: the mcts section, its defaults, the critic switch and the shipped configs', () => {
  const c = parseConfig({});
  assert.equal(c.mcts.numSimulations, 50);
  assert.equal(c.mcts.ucbConstant, 1.414);
  assert.equal(c.mcts.maxChildren, 5);
  assert.equal(c.mcts.valueMode, 'rollout');
  assert.equal(c.mcts.critic.backend, 'openai');
  const p = mctsParams(c);
  assert.equal(p.critic?.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.equal(mctsParams(parseConfig({ mcts: { critic: { backend: 'none' } } })).critic, null);
  assert.throws(() => parseConfig({ mcts: { valueMode: 'critic', critic: { backend: 'none' } } }), /mcts\.valueMode: valueMode critic needs a critic/);
  assert.throws(() => parseConfig({ mcts: { tasks: ['a', 'a'] } }), /mcts\.tasks/);
  assert.throws(
    () => parseConfig({ mcts: { maxChildren: 0, alpha: 2 } }),
    (err: Error) => /mcts\.maxChildren/.test(err.message) && /mcts\.alpha/.test(err.message),
  );
  const local = loadConfigFile(join(__dirname, '..', '..', 'configs', 'mcts-default.yaml'));
  assert.equal(local.policy.backend, 'colocated');
  assert.equal(local.mcts.critic.backend, 'none');
  // The local job: every candidate a valid action, each run once, evaluated greedily on seeds no search uses.
  assert.equal(local.policy.constrained, true);
  assert.ok(local.mcts.numSimulations >= local.mcts.maxChildren);
  assert.ok(local.mcts.evalEvery > 0);
  assert.ok(local.mcts.evalSeeds.every((s) => s >= 100_000));
  const real = loadConfigFile(join(__dirname, '..', '..', 'configs', 'mcts-real.yaml'));
  assert.equal(real.episode.env, 'real');
  assert.equal(real.mcts.critic.backend, 'openai');
  // The iteration's policy: the served adapter after the first update (openai + vLLM), else the config's model.
  const iterationModel = (cfg: typeof real, runId: string, adapterVersion: number) =>
    samplingPolicy({ policy: cfg.policy, runId, adapterVersion, serving: cfg.mcts.vllmBaseUrl ? { baseUrl: cfg.mcts.vllmBaseUrl } : undefined }).policy.model;
  assert.equal(iterationModel(real, 'mcts-real', 0), 'Qwen/Qwen3-VL-8B-Instruct');
  assert.equal(iterationModel(real, 'mcts-real', 2), 'mcts-real-v2');
  assert.equal(iterationModel(local, 'mcts-local', 2), 'tiny-random');
});

test('iteration metrics fit the metrics line schema', () => {
  const { tree, ids } = searchTree();
  backpropagate(tree, ids[0], 1);
  backpropagate(tree, ids[1], 0);
  backpropagate(tree, ids[2], 0);
  markTerminal(tree, ids[0], 1);
  const pairs = collectPairs(tree, 0.5, 0.1);
  const counters = { ...emptyCounters(), candidates: 4, invalidCandidates: 2, criticCalls: 1 };
  const search = {
    simulations: 3,
    stats: { nodes: 4, maxDepth: 1, totalVisits: 3, leaves: 3, terminalNodes: 3 },
    bestPath: bestPathView(tree, 0.5),
    pairs: pairsSummary(pairs, 'sha256:x'),
    counters,
  };
  const m = mctsIterationMetrics({
    searches: [search, { ...search, bestPath: { ...search.bestPath, success: false, reward: 0 }, pairs: pairsSummary([], null) }],
    update: { loss: 0.69, reward_margin: 0.1, accuracy: 0.5, grad_norm: 2 },
    adapterVersion: 1,
    seconds: { search: 3 },
  });
  assert.equal(TrainingMetricsSchema.safeParse(m).success, true);
  assert.equal(m.algorithm, 'mcts');
  assert.equal(m.num_episodes, 2);
  assert.equal(m.mcts.simulations, 6);
  assert.equal(m.success_rate, 0.5);
  assert.equal(m.mean_return, 0.5); // best paths ending in rewards 1 and 0
  assert.equal(m.mcts.pairs, pairs.length);
  close(m.mcts.mean_abs_delta_q!, meanAbsDeltaQ(pairs)!);
  assert.equal(m.mcts.pairs_with_ref_logprobs, 1);
  assert.equal(m.mcts.invalid_candidates, 4);
  assert.deepEqual([m.loss, m.grad_norm, m.adapter_version, m.mcts.update_skipped], [0.69, 2, 1, false]);
  const skipped = mctsIterationMetrics({ searches: [], update: null, adapterVersion: 0, seconds: {} });
  assert.equal(TrainingMetricsSchema.safeParse(skipped).success, true);
  assert.deepEqual([skipped.mcts.update_skipped, skipped.loss, skipped.adapter_version, skipped.mcts.mean_abs_delta_q, skipped.success_rate], [true, null, null, null, 0]);
});

test('halo mcts tree: text rendering marks the best path and terminal outcomes', () => {
  const { tree, ids } = searchTree();
  const [a, b] = ids;
  setCriticValue(tree, 0, 0.7);
  backpropagate(tree, a, 1);
  backpropagate(tree, b, 0);
  tree.nodes[b].data.outcome = 'unparseable';
  const view: MctsTreeView = {
    workflowId: 'r-it1-click-button',
    phase: 'done',
    simulations: 2,
    numSimulations: 2,
    stats: { nodes: 4, maxDepth: 1, totalVisits: 2, leaves: 3, terminalNodes: 2 },
    runs: 1,
    runId: 'r',
    iteration: 1,
    task: { env: 'miniwob', task: 'click-button', seed: 1 },
    goal: 'Click on the "ok" button.',
    alpha: 0.5,
    pairThreshold: 0.1,
    tree,
    bestPath: bestPathView(tree, 0.5),
    pairs: 1,
    counters: emptyCounters(),
  };
  const text = renderTree(view);
  assert.match(text, /^r-it1-click-button · miniwob\/click-button seed 1 · 2\/2 simulations · 4 nodes/);
  assert.match(text, /\[0\] root {2}N=2 .* critic=0\.70/);
  assert.match(text, new RegExp(`├─ ★ \\[${a}\\] click element \\[3\\] {2}N=1 Q=1\\.000`));
  assert.match(text, new RegExp(`\\[${b}\\] invalid: .* terminal r=0 \\(unparseable\\)`));
  assert.match(renderTree(view, 2), /… 2 more nodes/);
  assert.match(renderTree({ ...view, tree: null, phase: 'loading snapshot' }), /\(loading snapshot\)$/);
});

test('tree snapshots: chunks of nodes that join back to the same tree; a gap or a wrong count is an error', () => {
  const { tree } = searchTree();
  for (let i = 0; i < 3; i++) expand(tree, 1, [{ action: el(10 + i), prior: 1 - i / 4, data: { completion: record(`r${i}`, el(10 + i), `p${i}`) } }], 5);
  assert.equal(tree.nodes.length, 7);
  const chunks = snapshotChunks(tree, 3);
  assert.deepEqual(
    chunks.map((c) => [c.from, c.nodes.length]),
    [
      [0, 3],
      [3, 3],
      [6, 1],
    ],
  );
  const back = joinSnapshot({ nodeCount: 7, nextId: 7 }, JSON.parse(JSON.stringify(chunks)));
  assert.deepEqual(back, JSON.parse(JSON.stringify(tree)));
  assert.equal(back.nodes[6].data.completion?.preview, 'p2', 'node data travels with its node');
  assert.throws(() => joinSnapshot({ nodeCount: 7, nextId: 7 }, [chunks[0], chunks[2]]), /does not follow/);
  assert.throws(() => joinSnapshot({ nodeCount: 8, nextId: 8 }, chunks), /inconsistent/);
  assert.deepEqual(
    snapshotChunks(newTree()).map((c) => c.nodes.length),
    [1],
  );
});

test("tree snapshots written before node data moved into the nodes: their meta arrays become the nodes' data", () => {
  const { tree } = searchTree();
  // The old format: nodes without data, their data in a parallel `meta` array per chunk.
  const legacy: MctsSnapshotChunk[] = snapshotChunks(tree, 2).map((c) => ({
    from: c.from,
    nodes: c.nodes.map(({ data: _, ...n }) => n as Tree['nodes'][number]),
    meta: c.nodes.map((n) => n.data),
  }));
  const back = joinSnapshot({ nodeCount: tree.nodes.length, nextId: tree.nextId }, JSON.parse(JSON.stringify(legacy)));
  assert.deepEqual(back, JSON.parse(JSON.stringify(tree)));
  assert.deepEqual(collectPairs(back, 0.5, 0), collectPairs(tree, 0.5, 0));
  legacy[1].meta!.pop();
  assert.throws(() => joinSnapshot({ nodeCount: tree.nodes.length, nextId: tree.nextId }, legacy), /does not follow/);
});

test('tree snapshots written before the completion record: the flat completionRef / preview / tokensRef become the node’s record', () => {
  const { tree, ids } = searchTree();
  const [a] = ids;
  const tokens = ref('d', 'json');
  tree.nodes[a].data.completion = { ...tree.nodes[a].data.completion!, tokensRef: tokens };
  tree.nodes[0].data.promptRef = ref('p', 'json');
  backpropagate(tree, ids[0], 1);
  backpropagate(tree, ids[1], 0);
  const flat: MctsSnapshotChunk[] = snapshotChunks(tree, 2).map((c) => ({
    from: c.from,
    nodes: c.nodes.map(({ data: { completion, ...data }, ...n }) => ({
      ...n,
      data: {
        ...data,
        ...(completion ? { completionRef: completion.ref, preview: completion.preview, ...(completion.tokensRef ? { tokensRef: completion.tokensRef } : {}) } : {}),
      } as Tree['nodes'][number]['data'],
    })),
  }));
  const back = joinSnapshot({ nodeCount: tree.nodes.length, nextId: tree.nextId }, JSON.parse(JSON.stringify(flat)));
  assert.ok(
    back.nodes.every((n) => !('completionRef' in n.data) && !('preview' in n.data) && !('tokensRef' in n.data)),
    'no flat field left',
  );
  // Old trees kept no finish reason: the record says it is unknown.
  assert.deepEqual(back.nodes[a].data.completion, { ...tree.nodes[a].data.completion!, finishReason: null });
  assert.deepEqual(collectPairs(back, 0.5, 0), collectPairs(tree, 0.5, 0));
  assert.ok(collectPairs(back, 0.5, 0).length > 0 && collectPairs(back, 0.5, 0).every((p) => p.chosen_tokens_ref === tokens));
});

test('collectMctsPairs and writeMctsDpoBatch: pairs from a stored tree, one learner batch from the pair blobs', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-mcts-pairs-')));
  const acts = createMctsStoreActivities(blobs, createLearnerBatchActivities(blobs));
  const { tree, ids } = searchTree();
  // Real blobs behind the references: the prompt and the three completions.
  tree.nodes[0].data.promptRef = await blobs.putJson([{ role: 'user', content: [{ type: 'text', text: 'Goal: click OK' }] }]);
  for (const [i, id] of ids.entries()) tree.nodes[id].data.completion = { ...tree.nodes[id].data.completion!, ref: await blobs.put(`completion ${i}`, 'txt') };
  backpropagate(tree, ids[0], 1);
  backpropagate(tree, ids[1], 0);
  backpropagate(tree, ids[2], 0);
  const chunks = await Promise.all(snapshotChunks(tree, 2).map((c) => blobs.putJson(c)));
  const manifest = snapshotManifest(tree, chunks);
  const snapshotRef = await blobs.putJson(manifest);
  const summary = await acts.collectMctsPairs({ snapshot_ref: snapshotRef });
  const expected = collectPairs(tree, 0.5, 0.1);
  assert.equal(summary.count, 3);
  assert.equal(summary.withRefLogprobs, 1);
  close(summary.meanAbsDeltaQ!, meanAbsDeltaQ(expected)!);
  assert.deepEqual(await blobs.getJson(summary.ref!), expected);
  // The batch: both searches' pairs (the same blob twice here), texts and prompt resolved inline.
  const { batch_ref, pairs } = await acts.writeMctsDpoBatch({ pairs_refs: [summary.ref!, summary.ref!] });
  assert.equal(pairs, 6);
  const batch = await blobs.getJson<{ pairs: { prompt: unknown; chosen: string; rejected: string; ref_chosen_logprob: number | null }[] }>(batch_ref);
  assert.equal(batch.pairs.length, 6);
  assert.equal(batch.pairs[0].chosen, 'completion 0');
  assert.deepEqual(
    batch.pairs.map((p) => p.ref_chosen_logprob),
    [null, -3, null, null, -3, null],
  );
  // A tree snapshot that is not one fails for good, naming the reference.
  await assert.rejects(acts.collectMctsPairs({ snapshot_ref: tree.nodes[0].data.promptRef! }), /not an MCTS tree snapshot/);
});
