import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parseConfig, type HaloConfig } from '../../lib/config/config';
import { applyRunOverrides, completePolicyUrl, flagsImplyReal } from '../../client/config-overrides';
import { REPO_ROOT } from '../../client/processes';
import { runConfigFromFlags } from '../../client/run-flags';
import { withServedModel } from '../../client/served-model';

// The seeds' spellings of a served run: `--policy_url http://localhost:8000` (no /v1) and `halo train|mcts --policy_url …
// --domain gomail` without --config, which must sample the model the server serves on the REAL config.

const DEFAULT_CONFIG = join(REPO_ROOT, 'configs', 'default.yaml');
const MCTS_DEFAULT_CONFIG = join(REPO_ROOT, 'configs', 'mcts-default.yaml');

test('a policy URL without a path gets /v1; a URL with a path (a proxy route) or no URL at all is left as given', () => {
  assert.deepEqual(completePolicyUrl('http://localhost:8000'), { url: 'http://localhost:8000/v1', completed: true });
  assert.deepEqual(completePolicyUrl('http://localhost:8000/'), { url: 'http://localhost:8000/v1', completed: true });
  assert.deepEqual(completePolicyUrl('https://gpu.example:443'), { url: 'https://gpu.example:443/v1', completed: true });
  for (const kept of ['http://127.0.0.1:8000/v1', 'http://h:8000/openai/v1', 'http://h:8000/?x=1', 'localhost:8000', 'not a url']) {
    assert.deepEqual(completePolicyUrl(kept), { url: kept, completed: false }, kept);
  }
});

test('--policy-url http://localhost:8000: policy.baseUrl and the adapters endpoint are .../v1, and a note says so', () => {
  for (const command of ['train', 'mcts'] as const) {
    const o = applyRunOverrides(command, {}, { policyUrl: 'http://localhost:8000' });
    const cfg = parseConfig(o.raw);
    assert.equal(cfg.policy.baseUrl, 'http://localhost:8000/v1');
    assert.equal((command === 'train' ? cfg.train : cfg.mcts).vllmBaseUrl, 'http://localhost:8000/v1');
    assert.ok(o.notes.includes("--policy-url http://localhost:8000: completed to http://localhost:8000/v1 (vLLM's OpenAI API is under /v1)"), o.notes.join('\n'));
  }
  assert.ok(!applyRunOverrides('train', {}, { policyUrl: 'http://h:8000/v1' }).notes.some((n) => /completed/.test(n)));
});

test('which flags make a run REAL', () => {
  assert.ok(flagsImplyReal({ domain: 'gomail' }));
  assert.ok(flagsImplyReal({ env: 'real' }));
  assert.ok(flagsImplyReal({ task: 'v2.gomail-1' }));
  assert.ok(flagsImplyReal({ tasks: 'click-button, v2.omnizon-3' }));
  assert.ok(!flagsImplyReal({ tasks: 'click-button,click-test' }));
  assert.ok(!flagsImplyReal({ env: 'miniwob', policyUrl: 'http://h:8000/v1' }));
});

test('halo train|mcts --policy-url with REAL tasks and no --config: the REAL config, not the local tiny-random one', () => {
  const train = runConfigFromFlags('train', undefined, DEFAULT_CONFIG, { policyUrl: 'http://localhost:8000', task: 'v2.gomail-1' });
  assert.equal(train.cfg.policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.equal(train.cfg.policy.baseUrl, 'http://localhost:8000/v1');
  assert.equal(train.cfg.episode.env, 'real');
  assert.deepEqual(train.cfg.train.tasks, ['gomail-1']);
  assert.equal(train.notes[0], 'no --config: configs/grpo-real.yaml (REAL tasks on the policy server of --policy-url)');

  const mcts = runConfigFromFlags('mcts', undefined, MCTS_DEFAULT_CONFIG, { policyUrl: 'http://localhost:8000', task: 'v2.gomail-1' });
  assert.equal(mcts.cfg.policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.equal(mcts.cfg.mcts.runId, 'mcts-real');
  assert.equal(mcts.notes[0], 'no --config: configs/mcts-real.yaml (REAL tasks on the policy server of --policy-url)');
  assert.equal(mcts.cfg.mcts.numSimulations, 50, "mcts-real.yaml's search, not mcts-default's");

  // MiniWoB++ tasks keep the default config; without a policy URL a REAL task on it is still refused.
  assert.equal(runConfigFromFlags('train', undefined, DEFAULT_CONFIG, { policyUrl: 'http://h:8000/v1', tasks: 'click-button' }).cfg.episode.env, 'miniwob');
  assert.throws(() => runConfigFromFlags('train', undefined, DEFAULT_CONFIG, { task: 'v2.gomail-1' }), /is not a REAL config/);
  // A config named on the command line is the user's choice (its model is checked against the server later).
  const named = runConfigFromFlags('train', DEFAULT_CONFIG, DEFAULT_CONFIG, { policyUrl: 'http://h:8000/v1', task: 'v2.gomail-1' });
  assert.equal(named.cfg.policy.model, 'tiny-random');
  assert.ok(!named.notes.some((n) => n.startsWith('no --config')), named.notes.join('\n'));
});

/** A policy server whose `GET /v1/models` lists `cards`; records the requests. */
async function modelsServer(cards: unknown[]): Promise<{ url: string; requests: string[]; server: Server }> {
  const requests: string[] = [];
  const server = createServer((req, res) => {
    requests.push(`${req.method} ${req.url} ${req.headers.authorization ?? ''}`.trim());
    res.writeHead(req.url === '/v1/models' ? 200 : 404, { 'content-type': 'application/json' });
    res.end(JSON.stringify(req.url === '/v1/models' ? { object: 'list', data: cards } : { detail: 'Not Found' }));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, requests, server };
}

const served = (url: string, model: string): HaloConfig => parseConfig({ policy: { backend: 'openai', baseUrl: url, model } });
const VLLM_CARDS = [
  { id: 'Qwen/Qwen3-VL-4B-Instruct', object: 'model', root: 'Qwen/Qwen3-VL-4B-Instruct', parent: null },
  { id: 'run-v3', object: 'model', root: '/ckpt/run/v3', parent: 'Qwen/Qwen3-VL-4B-Instruct' },
];

test("the served model: the server's one base model replaces a model it does not serve, unless the user's config named it", async () => {
  const s = await modelsServer(VLLM_CARDS);
  try {
    const notes: string[] = [];
    const picked = await withServedModel(served(s.url, 'tiny-random'), { configGiven: true, notes, env: {} });
    assert.equal(picked.policy.model, 'Qwen/Qwen3-VL-4B-Instruct', 'the base model, not the adapter');
    assert.deepEqual(notes, [`--policy-url: policy.model Qwen/Qwen3-VL-4B-Instruct (the model ${s.url} serves; the config named tiny-random)`]);
    assert.equal((await withServedModel(served(s.url, 'Qwen/Qwen3-VL-8B-Instruct'), { configGiven: false, notes: [], env: {} })).policy.model, 'Qwen/Qwen3-VL-4B-Instruct');
    // A served name (an adapter too) is kept, silently.
    const kept: string[] = [];
    assert.equal((await withServedModel(served(s.url, 'run-v3'), { configGiven: false, notes: kept, env: {} })).policy.model, 'run-v3');
    assert.deepEqual(kept, []);
    // The user's own config and its real model: not even asked.
    const before = s.requests.length;
    assert.equal((await withServedModel(served(s.url, 'Qwen/Qwen3-VL-8B-Instruct'), { configGiven: true, notes: [], env: {} })).policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
    assert.equal(s.requests.length, before);
    // The policy key goes where the workers would send it (the local vLLM's port), and nowhere else.
    const port = new URL(s.url).port;
    await withServedModel(served(s.url, 'tiny-random'), { configGiven: true, notes: [], env: { HALO_POLICY_API_KEY: 'sk-local', HALO_VLLM_PORT: port } });
    assert.equal(s.requests.at(-1), 'GET /v1/models Bearer sk-local');
    await withServedModel(served(s.url, 'tiny-random'), { configGiven: true, notes: [], env: { HALO_POLICY_API_KEY: 'sk-local' } });
    assert.equal(s.requests.at(-1), 'GET /v1/models');
  } finally {
    s.server.close();
  }
});

test('the served model: several base models and none named is refused before anything starts; a silent server keeps the model, said', async () => {
  const s = await modelsServer([{ id: 'a', parent: null }, { id: 'b' }]);
  try {
    await assert.rejects(
      withServedModel(served(s.url, 'tiny-random'), { configGiven: false, notes: [], env: {} }),
      /^ConfigError: --policy-url: .* serves a, b, not tiny-random: name the model/,
    );
  } finally {
    s.server.close();
  }
  const notes: string[] = [];
  const down = await withServedModel(served(s.url, 'Qwen/Qwen3-VL-8B-Instruct'), { configGiven: false, notes, env: {} });
  assert.equal(down.policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.match(notes[0], /^--policy-url: could not ask http:\/\/127\.0\.0\.1:\d+\/v1 which model it serves \(.*\); policy\.model stays Qwen\/Qwen3-VL-8B-Instruct$/);
});

test("halo train --policy_url http://127.0.0.1:PORT without --config (the seeds' spelling): /v1 completed and the served model, before anything starts", async () => {
  const s = await modelsServer(VLLM_CARDS);
  try {
    const root = s.url.replace(/\/v1$/, '');
    const { stdout, stderr } = await promisify(execFile)(
      process.execPath,
      [join(REPO_ROOT, 'bin', 'halo.cjs'), 'train', '--policy_url', root, '--tasks', 'click-button', '--dry-run', '--json'],
      { cwd: REPO_ROOT, env: { ...process.env, HALO_ENV_FILE: '', HALO_POLICY_API_KEY: '' } },
    );
    const { config } = JSON.parse(stdout);
    assert.deepEqual([config.policy.baseUrl, config.policy.backend, config.policy.model], [`${root}/v1`, 'openai', 'Qwen/Qwen3-VL-4B-Instruct']);
    assert.match(stderr, new RegExp(`^halo: --policy-url ${root}: completed to ${root}/v1 `, 'm'));
    assert.match(stderr, /^halo: --policy-url: policy\.model Qwen\/Qwen3-VL-4B-Instruct \(the model .* serves; the config named tiny-random\)$/m);
  } finally {
    s.server.close();
  }
});
