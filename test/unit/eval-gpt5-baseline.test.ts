import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { samplingParams } from '../../activities/policy-client';
import { loadEvalConfigFile } from '../../host/eval-config-file';
import { parseConfig } from '../../lib/config/config';
import { parseEvalConfig, resolveEvalPlan } from '../../lib/eval/eval-config';

// The seeds' gpt5_baseline: an eval mode on OpenAI's API with gpt-5 that needs nothing but OPENAI_API_KEY.

const plan = (env: Record<string, string>) =>
  resolveEvalPlan(parseEvalConfig({ modes: [{ name: 'gpt5_baseline' }] }), parseConfig({}), {
    env,
    checkpoints: '/ckpt',
    miniwobTasks: ['click-button', 'enter-text', 'click-link', 'focus-text'],
    listAdapterVersions: () => [],
  });

test('gpt5_baseline: gpt-5 on OpenAI with the baseline key; room for its reasoning; no temperature sent', () => {
  const [m] = parseEvalConfig({ modes: [{ name: 'gpt5_baseline' }] }).modes;
  assert.deepEqual(m, { name: 'gpt5_baseline', model: 'gpt-5', baseUrl: 'https://api.openai.com/v1', credential: 'baseline', maxTokens: 4096 });

  const withKey = plan({ OPENAI_API_KEY: 'sk-test' });
  assert.deepEqual(withKey.skipped, []);
  const [mode] = withKey.modes;
  assert.deepEqual(
    [mode.label, mode.backend, mode.policy.backend, mode.policy.model, mode.policy.baseUrl, mode.policy.credential],
    ['gpt5_baseline', 'openai', 'openai', 'gpt-5', 'https://api.openai.com/v1', 'baseline'],
  );
  assert.equal(mode.policy.constrained, false, "OpenAI's API has no structured_outputs field");
  // gpt-5 refuses max_tokens and any temperature but its default: the request carries neither.
  assert.deepEqual(samplingParams(mode.policy), { max_completion_tokens: 4096 });
});

test('gpt5_baseline without OPENAI_API_KEY is skipped with the reason; the shipped eval configs carry it', () => {
  const none = plan({});
  assert.deepEqual(none.modes, []);
  assert.equal(none.skipped[0].mode, 'gpt5_baseline');
  assert.match(none.skipped[0].reason, /^no API key: OPENAI_API_KEY \(credential baseline\) is not set/);
  for (const file of ['eval-default.yaml', 'eval-real.yaml']) {
    const { config } = loadEvalConfigFile(join(__dirname, '..', '..', 'configs', file));
    const m = config.modes.find((x) => x.name === 'gpt5_baseline');
    assert.ok(m && m.model === 'gpt-5' && m.credential === 'baseline' && m.baseUrl === 'https://api.openai.com/v1', file);
  }
});
