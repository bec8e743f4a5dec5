import { test } from 'node:test';
import assert from 'node:assert/strict';
import { MetricsLineSchema, TrainingMetricsSchema } from '../../lib/run-metrics';
import { iterationMetrics, mctsIterationMetrics, type MctsIterationMetricsInput } from '../../lib/training-metrics';
import { emptyCounters } from '../../lib/mcts-search';

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
    },
  );
  close(m.mcts.mean_abs_delta_q!, (2 * 0.5 + 0.2) / 3); // weighted by each search's pairs
  assert.deepEqual(TrainingMetricsSchema.parse(m), m);
});

test('MCTS metrics without an update or searches: no loss, no adapter version, zeros never NaN', () => {
  const m = mctsIterationMetrics({ searches: [], update: null, adapterVersion: 3, seconds: {} });
  assert.deepEqual([m.loss, m.grad_norm, m.adapter_version, m.success_rate, m.mean_return, m.num_episodes], [null, null, null, 0, 0, 0]);
  assert.deepEqual([m.mcts.update_skipped, m.mcts.reward_margin, m.mcts.accuracy, m.mcts.mean_abs_delta_q], [true, null, null, null]);
  assert.equal(TrainingMetricsSchema.safeParse(m).success, true);
  assert.throws(() => mctsIterationMetrics({ searches: [], update: null, adapterVersion: 0, seconds: { search: Number.NaN } }), /seconds\.search is not a finite number/);
  assert.equal(MetricsLineSchema.safeParse({ run_id: 'r', iteration: 1, time: '2026-01-01T00:00:00Z', ...m }).success, true);
});
