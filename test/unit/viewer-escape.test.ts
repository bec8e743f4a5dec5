import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { buildEpisodeView, type Trajectory } from '../../client/commands/view';
import { renderEpisodeHtml } from '../../client/viewer-html';

// A trajectory file is only typed, never validated: a crafted one may put markup where a number or a
// boolean belongs. None of it may reach the page as markup.

const EVIL = '"><script>alert(1)</script><img src=x onerror=alert(2)>';

test('a crafted trajectory with markup in numeric and boolean fields renders no markup of its own', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-view-esc-')));
  const screenshotRef = await blobs.put(Buffer.from('not really a jpeg'), 'jpg');
  const axtreeRef = await blobs.put('[3] button "OK" @(500,500)', 'txt');
  const obs = { url: 'http://x/', step: EVIL, width: EVIL, height: EVIL, screenshotRef, axtreeRef };
  const step = {
    step: EVIL,
    promptRef: 'none',
    observation: obs,
    completion: { preview: 'click', finishReason: EVIL, action: { type: 'click', x: EVIL, y: EVIL }, valid: EVIL },
    shaped: { total: EVIL, terms: [{ term: 'valid_action', value: EVIL, detail: 'd' }] },
    reward: EVIL,
    done: EVIL,
    after: obs,
  };
  const crafted = {
    version: 2,
    workflowId: 'wf',
    task: { env: 'miniwob', task: 'click-button', seed: EVIL },
    policyModel: 'm',
    groups: [{ step: EVIL, chosen: 0, candidates: [{ completion: { preview: 'c', finishReason: null, action: { type: 'click', x: EVIL, y: EVIL }, valid: EVIL }, reward: EVIL }] }],
    success: EVIL,
    reward: EVIL,
    reason: null,
    goal: 'g',
    initial: obs,
    steps: [step, { ...step, completion: { ...step.completion, action: { type: 'click_element', id: EVIL } } }],
  } as unknown as Trajectory;

  const html = renderEpisodeHtml(await buildEpisodeView(crafted, blobs));
  assert.ok(html.includes('&lt;script&gt;'), 'the payload is on the page, as text');
  assert.doesNotMatch(html, /<script/i);
  assert.doesNotMatch(html, /<img src=x/i);
  assert.doesNotMatch(html, /="[^"]*"><script/);
  // Every attribute value stays one attribute: no raw quote from the file closes one early.
  assert.doesNotMatch(html, /=""\s*>/);
});
