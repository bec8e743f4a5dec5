import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, type Server } from 'node:http';
import OpenAI from 'openai';
import { ApplicationFailure } from '@temporalio/common';
import { chatCompletions, classifyPolicyError, missingModelOf, sampledTokens, wantsTokenIds } from '../../activities/policy-client';
import { parseConfig, type PolicyConfig } from '../../lib/config';
import { fakeLogprob, fakeTokenIds, startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';

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
  assert.deepEqual(sampledTokens(choice({ logprobs: content(['token_id:7', 'token_id:2'], [-0.5, -9999]) })), { tokenIds: [7, 2], logprobs: [-0.5, -9999] });
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
  const kept = sampledTokens(choice({ token_ids: [1, 2, 3], logprobs: content(['a', 'b', 'c'], f32) })).logprobs!;
  assert.deepEqual(kept.map(Math.fround), f32);
  assert.ok(kept.every((x, i) => String(x).length < String(f32[i]).length));
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
    assert.deepEqual(
      c.logprobs,
      c.tokenIds!.map((id, t) => fakeLogprob(id, t)),
    );
  }
});

test('without tokens (the critic, tokenIds off) none of the extension fields is sent', async () => {
  const before = fake.requests.length;
  const res = await chatCompletions(policyAt(fake.url), 1, user);
  const req = fake.requests[before];
  assert.deepEqual([req.logprobs, req.returnTokenIds, req.returnTokensAsTokenIds], [undefined, undefined, undefined]);
  assert.equal(res.askedForTokens, false);
  assert.equal(res.completions[0].tokenIds, undefined);
  assert.equal(res.completions[0].logprobs, undefined);
});

/** A server that rejects unknown fields the way OpenAI's API does. */
async function strictServer(): Promise<{ url: string; bodies: Record<string, unknown>[]; close(): Promise<void> }> {
  const bodies: Record<string, unknown>[] = [];
  const server: Server = createServer((req, res) => {
    let raw = '';
    req.on('data', (c) => (raw += c));
    req.on('end', () => {
      const body = JSON.parse(raw) as Record<string, unknown>;
      bodies.push(body);
      const unknown = Object.keys(body).find((k) => k.startsWith('return_token'));
      res.writeHead(unknown ? 400 : 200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify(
          unknown
            ? { error: { message: `Unrecognized request argument supplied: ${unknown}`, type: 'invalid_request_error', param: null, code: null } }
            : { id: 'x', object: 'chat.completion', created: 0, model: body.model, choices: [{ index: 0, finish_reason: 'stop', message: { role: 'assistant', content: 'ok' } }] },
        ),
      );
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/v1`, bodies, close: () => new Promise((r) => server.close(() => r())) };
}

test('auto: a server that refuses the fields is asked again without them, and not asked with them again', async () => {
  const strict = await strictServer();
  try {
    const policy = policyAt(strict.url);
    assert.equal(wantsTokenIds(policy), true);
    const res = await chatCompletions(policy, 1, user, undefined, { tokens: wantsTokenIds(policy) });
    assert.equal(res.completions[0].text, 'ok');
    assert.equal(res.askedForTokens, false);
    assert.deepEqual(
      strict.bodies.map((b) => 'return_token_ids' in b),
      [true, false],
    );
    assert.equal(wantsTokenIds(policy), false, 'remembered for this server');
    // on: the refusal is the user's to see (non-retryable, with the server's words).
    const err = await chatCompletions(policyAt(strict.url, { tokenIds: 'on' }), 1, user, undefined, { tokens: true }).catch((e: unknown) => e);
    assert.ok(err instanceof ApplicationFailure && err.nonRetryable);
    assert.match(err.message, /HTTP 400: 400 Unrecognized request argument supplied: return_token_ids/);
  } finally {
    await strict.close();
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
