import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { learnerCommand } from '../../client/processes';
import { startOrAttachTrain } from '../../client/train';
import { samplingSeed } from '../../lib/serving/iteration-policy';
import { isGrpoMetrics, parseMetricsJsonl } from '../../lib/training/run-metrics';
import { drawKey } from '../../lib/training/training-plan';
import type { TrainingResult } from '../../workflows/train-engine';
import { toolCall } from '../../testing/fake-policy-server';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { stackGrpoConfig } from '../../testing/grpo-config';
import { startTestStack, type TestStack } from '../../testing/stack';
import { tinyTokenizer } from '../helpers/tiny-tokenizer';

// A served, constrained GRPO run end to end: the vLLM stand-in started as compose starts vLLM 0.33
// (disable_any_whitespace: compact `,`/`:` JSON, processed log-probs) answering in the tiny model's ids, the real
// learner updating on what it sampled. Every completion must pass the learner's grammar check (a GrammarMismatch
// fails the update and so the run), and the update must take the decoupled objective: the stand-in's log-probs are
// another engine's, and clipped against them the tokens the engines disagree on lose their gradient. The first
// batch is also replayed through a plain update (no stale_weight_cap: what a served run sent before), so the two
// objectives' clip fractions are measured on the same samples from the same weights.
const exec = promisify(execFile);
const RUN = 'served-grpo';
const BASE = 'Qwen/Qwen3-VL-8B-Instruct';
let stack: TestStack;
let vllm: FakeVllmServer;

before(async () => {
  stack = await startTestStack({ browserWorkers: 1, learner: true });
  vllm = await startFakeVllmServer({
    baseModel: BASE,
    disableAnyWhitespace: true,
    tokenizer: tinyTokenizer(stack.home),
    // Candidate 0 clicks the button the goal names, candidate 1 waits: rewards differ, the group carries signal.
    mode: {
      kind: 'custom',
      answer: ({ goal, tree, choice }) => {
        const name = /Click on the "(.+?)" button/i.exec(goal)?.[1];
        const target = tree.find((l) => l.role === 'button' && l.name === name);
        return choice === 0 && target ? toolCall({ action: 'left_click', coordinate: [target.x, target.y] }) : toolCall({ action: 'wait', time: 0 });
      },
    },
  });
});
after(async () => {
  await stack?.stop();
  await vllm?.close();
});

/** The learner's update of `batchRef` as version 1 of `runId` from the base weights, in a process of its own. */
async function replayUpdate(runId: string, batchRef: string, hyperparameters: Record<string, unknown>): Promise<Record<string, number>> {
  const code = `
import json, sys
from pathlib import Path
from halo_learner import adapters
from halo_learner.blobs import BlobStore
from halo_learner.learner import Learner
from halo_learner.models import load_policy
from halo_learner.paths import blob_root
from halo_learner.payloads import UpdatePolicyInput
a = json.load(sys.stdin)
learner = Learner(load_policy("tiny-random"), blobs=BlobStore(blob_root()), checkpoints=Path(a["checkpoints"]))
out = learner.update_policy(UpdatePolicyInput(run_id=a["run_id"], version=1, batch_ref=a["batch_ref"], hyperparameters=a["hp"]))
print(json.dumps(adapters.read_manifest(Path(out.adapter_path))["metrics"]))
`;
  const { command, env } = learnerCommand({ ...process.env, HALO_HOME: stack.home, HALO_MODEL: 'tiny-random', HF_HUB_OFFLINE: '1' });
  const child = exec(command, ['-c', code], { env, maxBuffer: 16 << 20, timeout: 300_000 });
  child.child.stdin?.end(JSON.stringify({ run_id: runId, batch_ref: batchRef, hp: hyperparameters, checkpoints: join(stack.home, 'replay-checkpoints') }));
  const { stdout } = await child;
  return JSON.parse(stdout.trim().split('\n').at(-1) ?? '{}');
}

test('a served constrained GRPO run updates on vLLM 0.33 compact completions under the decoupled objective', async () => {
  const cfg = stackGrpoConfig(stack, {
    runId: RUN,
    iterations: 2,
    maxSteps: 1,
    policy: { backend: 'openai', baseUrl: `${vllm.url}/v1`, model: BASE, constrained: true, timeoutMs: 30_000, maxTokens: 128 },
    train: { vllmBaseUrl: `${vllm.url}/v1`, learnerHeartbeatTimeoutS: 120 },
  });
  assert.equal(cfg.policy.grammarWhitespace, 'compact');
  assert.equal(cfg.policy.server, 'vllm-0.33');
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  const result = (await handle.result().catch((err: unknown) => {
    const why: string[] = [];
    for (let e = err as { message?: string; cause?: unknown } | undefined; e; e = e.cause as typeof e) why.push(String(e.message));
    throw new Error(why.join(' <- '));
  })) as TrainingResult;
  assert.deepEqual(result, { runId: RUN, iterations: 2, adapterVersion: 2, stoppedEarly: false });

  // The stand-in wrote vLLM 0.33's compact JSON, and what it wrote is what was trained on.
  const chats = vllm.requests.filter((r) => r.path === '/v1/chat/completions');
  assert.ok(chats.length >= 2 && chats.every((r) => (r.body as { structured_outputs?: unknown }).structured_outputs !== undefined));
  // Each step group's request is seeded from the run (no seed: its id), iteration, episode and draw, as colocated.
  assert.deepEqual(
    chats.map((r) => (r.body as { seed?: number }).seed),
    [1, 2].map((it) => samplingSeed(drawKey(RUN, it, 0), 'step 1 draw 0', 2)),
  );
  const lines = parseMetricsJsonl(readFileSync(join(stack.home, RUN, 'metrics.jsonl'), 'utf8')).filter(isGrpoMetrics);
  assert.deepEqual(
    lines.map((l) => l.adapter_version),
    [1, 2],
  );
  for (const l of lines) {
    assert.ok((l.tokens ?? 0) > 0, 'the update trained on tokens');
    assert.equal(l.retokenized ?? 0, 0, 'every completion came with its token ids');
    assert.equal(l.unknown_logprobs ?? 0, 0);
    // The stand-in encodes prompts with the model's own processor, as vLLM does: the learner's encoding agrees, so no
    // item is dropped for its prompt.
    assert.equal(l.prompt_mismatch_rate, 0, "the server encoded every prompt to the learner's ids");
  }
  assert.ok((lines[0].reward_std ?? 0) > 0, 'the first group carried signal');

  // The first update, decoupled: clipped to the learner's own log-probs (nothing clipped before the step), the
  // stand-in's log-probs in the capped importance weight.
  const served = JSON.parse(readFileSync(join(stack.checkpoints, RUN, 'v1', 'manifest.json'), 'utf8')) as {
    batch_ref: string;
    metrics: Record<string, number> & { hyperparameters: Record<string, unknown> };
  };
  const m = served.metrics;
  assert.equal(m.hyperparameters.stale_weight_cap, cfg.train.staleWeightCap, 'a served run sends the cap');
  assert.equal(m.clip_fraction, 0);
  assert.equal(lines[0].clip_fraction, 0);
  assert.ok(m.ratio_tokens > 0 && Number.isFinite(m.mean_abs_log_ratio) && m.mean_abs_log_ratio > 0);

  // The same batch from the same base weights under the plain clip against the stand-in's log-probs.
  const { stale_weight_cap: _, ...plainHp } = m.hyperparameters;
  const plain = await replayUpdate(`${RUN}-plain`, served.batch_ref, plainHp);
  console.log(
    `first update on the served path: ${m.ratio_tokens} tokens, mean |log-ratio| to the sampler ${m.mean_abs_log_ratio.toFixed(4)} ` +
      `(max ${m.max_abs_log_ratio.toFixed(4)}); clip fraction plain ${plain.clip_fraction.toFixed(4)}, decoupled ${m.clip_fraction.toFixed(4)} ` +
      `(weights at the cap ${m.capped_fraction.toFixed(4)}); grad_norm plain ${plain.grad_norm.toFixed(6)}, decoupled ${m.grad_norm.toFixed(6)}`,
  );
  assert.equal(plain.ratio_tokens, m.ratio_tokens);
  assert.ok(Math.abs(plain.mean_abs_log_ratio - m.mean_abs_log_ratio) < 1e-4, 'both measured from the same weights');
  assert.ok(plain.clip_fraction > 0, 'the plain clip drops tokens on which the engines disagree');
});
