import { test } from 'node:test';
import assert from 'node:assert/strict';
import { firstJsonObject, kindOf, nonObjectJsonKind } from '../../lib/model-io/json-object';

test('the first balanced object that parses, around prose and braces inside strings', () => {
  assert.deepEqual(firstJsonObject('Sure: {"a": 1} and {"b": 2}'), { kind: 'found', value: { a: 1 } });
  // Braces and escaped quotes inside strings neither open nor close the object.
  assert.deepEqual(firstJsonObject('{"text": "a } b { c", "n": 1}'), { kind: 'found', value: { text: 'a } b { c', n: 1 } });
  assert.deepEqual(firstJsonObject('{"text": "say \\"}\\" now", "n": 2} tail }'), { kind: 'found', value: { text: 'say "}" now', n: 2 } });
  assert.deepEqual(firstJsonObject('{"outer": {"inner": [1, {"x": null}]}}'), { kind: 'found', value: { outer: { inner: [1, { x: null }] } } });
  assert.deepEqual(firstJsonObject('```json\n{"ranking": [1, 0], "value": 0.5}\n```'), { kind: 'found', value: { ranking: [1, 0], value: 0.5 } });
});

test('a balanced object that does not parse is skipped for a later one that does', () => {
  assert.deepEqual(firstJsonObject('set {x | x > 0}, then {"ok": true}'), { kind: 'found', value: { ok: true } });
  assert.deepEqual(firstJsonObject('{a: 1} {"b": [2]}'), { kind: 'found', value: { b: [2] } });
});

test('nothing found: none, the first parse error, or an object never closed', () => {
  assert.deepEqual(firstJsonObject(''), { kind: 'none' });
  assert.deepEqual(firstJsonObject('no braces here } ]'), { kind: 'none' });
  const invalid = firstJsonObject('{a: 1} and {b: 2}');
  assert.equal(invalid.kind, 'invalid');
  // The first failure is reported, with JSON.parse's position in it.
  assert.match((invalid as { error: string }).error, /position 1\b|line 1 column 2/);
  assert.deepEqual(firstJsonObject('{"a": {"b": 1}'), { kind: 'truncated' });
  // An unclosed string swallows the closing brace.
  assert.deepEqual(firstJsonObject('{"a": "}'), { kind: 'truncated' });
  // An unparseable object before an unclosed one: its error is what is reported.
  const first = firstJsonObject('{oops} {"a": 1');
  assert.equal(first.kind, 'invalid');
  // Nothing after an unclosed object counts, even a valid object inside it.
  assert.deepEqual(firstJsonObject('{ {"a": 1}'), { kind: 'truncated' });
});

test('text that is JSON but not an object is named by kind', () => {
  assert.equal(nonObjectJsonKind('[1, 2]'), 'array');
  assert.equal(nonObjectJsonKind('```json\n[{"a": 1}]\n```'), 'array');
  assert.equal(nonObjectJsonKind(' null '), 'null');
  assert.equal(nonObjectJsonKind('-0.5'), 'number');
  assert.equal(nonObjectJsonKind('true'), 'boolean');
  assert.equal(nonObjectJsonKind('"hi"'), 'string');
  assert.equal(nonObjectJsonKind('{"a": 1}'), undefined);
  assert.equal(nonObjectJsonKind('3 options: {"a": 1}'), undefined);
  assert.equal(kindOf({}), 'object');
});
