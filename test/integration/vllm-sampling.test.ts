import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { loadAdapterIntoVllm, withServedAdapter } from '../../activities/adapters';
import { classifyPolicyError, missingModelOf } from '../../activities/policy-client';
import { parseConfig, type PolicyConfig } from '../../lib/config/config';
import type { PromptObservationRef, SampledTokens, SampleInput } from '../../lib/episode/episode-types';
import type { Completion } from '../../lib/training/experience';
import { servedAdapterName } from '../../lib/serving/iteration-policy';
import { fakeLogprob, fakeTokenIds, toolCall } from '../../testing/fake-policy-server';
import { truncatedLogprob, VLLM_NEUTRAL } from '../../testing/fake-vllm-sampling';

/** The fake model's log-prob of `id` at `t` after temperature only (processed_logprobs, nothing cut): policy's 0.7. */
const scaled = (id: number, t: number, temperature = 0.7) => truncatedLogprob(fakeLogprob(id, t), { ...VLLM_NEUTRAL, temperature });
/** As the token blob keeps it (activities/policy-client.ts: 9 significant digits). */
const stored = (id: number, t: number) => Number(scaled(id, t).toPrecision(9));
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { failureOf } from '../helpers/application-failure';
import OpenAI from 'openai';

// `samplePolicy` called directly (outside a worker it has no cancellation signal) against the local server
// that keeps vLLM's contract: token ids and log-probs asked for and carried into the candidates, and a
// run's adapter loaded again when a restarted server has forgotten it.

let vllm: FakeVllmServer;
let root: string;
let blobs: BlobStore;
let control: ReturnType<typeof createControlActivities>;
let observation: PromptObservationRef;

const adapterDir = (run: string, version: number) => writeAdapterFolder(join(root, 'checkpoints'), run, version);

const policyFor = (model: string, extra: Partial<PolicyConfig> = {}): PolicyConfig =>
  parseConfig({ policy: { baseUrl: `${vllm.url}/v1`, model, temperature: 0.7, maxAttempts: 1, ...extra } }).policy;

function input(model: string, extra: Partial<SampleInput> = {}): SampleInput {
  return { policy: policyFor(model), n: 2, observation, history: [], ...extra };
}

async function tokensOf(c: Completion): Promise<SampledTokens> {
  assert.ok(c.tokensRef, 'the candidate carries its tokens');
  return blobs.getJson<SampledTokens>(c.tokensRef);
}

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'halo-vllm-sampling-'));
  blobs = new BlobStore(join(root, 'blobs'));
  control = createControlActivities(blobs);
  vllm = await startFakeVllmServer({ baseModel: 'base-model' });
  observation = {
    goal: 'Click on the "OK" button.',
    url: 'http://x/miniwob/click-button.html',
    step: 0,
    screenshotRef: await blobs.put(Buffer.from('\x89PNG fake'), 'png'),
    axtreeRef: await blobs.put('[4] button "OK" @(100,200)', 'txt'),
  };
});
after(async () => {
  await vllm?.close();
  rmSync(root, { recursive: true, force: true });
});

describe('samplePolicy: exact tokens', () => {
  test('asks for token ids and log-probs; the candidates carry them with the finish reason', async () => {
    const before = vllm.chats.length;
    const res = await control.samplePolicy(input('base-model'));
    const req = vllm.chats[before];
    assert.deepEqual([req.model, req.n, req.logprobs, req.returnTokenIds, req.returnTokensAsTokenIds], ['base-model', 2, true, true, true]);
    assert.equal(res.askedForTokens, true);
    assert.equal(res.candidates.length, 2);
    const text = `I will click the OK button.\n${toolCall({ action: 'left_click', coordinate: [100, 200] })}`;
    for (const c of res.candidates) {
      assert.ok(c.ref, 'the whole text is a blob');
      assert.equal((await blobs.get(c.ref)).toString('utf8'), text);
      assert.equal(c.action.type, 'click');
      assert.equal(c.finishReason, 'stop');
      // By reference: the ids and log-probs are a blob, so histories stay small.
      const t = await tokensOf(c);
      assert.deepEqual(t.token_ids, fakeTokenIds(text, 'stop'));
      assert.deepEqual(
        t.logprobs,
        t.token_ids.map((id, i) => stored(id, i)),
      );
    }
    assert.equal(res.adapterLoad, undefined, 'no adapter, no load');
  });

  test('a server older than 0.10.2 (no token_ids): the ids are read from the "token_id:N" strings', async () => {
    const old = await startFakeVllmServer({ baseModel: 'base-model', legacyTokens: true });
    try {
      const res = await control.samplePolicy({ ...input('base-model'), policy: parseConfig({ policy: { baseUrl: `${old.url}/v1`, model: 'base-model' } }).policy });
      const text = (await blobs.get(res.candidates[0].ref!)).toString('utf8');
      const t = await tokensOf(res.candidates[0]);
      assert.deepEqual(t.token_ids, fakeTokenIds(text, 'stop'));
      assert.equal(t.logprobs?.length, t.token_ids.length);
    } finally {
      await old.close();
    }
  });

  test('tokenIds off: no extension fields, candidates without ids (the learner retokenises)', async () => {
    const before = vllm.chats.length;
    const res = await control.samplePolicy({ ...input('base-model'), policy: policyFor('base-model', { tokenIds: 'off' }) });
    const req = vllm.chats[before];
    assert.deepEqual([req.logprobs, req.returnTokenIds, req.returnTokensAsTokenIds], [undefined, undefined, undefined]);
    assert.equal(res.askedForTokens, false);
    assert.ok(res.candidates.every((c) => c.tokensRef === undefined));
  });
});

describe('samplePolicy: seeded', () => {
  test("the request carries the seed as vLLM's `seed`; the same seed draws the same completions, another seed others", async () => {
    vllm.setMode({ kind: 'custom', answer: ({ random }) => toolCall({ action: 'type', element_id: 4, text: `draw ${Math.floor(random * 1e6)}` }) });
    const texts = async (seed?: number) => {
      const before = vllm.chats.length;
      const res = await control.samplePolicy({ ...input('base-model', { n: 4 }), ...(seed !== undefined ? { seed } : {}) });
      assert.equal(vllm.chats[before].seed, seed, 'the seed as sent');
      return Promise.all(res.candidates.map(async (c) => (await blobs.get(c.ref!)).toString('utf8')));
    };
    try {
      const first = await texts(11);
      assert.equal(new Set(first).size, 4, `one request's choices draw apart: ${first}`);
      assert.deepEqual(await texts(11), first);
      assert.notDeepEqual(await texts(12), first);
      await texts(undefined); // unseeded: no seed field at all
    } finally {
      vllm.setMode({ kind: 'scripted' });
    }
  });
});

describe('samplePolicy: adapters survive a vLLM restart', () => {
  const run = 'run-r';
  const adapter = (v: number) => ({ base_url: vllm.url, lora_name: servedAdapterName(run, v), lora_path: join(root, 'checkpoints', run, `v${v}`) });

  test('after a restart, sampling with <run>-v2 reloads it and answers in the same call', async () => {
    for (const v of [1, 2]) await loadAdapterIntoVllm({ base_url: `${vllm.url}/v1`, run_id: run, version: v, adapter_path: adapterDir(run, v), keep: 1 });
    // Loaded by this process: the first sample goes straight to the model.
    const before = vllm.requests.length;
    const warm = await control.samplePolicy(input('run-r-v2', { adapter: adapter(2) }));
    assert.equal(warm.adapterLoad, undefined);
    assert.deepEqual(
      vllm.requests.slice(before).map((r) => r.path),
      ['/v1/chat/completions'],
    );

    vllm.restart();
    assert.equal(vllm.adapters.size, 0);
    const mark = vllm.requests.length;
    const res = await control.samplePolicy(input('run-r-v2', { adapter: adapter(2) }));
    assert.equal(res.candidates.length, 2);
    for (const c of res.candidates) assert.ok((await tokensOf(c)).token_ids.length > 0);
    assert.equal(res.model, 'run-r-v2');
    assert.deepEqual(
      vllm.requests.slice(mark).map((r) => r.path),
      ['/v1/chat/completions', '/v1/load_lora_adapter', '/v1/chat/completions'],
      '404, reload, the same request again',
    );
    assert.deepEqual(vllm.requests.slice(mark)[1].body, { lora_name: 'run-r-v2', lora_path: adapter(2).lora_path });
    assert.deepEqual(vllm.unknownModels.slice(-1), ['run-r-v2']);
    assert.deepEqual(res.adapterLoad && [res.adapterLoad.requests, res.adapterLoad.reloaded], [1, true]);
    assert.deepEqual([...vllm.adapters.keys()], ['run-r-v2']);
  });

  test('an adapter this worker has not seen served is loaded before the request (idempotent: 400 counts as loaded)', async () => {
    adapterDir('run-s', 1);
    const mark = vllm.requests.length;
    const a = { base_url: vllm.url, lora_name: 'run-s-v1', lora_path: join(root, 'checkpoints', 'run-s', 'v1') };
    const res = await control.samplePolicy(input('run-s-v1', { adapter: a }));
    assert.deepEqual(
      vllm.requests.slice(mark).map((r) => r.path),
      ['/v1/load_lora_adapter', '/v1/chat/completions'],
    );
    assert.deepEqual(res.adapterLoad && [res.adapterLoad.requests, res.adapterLoad.reloaded], [1, false]);
    // Another name loaded elsewhere (e.g. another worker): "already loaded" is success.
    vllm.adapters.set('run-s-v9', adapterDir('run-s', 9));
    const res9 = await control.samplePolicy(input('run-s-v9', { adapter: { ...a, lora_name: 'run-s-v9', lora_path: join(root, 'checkpoints', 'run-s', 'v9') } }));
    assert.equal(res9.candidates.length, 2);
  });

  test("a model that is not this run's adapter stays a non-retryable rejection with vLLM's message", async () => {
    const mark = vllm.requests.length;
    const f = await failureOf(control.samplePolicy(input('no-such-model')));
    assert.equal(f.nonRetryable, true);
    assert.equal(f.type, 'PolicyRequestRejected');
    assert.match(f.message, /HTTP 404: 404 The model `no-such-model` does not exist\./);
    assert.deepEqual(
      vllm.requests.slice(mark).map((r) => r.path),
      ['/v1/chat/completions'],
      'nothing loaded, not repeated',
    );
    // An older run's adapter with no folder given: the same.
    vllm.restart();
    const g = await failureOf(control.samplePolicy(input('run-r-v1')));
    assert.equal(g.nonRetryable, true);
    assert.match(g.message, /The model `run-r-v1` does not exist/);
  });

  test('the adapter must be the sampled model; a folder that is gone is a non-retryable failure', async () => {
    const f = await failureOf(control.samplePolicy(input('run-r-v2', { adapter: adapter(1) })));
    assert.equal(f.type, 'InvalidInput');
    assert.equal(f.nonRetryable, true);
    vllm.restart();
    const gone = { base_url: vllm.url, lora_name: 'run-r-v7', lora_path: join(root, 'checkpoints', run, 'v7') };
    const g = await failureOf(control.samplePolicy(input('run-r-v7', { adapter: gone })));
    assert.equal(g.nonRetryable, true);
    assert.equal(g.type, 'VllmAdapterRejected');
    assert.match(g.message, /No adapter found for .*v7/);
  });

  test('forgotten again right after the reload: a retryable failure, so the next attempt loads again', async () => {
    const a = { base_url: vllm.url, lora_name: 'run-r-v2', lora_path: adapter(2).lora_path };
    const policy = policyFor('run-r-v2');
    let calls = 0;
    const missing = () => {
      calls++;
      vllm.restart(); // the server loses it between the load and the request
      return Promise.reject(classifyPolicyError(OpenAI.APIError.generate(404, { error: { message: 'The model `run-r-v2` does not exist.' } }, undefined, new Headers()), policy));
    };
    const f = await failureOf(withServedAdapter(a, missing, missingModelOf));
    assert.equal(calls, 2, 'one repeat within the attempt');
    assert.equal(f.type, 'VllmAdapterLost');
    assert.equal(f.nonRetryable, false);
  });
});

describe('the stand-in samples as vLLM 0.33 does', () => {
  const QWEN = 'Qwen/Qwen3-VL-8B-Instruct';
  const chat = (url: string, extra: Record<string, unknown> = {}) =>
    fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        model: QWEN,
        messages: [{ role: 'user', content: 'Goal: Click on the "OK" button.' }],
        max_tokens: 64,
        temperature: 0.7,
        logprobs: true,
        return_token_ids: true,
        ...extra,
      }),
    });
  type Answer = { prompt_token_ids?: number[]; choices: { token_ids: number[]; logprobs: { content: { logprob: number }[] } }[] };
  const logprobsOf = (a: Answer) => a.choices[0].logprobs.content.map((c) => c.logprob);
  const untruncated = (a: Answer) => a.choices[0].token_ids.map((id, t) => scaled(id, t));

  test("a request that leaves the distribution out is cut by the model's generation config (Qwen3-VL: top_k 20, top_p 0.8); pinned, or --generation-config vllm, it is not", async () => {
    const qwen = await startFakeVllmServer({ baseModel: QWEN });
    const plain = await startFakeVllmServer({ baseModel: QWEN, vllmGenerationConfig: true });
    try {
      const cut = (await (await chat(qwen.url)).json()) as Answer;
      assert.deepEqual([qwen.chats[0].sampling.top_k, qwen.chats[0].sampling.top_p, qwen.chats[0].sampling.temperature], [20, 0.8, 0.7]);
      assert.notDeepEqual(logprobsOf(cut), untruncated(cut), 'the log-probs of the cut distribution');
      assert.ok(logprobsOf(cut).every((lp, t) => lp >= untruncated(cut)[t]));
      // Our client's request states every field: the model's defaults do not apply.
      const res = await control.samplePolicy({ ...input(QWEN), policy: parseConfig({ policy: { baseUrl: `${qwen.url}/v1`, model: QWEN, maxAttempts: 1 } }).policy });
      assert.deepEqual(qwen.chats[1].sampling, { temperature: 0.7, top_p: 1, top_k: 0, min_p: 0, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 });
      const t = await tokensOf(res.candidates[0]);
      assert.deepEqual(
        t.logprobs,
        t.token_ids.map((id, i) => stored(id, i)),
      );
      // Started with --generation-config vllm: nothing applied.
      const neutral = (await (await chat(plain.url)).json()) as Answer;
      assert.deepEqual(logprobsOf(neutral), untruncated(neutral));
      assert.equal(plain.chats[0].sampling.top_k, 0);
    } finally {
      await qwen.close();
      await plain.close();
    }
  });

  test("sampling fields out of vLLM's ranges are refused with SamplingParams' messages; top_k -1 and 0 both mean off", async () => {
    const qwen = await startFakeVllmServer({ baseModel: QWEN });
    try {
      for (const [extra, message] of [
        [{ top_p: 0 }, /^top_p must be in \(0, 1\], got 0\.0\./],
        [{ top_p: 1.5 }, /^top_p must be in \(0, 1\], got 1\.5\./],
        [{ top_k: -2 }, /^top_k must be 0 \(disable\), or at least 1, got -2\.$/],
        [{ min_p: 1.5 }, /^min_p must be in \[0, 1\], got 1\.5\.$/],
        [{ presence_penalty: 3 }, /^presence_penalty must be in \[-2, 2\], got 3\.0\.$/],
        [{ repetition_penalty: 0 }, /^repetition_penalty must be greater than zero, got 0\.0\.$/],
      ] as const) {
        const res = await chat(qwen.url, extra);
        assert.equal(res.status, 400, JSON.stringify(extra));
        const body = (await res.json()) as { error: { message: string; type: string; code: number } };
        assert.match(body.error.message, message);
        assert.deepEqual([body.error.type, body.error.code], ['BadRequestError', 400]);
      }
      for (const top_k of [-1, 0]) assert.equal((await chat(qwen.url, { top_k })).status, 200, `top_k ${top_k}`);
      assert.equal(qwen.chats.length, 2, 'refused requests never reach the model');
    } finally {
      await qwen.close();
    }
  });

  test('processed log-probs follow the temperature (lower T, surer tokens); raw ones (vLLM default --logprobs-mode) do not', async () => {
    const processed = await startFakeVllmServer({ baseModel: 'base-model' });
    const raw = await startFakeVllmServer({ baseModel: 'base-model', rawLogprobs: true });
    try {
      const at = async (url: string, temperature: number) => (await (await chat(url, { model: 'base-model', temperature })).json()) as Answer;
      const [hot, cold] = [await at(processed.url, 1), await at(processed.url, 0.5)];
      assert.deepEqual(hot.choices[0].token_ids, cold.choices[0].token_ids);
      assert.deepEqual(
        logprobsOf(hot),
        untruncated(hot).map((_, t) => fakeLogprob(hot.choices[0].token_ids[t], t)),
      );
      assert.ok(logprobsOf(cold).every((lp, t) => lp > logprobsOf(hot)[t] && lp === scaled(cold.choices[0].token_ids[t], t, 0.5)));
      assert.deepEqual(logprobsOf(await at(raw.url, 0.5)), logprobsOf(hot));
    } finally {
      await processed.close();
      await raw.close();
    }
  });

  test('-9999 placeholders reach the token blob as null (counted, no log-prob sum); the prompt ids are one blob per request', async () => {
    const holes = await startFakeVllmServer({ baseModel: 'base-model', logprobPlaceholders: 0.25 });
    try {
      const policy = parseConfig({ policy: { baseUrl: `${holes.url}/v1`, model: 'base-model', maxAttempts: 1 } }).policy;
      const res = await control.samplePolicy({ ...input('base-model'), policy });
      const t = await tokensOf(res.candidates[0]);
      const nulls = t.logprobs!.filter((lp) => lp === null).length;
      assert.equal(nulls, Math.floor(t.token_ids.length * 0.25));
      assert.ok(t.logprobs!.every((lp, i) => lp === null || lp === stored(t.token_ids[i], i)));
      assert.equal(res.candidates[0].logprobSum, undefined);
      // Both candidates reference the one prompt-ids blob of the request; the same prompt again, the same blob.
      assert.ok(t.prompt_ref);
      assert.equal((await tokensOf(res.candidates[1])).prompt_ref, t.prompt_ref);
      const ids = await blobs.getJson<{ prompt_token_ids: number[] }>(t.prompt_ref!);
      assert.ok(ids.prompt_token_ids.length > 0);
      const again = await control.samplePolicy({ ...input('base-model'), policy });
      assert.equal((await tokensOf(again.candidates[0])).prompt_ref, t.prompt_ref);
    } finally {
      await holes.close();
    }
    await assert.rejects(startFakeVllmServer({ logprobPlaceholders: 1.5 }), /logprobPlaceholders/);
  });
});
