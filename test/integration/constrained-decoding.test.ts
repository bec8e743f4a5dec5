import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { deflateSync } from 'node:zlib';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { actionGrammar, elementIdsOf } from '../../lib/action-grammar';
import { isValidAction } from '../../lib/actions';
import { parseConfig } from '../../lib/config';
import type { PromptObservationRef } from '../../lib/episode-types';
import { parseAction } from '../../lib/parse';
import { buildPrompt } from '../../lib/prompt';
import { crc32, PNG_SIGNATURE } from '../../host/png';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
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
    const gRef = await blobs.putJson(grammar.schema);
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
    vllm = await startFakeVllmServer({ baseModel: 'base-model' });
    control = createControlActivities(blobs);
  });
  after(async () => vllm?.close());

  const policy = (constrained: boolean, maxTokens = MAX_TOKENS) =>
    parseConfig({ policy: { baseUrl: `${vllm.url}/v1`, model: 'base-model', maxAttempts: 1, constrained, maxTokens } }).policy;
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
    assert.deepEqual(await blobs.getJson(res.grammarRef!), so.json);
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
