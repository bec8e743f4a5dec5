import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import { collectModes, evalConfigFromFlags, register } from '../../client/commands/eval';
import { loadConfigFile } from '../../host/config-file';
import { loadEvalConfigFile, resolveEvalPlanOnHost } from '../../host/eval-config-file';
import { parseConfig } from '../../lib/config/config';
import { ConfigError } from '../../lib/config/config-error';
import { parseEvalConfig, resolveEvalPlan, selectEvalModes } from '../../lib/eval/eval-config';
import { writeAdapterFolder } from '../../testing/adapter-folder';

// Served evaluation modes carry their adapter's folder (the 404 on a vLLM that forgot it loads it), a version
// no longer on disk is refused up front, `halo eval --mode` selects modes, and configs/eval-real.yaml plans.

const base = parseConfig({ policy: { backend: 'openai', model: 'Qwen/Qwen3-VL-8B-Instruct' } });
const VLLM = 'http://10.0.0.2:8000/v1';

test('served adapter modes name <run>-v<N> and carry <checkpoints>/<run>/v<N>; base, other model names and colocated modes carry none', () => {
  const cfg = parseEvalConfig({
    modes: [
      { name: 'qwen3vl_base', backend: 'openai', baseUrl: VLLM },
      { name: 'qwen3vl_grpo', backend: 'openai', baseUrl: VLLM, adapter: { run: 'grpo-a', version: 3 } },
      { name: 'qwen3vl_mcts', backend: 'openai', baseUrl: VLLM, adapter: { run: 'mcts-a', version: 'latest' } },
      { name: 'qwen3vl_grpo', label: 'by_path', backend: 'openai', baseUrl: VLLM, adapter: { path: 'elsewhere/grpo-a/v1' } },
      { name: 'qwen3vl_grpo', label: 'named', backend: 'openai', baseUrl: VLLM, adapter: { run: 'grpo-a', version: 9 }, model: 'merged-grpo' },
      { name: 'qwen3vl_grpo', label: 'colocated', backend: 'colocated', adapter: { run: 'grpo-a', version: 3 } },
    ],
  });
  const plan = resolveEvalPlan(cfg, base, {
    env: {},
    checkpoints: '/data/ckpt/',
    listAdapterVersions: (run) => (run === 'grpo-a' ? [1, 3] : run === 'mcts-a' ? [2, 7] : []),
  });
  const by = Object.fromEntries(plan.modes.map((m) => [m.label, m]));
  assert.equal(by.qwen3vl_base.adapter, undefined);
  assert.deepEqual(by.qwen3vl_grpo.adapter, { base_url: VLLM, lora_name: 'grpo-a-v3', lora_path: '/data/ckpt/grpo-a/v3' });
  assert.equal(by.qwen3vl_grpo.policy.model, 'grpo-a-v3');
  assert.deepEqual(by.qwen3vl_mcts.adapter, { base_url: VLLM, lora_name: 'mcts-a-v7', lora_path: '/data/ckpt/mcts-a/v7' });
  // A path names run and version; the folder is the run's under the checkpoints root, as for training.
  assert.deepEqual(by.by_path.adapter, { base_url: VLLM, lora_name: 'grpo-a-v1', lora_path: '/data/ckpt/grpo-a/v1' });
  assert.equal(by.named.adapter, undefined, 'a model the mode names itself is not loaded (nor checked on disk)');
  assert.equal(by.colocated.adapter, undefined);
});

test('a served version no longer on disk fails the plan, naming the versions there are', () => {
  const cfg = (version: number) => parseEvalConfig({ modes: [{ name: 'qwen3vl_base' }, { name: 'qwen3vl_grpo', backend: 'openai', adapter: { run: 'grpo-a', version } }] });
  const opts = (have: number[]) => ({ env: {}, checkpoints: '/data/ckpt', listAdapterVersions: () => have });
  assert.throws(
    () => resolveEvalPlan(cfg(2), base, opts([1, 3, 10])),
    (err: Error) =>
      err instanceof ConfigError && /modes\.1\.adapter: adapter grpo-a\/v2 is not on disk under \/data\/ckpt\/grpo-a \(versions on disk: v1, v3, v10\)/.test(err.message),
  );
  assert.throws(() => resolveEvalPlan(cfg(4), base, opts([])), /adapter grpo-a\/v4 is not on disk under \/data\/ckpt\/grpo-a \(versions on disk: none\)/);
  assert.equal(resolveEvalPlan(cfg(3), base, opts([1, 3, 10])).modes[1].adapter?.lora_path, '/data/ckpt/grpo-a/v3');
});

test('on this host: versions read from the checkpoints folder, a relative root made absolute', (t) => {
  const root = mkdtempSync(join(tmpdir(), 'halo-eval-ckpt-'));
  t.after(() => rmSync(root, { recursive: true, force: true }));
  writeAdapterFolder(root, 'grpo-a', 1);
  writeAdapterFolder(root, 'grpo-a', 3);
  const cfg = (version: number) => parseEvalConfig({ modes: [{ name: 'qwen3vl_grpo', backend: 'openai', adapter: { run: 'grpo-a', version } }] });
  const plan = resolveEvalPlanOnHost(cfg(3), base, { env: {}, checkpoints: root });
  assert.equal(plan.modes[0].adapter?.lora_path, join(root, 'grpo-a', 'v3'));
  assert.throws(() => resolveEvalPlanOnHost(cfg(2), base, { env: {}, checkpoints: root }), /grpo-a\/v2 is not on disk .*\(versions on disk: v1, v3\)/);
  const relative = resolveEvalPlanOnHost(parseEvalConfig({ modes: [{ name: 'qwen3vl_grpo', backend: 'openai', adapter: { run: 'grpo-a', version: 1 } }] }), base, {
    env: {},
    checkpoints: 'some/ckpt',
    listAdapterVersions: () => [1],
  });
  assert.match(relative.modes[0].adapter?.lora_path ?? '', /^\/.*\/some\/ckpt\/grpo-a\/v1$/);
});

test('--mode: the named modes in the file order, by label; unknown names listed with the modes there are', () => {
  const cfg = parseEvalConfig({
    modes: [{ name: 'qwen3vl_base' }, { name: 'qwen3vl_mcts', label: 'mcts_search', testTimeMcts: { simulations: 2 } }, { name: 'qwen3vl_mcts' }, { name: 'openai_baseline' }],
  });
  const labels = (c: typeof cfg) => c.modes.map((m) => m.label ?? m.name);
  assert.deepEqual(labels(selectEvalModes(cfg, ['openai_baseline', 'qwen3vl_base'])), ['qwen3vl_base', 'openai_baseline']);
  assert.deepEqual(labels(selectEvalModes(cfg, ['mcts_search'])), ['mcts_search']);
  assert.deepEqual(labels(selectEvalModes(cfg, ['qwen3vl_mcts', 'qwen3vl_mcts'])), ['qwen3vl_mcts']);
  assert.equal(selectEvalModes(cfg, []), cfg, 'no --mode: every mode');
  assert.throws(
    () => selectEvalModes(cfg, ['qwen3vl_base', 'qwen3vl_grpo', '']),
    (err: Error) =>
      err instanceof ConfigError &&
      err.message === '--mode "qwen3vl_grpo", "": no such mode in this eval config (its modes: qwen3vl_base, mcts_search, qwen3vl_mcts, openai_baseline)',
  );
  // Commander's collector: repeated flags accumulate, a comma separates several in one.
  assert.deepEqual(collectModes('c', collectModes('a, b')), ['a', 'b', 'c']);
});

test('halo eval --mode: repeatable on the command line, applied to the file before anything connects', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-eval-mode-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const file = join(dir, 'eval.yaml');
  writeFileSync(file, 'runId: ev\nmodes:\n  - name: qwen3vl_base\n  - name: qwen3vl_grpo\n  - name: openai_baseline\n');
  const ctx = { loadConfig: () => parseConfig({}) };
  const { cfg } = evalConfigFromFlags(file, { mode: ['openai_baseline', 'qwen3vl_base'] }, ctx);
  assert.deepEqual(
    cfg.modes.map((m) => m.name),
    ['qwen3vl_base', 'openai_baseline'],
  );
  const program = new Command().exitOverride();
  register(program, ctx);
  await assert.rejects(
    program.parseAsync(['eval', '--config', file, '--mode', 'qwen3vl_base', '--mode', 'qwen3vl_mtcs'], { from: 'user' }),
    /^ConfigError: --mode "qwen3vl_mtcs": no such mode in this eval config \(its modes: qwen3vl_base, qwen3vl_grpo, openai_baseline\)$/,
  );
});

test('configs/eval-real.yaml: REAL held-out tasks, base / GRPO / MCTS adapters served by vLLM, an OpenAI baseline', () => {
  const { config, haloConfigPath } = loadEvalConfigFile(join(__dirname, '..', '..', 'configs', 'eval-real.yaml'));
  assert.ok(haloConfigPath?.endsWith(join('configs', 'grpo-real.yaml')));
  const halo = loadConfigFile(haloConfigPath!);
  assert.equal(config.env, 'real');
  assert.deepEqual(config.tasks, halo.train.heldOutTasks, 'the GRPO run never trained on them');
  assert.deepEqual(
    config.modes.map((m) => [m.name, 'backend' in m ? m.backend : 'openai']),
    [
      ['qwen3vl_base', 'openai'],
      ['qwen3vl_grpo', 'openai'],
      ['qwen3vl_mcts', 'openai'],
      ['openai_baseline', 'openai'],
      ['gpt5_baseline', 'openai'],
    ],
  );
  const plan = resolveEvalPlan(config, halo, {
    env: { OPENAI_API_KEY: 'sk-test' },
    checkpoints: '/ckpt',
    listAdapterVersions: (run) => (run === halo.train.runId ? [10, 20] : run === 'mcts-real' ? [4] : []),
  });
  const by = Object.fromEntries(plan.modes.map((m) => [m.label, m]));
  assert.equal(by.qwen3vl_base.policy.model, 'Qwen/Qwen3-VL-8B-Instruct');
  assert.deepEqual(by.qwen3vl_grpo.adapter, { base_url: 'http://127.0.0.1:8000/v1', lora_name: 'grpo-real-gomail-v20', lora_path: '/ckpt/grpo-real-gomail/v20' });
  assert.deepEqual(by.qwen3vl_mcts.adapter, { base_url: 'http://127.0.0.1:8000/v1', lora_name: 'mcts-real-v4', lora_path: '/ckpt/mcts-real/v4' });
  assert.equal(by.openai_baseline.policy.model, 'gpt-4o');
  assert.equal(by.gpt5_baseline.policy.model, 'gpt-5');
  assert.deepEqual(
    plan.tasks.map((t) => t.site),
    config.tasks.map(() => 'gomail'),
  );
});
