import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore, BlobNotFoundError } from '../../blob/store';
import { buildPrompt, systemPrompt } from '../../lib/model-io/prompt';
import { parseAction } from '../../lib/model-io/parse';
import { actionValidity } from '../../lib/episode/episode-stats';
import { describeAction } from '../../lib/model-io/actions';

const obs = {
  goal: 'Click on the "OK" button.',
  url: 'http://x/miniwob/click-button.html',
  axtree: '[1] button "OK" @(100,200)',
  step: 2,
  screenshotRef: 'sha256:' + 'a'.repeat(64) + '.png',
};

test('the prompt has the image reference, goal, tree and only the recent history', () => {
  const history = Array.from({ length: 8 }, (_, i) => ({ step: i + 1, action: `wait ${i}s` }));
  const [sys, user] = buildPrompt(obs, history, 3);
  assert.equal(sys.role, 'system');
  assert.match(systemPrompt(), /<tool_call>/);
  assert.deepEqual(user.content[0], { type: 'image', ref: obs.screenshotRef });
  const text = (user.content[1] as { text: string }).text;
  assert.match(text, /^Goal: Click on the "OK" button\.$/m);
  assert.match(text, /\[1\] button "OK" @\(100,200\)/);
  assert.doesNotMatch(text, /wait 4s/);
  assert.match(text, /8\. wait 7s/);
  assert.match(text, /6\. wait 5s/);
});

test('the example in the system prompt parses into a valid action', () => {
  const example = systemPrompt().split('\n').slice(2, 5).join('\n').replace('[x, y]', '[10, 20]');
  assert.deepEqual(parseAction(example), { type: 'click', x: 10, y: 20, button: 'left', count: 1 });
});

test('blob store: content addressed, idempotent, clear error for a missing blob', async () => {
  const store = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-blob-')));
  const a = await store.put(Buffer.from('hello'), 'txt');
  const b = await store.put('hello', 'txt');
  assert.equal(a, b);
  assert.match(a, /^sha256:[0-9a-f]{64}\.txt$/);
  assert.equal((await store.get(a)).toString(), 'hello');
  const j = await store.putJson({ x: 1 });
  assert.deepEqual(await store.getJson(j), { x: 1 });
  await assert.rejects(store.get('sha256:' + 'b'.repeat(64) + '.png'), BlobNotFoundError);
  assert.throws(() => store.pathOf('../../etc/passwd'), /not a blob reference/);
});

test('action validity and descriptions', () => {
  assert.equal(actionValidity([]), 0);
  const step = (valid: boolean) => ({ completion: { preview: '', finishReason: null, action: { type: 'wait' as const, seconds: 1 }, valid } });
  assert.equal(actionValidity([step(true), step(false), step(true), step(true)]), 0.75);
  assert.equal(describeAction({ type: 'click', x: 1, y: 2, button: 'left', count: 1 }), 'click (1, 2)');
  assert.equal(describeAction({ type: 'invalid', reason: 'empty output', excerpt: '' }), 'invalid: empty output');
});
