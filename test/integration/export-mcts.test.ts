import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { BlobStore } from '../../blob/store';
import { exportRun, type MctsNodeExportRecord, type MctsPairExportRecord, type MctsSearchExportRecord } from '../../client/commands/export';
import { startOrAttachMcts } from '../../client/commands/mcts';
import { parseConfig } from '../../lib/config/config';
import type { MctsPair, MctsSearchResult } from '../../lib/search/mcts-search';
import { startFakeCriticServer, type FakeCriticServer } from '../../testing/fake-critic-server';
import { startTestStack, type TestStack } from '../../testing/stack';

// `halo export` of a finished local MCTS run (trainMcts: one iteration, one small search of the colocated
// tiny-random policy on click-button, a fake critic so siblings differ): searches, trees and DPO pairs as JSONL.
let stack: TestStack;
let critic: FakeCriticServer;
let out: string;
before(async () => {
  [stack, critic] = await Promise.all([startTestStack({ browserWorkers: 1, learner: true }), startFakeCriticServer({ kind: 'prefer', substring: 'click', value: 0.7 })]);
  out = mkdtempSync(join(tmpdir(), 'halo-export-mcts-'));
});
after(async () => {
  await stack?.stop();
  await critic?.close();
  if (out) rmSync(out, { recursive: true, force: true });
});

const read = (file: string) =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l)
    .map((l) => JSON.parse(l));

test('halo export of an MCTS run: searches, tree nodes and DPO pairs as JSONL with provenance', async () => {
  const runId = 'export-mcts';
  const cfg = parseConfig({
    temporal: { address: stack.address, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    stack: { home: stack.home },
    policy: { backend: 'colocated', model: 'tiny-random', maxTokens: 24, timeoutMs: 60_000 },
    episode: { env: 'miniwob', sessionStartTimeoutMs: 10_000 },
    train: { gpuTaskQueue: stack.gpuQueue },
    mcts: {
      runId,
      iterations: 1,
      tasks: ['click-button'],
      numSimulations: 4,
      maxChildren: 3,
      maxDepth: 2,
      continueAsNewEvery: 2,
      critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic', timeoutMs: 5_000 },
      learningRate: 1e-3,
    },
  });
  const { handle } = await startOrAttachMcts(stack.client, cfg);
  await handle.result();
  const searchId = `${runId}-it1-click-button`;
  const search = (await stack.client.workflow.getHandle(searchId).result()) as MctsSearchResult;

  const blobs = new BlobStore(join(stack.home, 'blobs'));
  const res = await exportRun(stack.client, blobs, runId, out);
  assert.deepEqual(res.skipped, []);
  const rel = res.files.map((f) => relative(out, f)).sort();
  assert.deepEqual(rel, ['mcts/export-mcts/dpo-pairs.jsonl', 'mcts/export-mcts/searches.jsonl', 'mcts/export-mcts/trees/click-button__it1.jsonl']);

  // One record per search, with its provenance.
  const searches = read(join(out, 'mcts/export-mcts/searches.jsonl')) as MctsSearchExportRecord[];
  assert.equal(searches.length, 1);
  const s = searches[0];
  assert.equal(s.type, 'search');
  assert.equal(s.run, runId);
  assert.equal(s.iteration, 1);
  assert.equal(s.searchWorkflowId, searchId);
  assert.equal(s.env, 'miniwob');
  assert.equal(s.task, 'click-button');
  assert.equal(s.seed, search.task.seed);
  assert.equal(s.adapterVersion, 0, 'iteration 1 searches with the base model');
  assert.equal(s.model, 'tiny-random');
  assert.equal(s.policyBackend, 'colocated');
  assert.match(s.configHash ?? '', /^[0-9a-f]{16}$/);
  assert.equal(s.simulations, 4);
  assert.equal(s.snapshotRef, search.snapshotRef);
  assert.equal(s.pairsRef, search.pairs.ref);
  assert.equal(s.pairs, search.pairs.count);
  assert.deepEqual(s.stats, search.stats);
  assert.deepEqual(s.bestPath, search.bestPath);

  // The tree: provenance first, then one record per node in id order.
  const tree = read(join(out, 'mcts/export-mcts/trees/click-button__it1.jsonl'));
  assert.equal(tree[0].type, 'search');
  assert.deepEqual(tree[0], s);
  const nodes = tree.slice(1) as MctsNodeExportRecord[];
  assert.equal(nodes.length, search.stats.nodes);
  nodes.forEach((n, i) => {
    assert.equal(n.type, 'node');
    assert.equal(n.run, runId);
    assert.equal(n.iteration, 1);
    assert.equal(n.searchWorkflowId, searchId);
    assert.equal(n.adapterVersion, 0);
    assert.equal(n.nodeId, i);
    assert.equal(typeof n.q, 'number');
  });
  assert.equal(nodes[0].parent, null);
  assert.equal(nodes[0].visits, 4, 'every simulation passes through the root');
  assert.ok(nodes[0].promptRef, 'the root was expanded: its prompt is referenced');
  assert.ok(nodes[0].screenshotRef && existsSync(nodes[0].screenshot!), "the root's screenshot is a file of the blob store");
  for (const n of nodes.slice(1)) {
    assert.equal(nodes[n.parent!].children.includes(n.nodeId), true);
    assert.ok(n.completionRef, 'every child names the completion that proposed it');
  }

  // DPO pairs: the search's pair blob, each with provenance and its node ids.
  const pairs = read(join(out, 'mcts/export-mcts/dpo-pairs.jsonl')) as MctsPairExportRecord[];
  const stored = search.pairs.ref ? await blobs.getJson<MctsPair[]>(search.pairs.ref) : [];
  assert.equal(pairs.length, stored.length);
  assert.ok(pairs.length > 0, 'the critic separates siblings: the search formed pairs');
  pairs.forEach((p, i) => {
    assert.equal(p.type, 'dpo_pair');
    assert.equal(p.run, runId);
    assert.equal(p.iteration, 1);
    assert.equal(p.searchWorkflowId, searchId);
    assert.equal(p.adapterVersion, 0, 'sampled from the base model');
    assert.equal(p.pairsRef, search.pairs.ref);
    assert.equal(p.parentNodeId, stored[i].parent);
    assert.equal(p.chosenNodeId, stored[i].chosen);
    assert.equal(p.rejectedNodeId, stored[i].rejected);
    assert.equal(p.promptRef, stored[i].prompt_ref);
    assert.equal(p.chosenRef, stored[i].chosen_ref);
    assert.equal(p.rejectedRef, stored[i].rejected_ref);
    assert.equal(p.deltaQ, stored[i].delta_q);
    assert.equal(typeof p.chosenText, 'string', 'the completions are read from their blobs');
    assert.equal(typeof p.rejectedText, 'string');
    assert.equal(nodes[p.chosenNodeId].completionRef, p.chosenRef);
    assert.equal(nodes[p.rejectedNodeId].completionRef, p.rejectedRef);
  });
});
