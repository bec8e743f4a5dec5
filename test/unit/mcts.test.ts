import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Action } from '../../lib/model-io/actions';
import { parseConfig } from '../../lib/config/config';
import {
  actionPath,
  backpropagate,
  bestPath,
  compositeQ,
  dpoPairs,
  expand,
  getNode,
  markTerminal,
  newTree,
  qMcts,
  select,
  setCriticValue,
  setObservation,
  treeStats,
  ucb1,
  type MctsNode,
  type Tree,
} from '../../lib/search/mcts';

const click = (x: number, y: number): Action => ({ type: 'click', x, y, button: 'left', count: 1 });
const el = (id: number): Action => ({ type: 'click_element', id });
const obs = (n: number) => ({ screenshotRef: `sha256:${'a'.repeat(64)}.png`, axtreeRef: `sha256:${'b'.repeat(64)}.txt`, url: `http://x/${n}`, stateKey: `s${n}` });

function node(partial: Partial<MctsNode>): MctsNode {
  return {
    id: 1,
    parent: 0,
    action: el(1),
    actionKey: null,
    depth: 1,
    visits: 0,
    valueSum: 0,
    prior: 0,
    criticValue: null,
    terminal: false,
    reward: null,
    children: [],
    data: {},
    ...partial,
  };
}

/** The search parameters' defaults, from the config schema. */
const defaults = parseConfig({}).mcts;

const close = (actual: number, expected: number, eps = 1e-12) => assert.ok(Math.abs(actual - expected) <= eps, `expected ${expected}, got ${actual}`);

/** Sets visit statistics directly (as if that many backpropagations had happened below). */
function setStats(tree: Tree, id: number, visits: number, valueSum: number): void {
  tree.nodes[id].visits = visits;
  tree.nodes[id].valueSum = valueSum;
}

test('qMcts and compositeQ (hand-computed)', () => {
  // Q_mcts = 3/4 = 0.75; Q_critic = prior 0.25 (no critic value yet); α = 0.5: 0.5·0.75 + 0.5·0.25 = 0.5
  const a = node({ visits: 4, valueSum: 3, prior: 0.25 });
  assert.equal(qMcts(a), 0.75);
  close(compositeQ(a, 0.5), 0.5);
  // With a critic value of 0.9 it replaces the prior; α = 0.3: 0.3·0.75 + 0.7·0.9 = 0.225 + 0.63 = 0.855
  close(compositeQ({ ...a, criticValue: 0.9 }, 0.3), 0.855);
  // Unvisited: Q_mcts = 0; prior 0.6, α = 0.5: 0 + 0.5·0.6 = 0.3
  const b = node({ prior: 0.6 });
  assert.equal(qMcts(b), 0);
  close(compositeQ(b, 0.5), 0.3);
  // α = 1 is pure search, α = 0 pure critic.
  assert.equal(compositeQ(a, 1), 0.75);
  assert.equal(compositeQ(a, 0), 0.25);
});

test('ucb1 (hand-computed)', () => {
  // child: 2 visits, valueSum 1 → Q_mcts 0.5; prior 1 → compositeQ(0.5) = 0.25 + 0.5 = 0.75
  // parent N = 4, c = 1.414: 1.414·sqrt(ln 4 / 2) = 1.414·sqrt(0.693147) = 1.414·0.832555 = 1.1772322
  const child = node({ visits: 2, valueSum: 1, prior: 1 });
  close(ucb1(child, 4, 1.414, 0.5), 1.9272322201769845);
  // N = 1: ln 1 = 0, no exploration bonus: UCB = compositeQ
  close(ucb1(child, 1, 1.414, 0.5), 0.75);
  // c = 0: pure exploitation
  close(ucb1(child, 100, 0, 0.5), 0.75);
  // unvisited: infinite
  assert.equal(ucb1(node({ prior: 0.1 }), 4, 1.414, 0.5), Infinity);
});

test('selection: unvisited children by prior, then lowest id; then UCB1 (hand-computed)', () => {
  const t = newTree(obs(0));
  assert.equal(select(t, 1.414, 0.5), 0, 'a fresh tree selects its root');
  // Candidates out of prior order: new ids follow the prior order (highest first).
  const ids = expand(
    t,
    0,
    [
      { action: el(3), prior: 0 },
      { action: el(1), prior: 1 },
      { action: el(2), prior: 0.5 },
    ],
    5,
  );
  assert.deepEqual(ids, [1, 2, 3]);
  const [A, B, C] = ids;
  assert.deepEqual(
    [A, B, C].map((id) => t.nodes[id].prior),
    [1, 0.5, 0],
  );

  assert.equal(select(t, 1.414, 0.5), A, 'unvisited, highest prior');
  backpropagate(t, A, 0);
  assert.equal(select(t, 1.414, 0.5), B, 'A is visited now; B is the unvisited one with the higher prior');
  backpropagate(t, B, 1);
  assert.equal(select(t, 1.414, 0.5), C);
  backpropagate(t, C, 0);

  // Root N = 3; every child has n = 1; bonus = 1.414·sqrt(ln 3 / 1) = 1.414·1.048147 = 1.4820800
  // A: Q_mcts 0, prior 1   → 0.5·0 + 0.5·1   = 0.5  → 1.9820800
  // B: Q_mcts 1, prior 0.5 → 0.5·1 + 0.5·0.5 = 0.75 → 2.2320800  ← max
  // C: Q_mcts 0, prior 0   → 0                     → 1.4820800
  close(ucb1(t.nodes[A], 3, 1.414, 0.5), 0.5 + 1.482079962591042);
  close(ucb1(t.nodes[B], 3, 1.414, 0.5), 0.75 + 1.482079962591042);
  close(ucb1(t.nodes[C], 3, 1.414, 0.5), 1.482079962591042);
  assert.equal(select(t, 1.414, 0.5), B);

  // With α = 1 (search only) and c = 0: A 0, B 1, C 0 → still B. With α = 0 (critic only), c = 0: A (prior 1).
  assert.equal(select(t, 0, 1), B);
  assert.equal(select(t, 0, 0), A);

  // Expanding B: selection now descends through B to B's best unvisited child.
  const [B1, B2] = expand(
    t,
    B,
    [
      { action: el(7), prior: 0.5 },
      { action: el(8), prior: 0.5 },
    ],
    5,
  );
  assert.equal(select(t, 1.414, 0.5), B1, 'equal priors: lowest id first');
  backpropagate(t, B1, 1);
  // Root N = 4. bonus(n=1) = 1.414·sqrt(ln 4) = 1.414·1.177410 = 1.6648577; bonus(n=2) = 1.1772322
  // A: n 1, Q_mcts 0,       prior 1   → 0.5  + 1.6648577 = 2.1648577  ← max
  // B: n 2, Q_mcts 2/2 = 1, prior 0.5 → 0.75 + 1.1772322 = 1.9272322
  // C: n 1, Q_mcts 0,       prior 0   → 0    + 1.6648577 = 1.6648577
  close(ucb1(t.nodes[A], 4, 1.414, 0.5), 0.5 + 1.414 * Math.sqrt(Math.log(4)));
  close(ucb1(t.nodes[B], 4, 1.414, 0.5), 1.9272322201769845);
  assert.equal(select(t, 1.414, 0.5), A);
  // With c = 0 (exploitation only) B wins (0.75 vs 0.5), and inside B the unvisited B2 comes first.
  assert.equal(select(t, 0, 0.5), B2);
  assert.deepEqual(actionPath(t, B2), [el(2), el(8)]);
  assert.deepEqual(actionPath(t, 0), []);
});

test('selection stops at a terminal node; terminal nodes are never expanded', () => {
  const t = newTree();
  const [A] = expand(t, 0, [{ action: { type: 'answer', text: 'done' }, prior: 1 }], 5);
  markTerminal(t, A, 1);
  assert.equal(select(t, 1.414, 0.5), A);
  assert.deepEqual(expand(t, A, [{ action: el(1), prior: 1 }], 5), []);
  backpropagate(t, A, 1);
  backpropagate(t, A, 1);
  assert.equal(select(t, 1.414, 0.5), A);
  assert.deepEqual([t.nodes[0].visits, t.nodes[0].valueSum], [2, 2]);
});

test('backpropagation updates the node and all its ancestors only', () => {
  const t = newTree();
  const [A, B] = expand(
    t,
    0,
    [
      { action: el(1), prior: 1 },
      { action: el(2), prior: 0.5 },
    ],
    5,
  );
  const [A1] = expand(t, A, [{ action: el(3), prior: 1 }], 5);
  backpropagate(t, A1, 1);
  backpropagate(t, A, 0.5);
  backpropagate(t, B, 0);
  // root: 1 + 0.5 + 0 = 1.5 over 3; A: 1 + 0.5 over 2; A1: 1 over 1; B: 0 over 1
  assert.deepEqual(
    t.nodes.map((n) => [n.id, n.visits, n.valueSum]),
    [
      [0, 3, 1.5],
      [A, 2, 1.5],
      [B, 1, 0],
      [A1, 1, 1],
    ],
  );
  assert.equal(qMcts(t.nodes[A]), 0.75);
  assert.equal(t.nodes[A1].depth, 2);
  assert.throws(() => backpropagate(t, A, NaN), /finite/);
  assert.throws(() => backpropagate(t, 99, 1), /no node 99/);
});

test('expansion dedupes equivalent actions (within the candidates and against existing children)', () => {
  const t = newTree();
  const sameClickOtherKeyOrder = { count: 1, button: 'left', y: 20, x: 10, type: 'click' } as Action;
  const ids = expand(
    t,
    0,
    [
      { action: click(10, 20), prior: 0.3 },
      { action: el(4), prior: 0.5 },
      { action: sameClickOtherKeyOrder, prior: 0.9 }, // same action as the first: the higher prior wins
      { action: el(4), prior: 0.5 }, // exact duplicate
    ],
    5,
  );
  assert.equal(ids.length, 2);
  assert.deepEqual(
    ids.map((id) => [t.nodes[id].actionKey, t.nodes[id].prior]),
    [
      [JSON.stringify(click(10, 20), ['button', 'count', 'type', 'x', 'y']), 0.9],
      ['{"id":4,"type":"click_element"}', 0.5],
    ],
  );
  // Against existing children: el(4) and the click are already there; only el(5) is new.
  const more = expand(
    t,
    0,
    [
      { action: el(4), prior: 1 },
      { action: click(10, 20), prior: 1 },
      { action: el(5), prior: 0.1 },
    ],
    5,
  );
  assert.deepEqual(
    more.map((id) => t.nodes[id].action),
    [el(5)],
  );
  assert.equal(t.nodes[0].children.length, 3);
  // Priors are clamped into [0, 1].
  const [x, y, z] = expand(
    t,
    0,
    [
      { action: el(6), prior: 7 },
      { action: el(7), prior: -1 },
      { action: el(8), prior: NaN },
    ],
    10,
  );
  assert.deepEqual([t.nodes[x].prior, t.nodes[y].prior, t.nodes[z].prior], [1, 0, 0]);
});

test('expansion keeps at most maxChildren, the highest priors, counting existing children', () => {
  const t = newTree();
  const priors = [0.1, 0.7, 0.3, 0.9, 0.5, 0.2, 0.8];
  const ids = expand(
    t,
    0,
    priors.map((p, i) => ({ action: el(i), prior: p })),
    5,
  );
  // Top 5 by prior: 0.9 (el 3), 0.8 (el 6), 0.7 (el 1), 0.5 (el 4), 0.3 (el 2); new ids in that order.
  assert.deepEqual(ids, [1, 2, 3, 4, 5]);
  assert.deepEqual(
    ids.map((id) => (t.nodes[id].action as { id: number }).id),
    [3, 6, 1, 4, 2],
  );
  assert.deepEqual(expand(t, 0, [{ action: el(20), prior: 1 }], 5), [], 'already full');
  assert.deepEqual(
    expand(
      t,
      0,
      [
        { action: el(20), prior: 0.1 },
        { action: el(21), prior: 0.2 },
      ],
      6,
    ),
    [6],
  );
  assert.equal((t.nodes[6].action as { id: number }).id, 21);
  assert.equal(t.nextId, 7);
  assert.deepEqual(expand(t, 0, [], 10), []);
});

test('best path follows visits, ties broken by composite Q (hand-computed)', () => {
  const t = newTree();
  const [A, B, C] = expand(
    t,
    0,
    [
      { action: el(1), prior: 1 },
      { action: el(2), prior: 0.5 },
      { action: el(3), prior: 0 },
    ],
    5,
  );
  const [A1] = expand(t, A, [{ action: el(11), prior: 0 }], 5);
  const [A2] = expand(t, A, [{ action: el(12), prior: 1 }], 5);
  setStats(t, 0, 7, 3);
  setStats(t, A, 3, 1); // Q_mcts 1/3, prior 1:   α=0.5 → 1/6 + 1/2  = 0.6667; α=1 → 0.3333
  setStats(t, B, 3, 2); // Q_mcts 2/3, prior 0.5: α=0.5 → 1/3 + 1/4  = 0.5833; α=1 → 0.6667
  setStats(t, C, 1, 1);
  setStats(t, A1, 2, 0); // more visits than A2 although A2 has the higher prior and Q
  setStats(t, A2, 1, 1);
  close(compositeQ(t.nodes[A], 0.5), 2 / 3);
  close(compositeQ(t.nodes[B], 0.5), 7 / 12);
  // A and B tie on 3 visits: α = 0.5 prefers A (critic), α = 1 prefers B (search only).
  assert.deepEqual(bestPath(t, 0.5), [A, A1]);
  assert.deepEqual(bestPath(t, 1), [B]);
  assert.deepEqual(actionPath(t, A1), [el(1), el(11)]);
  assert.deepEqual(bestPath(newTree(), 0.5), []);
  // Full tie (visits and Q): lowest id.
  const u = newTree();
  const [P, Q] = expand(
    u,
    0,
    [
      { action: el(1), prior: 0.5 },
      { action: el(2), prior: 0.5 },
    ],
    5,
  );
  assert.deepEqual(bestPath(u, 0.5), [P]);
  assert.ok(Q > P);
});

test('ties the search cannot break otherwise go to the action more samples proposed, then to the lowest id', () => {
  // Two ended children valued the same (the test-time search without a critic: 0.5 each) and one that failed.
  const t = newTree();
  const [Answer, Fail, Success] = expand(
    t,
    0,
    [
      { action: el(1), prior: 0.5, proposals: 1 },
      { action: el(2), prior: 0.5, proposals: 2 },
      { action: el(3), prior: 0.5, proposals: 9 },
    ],
    5,
  );
  assert.deepEqual(
    [Answer, Fail, Success].map((id) => t.nodes[id].proposals),
    [1, 2, 9],
  );
  // Unvisited children: the most proposed is tried first.
  assert.equal(select(t, 1.414, 0.5), Success);
  for (const [id, value] of [
    [Success, 0.5],
    [Fail, 0],
    [Answer, 0.5],
  ] as const) {
    markTerminal(t, id, value);
    backpropagate(t, id, value);
  }
  // Success and Answer tie on UCB1 (same visits and Q): the more proposed gets the next visit and is the answer.
  assert.equal(select(t, 1.414, 0.5), Success);
  assert.deepEqual(bestPath(t, 0.5), [Success]);
  backpropagate(t, Success, 0.5);
  backpropagate(t, Answer, 0.5);
  assert.deepEqual(bestPath(t, 0.5), [Success]);
  // Visits still come first: a less proposed child visited more is the answer.
  backpropagate(t, Answer, 0.5);
  assert.deepEqual(bestPath(t, 0.5), [Answer]);
  // Trees from before proposals were counted: equal, so the lowest id as before.
  const u = newTree();
  const [P] = expand(
    u,
    0,
    [
      { action: el(1), prior: 0.5 },
      { action: el(2), prior: 0.5 },
    ],
    5,
  );
  assert.equal(u.nodes[P].proposals, undefined);
  assert.equal(select(u, 1.414, 0.5), P);
});

test('DPO pairs from explored siblings whose composite Q differ by at least θ (hand-computed)', () => {
  const t = newTree();
  const [A, B, D, C] = expand(
    t,
    0,
    [
      { action: el(1), prior: 1 },
      { action: el(2), prior: 0.5 },
      { action: el(4), prior: 0.25 },
      { action: el(3), prior: 0 },
    ],
    5,
  );
  // α = 0.5:
  // A: 2 visits, sum 2 → Q_mcts 1,   prior 1   → 0.5 + 0.5  = 1.0
  // B: 2 visits, sum 1 → Q_mcts 0.5, prior 0.5 → 0.25 + 0.25 = 0.5
  // C: 1 visit,  sum 0 → Q_mcts 0,   prior 0   → 0
  // D: unvisited (prior 0.25): never in a pair
  setStats(t, A, 2, 2);
  setStats(t, B, 2, 1);
  setStats(t, C, 1, 0);
  setStats(t, 0, 5, 3);
  // Under B: B1 and B2 with critic values 0.6 and 0.5 and no search signal at α = 0: ΔQ = 0.6 − 0.5,
  // which is 0.09999999999999998 in floating point; θ = 0.1 must still accept it.
  const [B1, B2] = expand(
    t,
    B,
    [
      { action: el(5), prior: 1 },
      { action: el(6), prior: 0 },
    ],
    5,
  );
  setStats(t, B1, 1, 1);
  setStats(t, B2, 1, 0);
  setCriticValue(t, B1, 0.6);
  setCriticValue(t, B2, 0.5);

  // θ = 0.5 at α = 0.5: pairs (A,C) Δ 1.0, (A,B) Δ 0.5, (B,C) Δ 0.5. Under B at α = 0.5:
  // B1: 0.5·1 + 0.5·0.6 = 0.8, B2: 0.5·0 + 0.5·0.5 = 0.25 → Δ 0.55.
  assert.deepEqual(
    dpoPairs(t, 0.5, 0.5),
    [
      { parentId: 0, chosenId: A, rejectedId: C, chosenQ: 1, rejectedQ: 0, deltaQ: 1 },
      { parentId: 0, chosenId: A, rejectedId: B, chosenQ: 1, rejectedQ: 0.5, deltaQ: 0.5 },
      { parentId: 0, chosenId: B, rejectedId: C, chosenQ: 0.5, rejectedQ: 0, deltaQ: 0.5 },
      { parentId: B, chosenId: B1, rejectedId: B2, chosenQ: 0.8, rejectedQ: 0.25, deltaQ: 0.55 },
    ].map((p) => ({ ...p, deltaQ: p.chosenQ - p.rejectedQ })),
  );
  // θ = 0.6: only (A, C).
  assert.deepEqual(
    dpoPairs(t, 0.5, 0.6).map((p) => [p.chosenId, p.rejectedId]),
    [[A, C]],
  );
  // α = 0 (critic only), θ = 0.1: root: A 1, B 0.5, C 0 → all three; under B: 0.6 vs 0.5 → kept at θ = 0.1.
  const pairs = dpoPairs(t, 0, 0.1);
  assert.deepEqual(
    pairs.map((p) => [p.parentId, p.chosenId, p.rejectedId]),
    [
      [0, A, C],
      [0, A, B],
      [0, B, C],
      [B, B1, B2],
    ],
  );
  close(pairs[3].deltaQ, 0.1, 1e-12);
  assert.ok(!pairs.some((p) => p.chosenId === D || p.rejectedId === D));
  // θ = 0.11: the B1/B2 pair drops out.
  assert.equal(dpoPairs(t, 0, 0.11).filter((p) => p.parentId === B).length, 0);
  // Equal Q never makes a pair, even at θ = 0.
  const u = newTree();
  const [P, Q] = expand(
    u,
    0,
    [
      { action: el(1), prior: 0.5 },
      { action: el(2), prior: 0.5 },
    ],
    5,
  );
  setStats(u, P, 1, 1);
  setStats(u, Q, 1, 1);
  assert.deepEqual(dpoPairs(u, 0.5, 0), []);
  // One explored child only: no pairs.
  setStats(u, Q, 0, 0);
  assert.deepEqual(dpoPairs(u, 0.5, 0), []);
});

test('tree stats', () => {
  const t = newTree();
  assert.deepEqual(treeStats(t), { nodes: 1, maxDepth: 0, totalVisits: 0, leaves: 1, terminalNodes: 0 });
  const [A, B] = expand(
    t,
    0,
    [
      { action: el(1), prior: 1 },
      { action: el(2), prior: 0.5 },
    ],
    5,
  );
  const [A1] = expand(t, A, [{ action: { type: 'answer', text: 'x' }, prior: 1 }], 5);
  markTerminal(t, A1, 0);
  backpropagate(t, A1, 0);
  backpropagate(t, B, 1);
  assert.deepEqual(treeStats(t), { nodes: 4, maxDepth: 2, totalVisits: 2, leaves: 2, terminalNodes: 1 });
});

/** A deterministic pseudo-random stream (LCG) for the simulated search below. */
function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return s / 2 ** 32;
  };
}

/** A simulated search: K candidates per expansion from a small action space, random rewards, some terminals. */
function simulate(tree: Tree, sims: number, rnd: () => number): void {
  const { ucbConstant: c, alpha, maxChildren } = defaults;
  for (let i = 0; i < sims; i++) {
    let leaf = select(tree, c, alpha);
    const n = getNode(tree, leaf);
    if (!n.terminal) {
      if (n.depth >= 6 || rnd() < 0.1) {
        markTerminal(tree, leaf, rnd() < 0.5 ? 1 : 0);
      } else {
        setObservation(tree, leaf, obs(leaf));
        setCriticValue(tree, leaf, Math.round(rnd() * 100) / 100);
        const candidates = Array.from({ length: 8 }, () => ({ action: el(Math.floor(rnd() * 10)), prior: Math.round(rnd() * 4) / 4 }));
        const kids = expand(tree, leaf, candidates, maxChildren);
        if (kids.length > 0) leaf = kids[0];
      }
    }
    const node = getNode(tree, leaf);
    backpropagate(tree, leaf, node.terminal ? (node.reward ?? 0) : Math.round(rnd() * 10) / 10);
  }
}

test('JSON round trip: a serialised tree gives the same results and evolves identically', () => {
  const t = newTree(obs(0));
  simulate(t, 200, lcg(7));
  const copy: Tree = JSON.parse(JSON.stringify(t));
  assert.deepEqual(copy, t);
  const { ucbConstant: c, alpha, pairThreshold } = defaults;
  assert.equal(select(copy, c, alpha), select(t, c, alpha));
  assert.deepEqual(bestPath(copy, alpha), bestPath(t, alpha));
  assert.deepEqual(dpoPairs(copy, alpha, pairThreshold), dpoPairs(t, alpha, pairThreshold));
  assert.deepEqual(treeStats(copy), treeStats(t));
  assert.ok(dpoPairs(t, alpha, pairThreshold).length > 0);
  assert.equal(treeStats(t).totalVisits, 200);
  // Continuing the search on the original and on the copy gives identical trees.
  simulate(t, 100, lcg(99));
  simulate(copy, 100, lcg(99));
  assert.deepEqual(JSON.parse(JSON.stringify(copy)), JSON.parse(JSON.stringify(t)));
  // The root observation survives the round trip.
  assert.deepEqual(copy.nodes[0].observationRef, obs(0));
});

// Speed is bench/mcts-sims.ts's to measure (a wall-clock bound here failed on a loaded machine); this checks that
// a tree of thousands of nodes goes through every operation.
test('a few thousand nodes: select, pairs, best path and stats all run over the whole tree', () => {
  const t = newTree();
  simulate(t, 3000, lcg(1));
  const { alpha, pairThreshold } = defaults;
  for (let i = 0; i < 1000; i++) select(t, defaults.ucbConstant, alpha);
  dpoPairs(t, alpha, pairThreshold);
  assert.ok(bestPath(t, alpha).length > 0);
  assert.ok(treeStats(t).nodes > 2000, `only ${treeStats(t).nodes} nodes`);
});
