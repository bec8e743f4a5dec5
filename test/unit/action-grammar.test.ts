import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { QWEN3_VL_ADDED_TOKENS } from '../../lib/model-io/prompt-text';
import { actionGrammar, elementIdsOf, GRAMMAR_TEXT_MAX, minConstrainedMaxTokens } from '../../lib/model-io/action-grammar';
import { grammarBlob, readGrammarBlob } from '../../lib/model-io/grammar-blob';
import { isValidAction } from '../../lib/model-io/actions';
import { parseAction } from '../../lib/model-io/parse';
import { parseConfig } from '../../lib/config/config';

const TREE = '[3] text "Click the button." @(200,111)\n[5] button "Click Me!" @(76,629)\n[12] textbox value="" @(1,2)';

/** The longest text a variant admits, written the way xgrammar writes JSON without free whitespace. */
function xgrammarJson(value: unknown): string {
  if (Array.isArray(value)) return `[${value.map(xgrammarJson).join(', ')}]`;
  if (value && typeof value === 'object') {
    return `{${Object.entries(value)
      .map(([k, v]) => `${JSON.stringify(k)}: ${xgrammarJson(v)}`)
      .join(', ')}}`;
  }
  return JSON.stringify(value);
}

test('element ids come from the tree lines, sorted, without duplicates', () => {
  assert.deepEqual(elementIdsOf(TREE), [3, 5, 12]);
  assert.deepEqual(elementIdsOf('[7] a\n  [2] b\n[7] again\nno id [9] inside a line'), [2, 7]);
  assert.deepEqual(elementIdsOf(''), []);
});

test('the learner tests compile the same schema the builder writes', () => {
  const fixture = JSON.parse(readFileSync('workers/learner/tests/fixtures/action-schema.json', 'utf8'));
  assert.deepEqual(fixture, actionGrammar(TREE, 128).schema);
});

/** The JSON schema's tool-call variants, one per kind of action (the fields these tests read). */
type Variant = { properties: Record<string, { const?: string; enum?: unknown[] }>; required: string[]; additionalProperties: boolean };
const variantsOf = (schema: unknown) => (schema as { properties: { arguments: { anyOf: Variant[] } } }).properties.arguments.anyOf;

test('every variant has its fields in a fixed order, all required, nothing else allowed', () => {
  const args = variantsOf(actionGrammar(TREE, 256).schema);
  const kinds = args.map((v) => v.properties.action.const ?? v.properties.action.enum?.join('|'));
  assert.deepEqual(kinds, ['click_element', 'type', 'left_click|double_click|right_click|mouse_move', 'key', 'scroll', 'wait', 'answer']);
  for (const v of args) {
    assert.equal(v.additionalProperties, false);
    assert.deepEqual(v.required, Object.keys(v.properties));
  }
  assert.deepEqual(args[0].properties.element_id, { enum: [3, 5, 12] });
});

test('a page without element ids offers no element actions', () => {
  const args = variantsOf(actionGrammar('', 256).schema);
  assert.ok(args.every((v) => !('element_id' in v.properties)));
});

test('policy.actions: only the allowed actions, maxBytes theirs; a page where none is possible is a clear error', () => {
  const g = actionGrammar(TREE, 256, 'compact', ['click_element', 'answer']);
  assert.deepEqual(
    variantsOf(g.schema).map((v) => v.properties.action.const),
    ['click_element', 'answer'],
  );
  assert.equal(g.maxBytes, xgrammarJson({ name: 'computer_use', arguments: { action: 'answer', text: 'y'.repeat(g.textMax) } }).length);
  const clicks = actionGrammar(TREE, 256, 'compact', ['left_click', 'click_element']);
  const kinds = variantsOf(clicks.schema).map((v) => v.properties.action.const ?? v.properties.action.enum?.join('|'));
  assert.deepEqual(kinds, ['click_element', 'left_click']);
  assert.equal(clicks.maxBytes, xgrammarJson({ name: 'computer_use', arguments: { action: 'left_click', coordinate: [1000, 1000] } }).length);
  assert.throws(() => actionGrammar('', 256, 'compact', ['click_element']), /policy\.actions \[click_element\] leaves no action on this page \(it has no element ids/);
});

test('policy.actions needs constrained decoding and names only tool actions', () => {
  assert.deepEqual(parseConfig({ policy: { constrained: true, actions: ['click_element', 'answer'] } }).policy.actions, ['click_element', 'answer']);
  assert.equal(parseConfig({}).policy.actions, undefined);
  assert.throws(() => parseConfig({ policy: { actions: ['click_element'] } }), /policy\.actions: actions limits the constrained grammar/);
  assert.throws(() => parseConfig({ policy: { constrained: true, actions: ['click'] } }), /policy\.actions/);
  assert.throws(() => parseConfig({ policy: { constrained: true, actions: ['answer', 'answer'] } }), /distinct/);
});

test('maxBytes is the longest completion, and the longest completions parse into valid actions', () => {
  const g = actionGrammar(TREE, 256);
  assert.equal(g.textMax, GRAMMAR_TEXT_MAX);
  const longest = [
    { action: 'type', element_id: 12, text: 'x'.repeat(g.textMax) },
    { action: 'answer', text: 'y'.repeat(g.textMax) },
    { action: 'double_click', coordinate: [1000, 1000] },
    { action: 'key', keys: ['ArrowDown1', 'Backspace0', 'ctrl+shift'] },
    { action: 'scroll', pixels: -2000 },
  ].map((a) => xgrammarJson({ name: 'computer_use', arguments: a }));
  assert.equal(g.maxBytes, Math.max(...longest.map((s) => s.length)));
  for (const s of longest) assert.ok(isValidAction(parseAction(s)), s);
});

test('free text shrinks to fit the token budget; too small a budget names the value to raise', () => {
  const g = actionGrammar(TREE, 128);
  assert.ok(g.maxBytes <= 127 && g.textMax < GRAMMAR_TEXT_MAX && g.textMax >= 8);
  assert.throws(() => actionGrammar(TREE, 60), /policy\.maxTokens 60 is too small .* raise policy\.maxTokens to at least \d+/);
  assert.ok(minConstrainedMaxTokens() > 60 && minConstrainedMaxTokens() <= 128);
});

test("free text cannot spell a tokenizer token: every added token starts with '<', which no text pattern admits", () => {
  const g = actionGrammar('[3] textbox "Name" @(10,10)', 128);
  const patterns = JSON.stringify(g.schema)
    .match(/"pattern":"([^"]+)"/g)!
    .map((p) => new RegExp(JSON.parse(`{${p}}`).pattern));
  const textPatterns = patterns.filter((p) => p.test('hello world'));
  assert.ok(textPatterns.length >= 2, 'type and answer texts');
  for (const p of textPatterns) {
    for (const tok of QWEN3_VL_ADDED_TOKENS) assert.equal(p.test(`a${tok}b`), false, `${p} admits ${tok}`);
    assert.equal(p.test('a > b, 3 = 3; [x] ~ ok'), true);
  }
});

test("the stored grammar records its sampler's xgrammar call; older blobs read without separators; a malformed one is refused", () => {
  const compact = actionGrammar(TREE, 128);
  const any = actionGrammar(TREE, 128, 'any');
  const schema = compact.schema;
  // The calls of vllm/v1/structured_output/backend_xgrammar.py in the 0.33.0 and 0.31.0 wheels, and their xgrammar pins
  // (workers/learner/tests/test_grammar_whitespace.py compiles the same blobs).
  assert.deepEqual(grammarBlob(compact, 'vllm-0.33'), { schema, any_whitespace: false, separators: [',', ':'], sampler: 'vllm-0.33', xgrammar: '0.2.8' });
  assert.deepEqual(grammarBlob(compact, 'vllm-0.31'), { schema, any_whitespace: false, separators: null, sampler: 'vllm-0.31', xgrammar: '0.2.7' });
  assert.deepEqual(grammarBlob(any, 'vllm-0.33'), { schema, any_whitespace: true, separators: null, sampler: 'vllm-0.33', xgrammar: '0.2.8' });
  assert.deepEqual(grammarBlob(compact, 'colocated'), { schema, any_whitespace: false, separators: [',', ':'], sampler: 'colocated', xgrammar: null });
  // Through JSON, as the blob store keeps it.
  for (const g of [compact, any]) {
    for (const s of ['vllm-0.33', 'vllm-0.31', 'colocated'] as const) assert.deepEqual(readGrammarBlob(JSON.parse(JSON.stringify(grammarBlob(g, s)))), grammarBlob(g, s));
  }
  const old = { separators: null, sampler: null, xgrammar: null };
  assert.deepEqual(readGrammarBlob(schema), { schema, any_whitespace: false, ...old });
  assert.deepEqual(readGrammarBlob({ schema, any_whitespace: true }), { schema, any_whitespace: true, ...old });
  const blob = grammarBlob(compact, 'vllm-0.33');
  assert.throws(() => readGrammarBlob({ schema, any_whitespace: 'yes' }), /any_whitespace must be true or false/);
  assert.throws(() => readGrammarBlob({ schema: [], any_whitespace: true }), /schema must be a JSON object/);
  assert.throws(() => readGrammarBlob({ ...blob, separators: [','] }), /separators must be null or two strings/);
  assert.throws(() => readGrammarBlob({ ...blob, sampler: 'vllm-0.20' }), /sampler must be null, colocated or one of vllm-0.33, vllm-0.31/);
  assert.throws(() => readGrammarBlob({ ...blob, xgrammar: 28 }), /xgrammar must be null or a version/);
  assert.throws(() => readGrammarBlob([1]), /a grammar blob is a JSON object/);
});

test('free whitespace has no bound: maxBytes and the text budget stay the compact ones', () => {
  for (const budget of [128, 256]) {
    const compact = actionGrammar(TREE, budget);
    const any = actionGrammar(TREE, budget, 'any');
    assert.equal(any.whitespace, 'any');
    assert.equal(compact.whitespace, 'compact');
    assert.equal(any.maxBytes, compact.maxBytes);
    assert.equal(any.textMax, compact.textMax);
  }
  assert.throws(() => actionGrammar(TREE, 60, 'any'), /raise policy\.maxTokens to at least \d+/);
});
