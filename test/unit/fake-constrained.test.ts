import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { actionGrammar } from '../../lib/model-io/action-grammar';
import { isValidAction } from '../../lib/model-io/actions';
import { parseAction } from '../../lib/model-io/parse';
import { constrainedAnswer, firstAdmitted, schemaAdmits, xgrammarCompact } from '../../testing/fake-constrained';
import { scriptedAnswer, toolCall } from '../../testing/fake-policy-server';
import { startFakeVllmServer } from '../../testing/fake-vllm-server';
import { byteLevelAlphabet, byteLevelVocab } from '../../testing/fake-vocab';

// The vLLM stand-in under structured_outputs.json: one JSON value of the schema, in schema order and xgrammar's
// compact separators, in the model's own byte tokens. The xgrammar-level proof is in constrained-decoding.test.ts.

const TREE = ['[3] text "Click on the \\"okay\\" button." @(200,111)', '[6] button "okay" @(60,327)', '[8] textbox value="" @(193,420)'].join('\n');
const schema = actionGrammar(TREE, 256).schema;

test("the scripted model's action, admitted: bare JSON in schema order with xgrammar's separators, accepted by the schema", () => {
  const out = constrainedAnswer(schema, scriptedAnswer('Click on the "okay" button.', TREE, []));
  assert.equal(out, '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [60, 327]}}');
  assert.ok(schemaAdmits(schema, JSON.parse(out)));
  assert.ok(isValidAction(parseAction(out)));
  // Keys written in another order come back in the schema's.
  const shuffled = '{"arguments": {"coordinate": [1, 2], "action": "mouse_move"}, "name": "computer_use"}';
  assert.equal(constrainedAnswer(schema, shuffled), '{"name": "computer_use", "arguments": {"action": "mouse_move", "coordinate": [1, 2]}}');
});

test('an action the schema does not admit (an id off the page, a value out of range, prose) gives the first action it admits', () => {
  const first = '{"name": "computer_use", "arguments": {"action": "click_element", "element_id": 3}}';
  for (const text of [
    toolCall({ action: 'click_element', element_id: 99 }),
    toolCall({ action: 'wait', time: 0 }),
    'I would rather describe the page.',
    toolCall({ action: 'type', element_id: 8, text: 'a"b' }),
  ]) {
    assert.equal(constrainedAnswer(schema, text), first, text);
  }
  assert.ok(schemaAdmits(schema, firstAdmitted(schema)));
});

test('the schema check refuses what the action grammar refuses', () => {
  const call = (args: Record<string, unknown>) => ({ name: 'computer_use', arguments: args });
  assert.ok(schemaAdmits(schema, call({ action: 'type', element_id: 8, text: 'hello' })));
  assert.ok(schemaAdmits(schema, call({ action: 'scroll', pixels: -100 })));
  assert.ok(schemaAdmits(schema, call({ action: 'key', keys: ['ctrl', 'a'] })));
  for (const bad of [
    call({ action: 'click_element', element_id: 4 }),
    call({ action: 'scroll', pixels: 0 }),
    call({ action: 'left_click', coordinate: [1] }),
    call({ action: 'left_click', coordinate: [1, 1001] }),
    call({ action: 'key', keys: [] }),
    call({ action: 'answer', text: 'x'.repeat(65) }),
    call({ action: 'answer', text: '<tool_call>' }),
    call({ action: 'wait', time: 1, extra: 1 }),
    call({ action: 'wait' }),
    { name: 'other', arguments: { action: 'wait', time: 1 } },
    'computer_use',
  ]) {
    assert.equal(schemaAdmits(schema, bad), false, JSON.stringify(bad));
  }
  assert.throws(() => schemaAdmits({ type: 'tuple' }, 1), /no type "tuple"/);
});

test('any small schema: the first admitted value (the doctor probe), compact JSON', () => {
  const probe = { type: 'object', properties: { a: { type: 'integer', minimum: 0, maximum: 9 }, b: { enum: [1, 2] } }, required: ['a', 'b'], additionalProperties: false };
  assert.equal(constrainedAnswer(probe, 'no JSON here'), '{"a": 0, "b": 1}');
  assert.equal(xgrammarCompact({ a: [1, { b: 'x' }], c: null }), '{"a": [1, {"b": "x"}], "c": null}');
  assert.equal(xgrammarCompact({ a: [1, { b: 'x' }], c: null }, [',', ':']), '{"a":[1,{"b":"x"}],"c":null}');
  assert.throws(() => firstAdmitted({ type: 'string', pattern: '^z{3}$' }), /finds no value/);
});

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'halo-vocab-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

/** A byte-level BPE tokenizer.json: the 256 byte tokens from id 10 (in reverse alphabet order), three added tokens. */
function writeTokenizer(name: string, drop = 0): string {
  const alphabet = byteLevelAlphabet();
  const vocab = Object.fromEntries(alphabet.slice(drop).map((ch, i) => [ch, 265 - i]));
  const path = join(dir, name);
  writeFileSync(
    path,
    JSON.stringify({
      model: { type: 'BPE', vocab, merges: [] },
      added_tokens: [
        { id: 0, content: '<|im_start|>' },
        { id: 1, content: '<|im_end|>' },
        { id: 2, content: '<|image_pad|>' },
      ],
    }),
  );
  return path;
}

test("a byte-level tokenizer.json: each byte's single token, <|im_end|> from added_tokens; a tokenizer that is not one is refused", () => {
  const v = byteLevelVocab(writeTokenizer('ok.json'));
  // GPT-2's alphabet: '!' is the first printable byte; the space is spelled U+0120 (the 33rd stand-in: 256 + 32).
  assert.equal(byteLevelAlphabet()[0x21], '!');
  assert.equal(byteLevelAlphabet()[0x20], '\u0120');
  assert.equal(v.byteIds[0], 265);
  assert.equal(v.byteIds[255], 10);
  assert.deepEqual([v.imStart, v.eos, v.image], [0, 1, 2]);
  assert.throws(() => byteLevelVocab(writeTokenizer('short.json', 1)), /not byte-level, 1 of 256 byte tokens are missing/);
  writeFileSync(join(dir, 'wp.json'), JSON.stringify({ model: { type: 'WordPiece', vocab: {} } }));
  assert.throws(() => byteLevelVocab(join(dir, 'wp.json')), /not a BPE tokenizer\.json/);
  assert.throws(() => byteLevelVocab(join(dir, 'missing.json')), /cannot read it as JSON/);
});

test('compact, the stand-in writes the separators of the vLLM it plays: 0.33 `,`/`:`, 0.31 `, `/`: `', async () => {
  for (const [server, want] of [
    ['vllm-0.33', '{"name":"computer_use","arguments":{"action":"click_element","element_id":3}}'],
    ['vllm-0.31', '{"name": "computer_use", "arguments": {"action": "click_element", "element_id": 3}}'],
  ] as const) {
    const s = await startFakeVllmServer({ baseModel: 'base-model', disableAnyWhitespace: true, server });
    try {
      const res = await fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'base-model', messages: [{ role: 'user', content: 'x' }], structured_outputs: { json: schema } }),
      });
      assert.equal(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content, want);
    } finally {
      await s.close();
    }
  }
});

test('the server answers constrained requests in the tokenizer it was given (or set later): byte tokens, then <|im_end|>; log-probs per id', async () => {
  const server = await startFakeVllmServer({ baseModel: 'base-model', disableAnyWhitespace: true });
  try {
    const ask = async () => {
      const res = await fetch(`${server.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'base-model', messages: [{ role: 'user', content: 'x' }], logprobs: true, return_token_ids: true, structured_outputs: { json: schema } }),
      });
      assert.equal(res.status, 200);
      const body = (await res.json()) as {
        prompt_token_ids: number[];
        choices: { message: { content: string }; token_ids: number[]; logprobs: { content: { token: string }[] } }[];
      };
      return { ...body.choices[0], prompt: body.prompt_token_ids };
    };
    const before = await ask();
    server.setTokenizer(writeTokenizer('set.json'));
    const c = await ask();
    assert.equal(c.message.content, before.message.content);
    // vLLM 0.33 started with disable_any_whitespace compiles with separators (",", ":").
    assert.equal(c.message.content, '{"name":"computer_use","arguments":{"action":"click_element","element_id":3}}');
    const v = byteLevelVocab(join(dir, 'set.json'));
    assert.deepEqual(c.token_ids, [...Buffer.from(c.message.content)].map((b) => v.byteIds[b]).concat(v.eos));
    assert.notDeepEqual(c.token_ids, before.token_ids);
    assert.equal(c.logprobs.content.length, c.token_ids.length);
    assert.equal(c.logprobs.content.map((e) => e.token).join(''), c.message.content);
    // The prompt in the same vocabulary: <|im_start|>, the role's bytes.
    assert.deepEqual(c.prompt.slice(0, 5), [v.imStart, ...[...Buffer.from('user')].map((b) => v.byteIds[b])]);
  } finally {
    await server.close();
  }
});

test('the stand-in writes what xgrammar lets the model write, not what this subset admits: a `pattern` matches whole there', async () => {
  // JSON Schema searches a pattern, so this file's check admits "abc" for pattern "a"; xgrammar matches the whole
  // string, so vLLM's model could never write it, and the learner's mask (the same xgrammar call) would refuse it.
  const picky = { type: 'object', properties: { a: { type: 'string', pattern: 'a' } }, required: ['a'], additionalProperties: false };
  assert.ok(schemaAdmits(picky, { a: 'abc' }));
  for (const [server, want] of [
    ['vllm-0.33', '{"a":"a"}'],
    ['vllm-0.31', '{"a": "a"}'],
  ] as const) {
    const s = await startFakeVllmServer({ baseModel: 'base-model', disableAnyWhitespace: true, server, mode: { kind: 'custom', answer: () => '{"a": "abc"}' } });
    try {
      const res = await fetch(`${s.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'base-model', messages: [{ role: 'user', content: 'x' }], structured_outputs: { json: picky } }),
      });
      assert.equal(((await res.json()) as { choices: { message: { content: string } }[] }).choices[0].message.content, want, server);
    } finally {
      await s.close();
    }
  }
});
