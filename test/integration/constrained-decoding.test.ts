import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { deflateSync } from 'node:zlib';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { actionGrammar, elementIdsOf } from '../../lib/model-io/action-grammar';
import { grammarBlob } from '../../lib/model-io/grammar-blob';
import { isValidAction } from '../../lib/model-io/actions';
import { parseConfig } from '../../lib/config/config';
import type { PromptObservationRef } from '../../lib/episode/episode-types';
import { parseAction } from '../../lib/model-io/parse';
import { buildPrompt } from '../../lib/model-io/prompt';
import { crc32, PNG_SIGNATURE } from '../../host/png';
import { FAKE_BYTE_OFFSET, fakeTokenIds } from '../../testing/fake-policy-server';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { constrainedAnswer } from '../../testing/fake-constrained';
import { byteLevelVocab } from '../../testing/fake-vocab';
import { failureOf } from '../helpers/application-failure';

// Constrained action decoding, both backends, with the real grammar builder and the real parser: the colocated
// learner (tiny-random, random weights) samples hundreds of completions that all parse into valid actions on
// the page's element ids; the openai backend sends the same schema in vLLM's structured_outputs field.

// click-button, seed 0, as our MiniWoB++ env writes its tree.
const AXTREE = [
  '[3] text "Click on the \\"okay\\" button." @(200,111)',
  '[5] text "donec lacus, ridiculus" @(200,256)',
  '[6] button "okay" @(60,327)',
  '[7] button "okay" @(171,327)',
  '[8] textbox value="" @(193,420)',
  '[9] button "next" @(57,513)',
  '[10] text "enim id at" @(200,584)',
].join('\n');
const PAGE_IDS = [3, 5, 6, 7, 8, 9, 10];
const MAX_TOKENS = 128;

function png(width: number, height: number): Buffer {
  const chunk = (type: string, data: Buffer) => {
    const body = Buffer.concat([Buffer.from(type, 'ascii'), data]);
    const out = Buffer.alloc(12 + data.length);
    out.writeUInt32BE(data.length, 0);
    body.copy(out, 4);
    out.writeUInt32BE(crc32(body) >>> 0, 8 + data.length);
    return out;
  };
  const ihdr = Buffer.alloc(13);
  ihdr.writeUInt32BE(width, 0);
  ihdr.writeUInt32BE(height, 4);
  ihdr.set([8, 2, 0, 0, 0], 8);
  const rows = Buffer.alloc((width * 3 + 1) * height);
  for (let y = 0; y < height; y++) for (let x = 0; x < width * 3; x++) rows[y * (width * 3 + 1) + 1 + x] = (x * 7 + y * 13) % 256;
  return Buffer.concat([PNG_SIGNATURE, chunk('IHDR', ihdr), chunk('IDAT', deflateSync(rows)), chunk('IEND', Buffer.alloc(0))]);
}

let root: string;
let blobs: BlobStore;
let observation: PromptObservationRef;

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'halo-constrained-'));
  blobs = new BlobStore(join(root, 'blobs'));
  observation = {
    goal: 'Click on the "okay" button.',
    url: 'http://x/miniwob/click-button.html',
    step: 0,
    screenshotRef: await blobs.put(png(128, 72), 'png'),
    axtreeRef: await blobs.put(AXTREE, 'txt'),
  };
});
after(() => rmSync(root, { recursive: true, force: true }));

test('the grammar lists exactly the page ids', () => {
  assert.deepEqual(elementIdsOf(AXTREE), PAGE_IDS);
});

test('colocated: hundreds of samples from the random local model all parse into valid actions on the page', async () => {
  const grammar = actionGrammar(AXTREE, MAX_TOKENS);
  {
    const gRef = await blobs.putJson(grammarBlob(grammar, 'colocated'));
    const promptRef = await blobs.putJson(buildPrompt({ ...observation, axtree: AXTREE }, [], 5));
    const out = execFileSync(join(process.cwd(), '.venv/bin/python'), ['test/helpers/constrained-sample.py', promptRef, gRef, '25', '8', String(MAX_TOKENS)], {
      env: { ...process.env, HALO_HOME: root, HF_HUB_OFFLINE: '1', TOKENIZERS_PARALLELISM: 'false' },
      encoding: 'utf8',
      maxBuffer: 64 << 20,
    });
    const { texts, finish_reasons } = JSON.parse(out) as { texts: string[]; finish_reasons: string[] };
    assert.equal(texts.length, 200);
    const kinds = new Map<string, number>();
    for (const [i, text] of texts.entries()) {
      assert.equal(finish_reasons[i], 'stop', `sample ${i} ran out of tokens: ${text}`);
      const action = parseAction(text);
      assert.ok(isValidAction(action), `sample ${i} does not parse: ${text} (${action.type === 'invalid' ? action.reason : ''})`);
      if (action.type === 'click_element' || (action.type === 'type' && action.id !== undefined)) {
        assert.ok(PAGE_IDS.includes(action.id!), `sample ${i} names element ${action.id}, not on the page`);
      }
      kinds.set(action.type, (kinds.get(action.type) ?? 0) + 1);
    }
    // A random model under the grammar explores: several kinds of action, clicks on page elements among them.
    assert.ok(kinds.size >= 4, `only ${[...kinds.keys()].join(', ')}`);
    assert.ok((kinds.get('click_element') ?? 0) > 0);
  }
});

describe('openai backend', () => {
  let vllm: FakeVllmServer;
  let control: ReturnType<typeof createControlActivities>;
  before(async () => {
    vllm = await startFakeVllmServer({ baseModel: 'base-model', disableAnyWhitespace: true });
    control = createControlActivities(blobs);
  });
  after(async () => vllm?.close());

  const policy = (constrained: boolean, maxTokens = MAX_TOKENS, grammarWhitespace: 'compact' | 'any' = 'compact') =>
    parseConfig({ policy: { baseUrl: `${vllm.url}/v1`, model: 'base-model', maxAttempts: 1, constrained, maxTokens, grammarWhitespace } }).policy;
  const lastChat = () => vllm.requests.filter((r) => r.path === '/v1/chat/completions').at(-1)?.body as Record<string, unknown>;

  test('a constrained request carries the page grammar in structured_outputs, and the result names it', async () => {
    const res = await control.samplePolicy({ policy: policy(true), n: 2, observation, history: [] });
    const body = lastChat();
    const so = body.structured_outputs as { json: Record<string, unknown>; disable_any_whitespace: boolean };
    assert.equal(so.disable_any_whitespace, true);
    assert.deepEqual(so.json, actionGrammar(AXTREE, MAX_TOKENS).schema);
    assert.match(JSON.stringify(so.json), new RegExp(`"enum":\\[${PAGE_IDS.join(',')}\\]`));
    for (const legacy of ['guided_json', 'guided_grammar', 'guided_decoding_backend', 'response_format']) assert.equal(body[legacy], undefined, legacy);
    assert.ok(res.grammarRef);
    // The blob says which whitespace the server sampled under, for the learner's mask.
    assert.deepEqual(await blobs.getJson(res.grammarRef!), { schema: so.json, any_whitespace: false, separators: [',', ':'], sampler: 'vllm-0.33', xgrammar: '0.2.8' });
  });

  test('policy.grammarWhitespace any: the blob records free whitespace; the request sends the same schema', async () => {
    const res = await control.samplePolicy({ policy: policy(true, MAX_TOKENS, 'any'), n: 1, observation, history: [] });
    const so = lastChat().structured_outputs as { json: Record<string, unknown>; disable_any_whitespace: boolean };
    assert.deepEqual(so.json, actionGrammar(AXTREE, MAX_TOKENS).schema);
    assert.equal(so.disable_any_whitespace, false);
    assert.deepEqual(await blobs.getJson(res.grammarRef!), { schema: so.json, any_whitespace: true, separators: null, sampler: 'vllm-0.33', xgrammar: '0.2.8' });
  });

  test('an unconstrained request asks for no structure', async () => {
    const res = await control.samplePolicy({ policy: policy(false), n: 1, observation, history: [] });
    assert.equal(lastChat().structured_outputs, undefined);
    assert.equal(res.grammarRef, undefined);
  });

  test('a token budget too small for the grammar is a clear, non-retryable config error', async () => {
    const before = vllm.requests.length;
    const f = await failureOf(control.samplePolicy({ policy: policy(true, 40), n: 1, observation, history: [] }));
    assert.equal(f.nonRetryable, true);
    assert.match(f.message, /raise policy\.maxTokens to at least \d+/);
    assert.equal(vllm.requests.length, before, 'nothing was sent');
  });

  test("the local server, started as vLLM's default (any whitespace), answers constrained requests with free whitespace whatever the request says; token ids follow the text", async () => {
    const loose = await startFakeVllmServer({ baseModel: 'base-model' });
    try {
      const ask = async (extra: Record<string, unknown>) => {
        const res = await fetch(`${loose.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({ model: 'base-model', messages: [{ role: 'user', content: 'x' }], max_tokens: 40, logprobs: true, return_token_ids: true, ...extra }),
        });
        assert.equal(res.status, 200);
        const c = ((await res.json()) as { choices: { message: { content: string }; token_ids: number[]; finish_reason: string; logprobs: { content: unknown[] } }[] }).choices[0];
        assert.deepEqual(c.token_ids, fakeTokenIds(c.message.content, c.finish_reason));
        assert.equal(c.logprobs.content.length, c.token_ids.length);
        return c;
      };
      const plain = await ask({});
      assert.doesNotMatch(plain.message.content, /\{ /, 'unconstrained: as scripted');
      const so = { json: actionGrammar(AXTREE, MAX_TOKENS).schema, disable_any_whitespace: true };
      const loose1 = await ask({ structured_outputs: so });
      assert.match(loose1.message.content, /\{ "name" : "computer_use" , "arguments" : \{ /);
      assert.deepEqual(
        JSON.parse(loose1.message.content.slice(loose1.message.content.indexOf('{'), loose1.message.content.lastIndexOf('}') + 1)),
        // What the scripted model wrote unconstrained, as far as the grammar lets it (its `wait` 0 is below the minimum).
        JSON.parse(constrainedAnswer(so.json, plain.message.content)),
      );
      // Whitespace favoured by logit_bias: greedy decoding writes it until max_tokens.
      const biased = await ask({ structured_outputs: so, logit_bias: { [String(FAKE_BYTE_OFFSET + 0x20)]: 100 } });
      assert.equal(biased.finish_reason, 'length');
      assert.equal(biased.token_ids.length, 40);
      assert.match(biased.message.content, /\{ +$/);
    } finally {
      await loose.close();
    }
  });

  test('the local server refuses what vLLM refuses: two constraints, or none', async () => {
    for (const so of [{ json: {}, regex: 'a' }, { disable_any_whitespace: true }]) {
      const res = await fetch(`${vllm.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'base-model', messages: [{ role: 'user', content: 'x' }], structured_outputs: so }),
      });
      assert.equal(res.status, 400);
      assert.match(((await res.json()) as { error: { message: string } }).error.message, /kind of structured outputs constraint/);
    }
  });
});

describe("the local server's constrained answers, in the tiny model's token ids, pass the learner's grammar check", () => {
  const python = join(process.cwd(), '.venv/bin/python');
  const check = (args: string[]) =>
    JSON.parse(
      execFileSync(python, ['test/helpers/grammar-check.py', ...args], {
        env: { ...process.env, HALO_HOME: root, HF_HUB_OFFLINE: '1', TOKENIZERS_PARALLELISM: 'false' },
        encoding: 'utf8',
        maxBuffer: 64 << 20,
      }),
    );
  let tokenizer: string;
  before(() => {
    tokenizer = (check([]) as { tokenizer: string }).tokenizer;
  });

  // The scripted model's choice for each goal, as vLLM 0.33 writes it compact (separators `,`/`:`): schema order.
  const cases = [
    { goal: 'Click on the "okay" button.', compact: '{"name":"computer_use","arguments":{"action":"left_click","coordinate":[60,327]}}' },
    { goal: 'Enter "hello" into the text field', compact: '{"name":"computer_use","arguments":{"action":"type","element_id":8,"text":"hello"}}' },
    // The scripted fallback `wait` 0 is below the grammar's minimum: the first action the grammar admits instead.
    { goal: 'Do nothing in particular', compact: '{"name":"computer_use","arguments":{"action":"click_element","element_id":3}}' },
  ];

  async function sample(server: FakeVllmServer, grammarWhitespace: 'compact' | 'any') {
    const control = createControlActivities(blobs);
    const policy = parseConfig({
      policy: { baseUrl: `${server.url}/v1`, model: 'base-model', maxAttempts: 1, constrained: true, maxTokens: MAX_TOKENS, grammarWhitespace, tokenIds: 'on' },
    }).policy;
    const out: { grammarRef: string; tokensRef: string; text: string; compact: string }[] = [];
    for (const { goal, compact } of cases) {
      const res = await control.samplePolicy({ policy, n: 2, observation: { ...observation, goal }, history: [] });
      assert.ok(res.grammarRef);
      for (const c of res.candidates) {
        assert.equal(c.finishReason, 'stop');
        assert.ok(c.tokensRef, 'the server gave token ids');
        out.push({ grammarRef: res.grammarRef, tokensRef: c.tokensRef, text: (await blobs.get(c.ref!)).toString('utf8'), compact });
      }
    }
    return out;
  }

  test('bare JSON in schema order, then <|im_end|>; every completion a path through its grammar (compact and free whitespace); made-up ids are not', async () => {
    const eos = byteLevelVocab(tokenizer).eos;
    const pairs: [string, string][] = [];
    for (const ws of ['compact', 'any'] as const) {
      const server = await startFakeVllmServer({ baseModel: 'base-model', disableAnyWhitespace: ws === 'compact', tokenizer });
      try {
        for (const s of await sample(server, ws)) {
          if (ws === 'compact') assert.equal(s.text, s.compact);
          else assert.match(s.text, /^\{ "name" : "computer_use" , "arguments" : \{ "action" : /);
          assert.deepEqual(JSON.parse(s.text), JSON.parse(s.compact));
          assert.ok(isValidAction(parseAction(s.text)), s.text);
          const ids = (await blobs.getJson<{ token_ids: number[] }>(s.tokensRef)).token_ids;
          assert.equal(ids.length, Buffer.byteLength(s.text) + 1, 'one token per byte, then the end of turn');
          assert.equal(ids.at(-1), eos);
          pairs.push([s.grammarRef, s.tokensRef]);
        }
      } finally {
        await server.close();
      }
    }
    // The control: the same answers in the made-up byte ids, which are not the tiny model's tokens.
    const madeUp = await startFakeVllmServer({ baseModel: 'base-model', disableAnyWhitespace: true });
    const wrong = await sample(madeUp, 'compact').finally(() => madeUp.close());
    const { results, widened } = check([JSON.stringify([...pairs, ...wrong.map((s) => [s.grammarRef, s.tokensRef])])]) as { results: (string | null)[]; widened: number };
    assert.deepEqual(results.slice(0, pairs.length), Array(pairs.length).fill(null));
    assert.equal(widened, 0, 'every token was inside the mask xgrammar computes');
    for (const r of results.slice(pairs.length)) assert.match(r ?? '', /is not allowed by grammar/);
  });
});
