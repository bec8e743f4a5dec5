import { after, before, beforeEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createCriticActivities, CRITIC_MAX_TOKENS, type CritiqueInput } from '../../activities/critic';
import { describeAction } from '../../lib/model-io/actions';
import type { PromptMessage } from '../../lib/model-io/prompt';
import { startFakeCriticServer, type FakeCriticServer } from '../../testing/fake-critic-server';
import { failureOf } from '../helpers/application-failure';

// @temporalio/testing is not installed: the activity is called directly (outside a worker it has no
// cancellation signal), and its ApplicationFailure fields are what Temporal would see.

let critic: FakeCriticServer;
let root: string;
let blobs: BlobStore;
let activities: ReturnType<typeof createCriticActivities>;
let input: CritiqueInput;
const png = Buffer.from('89504e470d0a1a0a0000000d4948445200000001000000010806000000', 'hex');

const candidates = [
  describeAction({ type: 'wait', seconds: 1 }),
  describeAction({ type: 'click_element', id: 4 }),
  describeAction({ type: 'scroll', direction: 'down', amount: 300 }),
  describeAction({ type: 'click', x: 500, y: 120, button: 'left', count: 1 }),
];

before(async () => {
  critic = await startFakeCriticServer();
  root = mkdtempSync(join(tmpdir(), 'halo-critic-'));
  blobs = new BlobStore(root);
  activities = createCriticActivities(blobs);
  input = {
    critic: { baseUrl: critic.url, model: 'fake-critic', timeoutMs: 10_000, temperature: 0 },
    observation: {
      goal: 'Open the message from Alice.',
      url: 'http://x/mail',
      step: 2,
      screenshotRef: await blobs.put(png, 'png'),
      axtreeRef: await blobs.put('[4] link "Alice: lunch?" @(500,120)', 'txt'),
    },
    candidates,
  };
});
after(async () => {
  await critic?.close();
  rmSync(root, { recursive: true, force: true });
});
beforeEach(() => {
  critic.requests.length = 0;
});

describe('critiqueCandidates against an OpenAI-compatible critic', () => {
  test('a preferring critic: ranking, value and priors come back; prompt and completion are stored', async () => {
    critic.setMode({ kind: 'prefer', substring: 'click', value: 0.75 });
    const r = await activities.critiqueCandidates(input);
    // Candidates containing "click": 1 and 3 (index order), then 0 and 2.
    assert.deepEqual(r.ranking, [1, 3, 0, 2]);
    assert.equal(r.value, 0.75);
    assert.equal(r.ok, true);
    assert.equal(r.reason, undefined);
    // k = 4, linear priors by rank: 1, 2/3, 1/3, 0 → by candidate: [1/3, 1, 0, 2/3]
    assert.deepEqual(r.priors, [1 / 3, 1, 0, 2 / 3]);
    assert.equal(r.model, 'fake-critic');
    assert.equal((await blobs.get(r.completionRef)).toString(), '{"ranking":[1,3,0,2],"value":0.75}');
    const prompt = await blobs.getJson<PromptMessage[]>(r.promptRef);
    assert.deepEqual(prompt[1].content[0], { type: 'image', ref: input.observation.screenshotRef });
    assert.match((prompt[1].content[1] as { text: string }).text, /\[4\] link "Alice: lunch\?"/);

    assert.equal(critic.requests.length, 1);
    const req = critic.requests[0];
    assert.deepEqual(req.candidates, candidates);
    assert.equal(req.goal, 'Open the message from Alice.');
    assert.equal(req.model, 'fake-critic');
    assert.equal(req.n, 1);
    assert.equal(req.temperature, 0);
    assert.equal(req.maxTokens, CRITIC_MAX_TOKENS);
    assert.match(req.system, /critic of a web agent/);
  });

  test('the request carries the screenshot as an image', async () => {
    critic.setMode({ kind: 'prefer', substring: 'scroll' });
    const r = await activities.critiqueCandidates({ ...input, critic: { ...input.critic, maxTokens: 64, temperature: 0.3 } });
    assert.deepEqual(r.ranking, [2, 0, 1, 3]);
    assert.equal(r.value, 0.8);
    const req = critic.requests[0];
    assert.equal(req.hasImage, true);
    assert.equal(req.imageMime, 'image/png');
    assert.deepEqual(req.imageBytes, png);
    assert.equal(req.maxTokens, 64);
    assert.equal(req.temperature, 0.3);
  });

  test('garbage from the critic is ok:false with the neutral verdict, not a failure', async () => {
    critic.setMode({ kind: 'garbage' });
    const r = await activities.critiqueCandidates(input);
    assert.equal(r.ok, false);
    assert.deepEqual(r.ranking, [0, 1, 2, 3]);
    assert.equal(r.value, 0.5);
    assert.deepEqual(r.priors, [1, 2 / 3, 1 / 3, 0]);
    assert.match(r.reason ?? '', /no JSON object found/);
    assert.match((await blobs.get(r.completionRef)).toString(), /hard to say/);
  });

  test('an answer cut off at max_tokens says so in the reason', async () => {
    critic.setMode({ kind: 'raw', text: '{"ranking": [1, 0', finishReason: 'length' });
    const r = await activities.critiqueCandidates(input);
    assert.equal(r.ok, false);
    assert.match(r.reason ?? '', /truncated JSON.*hit max_tokens/);
  });

  test('a partial ranking is completed', async () => {
    critic.setMode({ kind: 'raw', text: 'Best is 3.\n{"ranking": [3], "value": 0.2}' });
    const r = await activities.critiqueCandidates(input);
    assert.deepEqual([r.ok, r.ranking, r.value], [true, [3, 0, 1, 2], 0.2]);
  });

  test('HTTP 400 is a non-retryable ApplicationFailure', async () => {
    critic.setMode({ kind: 'status', status: 400 });
    const f = await failureOf(activities.critiqueCandidates(input));
    assert.equal(f.nonRetryable, true);
    assert.equal(f.type, 'PolicyRequestRejected');
    assert.match(f.message, /^critic call failed: .*HTTP 400/);
    assert.match(f.message, /fake-critic/);
    assert.equal(critic.requests.length, 1, 'the client does not retry');
  });

  test('HTTP 429 and 500 are retryable', async () => {
    for (const status of [429, 500]) {
      critic.setMode({ kind: 'status', status });
      const f = await failureOf(activities.critiqueCandidates(input));
      assert.equal(f.nonRetryable, false, `status ${status}`);
    }
    assert.equal(critic.requests.length, 2, 'one request per call: no client retries');
  });

  test('no candidates or a bad critic config are non-retryable', async () => {
    const none = await failureOf(activities.critiqueCandidates({ ...input, candidates: [] }));
    assert.equal(none.nonRetryable, true);
    assert.equal(none.type, 'CriticBadInput');
    const bad = await failureOf(activities.critiqueCandidates({ ...input, critic: { ...input.critic, baseUrl: 'not a url' } }));
    assert.equal(bad.nonRetryable, true);
    assert.equal(bad.type, 'CriticConfigInvalid');
    assert.match(bad.message, /critic\.baseUrl/);
    assert.equal(critic.requests.length, 0);
  });

  test('an unreachable critic is retryable', async () => {
    const closed = await startFakeCriticServer();
    const url = closed.url;
    await closed.close();
    const f = await failureOf(activities.critiqueCandidates({ ...input, critic: { ...input.critic, baseUrl: url } }));
    assert.equal(f.nonRetryable, false);
    assert.equal(f.type, 'PolicyServerUnreachable');
  });
});
