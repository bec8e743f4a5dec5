import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runEval } from '../../client/commands/eval';
import { parseConfig } from '../../lib/config/config';
import { parseEvalConfig } from '../../lib/eval/eval-config';
import type { EvalEpisodeRecord, EvalSummary } from '../../lib/eval/eval-summary';
import type { MctsSearchResult } from '../../lib/search/mcts-search';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startFakeVllmServer } from '../../testing/fake-vllm-server';
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startTestStack, type TestStack } from '../../testing/stack';

// A real evaluation: Temporal, Chromium with MiniWoB++ pages, the Python learner sampling greedily with the
// colocated tiny-random Qwen3-VL for the three Qwen modes, and a local OpenAI-compatible server (scripted)
// standing in for OpenAI as the baseline.
let stack: TestStack;
let fake: FakePolicyServer;
let out: string;
before(async () => {
  [stack, fake] = await Promise.all([startTestStack({ browserWorkers: 1, learner: true }), startFakePolicyServer({ kind: 'scripted' })]);
  out = mkdtempSync(join(tmpdir(), 'halo-eval-'));
});
after(async () => {
  await fake?.close();
  await stack?.stop();
  if (out) rmSync(out, { recursive: true, force: true });
});

const NO_KEY = 'HALO_TEST_EVAL_NO_SUCH_KEY';

test('four modes × 2 tasks × 1 seed: table and JSON per mode, the scripted baseline solves click-button, a keyless baseline is skipped', async (t) => {
  const base = parseConfig({
    // The stack's home: the evaluation's records are read back from its blob store.
    stack: { home: stack.home },
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'colocated', model: 'tiny-random', maxTokens: 16, timeoutMs: 120_000 },
    episode: { sessionStartTimeoutMs: 10_000 },
    train: { gpuTaskQueue: stack.gpuQueue },
  });
  const cfg = parseEvalConfig({
    runId: 'eval-test',
    env: 'miniwob',
    tasks: ['click-button', 'enter-text'],
    seeds: [0],
    maxSteps: 3,
    parallelism: 2,
    modes: [
      { name: 'qwen3vl_base', backend: 'colocated', adapter: { run: 'base', version: 0 } },
      { name: 'qwen3vl_grpo', backend: 'colocated', adapter: { run: 'grpo-local', version: 0 } },
      // No run mcts-local under this stack's checkpoints: 'latest' resolves to version 0. Test-time search
      // without a critic model: a 2-simulation search before every step.
      {
        name: 'qwen3vl_mcts',
        backend: 'colocated',
        adapter: { run: 'mcts-local', version: 'latest' },
        testTimeMcts: { simulations: 2, critic: { backend: 'none' } },
      },
      { name: 'openai_baseline', model: 'gpt-4o', baseUrl: fake.url },
      // Default baseUrl and no key in the environment: listed as skipped.
      { name: 'openai_baseline', label: 'openai_nokey', model: 'gpt-4o', credential: 'critic' },
    ],
  });
  // The CLI reads the `critic` credential from NO_KEY, which is not set.
  const env: NodeJS.ProcessEnv = { ...process.env, HALO_CREDENTIAL_CRITIC_ENV: NO_KEY };
  delete env[NO_KEY];
  const lines: string[] = [];
  const dir = join(out, 'eval-test');
  const run = await runEval(cfg, stack.client, {
    base,
    outDir: dir,
    env,
    checkpoints: stack.checkpoints,
    progress: (l) => lines.push(l),
    pollMs: 200,
  });
  assert.equal(run.attached, false);
  const modes = ['qwen3vl_base', 'qwen3vl_grpo', 'qwen3vl_mcts', 'openai_baseline'];

  // Per-episode records: deterministic ids, 2 per mode, nothing failed.
  const episodes = readFileSync(run.files.episodes, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as EvalEpisodeRecord);
  assert.equal(episodes.length, 8);
  for (const e of episodes) {
    assert.equal(e.workflowId, `eval-test-${e.mode}-${e.task}-s0`);
    assert.equal(e.error, undefined, `${e.workflowId}: ${e.error}`);
    assert.match(e.trajectoryRef ?? '', /^sha256:/);
  }
  const baselineClick = episodes.find((e) => e.mode === 'openai_baseline' && e.task === 'click-button');
  assert.equal(baselineClick?.success, true, 'the scripted fake solves click-button');

  // summary.json: four modes, n = 2 each, the skipped one with its reason, the MCTS note.
  const summary = JSON.parse(readFileSync(run.files.summaryJson, 'utf8')) as EvalSummary & { resultsRef: string };
  assert.deepEqual(summary.modes, modes);
  assert.deepEqual(
    summary.rows.map((r) => [r.mode, r.site, r.n]),
    modes.map((m) => [m, 'miniwob', 2]),
  );
  const baselineRow = summary.rows.find((r) => r.mode === 'openai_baseline')!;
  assert.ok(baselineRow.successes >= 1);
  assert.ok(baselineRow.ci95.low > 0 && baselineRow.ci95.high <= 1);
  assert.equal(baselineRow.actionValidity, 1);
  assert.equal(summary.skipped.length, 1);
  assert.equal(summary.skipped[0].mode, 'openai_nokey');
  assert.match(summary.skipped[0].reason, new RegExp(`no API key: ${NO_KEY} \\(credential critic\\) is not set and baseUrl is the default https://api\\.openai\\.com/v1`));
  assert.ok(summary.notes.some((n) => n.mode === 'qwen3vl_mcts' && /^test-time MCTS: 2 simulations before every step/.test(n.note)));
  assert.ok(summary.notes.some((n) => n.mode === 'qwen3vl_mcts' && /run mcts-local has no adapter/.test(n.note)));
  assert.match(summary.resultsRef, /^sha256:/);

  // The MCTS mode's steps were chosen by searches: one finished mctsSearch child per step, 2 simulations each.
  for (const e of episodes.filter((x) => x.mode === 'qwen3vl_mcts')) {
    assert.ok(e.steps >= 1);
    for (let step = 1; step <= e.steps; step++) {
      const res = (await stack.client.workflow.getHandle(`${e.workflowId}-search${step}`).result()) as MctsSearchResult;
      assert.equal(res.simulations, 2);
      assert.ok(res.decision, `${e.workflowId} step ${step}: the search made a decision`);
    }
    await assert.rejects(stack.client.workflow.getHandle(`${e.workflowId}-search${e.steps + 1}`).describe(), /not found/i);
  }
  for (const e of episodes.filter((x) => x.mode === 'qwen3vl_base')) {
    await assert.rejects(stack.client.workflow.getHandle(`${e.workflowId}-search1`).describe(), /not found/i, 'greedy modes do not search');
  }

  // summary.md (also what `halo eval` prints): one table row per mode with n = 2, and the skipped section.
  const md = readFileSync(run.files.summaryMd, 'utf8');
  for (const line of md.split('\n')) t.diagnostic(line);
  assert.equal(md, run.markdown);
  assert.match(md, /\| mode \| site \| n \| success \(95% CI\) \| median steps \| mean reward \| validity \|/);
  for (const m of modes) assert.match(md, new RegExp(`^\\| ${m} \\| miniwob \\| 2 \\| \\d+\\.\\d% \\(`, 'm'));
  assert.match(md, /### Skipped\n\n- openai_nokey: no API key/);
  assert.doesNotMatch(md, /^\| openai_nokey/m);

  // Greedy requests to the OpenAI-compatible server: temperature 0, one sample, the configured model.
  assert.ok(fake.requests.length >= 2);
  for (const r of fake.requests) assert.deepEqual([r.model, r.n, r.temperature, r.hasImage], ['gpt-4o', 1, 0, true]);

  // Progress was shown as episodes done / total.
  assert.match(lines[0], /started eval eval-test .*4 modes × 2 tasks × 1 seeds; skipped openai_nokey/);
  assert.ok(
    lines.some((l) => /\d\/8 episodes done/.test(l)),
    lines.join('\n'),
  );

  // The same eval id again attaches to the finished evaluation: same result, no new episodes.
  const requests = fake.requests.length;
  const again = await runEval(cfg, stack.client, { base, outDir: join(out, 'again'), env, checkpoints: stack.checkpoints });
  assert.equal(again.attached, true);
  assert.deepEqual(again.result, run.result);
  assert.equal(fake.requests.length, requests);
});

test('a served adapter mode: vLLM never held the version and restarts mid-evaluation; every episode still runs on it', async (t) => {
  const vllm = await startFakeVllmServer({ baseModel: 'base-model' });
  t.after(() => vllm.close());
  // v1 of two on disk: an older version, which vLLM is never asked to keep.
  const folder = writeAdapterFolder(stack.checkpoints, 'served-grpo', 1);
  writeAdapterFolder(stack.checkpoints, 'served-grpo', 2);
  // The first chat that reaches the model restarts the server: it forgets the adapter loaded for it.
  const record = vllm.chats.push.bind(vllm.chats);
  vllm.chats.push = (...r) => {
    const n = record(...r);
    if (n === 1) vllm.restart();
    return n;
  };
  const base = parseConfig({
    stack: { home: stack.home },
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'openai', baseUrl: `${vllm.url}/v1`, model: 'base-model', maxTokens: 64, timeoutMs: 30_000 },
    episode: { sessionStartTimeoutMs: 10_000 },
    train: { gpuTaskQueue: stack.gpuQueue },
  });
  const cfg = parseEvalConfig({
    runId: 'eval-served',
    env: 'miniwob',
    tasks: ['click-button', 'enter-text'],
    seeds: [0, 1],
    maxSteps: 2,
    parallelism: 1,
    modes: [{ name: 'qwen3vl_grpo', backend: 'openai', baseUrl: `${vllm.url}/v1`, adapter: { run: 'served-grpo', version: 1 } }],
  });
  const run = await runEval(cfg, stack.client, { base, outDir: join(out, 'eval-served'), checkpoints: stack.checkpoints });

  const episodes = readFileSync(run.files.episodes, 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as EvalEpisodeRecord);
  assert.equal(episodes.length, 4);
  for (const e of episodes) assert.equal(e.error, undefined, `${e.workflowId}: ${e.error}`);
  assert.equal(vllm.restarts, 1);
  // Every request that reached the model named the requested version; the restart made it load again, from the folder.
  assert.ok(vllm.chats.length >= 4);
  assert.deepEqual([...new Set(vllm.chats.map((c) => c.model))], ['served-grpo-v1']);
  assert.ok(vllm.unknownModels.every((m) => m === 'served-grpo-v1'));
  const loads = vllm.requests.filter((r) => r.path === '/v1/load_lora_adapter').map((r) => r.body as { lora_name: string; lora_path: string });
  assert.ok(loads.length >= 2, `loaded before and after the restart (${loads.length} loads)`);
  for (const l of loads) assert.deepEqual(l, { lora_name: 'served-grpo-v1', lora_path: folder });
  assert.equal(vllm.adapters.get('served-grpo-v1'), folder);
});
