import assert from 'node:assert/strict';
import { test } from 'node:test';
import { episodeMaxTimeMs, miniwobSuccess, reportedReward } from '../../env/miniwob-scoring';
import { parseConfig } from '../../lib/config/config';

test('success is raw reward 1: partial credit and BrowserGym-style raw > 0 are failures', () => {
  assert.equal(miniwobSuccess(1), true);
  for (const raw of [0.999, 0.5, 0, -1]) assert.equal(miniwobSuccess(raw), false, String(raw));
});

test('time limit: raised by default, the task own limit for official, or ms', () => {
  assert.equal(episodeMaxTimeMs(undefined), 1_000_000);
  assert.equal(episodeMaxTimeMs('raised'), 1_000_000);
  assert.equal(episodeMaxTimeMs('official'), null);
  assert.equal(episodeMaxTimeMs(30_000), 30_000);
  assert.throws(() => episodeMaxTimeMs(-5), /invalid MiniWoB time limit/);
});

test('reward: raw by default, the time-scaled one for official', () => {
  const outcome = { raw: 1, scaled: 0.97 };
  assert.equal(reportedReward(outcome, undefined), 1);
  assert.equal(reportedReward(outcome, 'raw'), 1);
  assert.equal(reportedReward(outcome, 'official'), 0.97);
});

test('config: miniwob section defaults and validation', () => {
  assert.deepEqual(parseConfig({}).miniwob, { timeLimit: 'raised', reward: 'raw' });
  assert.deepEqual(parseConfig({ miniwob: { timeLimit: 20_000, reward: 'official' } }).miniwob, { timeLimit: 20_000, reward: 'official' });
  assert.throws(() => parseConfig({ miniwob: { timeLimit: 'fast' } }), /miniwob\.timeLimit/);
  assert.throws(() => parseConfig({ miniwob: { timeLimit: 10 } }), /miniwob\.timeLimit/);
  assert.throws(() => parseConfig({ miniwob: { reward: 'binary' } }), /miniwob\.reward/);
});
