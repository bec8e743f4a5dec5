import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { AgentAction } from '../../lib/model-io/actions';
import { backpropagate, getNode, newTree } from '../../lib/search/mcts';
import { addChildren, describeSimulation, markEnded, NEUTRAL_PRIOR, recordActionError, recordShaped, shapedValue, type SearchCandidate } from '../../lib/search/search-tree';
import { testTimeSearchParams } from '../../lib/eval/eval-config';
import { parseConfig } from '../../lib/config/config';

const el = (id: number): AgentAction => ({ type: 'click_element', id });
const garbage: AgentAction = { type: 'invalid', reason: 'no action found', excerpt: 'hmm' };
const record = (action: AgentAction, preview: string) => ({ ref: `c-${preview}`, preview, finishReason: 'stop', action, valid: action.type !== 'invalid' });
const cand = (action: AgentAction, preview = 'p'): SearchCandidate => ({ completion: record(action, preview), refLogprob: -1.5 });

test('an expansion with a verdict: critic value and prompt on the node, children by prior, unparseable ones terminal', () => {
  const tree = newTree();
  const added = addChildren(tree, 0, 'prompt-0', [cand(el(1), 'a'), cand(garbage, 'b'), cand(el(3), 'c')], { priors: [0.2, 0.7, 0.5], value: 0.8, ok: false }, 2);
  // At most two children, the highest priors first: the unparseable one (0.7), then element 3 (0.5).
  assert.deepEqual(added, [1, 2]);
  const root = getNode(tree, 0);
  assert.equal(root.criticValue, 0.8);
  assert.equal(root.data.criticOk, false);
  assert.equal(root.data.promptRef, 'prompt-0');
  const [bad, good] = added.map((id) => getNode(tree, id));
  assert.deepEqual([bad.terminal, bad.reward, bad.data.outcome], [true, 0, 'unparseable']);
  assert.deepEqual([good.terminal, good.action, good.prior], [false, el(3), 0.5]);
  assert.deepEqual(good.data, { completion: record(el(3), 'c'), refLogprob: -1.5 });
});

test('an expansion without a critic: neutral priors, no critic value, previews clipped', () => {
  const tree = newTree();
  const long = 'x'.repeat(500);
  const added = addChildren(tree, 0, 'prompt-0', [cand(el(1), long), cand(el(2))], null, 5);
  assert.deepEqual(added, [1, 2]);
  assert.equal(getNode(tree, 0).criticValue, null);
  assert.equal(getNode(tree, 0).data.criticOk, undefined);
  assert.ok(added.every((id) => getNode(tree, id).prior === NEUTRAL_PRIOR));
  assert.ok(getNode(tree, 1).data.completion!.preview.length <= 120, 'preview clipped');
  // A missing prior (the critic ranked fewer candidates) counts as 0.
  const t2 = newTree();
  addChildren(t2, 0, 'p', [cand(el(1)), cand(el(2))], { priors: [0.9], value: 0.5, ok: true }, 5);
  assert.deepEqual([getNode(t2, 1).prior, getNode(t2, 2).prior], [0.9, 0]);
});

test('ended nodes and action errors are recorded on the node', () => {
  const tree = newTree();
  addChildren(tree, 0, 'p', [cand(el(1))], null, 1);
  markEnded(tree, 1, 1, 'success');
  recordActionError(tree, 1, 'e'.repeat(1000));
  const n = getNode(tree, 1);
  assert.deepEqual([n.terminal, n.reward, n.data.outcome], [true, 1, 'success']);
  assert.ok(n.data.actionError!.length <= 200 && n.data.actionError!.startsWith('eee'));
});

test('valueMode shaped: a success is worth 1, any other episode half its shaped return from the root over the scale', () => {
  const tree = newTree();
  addChildren(tree, 0, 'p', [cand(el(5)), cand(el(10))], null, 2);
  addChildren(tree, 1, 'p1', [cand(el(10)), cand(el(3)), cand(el(5))], null, 3);
  // Header (new page, 10.1), then Submit (success, 11.1), the goal text (0.1) or the header again (collapsed: a
  // new page too, 10.1); Submit first fails (-0.9).
  for (const [id, r] of [
    [1, 10.1],
    [2, -0.9],
    [3, 11.1],
    [4, 0.1],
    [5, 10.1],
  ] as const)
    recordShaped(tree, id, r);
  assert.equal(getNode(tree, 3).data.shaped, 11.1);
  const v = (id: number, success = false, more = 0) => shapedValue(tree, id, more, 20, success);
  assert.equal(v(3, true), 1);
  assert.equal(v(5), 0.5, 'two page changes: as much progress as the scale, still half a success');
  assert.ok(Math.abs(v(4) - (0.5 * 10.2) / 20) < 1e-12);
  assert.equal(v(2), 0, 'a negative return is worth 0');
  assert.equal(v(0), 0, 'the root earned nothing');
  // A rollout's rewards count after the node's own path.
  assert.ok(Math.abs(v(1, false, 4.9) - (0.5 * 15) / 20) < 1e-12);
  assert.equal(v(1, false, 100), 0.5);
  assert.ok(v(3, true) - v(5) >= 0.5 && v(5) > v(4) && v(4) > v(2), 'success, then progress, orders the siblings');
});

test('a test-time search never values by shaped return (it counts the task success): it rolls out', () => {
  const base = parseConfig({ mcts: { valueMode: 'shaped', shapedScale: 21 } });
  assert.equal(base.mcts.valueMode, 'shaped');
  assert.equal(testTimeSearchParams(base, { simulations: 4 }).valueMode, 'rollout');
  assert.equal(testTimeSearchParams(parseConfig({}), { simulations: 4 }).valueMode, 'rollout');
  assert.throws(() => parseConfig({ mcts: { shapedScale: 0 } }), /shapedScale/);
});

test('the simulation summary names the selected and evaluated nodes, the value and the tree', () => {
  const tree = newTree();
  addChildren(tree, 0, 'p', [cand(el(1)), cand(el(2))], null, 2);
  markEnded(tree, 1, 1, 'success');
  backpropagate(tree, 1, 1);
  const text = describeSimulation(tree, 0.5, { tag: 'sim 1/4', label: 'miniwob/click-button seed 3', leaf: 0, valuation: { node: 1, value: 1, how: 'terminal: success' } });
  const lines = text.split('\n');
  assert.equal(lines.length, 6);
  assert.equal(lines[0], 'sim 1/4 · miniwob/click-button seed 3');
  assert.match(lines[1], /^selected \[0\] root/);
  assert.match(lines[2], /^expanded: 2 children; evaluated \[1\] /);
  assert.equal(lines[3], 'value 1 (terminal: success), backed up over 2 nodes');
  assert.match(lines[4], /^root N=1 .* 3 nodes, depth 1, 1 terminal$/);
  assert.match(lines[5], /^best path: .* ✓$/);
  // The leaf valued itself (a terminal leaf backed up again): no expansion line.
  assert.equal(describeSimulation(tree, 0.5, { tag: 't', label: 'l', leaf: 1, valuation: { node: 1, value: 1, how: 'again' } }).split('\n').length, 5);
});
