import { test } from 'node:test';
import assert from 'node:assert/strict';
import { anchorGroupAdvantages, anchorRollout, discountedReturns, mergeAnchorStats, type AnchorRollout } from '../../lib/training/anchor-groups';
import { AnchorRolloutSchema } from '../../lib/training/experience';
import { anchorStateKey, normaliseAxtree, normaliseAxtreeForAnchor, stateKey } from '../../lib/rewards/shaping';
import { TrainingMetricsSchema } from '../../lib/training/run-metrics';
import { iterationMetrics } from '../../lib/training/training-metrics';

function close(actual: number[][], expected: number[][], tol = 1e-8): void {
  assert.equal(actual.length, expected.length);
  actual.forEach((row, i) => {
    assert.equal(row.length, expected[i].length, `rollout ${i}`);
    row.forEach((v, t) => assert.ok(Math.abs(v - expected[i][t]) <= tol, `advantage[${i}][${t}] = ${v}, expected ${expected[i][t]}`));
  });
}

// Two rollouts from one reset state s0; they part after the first step.
//   A: s0 → a1, rewards [0, 1]     B: s0 → b1, rewards [0, 0]
const parted: AnchorRollout[] = [
  { stateKeys: ['s0', 'a1'], rewards: [0, 1] },
  { stateKeys: ['s0', 'b1'], rewards: [0, 0] },
];

test('discounted step returns: G_t = r_t + γ·G_{t+1}', () => {
  // γ = 0.5, r = [1, 0, 2]: G_2 = 2; G_1 = 0 + 0.5·2 = 1; G_0 = 1 + 0.5·1 = 1.5.
  assert.deepEqual(discountedReturns([1, 0, 2], 0.5), [1.5, 1, 2]);
  // γ = 1 is the plain remaining sum.
  assert.deepEqual(discountedReturns([1, 0, 2], 1), [3, 2, 2]);
  assert.deepEqual(discountedReturns([], 0.9), []);
});

test('shared first state gets a step term, unshared states keep only the episode term (discounted)', () => {
  // R_A = 1, R_B = 0, mean 0.5 → episode terms A +0.5, B −0.5.
  // γ = 0.5: G_A = [0 + 0.5·1, 1] = [0.5, 1]; G_B = [0, 0].
  // Anchor group s0 = {A_0: 0.5, B_0: 0}, mean 0.25 → step terms A_0 +0.25, B_0 −0.25.
  // a1 and b1 are met once: step term 0.
  // A = [0.5 + 0.25, 0.5] = [0.75, 0.5];  B = [−0.5 − 0.25, −0.5] = [−0.75, −0.5].
  const r = anchorGroupAdvantages(parted, { episodeWeight: 1, stepWeight: 1, discount: 0.5 });
  close(r.advantages, [
    [0.75, 0.5],
    [-0.75, -0.5],
  ]);
  assert.deepEqual(r.returns, [1, 0]);
  assert.deepEqual(r.stepReturns, [
    [0.5, 1],
    [0, 0],
  ]);
  assert.deepEqual(r.groupSizes, [
    [2, 1],
    [2, 1],
  ]);
  // One group of size 2; 2 of the 4 steps sit in it.
  assert.deepEqual(r.stats, { anchor_groups: 1, anchor_group_size_mean: 2, anchor_group_size_max: 2, step_signal_share: 0.5 });
});

test('discount changes the step term only', () => {
  // γ = 1: G_A = [1, 1], G_B = [0, 0]; group s0 {1, 0}, mean 0.5 → step terms ±0.5.
  // A = [0.5 + 0.5, 0.5] = [1, 0.5];  B = [−1, −0.5].
  const r = anchorGroupAdvantages(parted, { episodeWeight: 1, stepWeight: 1, discount: 1 });
  close(r.advantages, [
    [1, 0.5],
    [-1, -0.5],
  ]);
});

test('stepWeight 0 is episode grouping: every step carries R_i − mean R', () => {
  // Episode terms only: A +0.5 on both steps, B −0.5 on both (same as grouping `episode`).
  const r = anchorGroupAdvantages(parted, { episodeWeight: 1, stepWeight: 0, discount: 0.5 });
  close(r.advantages, [
    [0.5, 0.5],
    [-0.5, -0.5],
  ]);
});

test('episodeWeight 0 keeps only the step terms', () => {
  // From the shared-state case: step terms A_0 +0.25, B_0 −0.25; singletons 0.
  const r = anchorGroupAdvantages(parted, { episodeWeight: 0, stepWeight: 1, discount: 0.5 });
  close(r.advantages, [
    [0.25, 0],
    [-0.25, 0],
  ]);
});

test('both weights scale their own term', () => {
  // episodeWeight 2, stepWeight 0.5, γ 0.5: A_0 = 2·0.5 + 0.5·0.25 = 1.125, A_1 = 2·0.5 = 1;
  // B_0 = 2·(−0.5) + 0.5·(−0.25) = −1.125, B_1 = −1.
  const r = anchorGroupAdvantages(parted, { episodeWeight: 2, stepWeight: 0.5, discount: 0.5 });
  close(r.advantages, [
    [1.125, 1],
    [-1.125, -1],
  ]);
});

test('a state met twice in one rollout puts both visits in its group', () => {
  // A: s0 → x → s0 (loops back), rewards [0, 0, 1];  B: s0 → y, rewards [0.5, 0].  γ = 0.5.
  // R_A = 1, R_B = 0.5, mean 0.75 → episode terms A +0.25, B −0.25.
  // G_A: G_2 = 1, G_1 = 0 + 0.5·1 = 0.5, G_0 = 0 + 0.5·0.5 = 0.25.  G_B: G_1 = 0, G_0 = 0.5.
  // Group s0 = {A_0: 0.25, A_2: 1, B_0: 0.5}, mean 1.75/3 = 0.583333…
  //   step terms A_0 = −0.333333…, A_2 = +0.416666…, B_0 = −0.083333…; x and y are alone.
  // A = [0.25 − 0.333333, 0.25, 0.25 + 0.416667] = [−0.083333, 0.25, 0.666667]
  // B = [−0.25 − 0.083333, −0.25] = [−0.333333, −0.25]
  const r = anchorGroupAdvantages(
    [
      { stateKeys: ['s0', 'x', 's0'], rewards: [0, 0, 1] },
      { stateKeys: ['s0', 'y'], rewards: [0.5, 0] },
    ],
    { episodeWeight: 1, stepWeight: 1, discount: 0.5 },
  );
  close(r.advantages, [
    [-1 / 12, 0.25, 2 / 3],
    [-1 / 3, -0.25],
  ]);
  assert.deepEqual(r.groupSizes, [
    [3, 1, 3],
    [3, 1],
  ]);
  // One group of 3; 3 of the 5 steps in it.
  assert.deepEqual(r.stats, { anchor_groups: 1, anchor_group_size_mean: 3, anchor_group_size_max: 3, step_signal_share: 0.6 });
});

test('a step with no state key is never grouped; equal returns give zeros', () => {
  // Both rollouts identical in reward: R = 0 each → episode terms 0. The shared key s0 holds G = {0.5, 0.5}
  // (γ 0.5, r [0, 1]) → step terms 0. The missing keys form no group, so only s0 counts.
  const r = anchorGroupAdvantages(
    [
      { stateKeys: ['s0', undefined], rewards: [0, 1] },
      { stateKeys: ['s0', null], rewards: [0, 1] },
    ],
    { episodeWeight: 1, stepWeight: 1, discount: 0.5 },
  );
  close(r.advantages, [
    [0, 0],
    [0, 0],
  ]);
  assert.deepEqual(r.stats, { anchor_groups: 1, anchor_group_size_mean: 2, anchor_group_size_max: 2, step_signal_share: 0.5 });
});

test('a recorded trajectory is read as a rollout: shaped rewards and the anchor keys of the pages the steps acted from', () => {
  const trees: Record<string, string> = { a: '[1] button "Send" @(1,1)', b: '[1] button "Sent" @(1,1)' };
  const step = (total: number, url: string, axtreeRef: string) => ({
    shaped: { total, terms: [] },
    observation: { url, step: 0, screenshotRef: 's', axtreeRef, stateKey: 'recorded shaping key' },
  });
  const r = anchorRollout({ steps: [step(0.1, 'https://x/', 'a'), step(-0.5, 'https://x/', 'b'), step(10, 'https://x/?q=1', 'a')] }, (ref) => trees[ref]);
  assert.deepEqual(r.rewards, [0.1, -0.5, 10]);
  assert.deepEqual(r.stateKeys, [
    anchorStateKey({ url: 'https://x/', axtree: trees.a }),
    anchorStateKey({ url: 'https://x/', axtree: trees.b }),
    anchorStateKey({ url: 'https://x/', axtree: trees.a }), // the query is left out, as in the shaping key
  ]);
  assert.notEqual(r.stateKeys[0], r.stateKeys[1]);
  assert.equal(AnchorRolloutSchema.safeParse(r).success, true);
  assert.equal(AnchorRolloutSchema.safeParse({ rewards: [Number.NaN], stateKeys: ['s0'] }).success, false);
});

// The pages after typing into the "To" field: the text differs, or only what the shaping key ignores does.
const MAIL = 'https://mail.example/compose';
const typed = (to: string, at = '@(400,40)', focus = ' focused') => ({ url: MAIL, axtree: `[1] button "Send" @(60,120)\n[2] textbox "To" value="${to}"${focus} ${at}` });

test('anchor keys tell field contents apart by a hash of the text; the shaping key only sees empty or filled', () => {
  assert.notEqual(anchorStateKey(typed('alice@example.com')), anchorStateKey(typed('bob@example.com')), 'two recipients, two anchor keys');
  assert.equal(anchorStateKey(typed('alice@example.com')), anchorStateKey(typed('alice@example.com', '@(401,90)', '')), 'one recipient, one anchor key');
  assert.notEqual(anchorStateKey(typed('')), anchorStateKey(typed('a')));
  assert.equal(anchorStateKey(typed('')), anchorStateKey(typed('  ')), 'blank counts as empty');
  // Shaping keeps "filled": another letter typed is no new state to pay for.
  assert.equal(stateKey(typed('alice@example.com')), stateKey(typed('bob@example.com')));
  // The key holds a hash of the text, never the text.
  const tree = normaliseAxtreeForAnchor(typed('alice@example.com').axtree);
  assert.equal(tree.includes('alice'), false);
  assert.match(tree, /textbox "To" value=#[0-9a-f]{8}$/);
  assert.match(normaliseAxtree(typed('alice@example.com').axtree), /textbox "To" value=\*$/);
  assert.match(anchorStateKey(typed('x')), /^[0-9a-f]{8}$/);
});

test('typing the right and the wrong recipient puts the next steps in two anchor groups', () => {
  // Three rollouts type a recipient, then press Send. A and C type the right one; B the wrong one and fails.
  const axtrees: Record<string, string> = { start: typed('').axtree, right: typed('alice@example.com').axtree, wrong: typed('bob@example.com').axtree };
  const rollout = (after: string, rewards: number[]) => ({
    steps: rewards.map((total, k) => ({
      shaped: { total, terms: [] },
      observation: { url: MAIL, step: k, screenshotRef: 's', axtreeRef: k === 0 ? 'start' : after },
    })),
  });
  const rs = [rollout('right', [0, 1]), rollout('wrong', [0, 0]), rollout('right', [0, 0.5])].map((t) => anchorRollout(t, (ref) => axtrees[ref]));
  const r = anchorGroupAdvantages(rs, { episodeWeight: 0, stepWeight: 1, discount: 1 });
  // Step 2 of A and C share a state (the right recipient); B's page is another state: no comparison, step term 0.
  assert.deepEqual(
    r.groupSizes.map((g) => g[1]),
    [2, 1, 2],
  );
  close(
    r.advantages.map((a) => [a[1]]),
    [[0.25], [0], [-0.25]],
  );
});

test('bad parameters and mismatched rollouts are rejected', () => {
  const ok = { episodeWeight: 1, stepWeight: 1, discount: 0.95 };
  assert.throws(() => anchorGroupAdvantages(parted, { ...ok, discount: 1.5 }), RangeError);
  assert.throws(() => anchorGroupAdvantages(parted, { ...ok, stepWeight: -1 }), RangeError);
  assert.throws(() => anchorGroupAdvantages([{ stateKeys: ['s0'], rewards: [0, 1] }], ok), RangeError);
  assert.throws(() => anchorGroupAdvantages([{ stateKeys: ['s0'], rewards: [Number.NaN] }], ok), RangeError);
});

test('stats of several task groups merge as one', () => {
  // Groups: 1 of size 2 (4 steps, 2 in groups) + 1 of size 3 (5 steps, 3 in groups).
  // → 2 groups, mean size (2 + 3)/2 = 2.5, max 3, share (2 + 3)/9 = 0.555555556.
  const m = mergeAnchorStats([
    { stats: { anchor_groups: 1, anchor_group_size_mean: 2, anchor_group_size_max: 2, step_signal_share: 0.5 }, steps: 4 },
    { stats: { anchor_groups: 1, anchor_group_size_mean: 3, anchor_group_size_max: 3, step_signal_share: 0.6 }, steps: 5 },
  ]);
  assert.deepEqual(m, { anchor_groups: 2, anchor_group_size_mean: 2.5, anchor_group_size_max: 3, step_signal_share: 0.555555556 });
  assert.deepEqual(mergeAnchorStats([]), { anchor_groups: 0, anchor_group_size_mean: 0, anchor_group_size_max: 0, step_signal_share: 0 });
});

test('the metrics row carries the anchor stats and the metrics schema keeps them', () => {
  const anchor = { anchor_groups: 2, anchor_group_size_mean: 2.5, anchor_group_size_max: 3, step_signal_share: 0.5 };
  const m = iterationMetrics({
    groups: [{ rewards: [1, 0] }],
    episodes: [{ success: true, steps: 2, validActions: 2, shapedReturn: 1 }],
    phaseSeconds: {},
    anchor,
  });
  const parsed = TrainingMetricsSchema.parse(m);
  for (const [k, v] of Object.entries(anchor)) assert.equal((parsed as Record<string, unknown>)[k], v, k);
  // Other groupings do not write the keys.
  const plain = iterationMetrics({ groups: [{ rewards: [1, 0] }], episodes: [], phaseSeconds: {} });
  assert.equal('anchor_groups' in plain, false);
});

test('balanceGroups: a group that few rollouts reached weighs as much as the start state all N share', () => {
  // Four rollouts from s0; three click to x (reward 1), one to y (reward 0). From x, two press "ok" (reward 10)
  // and one "no" (reward 0); immediate credit (γ = 0), step terms only.
  //   s0 group {1, 1, 1, 0}, mean 0.75: +0.25 ×3, −0.75. Scale N/4 = 1: unchanged.
  //   x group {10, 10, 0}, mean 20/3: +10/3 ×2, −20/3. Scale 4/3: +40/9 ×2, −80/9.
  const rs: AnchorRollout[] = [
    { stateKeys: ['s0', 'x'], rewards: [1, 10] },
    { stateKeys: ['s0', 'x'], rewards: [1, 10] },
    { stateKeys: ['s0', 'x'], rewards: [1, 0] },
    { stateKeys: ['s0', 'y'], rewards: [0, 0] },
  ];
  const p = { episodeWeight: 0, stepWeight: 1, discount: 0 };
  const plain = anchorGroupAdvantages(rs, p).advantages;
  const balanced = anchorGroupAdvantages(rs, { ...p, balanceGroups: true }).advantages;
  const unbalanced = [
    [0.25, 10 / 3],
    [0.25, 10 / 3],
    [0.25, -20 / 3],
    [-0.75, 0],
  ];
  close(plain, unbalanced, 1e-3);
  // Only the x group (3 members of N = 4) is scaled, by 4/3.
  close(
    balanced,
    unbalanced.map((r, i) => (i < 3 ? [r[0], (r[1] * 4) / 3] : r)),
    1e-3,
  );
  // Each group's summed absolute credit is now proportional to N, not to its member count.
  const xMass = (a: number[][]) => a.slice(0, 3).reduce((s, r) => s + Math.abs(r[1]), 0);
  assert.ok(Math.abs(xMass(balanced) / xMass(plain) - 4 / 3) < 1e-3);
});
