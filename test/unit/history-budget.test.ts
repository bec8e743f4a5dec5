import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, parseConfig, parseStoredConfig } from '../../lib/config/config';
import { episodeFootprint, episodeHistoryProblems, TEMPORAL_LIMITS } from '../../lib/config/history-budget';
import { loadConfigFile } from '../../host/config-file';

const KEYS = { n: 'train.numGenerations', maxSteps: 'episode.maxSteps', maxTokens: 'policy.maxTokens' };

test('the footprint of a small step-grouped episode, by hand', () => {
  // n 2, forks, 3 steps, 10 tokens:
  //   completions per call = 2 × (16 × 10 + 512) = 1344 bytes
  //   events = 6 × (6 + 3 × (3 + 3 × 2)) = 6 × 33 = 198
  //   forks = 2 × (3 × 4096 + 256 × 3 × 4 / 2) = 2 × (12288 + 1536) = 27648
  //   trajectory = 3 × (4096 + 256 + 2 × 512) = 16128
  //   history = 3 × (2 × 1344 + 4096) + 27648 + 16128 = 20352 + 43776 = 64128
  assert.deepEqual(episodeFootprint({ n: 2, forks: true, maxSteps: 3, maxTokens: 10 }), {
    events: 198,
    historyBytes: 64128,
    samplePayloadBytes: 1344,
    trajectoryPayloadBytes: 16128,
  });
});

test('every shipped config fits', () => {
  for (const name of ['default', 'grpo-real', 'mcts-default', 'mcts-real']) {
    assert.doesNotThrow(() => loadConfigFile(`configs/${name}.yaml`), name);
  }
});

test('each limit names the values to lower', () => {
  // 64 × 16 × 4096 bytes of completions in one answer: 4 MiB, twice the payload limit.
  const [payload] = episodeHistoryProblems({ n: 64, forks: true, maxSteps: 1, maxTokens: 4096 }, KEYS);
  assert.match(payload, /one sampling call answers up to 4\.0 MiB .* payload limit: lower policy\.maxTokens or train\.numGenerations$/);
  // 6 × (6 + 200 × (3 + 3 × 64)) = 234036 events.
  const events = episodeHistoryProblems({ n: 64, forks: true, maxSteps: 200, maxTokens: 16 }, KEYS);
  assert.ok(
    events.some((p) => /history reaches 234036 events, over Temporal's 51200: lower episode\.maxSteps or train\.numGenerations$/.test(p)),
    events.join('\n'),
  );
  // The same length without forks (episode grouping runs one candidate per state) fits the event limit.
  assert.ok(!episodeHistoryProblems({ n: 1, forks: false, maxSteps: 200, maxTokens: 16 }, KEYS).some((p) => /events/.test(p)));
  // Long completions over many steps fill the history's bytes; one candidate: only maxTokens or maxSteps to lower.
  const bytes = episodeHistoryProblems({ n: 1, forks: false, maxSteps: 200, maxTokens: 8192 }, KEYS);
  assert.deepEqual(bytes.length, 1, bytes.join('\n'));
  assert.match(bytes[0], /^episode\.maxSteps 200 × policy\.maxTokens 8192: an episode's history reaches [0-9.]+ MiB, over Temporal's 50\.0 MiB: lower policy\.maxTokens$/);
  assert.equal(TEMPORAL_LIMITS.historyEvents, 51_200);
});

test('halo refuses a config whose episodes would pass a limit; a run already under way still loads', () => {
  const raw = { policy: { maxTokens: 4096 }, episode: { maxSteps: 50 }, train: { grouping: 'step', numGenerations: 64 } };
  assert.throws(
    () => parseConfig(raw),
    (err: unknown) => {
      assert.ok(err instanceof ConfigError);
      assert.match(
        err.message,
        /^invalid config:\n {2}train\.numGenerations 64 × policy\.maxTokens 4096: one sampling call .*\n {2}train\.numGenerations 64 × episode\.maxSteps 50 × policy\.maxTokens 4096: an episode.s history reaches 58536 events/,
      );
      return true;
    },
  );
  // An MCTS expansion samples maxChildren completions in one call.
  assert.throws(
    () => parseConfig({ policy: { maxTokens: 8192 }, mcts: { maxChildren: 32 } }),
    /mcts\.maxChildren 32 × policy\.maxTokens 8192: .* lower policy\.maxTokens or mcts\.maxChildren/,
  );
  assert.equal(parseStoredConfig(raw).cfg.train.numGenerations, 64);
});
