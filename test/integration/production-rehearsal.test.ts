import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { loadConfigFile } from '../../host/config-file';
import { parseConfig } from '../../lib/config/config';
import { isGrpoMetrics, parseMetricsJsonl } from '../../lib/training/run-metrics';
import { startOrAttachTrain } from '../../client/train';
import type { TrainingResult } from '../../workflows/train-engine';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';
import { startTestStack, type TestStack } from '../../testing/stack';
import { tinyTokenizer } from '../helpers/tiny-tokenizer';

// The production job rehearsed: configs/grpo-real.yaml's shape (openai backend served by vLLM with runtime
// LoRA loading, step grouping N=8, parallelism 4, REAL v2 through HALO_REAL_ORIGIN), the Python learner on
// the gpu queue, against a local server that enforces vLLM's contract. vLLM is restarted mid-run and forgets
// every adapter; the run must go on sampling from the adapter it trains. It runs with constrained decoding off (the
// shipped setting) and on, and every request must state the whole sampling distribution: the stand-in applies
// Qwen3-VL's generation config (top_k 20, top_p 0.8) to whatever a request leaves out, as vLLM does.
let site: FakeRealSite;
let vllm: FakeVllmServer;
let stack: TestStack;
let RUN = 'grpo-rehearsal';
const BASE = 'Qwen/Qwen3-VL-8B-Instruct';

// Started as compose starts vLLM (disable_any_whitespace), answering in the ids of the learner's model (the tiny
// model's tokenizer, written when the learner started): ids the learner's tokenizer and grammar check take as sampled.
const startVllm = () =>
  startFakeVllmServer({
    baseModel: BASE,
    disableAnyWhitespace: true,
    tokenizer: tinyTokenizer(stack.home),
    mode: {
      kind: 'scripted',
      email: { to: 'brian.king@example.com', subject: 'Meeting notes', body: 'Hi Brian, could you please send me the notes from our meeting? Thanks!' },
    },
  });

before(async () => {
  site = await startFakeRealSite();
  process.env.HALO_REAL_ORIGIN = site.origin; // inherited by the browser workers
  // Fewer site slots than N: the old per-session limiter deadlocked at the first step group with these numbers.
  process.env.HALO_SITE_CONCURRENCY = '2';
  stack = await startTestStack({ browserWorkers: 2, learner: true });
});
after(async () => {
  await stack?.stop();
  await vllm?.close();
  await site?.close();
});

function rehearsalConfig(constrained: boolean) {
  const shipped = loadConfigFile(join(__dirname, '..', '..', 'configs', 'grpo-real.yaml'));
  // The shipped file, with only what a local rehearsal must change: addresses, queues, size.
  return parseConfig({
    ...shipped,
    temporal: { ...shipped.temporal, address: stack.address, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { ...shipped.policy, baseUrl: `${vllm.url}/v1`, timeoutMs: 20_000, constrained },
    episode: { ...shipped.episode, maxSteps: 1, sessionStartTimeoutMs: 20_000, heartbeatTimeoutMs: 10_000 },
    train: {
      ...shipped.train,
      runId: RUN,
      iterations: 3,
      episodesPerIteration: 4,
      tasks: ['gomail-18'],
      heldOutTasks: ['gomail-18'],
      evalEvery: 2,
      learningRate: 1e-3,
      vllmBaseUrl: `${vllm.url}/v1`,
      gpuTaskQueue: stack.gpuQueue,
      learnerHeartbeatTimeoutS: 60,
    },
  });
}

const version = (model: string) => (model === BASE ? 0 : Number(/-v(\d+)$/.exec(model)?.[1] ?? NaN));

// Constrained on: the stand-in answers the bare JSON of the action schema in the tiny model's ids, and the learner's
// grammar check must take every completion (a GrammarMismatch fails the update, so the run).
for (const constrained of [false, true]) {
  const name = `grpo-real shape (constrained ${constrained}): every iteration samples the adapter it trained, through a vLLM restart; adapters v1..v3 once`;
  test(name, async () => {
    await vllm?.close();
    vllm = await startVllm();
    RUN = constrained ? 'grpo-rehearsal-constrained' : 'grpo-rehearsal';
    await rehearse(constrained);
  });
}

async function rehearse(constrained: boolean) {
  const cfg = rehearsalConfig(constrained);
  assert.equal(cfg.train.numGenerations, 8, 'the shipped N');
  assert.equal(cfg.train.parallelism, 4, 'the shipped parallelism');
  assert.equal(cfg.train.grouping, 'step');
  assert.equal(cfg.policy.backend, 'openai');

  const { handle } = await startOrAttachTrain(stack.client, cfg);
  // Restart vLLM once adapter v1 is loaded: it forgets every runtime-loaded adapter.
  const restarted = (async () => {
    const deadline = Date.now() + 300_000;
    while (!vllm.adapters.has(`${RUN}-v1`)) {
      if (Date.now() > deadline) throw new Error('adapter v1 was never loaded');
      await new Promise((r) => setTimeout(r, 200));
    }
    vllm.restart();
  })();
  // A failed run says why: the causes' messages, not only "Workflow execution failed".
  const result = (await handle.result().catch((err: unknown) => {
    const why: string[] = [];
    for (let e = err as { message?: string; cause?: unknown } | undefined; e; e = e.cause as typeof e) why.push(String(e.message));
    throw new Error(why.join(' <- '));
  })) as TrainingResult;
  await restarted;
  const { best, ...ended } = result;
  assert.deepEqual(ended, { runId: RUN, iterations: 3, adapterVersion: 3, stoppedEarly: false });
  // The greedy evaluation after iteration 2 scored v2: the run names it as its best-evaluated adapter.
  assert.equal(best?.version, 2);

  // Which model every sampling request named: the newest adapter loaded so far (the base model before v1).
  // Iteration i's episodes start only after v<i-1> is loaded; the greedy evaluation after iteration 2 uses v2.
  let expected = 0;
  const named: number[] = [];
  for (const r of vllm.requests) {
    const body = r.body as { lora_name?: string; model?: string; logprobs?: boolean; return_token_ids?: boolean };
    if (r.path === '/v1/load_lora_adapter' && body.lora_name) expected = Math.max(expected, version(body.lora_name));
    if (r.path !== '/v1/chat/completions') continue;
    assert.equal(version(body.model ?? ''), expected, `a request named ${body.model} while v${expected} was the newest adapter`);
    assert.equal(body.logprobs, true, 'sampling asks for log-probs');
    assert.equal(body.return_token_ids, true, 'sampling asks for token ids');
    const sent = body as Record<string, unknown>;
    assert.deepEqual(
      [sent.top_p, sent.top_k, sent.min_p, sent.presence_penalty, sent.frequency_penalty, sent.repetition_penalty],
      [1, 0, 0, 0, 0, 1],
      `every request states the distribution, neutral: ${JSON.stringify(sent)}`,
    );
    assert.equal(sent.structured_outputs !== undefined, constrained, 'constrained requests carry the grammar');
    named.push(expected);
  }

  for (const c of vllm.chats) {
    const { temperature: _, ...rest } = c.sampling;
    assert.deepEqual(rest, { top_p: 1, top_k: 0, min_p: 0, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 }, 'sampled from the uncut distribution');
  }
  for (const v of [0, 1, 2]) assert.ok(named.includes(v), `some requests sampled from v${v}: ${[...new Set(named)]}`);
  assert.ok(!named.includes(3), 'nothing samples from v3: the run ends with its update');

  // The restart was noticed and healed: a request for v1 was refused once, v1 was loaded again, the run went on.
  assert.equal(vllm.restarts, 1);
  assert.ok(vllm.unknownModels.includes(`${RUN}-v1`), `the restarted server refused v1: ${vllm.unknownModels}`);
  const loads = vllm.requests.filter((r) => r.path === '/v1/load_lora_adapter').map((r) => (r.body as { lora_name: string }).lora_name);
  assert.ok(loads.filter((n) => n === `${RUN}-v1`).length >= 2, `v1 loaded again after the restart: ${loads}`);

  // Adapters v1..v3 exactly once, each a folder vLLM accepts.
  const dirs = readdirSync(join(stack.checkpoints, RUN))
    .filter((d) => /^v\d+$/.test(d))
    .sort();
  assert.deepEqual(dirs, ['v1', 'v2', 'v3']);
  for (const d of dirs) {
    assert.ok(existsSync(join(stack.checkpoints, RUN, d, 'adapter_config.json')));
    assert.ok(existsSync(join(stack.checkpoints, RUN, d, 'adapter_model.safetensors')));
  }
  const lines = parseMetricsJsonl(readFileSync(join(stack.home, RUN, 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
  assert.deepEqual(
    lines.map((l) => l.iteration),
    [1, 2, 3],
  );
  assert.deepEqual(
    lines.map((l) => l.adapter_version),
    [1, 2, 3],
  );
  assert.equal(lines[1].eval?.episodes, 1, 'the greedy evaluation ran after iteration 2');
  // The learner trained on the sampler's own token ids: nothing was retokenised.
  for (const l of lines) {
    assert.ok(l.tokens > 0, 'the update trained on tokens');
    assert.equal((l as { retokenized?: number }).retokenized ?? 0, 0, 'every completion came with its token ids');
    assert.equal((l as { token_mismatch_rate?: number }).token_mismatch_rate ?? 0, 0, 'no retokenisation differed from what was sampled');
  }
}
