import { test } from 'node:test';
import assert from 'node:assert/strict';
import { renderTree } from '../../client/commands/mcts';
import { expand, newTree, treeStats, type Tree } from '../../lib/search/mcts';
import type { MctsTreeView } from '../../lib/search/mcts-search';
import { boundTree, TREE_QUERY_BYTES } from '../../lib/search/tree-query';
import { TEMPORAL_LIMITS } from '../../lib/config/history-budget';

const ref = (s: string) => `sha256:${s.padStart(64, '0')}`;

/** A tree as a search grows it, with the references and previews a real node carries (~1 KB a node). */
function searchTree(nodes: number, k: number): Tree {
  const tree = newTree({ screenshotRef: ref('root'), axtreeRef: ref('rootax'), url: 'http://127.0.0.1/miniwob/click-button.html', stateKey: 'root' });
  for (let at = 0; tree.nodes.length < nodes; at++) {
    const want = Math.min(k, nodes - tree.nodes.length);
    expand(
      tree,
      at,
      Array.from({ length: want }, (_, i) => ({
        action: { type: 'click' as const, x: i * 10, y: at % 1000, button: 'left' as const, count: 1 },
        prior: 1 / (i + 1),
        proposals: 1,
        data: {
          completionRef: ref(`c${at}-${i}`),
          tokensRef: ref(`t${at}-${i}`),
          promptRef: ref(`p${at}`),
          refLogprob: -3.25,
          preview: `{"action":"click","x":${i * 10},"y":${at % 1000}}`,
        },
      })),
      k,
    );
    tree.nodes[at].observationRef = { screenshotRef: ref(`s${at}`), axtreeRef: ref(`a${at}`), url: 'http://127.0.0.1/miniwob/click-button.html', stateKey: `k${at}` };
  }
  return tree;
}

test('a small tree is returned whole, without a note', () => {
  const tree = searchTree(40, 5);
  const shown = boundTree(tree);
  assert.equal(shown.tree, tree);
  assert.equal(shown.note, undefined);
});

// The schema's maxima (10,000 simulations × 32 children): the config now refuses a search whose history would not
// fit (lib/config/search-budget.ts), but the query's bound must hold for any tree, so it is tried on the largest.
test("a tree of the schema's maxima (numSimulations × maxChildren nodes) gives a tree query result under the payload limit", () => {
  const m = { numSimulations: 10_000, maxChildren: 32 };
  const full = searchTree(m.numSimulations * m.maxChildren + 1, m.maxChildren);
  const fullBytes = JSON.stringify(full).length;
  assert.ok(fullBytes > 4 * TEMPORAL_LIMITS.payloadBytes, `the whole tree is ${fullBytes} bytes`);
  const { tree, note } = boundTree(full);
  const bytes = JSON.stringify(tree).length;
  assert.ok(bytes <= TREE_QUERY_BYTES, `${bytes} bytes shown`);
  assert.ok(tree.nodes.length > 500, `${tree.nodes.length} nodes shown`);
  // A tree rooted at 0: ids are indexes, every parent shown, every child listed is shown.
  tree.nodes.forEach((n, i) => {
    assert.equal(n.id, i);
    if (n.parent !== null) assert.ok(n.parent < tree.nodes.length && tree.nodes[n.parent].children.includes(i));
    for (const c of n.children) assert.ok(c < tree.nodes.length);
  });
  assert.equal(tree.nextId, tree.nodes.length);
  assert.equal(treeStats(tree).nodes, tree.nodes.length);
  // The search's own tree is untouched (the query must not change workflow state).
  assert.equal(full.nodes.length, m.numSimulations * m.maxChildren + 1);
  assert.equal(full.nodes[0].children.length, m.maxChildren);
  assert.match(note ?? '', new RegExp(`first ${tree.nodes.length} of ${full.nodes.length} nodes .* query result limit`));

  const view: MctsTreeView = {
    workflowId: 'run-it1-click-button',
    phase: 'simulation 9000',
    simulations: 9000,
    numSimulations: m.numSimulations,
    stats: treeStats(full),
    runs: 900,
    runId: 'run',
    iteration: 1,
    task: { env: 'miniwob', task: 'click-button', seed: 1 },
    goal: 'Click the button.',
    alpha: 0.5,
    pairThreshold: 0.1,
    tree,
    treeNote: note,
    bestPath: null,
    pairs: 0,
    counters: null,
  };
  assert.ok(JSON.stringify(view).length < TEMPORAL_LIMITS.payloadBytes);
  const text = renderTree(view);
  assert.match(text, /note: the tree query shows the first \d+ of 320001 nodes/);
  assert.match(text, /320001 nodes/, 'the header counts the whole tree');
});
