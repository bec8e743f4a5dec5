import assert from 'node:assert/strict';
import { test } from 'node:test';
import { episodeMaxSteps, REAL_MAX_STEPS, singleEpisodeInput } from '../../client/episode-input';
import { parseConfig } from '../../lib/config/config';

// `halo episode --env real …` from default.yaml (a MiniWoB++ config capping its one-action tasks at 1) must not
// inherit that cap: a REAL episode ends only when the agent answers, so one step could never score.

const miniwobConfig = parseConfig({ episode: { env: 'miniwob', maxSteps: 1 } });
const realConfig = parseConfig({ episode: { env: 'real', task: 'gomail-18', maxSteps: 12 } });

test("--env real from a MiniWoB++ config runs under REAL's step cap of 25", () => {
  assert.equal(REAL_MAX_STEPS, 25);
  assert.equal(episodeMaxSteps(miniwobConfig, 'real', undefined), 25);
  const cfg = parseConfig({ ...miniwobConfig, episode: { ...miniwobConfig.episode, env: 'real', task: 'gomail-18', maxSteps: episodeMaxSteps(miniwobConfig, 'real', undefined) } });
  assert.equal(singleEpisodeInput(cfg, 'wf').maxSteps, 25);
});

test('--max-steps and a REAL config keep their own cap; MiniWoB++ keeps the config', () => {
  assert.equal(episodeMaxSteps(miniwobConfig, 'real', 7), 7);
  assert.equal(episodeMaxSteps(realConfig, undefined, undefined), undefined);
  assert.equal(episodeMaxSteps(realConfig, 'real', undefined), undefined);
  assert.equal(episodeMaxSteps(miniwobConfig, undefined, undefined), undefined);
  assert.equal(episodeMaxSteps(miniwobConfig, 'miniwob', undefined), undefined);
});
