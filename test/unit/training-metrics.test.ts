import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MetricsLineSchema, TrainingMetricsSchema } from '../../lib/training/run-metrics';
import { iterationMetrics, mctsIterationMetrics, type MctsIterationMetricsInput } from '../../lib/training/training-metrics';
import { emptyCounters } from '../../lib/search/mcts-search';

const close = (a: number, b: number, eps = 1e-9): void => assert.ok(Math.abs(a - b) <= eps, `${a} ≉ ${b}`);

// ---- GRPO -------------------------------------------------------------------------------------------

test('iteration metrics of a hand-made iteration', () => {
  const m = iterationMetrics({
    groups: [{ rewards: [1, 0, 0.5] }, { rewards: [0.2, 0.2] }, { rewards: [-1] }],
    episodes: [
      { success: true, steps: 4, validActions: 3, shapedReturn: 11.2 },
      { success: false, steps: 6, validActions: 6, shapedReturn: -0.4 },
    ],
    update: { loss: 0.12, grad_norm: 0.8, version: 3, tokens: 512 },
    phaseSeconds: { update: 12, rollout: 30.5 },
  });
  // all rewards [1, 0, 0.5, 0.2, 0.2, -1]: sum 0.9, n 6 → mean 0.15;
  // squared deviations .7225 + .0225 + .1225 + .0025 + .0025 + 1.3225 = 2.195 → std sqrt(2.195 / 6)
  close(m.mean_reward, 0.15);
  close(m.reward_std, Math.sqrt(2.195 / 6));
  close(m.frac_reward_zero_std, 2 / 3); // [0.2, 0.2] and the group of one
  assert.equal(m.episode_length, 5); // (4 + 6) / 2
  assert.equal(m.success_rate, 0.5);
  assert.equal(m.action_validity, 0.9); // 9 valid / 10 steps
  assert.equal(m.mean_return, 5.4); // (11.2 - 0.4) / 2
  assert.equal(m.loss, 0.12);
  assert.equal(m.grad_norm, 0.8);
  assert.equal(m.adapter_version, 3);
  assert.equal(m.tokens, 512);
  assert.deepEqual(m.seconds, { rollout: 30.5, update: 12 });
  assert.equal(m.num_groups, 3);
  assert.equal(m.num_episodes, 2);
});

test("iteration metrics carry the learner's retokenisation counts when it reports them", () => {
  const base = { groups: [{ rewards: [1, 0] }], episodes: [], phaseSeconds: {} };
  const m = iterationMetrics({ ...base, update: { loss: 0.1, grad_norm: 0.5, version: 2, tokens: 40, retokenized: 3, token_mismatch_rate: 1 / 3 } });
  assert.equal(m.retokenized, 3);
  assert.equal(m.token_mismatch_rate, 0.333333333);
  assert.deepEqual(MetricsLineSchema.parse({ run_id: 'r', iteration: 1, time: '2026-01-01T00:00:00Z', ...m }).retokenized, 3);
  // An older learner (no counts) and an iteration without update: the keys are absent, not zero.
  const old = iterationMetrics({ ...base, update: { loss: 0.1, grad_norm: 0.5, version: 2, tokens: 40 } });
  assert.ok(!('retokenized' in old) && !('token_mismatch_rate' in old));
  assert.ok(!('retokenized' in iterationMetrics(base)));
});

test("iteration metrics carry the learner's unknown log-probs and prompt mismatches; rows with or without them parse", () => {
  const base = { groups: [{ rewards: [1, 0] }], episodes: [], phaseSeconds: {} };
  const line = { run_id: 'r', iteration: 1, time: '2026-01-01T00:00:00Z' };
  const m = iterationMetrics({ ...base, update: { loss: 0.1, grad_norm: 0.5, version: 2, tokens: 40, unknown_logprobs: 4, prompt_mismatch_rate: 1 / 3 } });
  assert.equal(m.unknown_logprobs, 4);
  assert.equal(m.prompt_mismatch_rate, 0.333333333);
  const parsed = MetricsLineSchema.parse({ ...line, ...m });
  assert.equal(parsed.unknown_logprobs, 4);
  assert.equal(parsed.prompt_mismatch_rate, 0.333333333);
  // A learner from before them (absent) or a reused version written before them (null): no keys, and the row parses.
  for (const u of [{}, { unknown_logprobs: null, prompt_mismatch_rate: null }]) {
    const old = iterationMetrics({ ...base, update: { loss: 0.1, grad_norm: 0.5, version: 2, tokens: 40, ...u } });
    assert.ok(!('unknown_logprobs' in old) && !('prompt_mismatch_rate' in old));
    assert.ok(!('unknown_logprobs' in MetricsLineSchema.parse({ ...line, ...old })));
  }
  assert.throws(() => MetricsLineSchema.parse({ ...line, ...m, prompt_mismatch_rate: 1.5 }));
});

test('iteration metrics of an empty iteration are zeros and nulls, never NaN', () => {
  const m = iterationMetrics({ groups: [], episodes: [], phaseSeconds: {} });
  assert.deepEqual(m, {
    algorithm: 'grpo',
    mean_reward: 0,
    reward_std: 0,
    frac_reward_zero_std: 0,
    episode_length: 0,
    success_rate: 0,
    mean_return: 0,
    action_validity: 0,
    loss: null,
    grad_norm: null,
    adapter_version: null,
    tokens: 0,
    seconds: {},
    num_groups: 0,
    num_episodes: 0,
    env_steps: 0,
    sessions_opened: 0,
    replayed_actions: 0,
  });
  // episodes of zero steps: validity 0, not NaN
  const z = iterationMetrics({ groups: [{ rewards: [] }], episodes: [{ success: false, steps: 0, validActions: 0, shapedReturn: 0 }], phaseSeconds: {} });
  assert.equal(z.action_validity, 0);
  assert.equal(z.frac_reward_zero_std, 1);
  assert.equal(z.mean_reward, 0);
  assert.throws(() => iterationMetrics({ groups: [], episodes: [], phaseSeconds: { x: Number.NaN } }), /phaseSeconds\.x/);
});

test('frac_reward_zero_std counts groups with all rewards equal', () => {
  const f = (groups: number[][]): number => iterationMetrics({ groups: groups.map((rewards) => ({ rewards })), episodes: [], phaseSeconds: {} }).frac_reward_zero_std;
  assert.equal(
    f([
      [0, 0, 0],
      [1, 1],
      [0, 1],
    ]),
    0.666666667,
  );
  assert.equal(
    f([
      [0, 1],
      [2, 3],
    ]),
    0,
  );
  assert.equal(f([[-0.1, -0.1, -0.1, -0.1]]), 1);
  assert.equal(f([[1, 0], [0.5, 0.5], [3], [0.1, 0.7]]), 0.5);
});

test('a GRPO row is a training metrics row of algorithm grpo', () => {
  const m = iterationMetrics({
    groups: [{ rewards: [1, 0] }],
    episodes: [{ success: true, steps: 2, validActions: 2, shapedReturn: 1 }],
    phaseSeconds: { rollout: 1 },
    staleness: { sampledVersion: 2, value: 1 },
  });
  assert.equal(m.algorithm, 'grpo');
  assert.deepEqual([m.sampled_adapter_version, m.staleness], [2, 1]);
  assert.deepEqual(TrainingMetricsSchema.parse(m), m);
});

test("a GRPO row's browser work is its episodes' (every candidate's step, every fork's session and replay)", () => {
  const line = { run_id: 'r', iteration: 1, time: '2026-01-01T00:00:00Z' };
  // Step groups of 3 candidates: 2 steps → 6 candidate steps in 1 + 6 sessions.
  const grouped = { success: true, steps: 2, validActions: 2, shapedReturn: 1, browser: { sessions: 7, steps: 6, replayedActions: 3 } };
  const plain = { success: false, steps: 4, validActions: 4, shapedReturn: 0, browser: { sessions: 2, steps: 4, replayedActions: 2 } };
  const m = iterationMetrics({ groups: [{ rewards: [1, 0] }], episodes: [grouped, plain], phaseSeconds: {} });
  assert.deepEqual([m.env_steps, m.sessions_opened, m.replayed_actions], [10, 9, 5]);
  assert.equal(m.episode_length, 3, "episode_length stays the episodes' own steps");
  const parsed = MetricsLineSchema.parse({ ...line, ...m });
  assert.deepEqual([parsed.env_steps, parsed.sessions_opened, parsed.replayed_actions], [10, 9, 5]);

  // An episode recorded before the count: its own steps stand in for env_steps, the other keys are not guessed.
  const old = { success: true, steps: 5, validActions: 5, shapedReturn: 1 };
  const mixed = iterationMetrics({ groups: [], episodes: [grouped, old], phaseSeconds: {} });
  assert.equal(mixed.env_steps, 11);
  assert.ok(!('sessions_opened' in mixed) && !('replayed_actions' in mixed));
  assert.equal(iterationMetrics({ groups: [], episodes: [old, old], phaseSeconds: {} }).env_steps, 10);
  assert.equal(MetricsLineSchema.safeParse({ ...line, ...mixed }).success, true);
  assert.throws(() => iterationMetrics({ groups: [], episodes: [{ ...grouped, browser: { ...grouped.browser, steps: Number.NaN } }], phaseSeconds: {} }), /browser/);
  // Rows written before the keys existed still parse; negative or fractional counts do not.
  const { env_steps: _e, sessions_opened: _s, replayed_actions: _r, ...before } = m;
  assert.equal(MetricsLineSchema.safeParse({ ...line, ...before }).success, true);
  assert.equal(MetricsLineSchema.safeParse({ ...line, ...m, env_steps: -1 }).success, false);
  assert.equal(MetricsLineSchema.safeParse({ ...line, ...m, sessions_opened: 1.5 }).success, false);
});

// ---- MCTS -------------------------------------------------------------------------------------------

type Search = MctsIterationMetricsInput['searches'][number];

function search(over: { success?: boolean; terminal?: boolean; reward?: number | null; pairs?: number; deltaQ?: number | null; withRef?: number } = {}): Search {
  const pairs = over.pairs ?? 2;
  return {
    simulations: 5,
    stats: { nodes: 7, maxDepth: 2, totalVisits: 5, leaves: 4, terminalNodes: 2 },
    bestPath: { nodeIds: [0, 1], actions: ['click'], success: over.success ?? false, terminal: over.terminal ?? true, reward: over.reward ?? 0 },
    pairs: { ref: pairs ? 'sha256:x' : null, count: pairs, meanAbsDeltaQ: pairs ? (over.deltaQ ?? 0.5) : null, withRefLogprobs: over.withRef ?? 0 },
    counters: { ...emptyCounters(), candidates: 6, invalidCandidates: 1, criticCalls: 3, criticFailures: 1, sessionRebuilds: 2 },
  };
}

test('MCTS metrics: the searches are the episodes, their best paths the success and return, the rest in the mcts section', () => {
  const m = mctsIterationMetrics({
    searches: [
      search({ success: true, reward: 1, pairs: 2, deltaQ: 0.5, withRef: 2 }),
      search({ reward: 0.25, pairs: 1, deltaQ: 0.2 }), // self-evaluation: a judged ending below success
      search({ terminal: false, reward: null, pairs: 0 }), // the best path never ended: return 0
    ],
    update: { loss: 0.69, reward_margin: 0.1, accuracy: 1.2, grad_norm: 3 },
    adapterVersion: 4,
    seconds: { update: 2, search: 10 },
  });
  assert.deepEqual(
    { ...m, mcts: { ...m.mcts, mean_abs_delta_q: null } },
    {
      algorithm: 'mcts',
      success_rate: 0.333333333,
      mean_return: 0.416666667, // (1 + 0.25 + 0) / 3
      loss: 0.69,
      grad_norm: 3,
      adapter_version: 4,
      num_episodes: 3,
      seconds: { search: 10, update: 2 },
      mcts: {
        simulations: 15,
        nodes: 21,
        pairs: 3,
        mean_abs_delta_q: null,
        pairs_with_ref_logprobs: 2,
        reward_margin: 0.1,
        accuracy: 1, // clamped: the learner's share cannot exceed 1
        update_skipped: false,
        candidates: 18,
        invalid_candidates: 3,
        critic_calls: 9,
        critic_failures: 3,
        session_rebuilds: 6,
      },
      env_steps: 0,
      sessions_opened: 0,
      replayed_actions: 0,
    },
  );
  close(m.mcts.mean_abs_delta_q!, (2 * 0.5 + 0.2) / 3); // weighted by each search's pairs
  assert.deepEqual(TrainingMetricsSchema.parse(m), m);
});

test("an MCTS row's browser work is its searches' steps, new sessions (restores, rebuilds, spares) and replays", () => {
  const counters = (o: { steps: number; replayed: number; fresh: number; reused: number; spares?: { sessions: number; replayed: number } }): Search['counters'] => ({
    ...emptyCounters(),
    browserSteps: o.steps,
    replayedActions: o.replayed,
    sessionReuse: {
      ...emptyCounters().sessionReuse,
      fresh: o.fresh,
      reused: o.reused,
      resetInPlace: 4,
      prepared: 3,
      ...(o.spares ? { spareSessions: o.spares.sessions, spareReplayedActions: o.spares.replayed } : {}),
    },
  });
  const parked = { ...search(), counters: counters({ steps: 12, replayed: 9, fresh: 2, reused: 5, spares: { sessions: 1, replayed: 6 } }) };
  const unparked = { ...search(), counters: counters({ steps: 8, replayed: 10, fresh: 5, reused: 0 }) };
  const m = mctsIterationMetrics({ searches: [parked, unparked], update: null, adapterVersion: 1, seconds: {} });
  // Reused and reset-in-place sessions are no new sessions; spares that opened one are.
  assert.deepEqual([m.env_steps, m.sessions_opened, m.replayed_actions], [20, 2 + 1 + 5, 9 + 6 + 10]);
  assert.equal(TrainingMetricsSchema.safeParse(m).success, true);
  // A search recorded before its reuse counters: steps and replays still add up, new sessions are not guessed.
  const { sessionReuse: _, ...before } = unparked.counters;
  const old = mctsIterationMetrics({ searches: [parked, { ...unparked, counters: before as Search['counters'] }], update: null, adapterVersion: 1, seconds: {} });
  assert.deepEqual([old.env_steps, old.replayed_actions], [20, 25]);
  assert.ok(!('sessions_opened' in old));
});

test('MCTS metrics without an update or searches: no loss, no adapter version, zeros never NaN', () => {
  const m = mctsIterationMetrics({ searches: [], update: null, adapterVersion: 3, seconds: {} });
  assert.deepEqual([m.loss, m.grad_norm, m.adapter_version, m.success_rate, m.mean_return, m.num_episodes], [null, null, null, 0, 0, 0]);
  assert.deepEqual([m.mcts.update_skipped, m.mcts.reward_margin, m.mcts.accuracy, m.mcts.mean_abs_delta_q], [true, null, null, null]);
  assert.equal(TrainingMetricsSchema.safeParse(m).success, true);
  assert.throws(() => mctsIterationMetrics({ searches: [], update: null, adapterVersion: 0, seconds: { search: Number.NaN } }), /seconds\.search is not a finite number/);
  assert.equal(MetricsLineSchema.safeParse({ run_id: 'r', iteration: 1, time: '2026-01-01T00:00:00Z', ...m }).success, true);
});
