import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as profiles from '../../workflows/activity-profiles';
import { clipSummary, clipUrlForSummary, SUMMARY_MAX_BYTES, SUMMARY_URL_CHARS } from '../../lib/model-io/text';

const bytes = (s: string) => Buffer.byteLength(s, 'utf8');

test('activity summaries carry clipped page URLs: no query, no fragment, bounded length', () => {
  const url = `https://shop.example/${'p/'.repeat(400)}item?session=SECRET-TOKEN&q=${'x'.repeat(5000)}#frag`;
  const summary = `step 3: click [12] "Buy" on ${url}`;
  for (const opts of [profiles.modelCall(60_000, 3, summary), profiles.sessionOpen('q', 10_000, summary), profiles.onSession('q', 10_000, 10_000, summary)]) {
    const s = opts.summary as string;
    assert.ok(bytes(s) <= SUMMARY_MAX_BYTES, `${bytes(s)} bytes`);
    assert.ok(s.startsWith('step 3: click [12] "Buy" on https://shop.example/p/'), s);
    assert.ok(!s.includes('SECRET-TOKEN') && !s.includes('frag'), s);
  }
});

test('clipSummary: short summaries unchanged, one line, multi-byte text cut on a character boundary', () => {
  assert.equal(clipSummary('update_policy grpo-local v3 (8 items)'), 'update_policy grpo-local v3 (8 items)');
  assert.equal(clipSummary('step 1: goto on http://127.0.0.1:8080/miniwob/click-button.html'), 'step 1: goto on http://127.0.0.1:8080/miniwob/click-button.html');
  assert.equal(clipSummary('a\nb\r\n c'), 'a b c');
  const wide = clipSummary('é'.repeat(500) + '😀'.repeat(100));
  assert.ok(bytes(wide) <= SUMMARY_MAX_BYTES);
  assert.ok(wide.endsWith('…') && !wide.includes('\ufffd'));
  assert.equal(clipUrlForSummary('http://a/b?c=d'), 'http://a/b?…');
  assert.equal(clipUrlForSummary(`http://a/${'b'.repeat(200)}`).length, SUMMARY_URL_CHARS);
  assert.ok(clipSummary(`x data:image/png;base64,${'A'.repeat(10_000)}`).length < 100);
});
