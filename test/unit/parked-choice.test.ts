import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Action } from '../../lib/model-io/actions';
import { expand, newTree, type Tree } from '../../lib/search/mcts';
import { chooseParked, chooseSpare, nodeAtPath, parkedMaxAgeMs } from '../../lib/search/parked-choice';

const el = (id: number): Action => ({ type: 'click_element', id });

/** root 0 → 1 (el 1), 2 (el 2); 1 → 3 (el 3); 3 → 4 (el 4); 4 → 5 (el 5). */
function chain(): Tree {
  const tree = newTree();
  expand(
    tree,
    0,
    [
      { action: el(1), prior: 0.9 },
      { action: el(2), prior: 0.1 },
    ],
    5,
  );
  expand(tree, 1, [{ action: el(3), prior: 1 }], 5);
  expand(tree, 3, [{ action: el(4), prior: 1 }], 5);
  expand(tree, 4, [{ action: el(5), prior: 1 }], 5);
  return tree;
}

const opts = { maxAdvance: 2, canReset: true };

test('a session exactly at the node wins over ancestors and resets', () => {
  const tree = chain();
  assert.deepEqual(chooseParked(tree, [{ node: 1 }, { node: 3 }, { node: null }], 3, opts), { kind: 'exact', index: 1 });
});

test('an ancestor at most maxAdvance actions up is stepped forward; the closest one wins', () => {
  const tree = chain();
  assert.deepEqual(chooseParked(tree, [{ node: 0 }, { node: 1 }], 4, opts), { kind: 'advance', index: 1, actions: [el(3), el(4)] });
  assert.deepEqual(chooseParked(tree, [{ node: 1 }, { node: 3 }], 4, opts), { kind: 'advance', index: 1, actions: [el(4)] });
  // Among equally close ones, the most recently used (last).
  assert.deepEqual(chooseParked(tree, [{ node: 3 }, { node: 3 }], 4, opts), { kind: 'advance', index: 1, actions: [el(4)] });
});

test('too far up, on another branch or past the tree: the least recently used (at no node first) is reset in place', () => {
  const tree = chain();
  assert.deepEqual(chooseParked(tree, [{ node: null }, { node: 0 }], 5, opts), { kind: 'reset', index: 0 });
  assert.deepEqual(chooseParked(tree, [{ node: 2 }, { node: 4 }], 3, opts), { kind: 'reset', index: 0 });
  // One at no node goes first: the others may still be hit exactly.
  assert.deepEqual(chooseParked(tree, [{ node: 2 }, { node: null }], 3, opts), { kind: 'reset', index: 1 });
  // A descendant of the target is no use either.
  assert.deepEqual(chooseParked(tree, [{ node: 4 }], 1, opts), { kind: 'reset', index: 0 });
});

test('nothing parked, or no in-place reset: none', () => {
  const tree = chain();
  assert.deepEqual(chooseParked(tree, [], 0, opts), { kind: 'none' });
  assert.deepEqual(chooseParked(tree, [{ node: 2 }], 3, { maxAdvance: 2, canReset: false }), { kind: 'none' });
  assert.deepEqual(chooseParked(tree, [{ node: 1 }], 3, { maxAdvance: 2, canReset: false }), { kind: 'advance', index: 0, actions: [el(3)] });
});

test('nodeAtPath finds the node of an action path, null once the path leaves the tree', () => {
  const tree = chain();
  assert.equal(nodeAtPath(tree, []), 0);
  assert.equal(nodeAtPath(tree, [el(1), el(3)]), 3);
  assert.equal(nodeAtPath(tree, [el(2)]), 2);
  assert.equal(nodeAtPath(tree, [el(2), el(3)]), null);
  assert.equal(nodeAtPath(tree, [el(1), el(3), el(4), el(5), el(6)]), null);
});

test('a spare goes to the target from an idle session (at no node first), never twice, never from a busy one', () => {
  const spot = (node: number | null, busy = false) => ({ node, busy });
  assert.equal(chooseSpare([spot(1), spot(null), spot(null)], 3), 1);
  assert.equal(chooseSpare([spot(1), spot(2)], 3), 0);
  assert.equal(chooseSpare([spot(null, true), spot(2)], 3), 1);
  // One is there already, or on its way: no second spare.
  assert.equal(chooseSpare([spot(null), spot(3, true)], 3), -1);
  assert.equal(chooseSpare([spot(null), spot(3)], 3), -1);
  assert.equal(chooseSpare([spot(null, true)], 3), -1);
  assert.equal(chooseSpare([], 3), -1);
});

test('parked sessions are used as they are for half the MiniWoB++ time limit; official limits: resets only', () => {
  assert.equal(parkedMaxAgeMs('miniwob', undefined), 500_000);
  assert.equal(parkedMaxAgeMs('miniwob', 'raised'), 500_000);
  assert.equal(parkedMaxAgeMs('miniwob', 60_000), 30_000);
  assert.equal(parkedMaxAgeMs('miniwob', 'official'), 0);
  assert.equal(parkedMaxAgeMs('real', undefined), Infinity);
});
