import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, parseConfig } from '../../lib/config/config';
import { identicalCandidatesProblem } from '../../lib/config/config-checks';
import { loadConfigFile } from '../../host/config-file';
import { temporalSettings } from '../../host/connection';
import { samplingParams } from '../../activities/policy-client';

test('an empty config gets every default', () => {
  const c = parseConfig({});
  assert.equal(c.temporal.address, '127.0.0.1:7233');
  assert.equal(c.episode.task, 'click-button');
  // The seeds' GRPO sampling: N = 8 candidates at temperature 0.7 (greedy candidates would all be the same).
  assert.equal(c.policy.temperature, 0.7);
  assert.equal(c.train.numGenerations, 8);
  assert.equal(c.train.evalEverySteps, 0, 'no evaluation by steps unless asked');
  assert.equal('n' in c.policy, false, 'N is train.numGenerations or mcts.maxChildren, not a policy field');
  assert.equal(c.stack.retentionDays, 30);
});

test('configs/default.yaml is valid', () => {
  const c = loadConfigFile(join(__dirname, '..', '..', 'configs', 'default.yaml'));
  assert.equal(c.episode.env, 'miniwob');
});

test('errors name every bad field by its path', () => {
  assert.throws(
    () => parseConfig({ policy: { temperature: 9, maxTokens: 'two' }, episode: { maxSteps: 0 }, typo: true }),
    (err: Error) => {
      assert.ok(err instanceof ConfigError);
      assert.match(err.message, /policy\.temperature/);
      assert.match(err.message, /policy\.maxTokens/);
      assert.match(err.message, /episode\.maxSteps/);
      assert.match(err.message, /typo/);
      return true;
    },
  );
});

test('a broken YAML file and a missing file give clear errors', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-cfg-'));
  writeFileSync(join(dir, 'bad.yaml'), 'policy: [unclosed');
  assert.throws(() => loadConfigFile(join(dir, 'bad.yaml')), /not valid YAML/);
  assert.throws(() => loadConfigFile(join(dir, 'nope.yaml')), /cannot read config file/);
  writeFileSync(join(dir, 'url.yaml'), 'policy:\n  baseUrl: not a url\n');
  assert.throws(() => loadConfigFile(join(dir, 'url.yaml')), /policy\.baseUrl/);
});

test('Temporal connection settings come from the environment', () => {
  const d = { address: '127.0.0.1:7233', namespace: 'default' };
  assert.deepEqual(temporalSettings(d, {}), { address: d.address, namespace: 'default', apiKey: undefined, tls: undefined });
  const cloud = temporalSettings(d, { TEMPORAL_ADDRESS: 'ns.acct.tmprl.cloud:7233', TEMPORAL_NAMESPACE: 'ns.acct', TEMPORAL_API_KEY: 'k' });
  assert.equal(cloud.address, 'ns.acct.tmprl.cloud:7233');
  assert.equal(cloud.namespace, 'ns.acct');
  assert.equal(cloud.apiKey, 'k');
  assert.equal(cloud.tls, true, 'an API key implies TLS');
  assert.throws(() => temporalSettings(d, { TEMPORAL_TLS_CLIENT_CERT_PATH: '/x.pem' }), /must be set together/);
  const dir = mkdtempSync(join(tmpdir(), 'halo-tls-'));
  writeFileSync(join(dir, 'c.pem'), 'CERT');
  writeFileSync(join(dir, 'k.pem'), 'KEY');
  const mtls = temporalSettings(d, { TEMPORAL_TLS_CLIENT_CERT_PATH: join(dir, 'c.pem'), TEMPORAL_TLS_CLIENT_KEY_PATH: join(dir, 'k.pem') });
  assert.equal(Buffer.from((mtls.tls as { clientCertPair: { crt: Uint8Array } }).clientCertPair.crt).toString(), 'CERT');
});

test('reward weights come from the YAML file the config names', () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-rw-'));
  writeFileSync(join(dir, 'w.yaml'), 'general:\n  valid_action: 0.3\nsites:\n  gomail:\n    compose_opened: 0.9\n');
  writeFileSync(join(dir, 'c.yaml'), 'rewards: w.yaml\n');
  const c = loadConfigFile(join(dir, 'c.yaml'));
  assert.equal(c.rewards.general.valid_action, 0.3);
  assert.equal(c.rewards.sites.gomail.compose_opened, 0.9);
  assert.equal(c.rewards.general.loop, -1);
  writeFileSync(join(dir, 'bad.yaml'), 'general:\n  loop: 2\n');
  writeFileSync(join(dir, 'c2.yaml'), 'rewards: bad.yaml\n');
  assert.throws(() => loadConfigFile(join(dir, 'c2.yaml')), /rewards\.general\.loop/);
  writeFileSync(join(dir, 'c3.yaml'), 'rewards: missing.yaml\n');
  assert.throws(() => loadConfigFile(join(dir, 'c3.yaml')), /cannot read rewards file/);
});

test('reasoning models get max_completion_tokens and no temperature; others max_tokens and temperature', () => {
  assert.deepEqual(samplingParams({ model: 'gpt-5-mini', maxTokens: 100, temperature: 0 }), { max_completion_tokens: 100 });
  assert.deepEqual(samplingParams({ model: 'o3', maxTokens: 50, temperature: 0 }), { max_completion_tokens: 50 });
  assert.deepEqual(samplingParams({ model: 'Qwen/Qwen3-VL-8B-Instruct', maxTokens: 256, temperature: 0.7 }), { max_tokens: 256, temperature: 0.7 });
  assert.deepEqual(samplingParams({ model: 'gpt-4o', maxTokens: 8, temperature: 0 }), { max_tokens: 8, temperature: 0 });
});

test('configs/grpo-real.yaml is the real setup: REAL gomail, vLLM, N=8, T=0.7, LoRA lr 1e-5, dr_grpo, kl 0.001', () => {
  const c = loadConfigFile(join(__dirname, '..', '..', 'configs', 'grpo-real.yaml'));
  assert.equal(c.episode.env, 'real');
  assert.ok(c.train.tasks.every((t) => t.startsWith('gomail-')));
  assert.equal(c.policy.backend, 'openai');
  assert.equal(c.policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.equal(c.train.numGenerations, 8);
  assert.equal(c.policy.temperature, 0.7);
  assert.equal(c.train.learningRate, 1e-5);
  assert.equal(c.train.lossType, 'dr_grpo');
  assert.equal(c.train.klCoef, 0.001);
  assert.ok(c.train.vllmBaseUrl);
});

test('greedy sampling with N > 1 candidates is a problem naming policy.temperature and train.numGenerations, for every grouping', () => {
  for (const grouping of ['step', 'episode', 'anchor'] as const) {
    const p = identicalCandidatesProblem(parseConfig({ policy: { temperature: 0 }, train: { grouping, numGenerations: 4 } }));
    assert.match(p ?? '', /policy\.temperature 0 \(greedy\) with train\.numGenerations 4: the 4 (candidates|rollouts) .*identical/);
  }
  assert.equal(identicalCandidatesProblem(parseConfig({})), undefined, 'the defaults sample');
  assert.equal(identicalCandidatesProblem(parseConfig({ policy: { temperature: 0.01 }, train: { numGenerations: 2 } })), undefined);
  // The config itself stays valid: MCTS, evaluations and single episodes may decode greedily.
  assert.doesNotThrow(() => parseConfig({ policy: { temperature: 0 } }));
});

test('train.maxStaleness above 1 needs train.rollout stream; the stream takes any bound up to 8', () => {
  assert.throws(() => parseConfig({ train: { maxStaleness: 2 } }), /train\.maxStaleness 2: iterations overlap one update at most .*train\.rollout: stream/);
  const cfg = parseConfig({ train: { rollout: 'stream', maxStaleness: 2 } });
  assert.equal(cfg.train.maxStaleness, 2);
  assert.deepEqual(cfg.train.stream, { episodeRetries: 1, updatesPerRun: 10 });
  assert.throws(() => parseConfig({ train: { rollout: 'stream', maxStaleness: 9 } }), /maxStaleness/);
});
