import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { deflateSync } from 'node:zlib';
import { ApplicationFailure } from '@temporalio/common';
import { NativeConnection, Worker } from '@temporalio/worker';
import { BlobStore } from '../../blob/store';
import { buildPrompt } from '../../lib/model-io/prompt';
import { DpoBatchSchema, GrpoBatchSchema, LEARNER_SCHEMAS, PromptSchema } from '../../lib/training/learner-types';
import { createLearnerBatchActivities } from '../../activities/learner-batches';
import { learnerCommand } from '../../client/processes';
import { learnerContract, type LearnerContractInput, type LearnerContractResult } from '../test-workflows/learner-contract';
import { startTestStack, type TestStack } from '../../testing/stack';

// The cross-language contract: the zod schemas against the pydantic models (field by field, and the same
// verdict on the same payloads), then every learner activity through the real gpu task queue with the real
// Python worker (tiny-random Qwen3-VL), with a prompt from our prompt builder and a real PNG screenshot.
// The learnerContract workflow is test code: this file runs it on a worker of its own, not the control worker.
const exec = promisify(execFile);
let stack: TestStack;

before(async () => {
  stack = await startTestStack({ browserWorkers: 0, control: false, learner: true });
});
after(async () => {
  await stack?.stop();
});

/** Runs a Python snippet with halo_learner importable; stdin → stdout JSON. */
async function python(code: string, input: unknown): Promise<unknown> {
  const { command, env } = learnerCommand();
  const child = exec(command, ['-c', code], { env, maxBuffer: 16 << 20, timeout: 60_000 });
  child.child.stdin?.end(JSON.stringify(input));
  const { stdout } = await child;
  return JSON.parse(stdout);
}

// ---- schemas ---------------------------------------------------------------------------------------

// The pydantic models are generated from the zod schemas (test/unit/learner-schema.test.ts keeps payloads.py
// current); what is written twice is the refines (payload_rules.py), judged here on the same payloads.

/** Payloads judged by both sides: same verdict, and for valid ones the same parsed value (defaults filled). */
const IMG = `sha256:${'a'.repeat(64)}.png`;
const TOKENS = `sha256:${'c'.repeat(64)}.json`;
const PROMPT = [
  { role: 'system', content: [{ type: 'text', text: 'sys' }] },
  {
    role: 'user',
    content: [
      { type: 'image', ref: IMG },
      { type: 'text', text: 'goal' },
    ],
  },
];
const CASES: { model: keyof typeof LEARNER_SCHEMAS; payload: unknown; valid: boolean }[] = [
  { model: 'GrpoItem', payload: { prompt: PROMPT, completion: 'x', advantage: 0.5 }, valid: true },
  { model: 'GrpoItem', payload: { prompt: PROMPT, completion: 'x', advantage: 1, tokens_ref: TOKENS, finish_reason: 'length' }, valid: true },
  { model: 'GrpoItem', payload: { prompt: PROMPT, completion: 'x', advantage: 1, tokens_ref: null }, valid: true },
  { model: 'GrpoItem', payload: { prompt: PROMPT, completion: 'x', advantage: 1, tokens_ref: 'sha256:t' }, valid: false },
  // Token arrays never travel in a batch: the learner reads them from the sampler's blob.
  { model: 'GrpoItem', payload: { prompt: PROMPT, completion: 'x', advantage: 1, completion_token_ids: [1, 2], old_logprobs: [-0.1, -2] }, valid: false },
  { model: 'SampledTokens', payload: { token_ids: [1, 2], logprobs: [-0.1, -2] }, valid: true },
  { model: 'SampledTokens', payload: { token_ids: [1, 2], logprobs: [-0.1, -2], grammar_ref: 'sha256:g' }, valid: true },
  { model: 'SampledTokens', payload: { token_ids: [3] }, valid: true },
  { model: 'SampledTokens', payload: { token_ids: [] }, valid: false },
  { model: 'SampledTokens', payload: { token_ids: [1, 2], logprobs: [-1] }, valid: false },
  { model: 'SampledTokens', payload: { token_ids: [1, -2] }, valid: false },
  { model: 'SampledTokens', payload: { token_ids: [1], logprobs: [-1], text: 'x' }, valid: false },
  { model: 'GrpoItem', payload: { prompt: PROMPT, completion: 'x', advantage: 1, adv: 2 }, valid: false },
  { model: 'GrpoItem', payload: { prompt: [], completion: 'x', advantage: 1 }, valid: false },
  { model: 'GrpoBatch', payload: { items: [] }, valid: false },
  { model: 'GrpoBatch', payload: { items: [{ prompt: PROMPT, completion: '', advantage: -1 }], max_completion_len: 8 }, valid: true },
  { model: 'GrpoBatch', payload: { items: [{ prompt: PROMPT, completion: '', advantage: -1 }], max_completion_len: 0 }, valid: false },
  { model: 'GrpoHyperparameters', payload: {}, valid: true },
  { model: 'GrpoHyperparameters', payload: { loss_type: 'grpo' }, valid: false },
  { model: 'GrpoHyperparameters', payload: { clip_epsilon: 1 }, valid: false },
  { model: 'GrpoHyperparameters', payload: { kl_coef: 0 }, valid: true },
  { model: 'GrpoHyperparameters', payload: { stale_weight_cap: 5 }, valid: true },
  { model: 'GrpoHyperparameters', payload: { stale_weight_cap: null }, valid: true },
  { model: 'GrpoHyperparameters', payload: { stale_weight_cap: 0 }, valid: false },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r-1.a_b', version: 1, batch_ref: 'x' }, valid: true },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r 1', version: 1, batch_ref: 'x' }, valid: false },
  // A run id names the learner's checkpoint folder: one path component, never '..' (zod accepted it before generation).
  { model: 'UpdatePolicyInput', payload: { run_id: '..', version: 1, batch_ref: 'x' }, valid: false },
  { model: 'PromptTokenIds', payload: { prompt_token_ids: [1, 2] }, valid: true },
  { model: 'PromptTokenIds', payload: { prompt_token_ids: [] }, valid: false },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r', version: 0, batch_ref: 'x' }, valid: false },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r', version: 2, batch_ref: 'x', hyperparameters: { learning_rate: 1e-5 } }, valid: true },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r', version: 2, batch_ref: 'x', hyperparameters: { lr: 1e-5 } }, valid: false },
  { model: 'DpoPair', payload: { prompt: PROMPT, chosen: 'a', rejected: 'b' }, valid: true },
  { model: 'DpoPair', payload: { prompt: PROMPT, chosen: 'a', rejected: 'b', ref_chosen_logprob: -1 }, valid: false },
  { model: 'DpoPair', payload: { prompt: PROMPT, chosen: 'a', rejected: 'b', ref_chosen_logprob: -1, ref_rejected_logprob: -2 }, valid: true },
  { model: 'DpoPair', payload: { prompt: PROMPT, chosen: 'a', rejected: 'b', chosen_tokens_ref: TOKENS, rejected_tokens_ref: null }, valid: true },
  { model: 'DpoPair', payload: { prompt: PROMPT, chosen: 'a', rejected: 'b', chosen_tokens_ref: 'tokens' }, valid: false },
  { model: 'UpdateDpoInput', payload: { run_id: 'r', version: 3, batch_ref: 'x', hyperparameters: { beta: 0 } }, valid: false },
  { model: 'SampleActionsInput', payload: { run_id: 'r', prompt_ref: 'p' }, valid: true },
  { model: 'SampleActionsInput', payload: { run_id: 'r', prompt_ref: 'p', n: 65 }, valid: false },
  { model: 'SampleActionsInput', payload: { run_id: 'r', prompt_ref: 'p', version: -1 }, valid: false },
  { model: 'SampleActionsInput', payload: { run_id: 'r', prompt_ref: 'p', temperature: 0, seed: 3 }, valid: true },
  { model: 'SampleActionsInput', payload: { run_id: 'r', prompt_ref: 'p', store_tokens: true }, valid: true },
  { model: 'Completion', payload: { text: 'x', token_ids: [1], logprobs: [-1], finish_reason: 'stop' }, valid: true },
  { model: 'Completion', payload: { text: 'x', tokens_ref: 'sha256:t', finish_reason: 'stop' }, valid: true },
  { model: 'Completion', payload: { text: 'x', finish_reason: 'stop' }, valid: false },
  { model: 'Completion', payload: { text: 'x', token_ids: [1], logprobs: [-1], tokens_ref: 'sha256:t', finish_reason: 'stop' }, valid: false },
  { model: 'Completion', payload: { text: 'x', token_ids: [1], finish_reason: 'length' }, valid: false },
  { model: 'ImagePart', payload: { type: 'image', ref: 'sha256:abc.png' }, valid: false },
  { model: 'PromptMessage', payload: { role: 'tool', content: [{ type: 'text', text: 'x' }] }, valid: false },
  { model: 'PromptMessage', payload: { role: 'assistant', content: [] }, valid: false },
  { model: 'Completion', payload: { text: 'a', token_ids: [1], logprobs: [-0.5], finish_reason: 'eos' }, valid: false },
  {
    model: 'UpdateDpoOutput',
    payload: { run_id: 'r', version: 1, adapter_path: '/a', loss: 0.7, grad_norm: 1, tokens: 3, seconds: 0.1, reused: false, reward_margin: 0, accuracy: 0.5 },
    valid: true,
  },
  { model: 'UpdatePolicyOutput', payload: { run_id: 'r', version: 1, adapter_path: '/a', loss: 0.7, grad_norm: 1, tokens: 3, seconds: 0.1, reused: false }, valid: false },
  {
    model: 'UpdatePolicyOutput',
    payload: { run_id: 'r', version: 1, adapter_path: '/a', loss: 0.7, grad_norm: 1, tokens: 3, seconds: 0.1, reused: false, retokenized: 0, token_mismatch_rate: 0 },
    valid: true,
  },
  {
    model: 'UpdatePolicyOutput',
    payload: {
      run_id: 'r',
      version: 1,
      adapter_path: '/a',
      loss: 0.7,
      grad_norm: 1,
      tokens: 3,
      seconds: 0.1,
      reused: false,
      retokenized: 0,
      token_mismatch_rate: 0,
      kl: 0.01,
      clip_fraction: 0.1,
      mean_ratio: 1.02,
      ratio_tokens: 3,
      entropy: 1.5,
      denominator: 2048,
      micro_batch: 4,
    },
    valid: true,
  },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r', version: 1, batch_ref: 'x', base_model: 'Qwen/Qwen3-VL-8B-Instruct' }, valid: true },
  { model: 'UpdatePolicyInput', payload: { run_id: 'r', version: 1, batch_ref: 'x', base_model: '' }, valid: false },
  { model: 'UpdateDpoInput', payload: { run_id: 'r', version: 1, batch_ref: 'x', base_model: 'tiny-random' }, valid: true },
  { model: 'SampleActionsInput', payload: { run_id: 'r', prompt_ref: 'p', base_model: 'tiny-random' }, valid: true },
];

const PY_CASES = `
import json, sys
from pydantic import ValidationError
from halo_learner import payloads
out = []
for c in json.load(sys.stdin):
    try:
        out.append({"ok": True, "value": getattr(payloads, c["model"]).model_validate(c["payload"]).model_dump(mode="json")})
    except ValidationError as e:
        out.append({"ok": False, "error": str(e).splitlines()[0:3]})
print(json.dumps(out))
`;

describe('learner contract: zod (lib/training/learner-types.ts, lib/training/experience.ts) = pydantic (halo_learner/payloads.py)', () => {
  test('the same payloads are accepted and rejected on both sides, with the same defaults', async () => {
    const py = (await python(PY_CASES, CASES)) as { ok: boolean; value?: unknown; error?: string[] }[];
    CASES.forEach((c, i) => {
      const ts = LEARNER_SCHEMAS[c.model].safeParse(c.payload);
      const where = `${c.model} ${JSON.stringify(c.payload)}`;
      assert.equal(py[i].ok, c.valid, `pydantic on ${where}: ${py[i].error?.join(' ')}`);
      assert.equal(ts.success, c.valid, `zod on ${where}: ${ts.error?.message}`);
      if (c.valid) assert.deepEqual(ts.data, py[i].value, `parsed value of ${where}`);
    });
    // A strict zod object also rejects unknown keys (extra="forbid"): one spot check per kind of model.
    assert.equal(LEARNER_SCHEMAS.SampleActionsOutput.safeParse({ completions: [], model: 'm', version: 0, seconds: 0, extra: 1 }).success, false);
  });

  test('what the prompt builder writes is a valid learner prompt', () => {
    const prompt = buildPrompt({ goal: 'g', url: 'u', axtree: '', step: 0, screenshotRef: IMG }, [{ step: 0, action: 'click(1)' }], 5);
    assert.equal(PromptSchema.safeParse(prompt).success, true);
  });
});

// ---- the real round trip ---------------------------------------------------------------------------

/** A small real PNG (RGB, a page with a header bar and a button), encoded here: signature, IHDR, IDAT, IEND. */
function screenshotPng(width = 320, height = 200): Buffer {
  const raw = Buffer.alloc((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) {
    const row = y * (width * 3 + 1);
    raw[row] = 0; // filter: none
    for (let x = 0; x < width; x++) {
      let rgb = [255, 255, 255];
      if (y < 24) rgb = [60, 60, 70];
      else if (x >= 120 && x < 200 && y >= 100 && y < 130) rgb = [30, 110, 230];
      else if ((x + y) % 40 === 0) rgb = [230, 230, 230];
      raw.set(rgb, row + 1 + x * 3);
    }
  }
  const chunk = (type: string, data: Buffer) => {
    const len = Buffer.alloc(4);
    len.writeUInt32BE(data.length);
    const td = Buffer.concat([Buffer.from(type, 'ascii'), data]);
    const crc = Buffer.alloc(4);
    crc.writeUInt32BE(crc32(td));
    return Buffer.concat([len, td, crc]);
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr[8] = 8; // bit depth
  ihdr[9] = 2; // colour type: RGB
  return Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), chunk('IHDR', ihdr), chunk('IDAT', deflateSync(raw)), chunk('IEND', Buffer.alloc(0))]);
}

function crc32(buf: Buffer): number {
  let c = ~0;
  for (const b of buf) {
    c ^= b;
    for (let k = 0; k < 8; k++) c = (c >>> 1) ^ (0xedb88320 & -(c & 1));
  }
  return ~c >>> 0;
}

describe('learner contract: learnerContract workflow through the real gpu task queue', () => {
  test('GRPO v1, sampling with v1, DPO v2, idempotent repeat of v1, GRPO v3 from sampled tokens', async () => {
    const blobs = new BlobStore(join(stack.home, 'blobs'));
    const screenshotRef = await blobs.put(screenshotPng(), 'png');
    const axtree = '[1] heading "Form" @(500,60)\n[2] button "Submit" @(500,575)\n[3] textbox "Name" @(500,400)';
    const prompt = buildPrompt(
      { goal: 'Click on the "Submit" button.', url: 'http://localhost:8000/miniwob/click-button.html', axtree, step: 1, screenshotRef },
      [{ step: 0, action: 'click_element(3)', note: 'nothing happened' }],
      5,
    );
    const promptRef = await blobs.putJson(prompt);
    const runId = `contract-${Date.now().toString(36)}`;
    const n = 3;
    const input: LearnerContractInput = { runId, promptRef, gpuTaskQueue: stack.gpuQueue, n, maxTokens: 12, seed: 7, learnerTimeout: '3m' };

    const taskQueue = `learner-contract-${runId}`;
    const connection = await NativeConnection.connect({ address: stack.address });
    let r: LearnerContractResult;
    try {
      const worker = await Worker.create({
        connection,
        namespace: stack.namespace,
        taskQueue,
        workflowsPath: require.resolve('../test-workflows/learner-contract'),
        // The workflow writes its batches through activities on its own queue.
        activities: createLearnerBatchActivities(blobs),
      });
      r = await worker.runUntil(stack.client.workflow.execute(learnerContract, { taskQueue, workflowId: `learner-contract-${runId}`, args: [input] }));
    } finally {
      await connection.close();
    }

    const adapter = (v: number) => join(stack.checkpoints, runId, `v${v}`);
    const assertAdapter = (v: number, parent: number, kind: string) => {
      for (const f of ['adapter_config.json', 'adapter_model.safetensors', 'manifest.json']) {
        assert.ok(existsSync(join(adapter(v), f)), `v${v}/${f} exists`);
      }
      const manifest = JSON.parse(readFileSync(join(adapter(v), 'manifest.json'), 'utf8'));
      assert.deepEqual([manifest.run_id, manifest.version, manifest.parent_version, manifest.kind], [runId, v, parent, kind]);
    };
    const finite = (x: number, what: string) => assert.ok(Number.isFinite(x), `${what} = ${x} is finite`);

    // update_policy v1 from text: both completions retokenised by the learner.
    assert.equal(r.grpo.run_id, runId);
    assert.equal(r.grpo.version, 1);
    assert.equal(r.grpo.reused, false);
    assert.equal(r.grpo.adapter_path, adapter(1));
    finite(r.grpo.loss, 'grpo loss');
    finite(r.grpo.grad_norm, 'grpo grad_norm');
    assert.ok(r.grpo.grad_norm > 0, 'a non-zero advantage gives a gradient');
    assert.ok(r.grpo.tokens > 0);
    assert.equal(r.grpo.retokenized, 2);
    assert.ok(r.grpo.token_mismatch_rate >= 0 && r.grpo.token_mismatch_rate <= 1);
    assertAdapter(1, 0, 'grpo');

    // sample_actions with v1: n completions, token ids and log-probs aligned.
    assert.equal(r.sample.version, 1);
    assert.equal(r.sample.model, 'tiny-random');
    assert.equal(r.sample.completions.length, n);
    for (const c of r.sample.completions) {
      assert.ok(c.token_ids && c.logprobs && c.tokens_ref == null, 'inline unless asked to store');
      assert.ok(c.token_ids.length >= 1 && c.token_ids.length <= 12);
      assert.equal(c.logprobs.length, c.token_ids.length);
      assert.ok(c.logprobs.every((lp) => Number.isFinite(lp) && lp <= 0));
      assert.ok(c.finish_reason === 'stop' || c.finish_reason === 'length');
    }
    // store_tokens: the same seeded draw, its tokens in one blob per completion and nothing inline.
    assert.equal(r.stored.completions.length, n);
    for (const [i, c] of r.stored.completions.entries()) {
      const inline = r.sample.completions[i];
      assert.equal(c.text, inline.text);
      assert.ok(c.token_ids == null && c.logprobs == null && c.tokens_ref, `completion ${i} by reference only`);
      assert.deepEqual(await blobs.getJson(c.tokens_ref), { token_ids: inline.token_ids, logprobs: inline.logprobs, grammar_ref: null, prompt_ref: null });
      // The sum travels inline both ways (MCTS's DPO reference log-prob).
      const sum = inline.logprobs!.reduce((a, b) => a + b, 0);
      assert.ok(Math.abs(c.logprob_sum! - sum) < 1e-6 && Math.abs(inline.logprob_sum! - sum) < 1e-6, `${c.logprob_sum} ${inline.logprob_sum} ${sum}`);
    }

    // update_dpo v2 from v1.
    assert.equal(r.dpo.version, 2);
    assert.equal(r.dpo.reused, false);
    assert.equal(r.dpo.adapter_path, adapter(2));
    finite(r.dpo.loss, 'dpo loss');
    finite(r.dpo.grad_norm, 'dpo grad_norm');
    finite(r.dpo.reward_margin, 'dpo reward_margin');
    assert.ok(r.dpo.accuracy >= 0 && r.dpo.accuracy <= 1);
    assertAdapter(2, 1, 'dpo');

    // update_policy v1 again: the adapter already written, no second gradient step.
    assert.equal(r.repeat.reused, true);
    assert.equal(r.repeat.version, 1);
    assert.equal(r.repeat.adapter_path, r.grpo.adapter_path);
    assert.equal(r.repeat.loss, r.grpo.loss);
    assert.equal(r.repeat.grad_norm, r.grpo.grad_norm);
    assert.equal(r.repeat.retokenized, r.grpo.retokenized);

    // update_policy v3 from v2 with the sampler's own tokens, read by the learner from their blobs: nothing retokenised.
    assert.equal(r.tokens.version, 3);
    assert.equal(r.tokens.reused, false);
    assert.equal(r.tokens.retokenized, 0);
    assert.equal(r.tokens.token_mismatch_rate, 0);
    finite(r.tokens.loss, 'token-batch loss');
    assertAdapter(3, 2, 'grpo');

    // The stored batches are exactly what the learner validated: full inline prompts, defaults filled in.
    const grpoBatch = GrpoBatchSchema.parse(await blobs.getJson(r.grpoBatchRef));
    assert.equal(grpoBatch.items.length, 2);
    assert.deepEqual(grpoBatch.items[0].prompt, prompt);
    const dpoBatch = DpoBatchSchema.parse(await blobs.getJson(r.dpoBatchRef));
    assert.equal(dpoBatch.pairs[0].rejected, r.sample.completions[0].text);
    const tokenBatch = GrpoBatchSchema.parse(await blobs.getJson(r.tokenBatchRef));
    assert.deepEqual(
      tokenBatch.items.map((it) => it.tokens_ref),
      r.stored.completions.map((c) => c.tokens_ref),
    );
    assert.ok(r.tokens.ratio_tokens! > 0, 'the sampler log-probs in the blobs were paired with their tokens');

    // Only references travel through Temporal: no payload in the history comes near the blobs' size.
    const history = await stack.client.workflow.getHandle(`learner-contract-${runId}`).fetchHistory();
    const largest = Math.max(...(history.events ?? []).map((e) => JSON.stringify(e).length));
    assert.ok(largest < 64_000, `largest history event ${largest} bytes`);
  });

  test('a batch that breaks the contract fails in the writer, non-retryable, naming the field', async () => {
    const acts = createLearnerBatchActivities(new BlobStore(join(stack.home, 'blobs')));
    const prompt = buildPrompt({ goal: 'g', url: 'u', axtree: '', step: 0, screenshotRef: IMG }, [], 0);
    const cases: [Promise<unknown>, RegExp][] = [
      [acts.writeGrpoBatch({ items: [{ prompt, completion: 'x', advantage: Number.NaN }] }), /items\.0\.advantage/],
      [acts.writeGrpoBatch({ items: [{ prompt, completion: 'x', advantage: 1, tokens_ref: 'sha256:t' }] }), /items\.0\.tokens_ref: not a blob reference/],
      [acts.writeGrpoBatch({ items: [] }), /items: /],
      [acts.writeDpoBatch({ pairs: [{ prompt, chosen: 'a', rejected: 'b', ref_chosen_logprob: -1 }] }), /give both ref_chosen_logprob and ref_rejected_logprob/],
      [acts.writeDpoBatch({ pairs: [{ prompt_ref: `sha256:${'b'.repeat(64)}.json`, chosen: 'a', rejected: 'b' }] }), /pairs\.0\.prompt_ref: blob .* not found/],
    ];
    for (const [p, re] of cases) {
      const err = await p.then(
        () => undefined,
        (e: unknown) => e,
      );
      assert.ok(err instanceof ApplicationFailure, String(err));
      assert.equal(err.nonRetryable, true);
      assert.match(err.message, re);
    }
  });
});
