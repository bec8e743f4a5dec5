import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import OpenAI from 'openai';
import { ApplicationFailure } from '@temporalio/common';
import { chatCompletions, classifyPolicyError, missingModelOf, NEUTRAL_SAMPLING, sampledTokens, vllmLike, wantsTokenIds } from '../../activities/policy-client';
import { parseConfig, type PolicyConfig } from '../../lib/config/config';
import { fakeLogprob, fakeTokenIds, startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { truncatedLogprob } from '../../testing/fake-vllm-sampling';

let fake: FakePolicyServer;
before(async () => {
  fake = await startFakePolicyServer({ kind: 'custom', answer: ({ choice }) => `answer ${choice}` });
});
after(async () => fake?.close());

const policyAt = (baseUrl: string, extra: Partial<PolicyConfig> = {}): PolicyConfig => parseConfig({ policy: { baseUrl, model: 'm', ...extra } }).policy;
const user: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [{ role: 'user', content: 'hi' }];

test('token ids come from token_ids, else from "token_id:N" strings; log-probs pair with them or are dropped', () => {
  const content = (tokens: string[], lps: number[]) => ({ content: tokens.map((token, i) => ({ token, logprob: lps[i], bytes: [], top_logprobs: [] })) });
  const choice = (extra: object) => ({ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'x', refusal: null }, logprobs: null, ...extra }) as never;
  assert.deepEqual(sampledTokens(choice({ token_ids: [5, 6], logprobs: content(['a', 'b'], [-0.1, -0.2]) })), { tokenIds: [5, 6], logprobs: [-0.1, -0.2] });
  // A server older than 0.10.2: no token_ids, the ids are in the token strings (return_tokens_as_token_ids).
  assert.deepEqual(sampledTokens(choice({ logprobs: content(['token_id:7', 'token_id:2'], [-0.5, -0.25]) })), { tokenIds: [7, 2], logprobs: [-0.5, -0.25] });
  // Token strings that are text: log-probs only (the learner retokenises and pairs them if the count agrees).
  assert.deepEqual(sampledTokens(choice({ logprobs: content(['a', 'b'], [-0.1, -0.2]) })), { logprobs: [-0.1, -0.2] });
  // Counts that disagree: the ids win, the log-probs go.
  assert.deepEqual(sampledTokens(choice({ token_ids: [5, 6, 2], logprobs: content(['a', 'b'], [-0.1, -0.2]) })), { tokenIds: [5, 6, 2] });
  // Malformed ids (negative, fractional) are not ids.
  assert.deepEqual(sampledTokens(choice({ token_ids: [5, -1] })), {});
  assert.deepEqual(sampledTokens(choice({ token_ids: [1.5] })), {});
  assert.deepEqual(sampledTokens(choice({})), {});
  // float32 log-probs (what vLLM computes) come through float32-exact in 9 significant digits.
  const f32 = [Math.fround(-0.013059139), Math.fround(-1.23456789), Math.fround(-3.09944e-6)];
  const kept = sampledTokens(choice({ token_ids: [1, 2, 3], logprobs: content(['a', 'b', 'c'], f32) })).logprobs as number[];
  assert.deepEqual(kept.map(Math.fround), f32);
  assert.ok(kept.every((x, i) => String(x).length < String(f32[i]).length));
});

test("vLLM's -9999 placeholder (or below), null, a missing or non-finite log-prob is unknown: null in place, counted", () => {
  const choice = (lps: unknown[]) =>
    ({
      index: 0,
      finish_reason: 'stop',
      message: { role: 'assistant', content: 'x', refusal: null },
      token_ids: lps.map((_, i) => 10 + i),
      logprobs: { content: lps.map((lp) => ({ token: 't', ...(lp === 'missing' ? {} : { logprob: lp }), bytes: [], top_logprobs: [] })) },
    }) as never;
  assert.deepEqual(sampledTokens(choice([-0.5, -9999, -0.25])), { tokenIds: [10, 11, 12], logprobs: [-0.5, null, -0.25], unknownLogprobs: 1 });
  assert.deepEqual(sampledTokens(choice([-1e5, null, 'missing', -0.1])), { tokenIds: [10, 11, 12, 13], logprobs: [null, null, null, -0.1], unknownLogprobs: 3 });
  // Just above the placeholder is a (tiny) probability, kept.
  assert.deepEqual(sampledTokens(choice([-9998.5])).logprobs, [-9998.5]);
  assert.deepEqual(sampledTokens(choice([-0.1, -0.2])), { tokenIds: [10, 11], logprobs: [-0.1, -0.2] }, 'none unknown: no count');
});

test("every request to a vLLM-like server states the whole distribution at neutral values; OpenAI's API gets none of it", async () => {
  const capture = await strictServer({ refuse: false, tokens: true });
  try {
    await chatCompletions(policyAt(capture.url), 1, user);
    await chatCompletions(policyAt(capture.url), 1, user, undefined, { tokens: true });
    for (const b of capture.bodies) {
      assert.deepEqual([b.top_p, b.top_k, b.min_p, b.presence_penalty, b.frequency_penalty, b.repetition_penalty, b.temperature], [1, 0, 0, 0, 0, 1, 0.7]);
    }
    assert.deepEqual(NEUTRAL_SAMPLING, { top_p: 1, top_k: 0, min_p: 0, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 });
  } finally {
    await capture.close();
  }
  // The one rule for "vLLM-like", which also decides tokenIds auto.
  for (const url of ['https://api.openai.com/v1', 'https://x.openai.azure.com/openai', 'not a url']) assert.equal(vllmLike(url), false, url);
  for (const url of ['http://127.0.0.1:8000/v1', 'http://vllm:8000/v1', 'https://openai.com.example/v1']) assert.equal(vllmLike(url), true, url);
});

test("tokenIds: auto asks every server but OpenAI's own API; on and off are what they say", () => {
  assert.equal(wantsTokenIds(policyAt('http://127.0.0.1:8000/v1')), true);
  assert.equal(wantsTokenIds(policyAt('http://vllm:8000/v1')), true);
  assert.equal(wantsTokenIds(policyAt('https://api.openai.com/v1')), false);
  assert.equal(wantsTokenIds(policyAt('https://x.openai.azure.com/openai')), false);
  assert.equal(wantsTokenIds(policyAt('https://api.openai.com/v1', { tokenIds: 'on' })), true);
  assert.equal(wantsTokenIds(policyAt('http://127.0.0.1:8000/v1', { tokenIds: 'off' })), false);
  // Inputs recorded before the setting existed have no tokenIds: auto.
  const { tokenIds: _, ...legacy } = policyAt('http://127.0.0.1:8000/v1');
  assert.equal(wantsTokenIds(legacy), true);
  assert.equal(parseConfig({}).policy.tokenIds, 'auto');
});

test("with tokens the request carries vLLM's fields and the completions the sampled ids and log-probs", async () => {
  const before = fake.requests.length;
  const res = await chatCompletions(policyAt(fake.url), 2, user, undefined, { tokens: true });
  const req = fake.requests[before];
  assert.deepEqual([req.logprobs, req.returnTokenIds, req.returnTokensAsTokenIds], [true, true, true]);
  assert.equal(res.askedForTokens, true);
  for (const [i, c] of res.completions.entries()) {
    assert.equal(c.text, `answer ${i}`);
    assert.equal(c.finishReason, 'stop');
    assert.deepEqual(c.tokenIds, fakeTokenIds(c.text, 'stop'));
    // Processed log-probs: the fake model's after the request's temperature, as the client keeps them (9 digits).
    assert.deepEqual(
      c.logprobs,
      c.tokenIds!.map((id, t) => Number(truncatedLogprob(fakeLogprob(id, t), req.sampling).toPrecision(9))),
    );
  }
  // The prompt as the server encoded it, top-level in vLLM's answer: the same prompt, the same ids.
  assert.ok(res.promptTokenIds && res.promptTokenIds.length > 0 && res.promptTokenIds.every((id) => Number.isInteger(id) && id >= 0));
  const again = await chatCompletions(policyAt(fake.url), 1, user, undefined, { tokens: true });
  assert.deepEqual(again.promptTokenIds, res.promptTokenIds);
  const other = await chatCompletions(policyAt(fake.url), 1, [{ role: 'user', content: 'hello' }], undefined, { tokens: true });
  assert.notDeepEqual(other.promptTokenIds, res.promptTokenIds);
});

test('without tokens (the critic, tokenIds off) none of the extension fields is sent', async () => {
  const before = fake.requests.length;
  const res = await chatCompletions(policyAt(fake.url), 1, user);
  const req = fake.requests[before];
  assert.deepEqual([req.logprobs, req.returnTokenIds, req.returnTokensAsTokenIds], [undefined, undefined, undefined]);
  assert.equal(res.askedForTokens, false);
  assert.equal(res.completions[0].tokenIds, undefined);
  assert.equal(res.completions[0].logprobs, undefined);
  assert.equal(res.promptTokenIds, undefined);
});

/**
 * A server that rejects the token fields the way OpenAI's API rejects unknown fields (`refuse`), or takes them and
 * answers without any token field (a proxy that drops them, a server that ignores them).
 */
async function strictServer(opts: { refuse: boolean; tokens?: boolean } = { refuse: true }): Promise<{ url: string; bodies: Record<string, unknown>[]; close(): Promise<void> }> {
  const bodies: Record<string, unknown>[] = [];
  const server: Server = createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      const body = JSON.parse(raw) as Record<string, unknown>;
      bodies.push(body);
      const unknown = opts.refuse ? Object.keys(body).find((k) => k.startsWith('return_token')) : undefined;
      const ids =
        opts.tokens && body.return_token_ids
          ? { token_ids: [5, 2], logprobs: { content: [-0.1, -0.2].map((logprob) => ({ token: 'x', logprob, bytes: [], top_logprobs: [] })) } }
          : {};
      res.writeHead(unknown ? 400 : 200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify(
          unknown
            ? { error: { message: `Unrecognized request argument supplied: ${unknown}`, type: 'invalid_request_error', param: null, code: null } }
            : {
                id: 'x',
                object: 'chat.completion',
                created: 0,
                model: body.model,
                choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'ok' }, ...ids }],
              },
        ),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/v1`, bodies, close: () => new Promise((r) => server.close(() => r())) };
}

test('a server that refuses the token fields fails the request with the way on (tokenIds off), every time: no silent fallback', async () => {
  const strict = await strictServer();
  try {
    const policy = policyAt(strict.url);
    for (const attempt of [1, 2]) {
      assert.equal(wantsTokenIds(policy), true, `still asked, attempt ${attempt}`);
      const err = await chatCompletions(policy, 1, user, undefined, { tokens: wantsTokenIds(policy) }).catch((e: unknown) => e);
      assert.ok(err instanceof ApplicationFailure && err.nonRetryable, String(err));
      assert.equal(err.type, 'PolicyTokenIdsMissing');
      assert.ok(err.message.includes(strict.url), 'names the server');
      assert.match(err.message, /HTTP 400: 400 Unrecognized request argument supplied: return_token_ids/);
      assert.match(err.message, /set policy\.tokenIds: off/);
    }
    assert.deepEqual(
      strict.bodies.map((b) => 'return_token_ids' in b),
      [true, true],
      'asked each time, never asked again without',
    );
    // on: the same.
    const on = await chatCompletions(policyAt(strict.url, { tokenIds: 'on' }), 1, user, undefined, { tokens: true }).catch((e: unknown) => e);
    assert.ok(on instanceof ApplicationFailure && on.nonRetryable && /policy\.tokenIds: off/.test(on.message));
  } finally {
    await strict.close();
  }
});

test('a server that takes the token fields and answers without ids fails the request the same way', async () => {
  const quiet = await strictServer({ refuse: false });
  try {
    const err = await chatCompletions(policyAt(quiet.url), 1, user, undefined, { tokens: true }).catch((e: unknown) => e);
    assert.ok(err instanceof ApplicationFailure && err.nonRetryable, String(err));
    assert.match(err.message, /answered without the sampled token ids/);
    assert.match(err.message, /set policy\.tokenIds: off \(the learner then retokenises the text, ratio 1\)/);
    // Not asked: the same answer is fine.
    const res = await chatCompletions(policyAt(quiet.url, { tokenIds: 'off' }), 1, user, undefined, { tokens: false });
    assert.equal(res.completions[0].text, 'ok');
  } finally {
    await quiet.close();
  }
});

test('a 404 "model does not exist" names the missing model in the failure; other 404s do not', () => {
  const policy = policyAt('http://127.0.0.1:1/v1');
  const notFound = (message: string) =>
    classifyPolicyError(OpenAI.APIError.generate(404, { error: { message, type: 'NotFoundError', param: 'model', code: 404 } }, undefined, new Headers()), policy);
  const f = notFound('The model `run-v2` does not exist.');
  assert.ok(f instanceof ApplicationFailure);
  assert.equal(f.type, 'PolicyRequestRejected');
  assert.equal(f.nonRetryable, true);
  assert.match(f.message, /The model `run-v2` does not exist\./);
  assert.equal(missingModelOf(f), 'run-v2');
  // vLLM ≥0.32 appends the valid names.
  assert.equal(missingModelOf(notFound('The model `run-v3` does not exist. Valid aliases: base, run-v1.')), 'run-v3');
  assert.equal(missingModelOf(notFound('Not Found')), undefined);
  assert.equal(missingModelOf(new Error('The model `run-v2` does not exist.')), undefined);
});
