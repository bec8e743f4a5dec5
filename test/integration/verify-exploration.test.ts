import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT } from '../../client/processes';
import { firstDifference, formatExploration, verifyExploration } from '../../client/commands/verify-exploration';
import { parseConfig } from '../../lib/config/config';
import { startFakePolicyServer, toolCall, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../../testing/stack';

// Two real episodes (MiniWoB++ in Chromium, Temporal) of one task and seed, sampled from a fake policy whose
// answers depend on the request's temperature: greedy waits, and at 0.7 it scrolls from its third step on.
let stack: TestStack;
let policy: FakePolicyServer;
before(async () => {
  stack = await startTestStack({ browserWorkers: 1 });
  policy = await startFakePolicyServer({
    kind: 'custom',
    answer: ({ previous, temperature }) => (temperature > 0 && previous.length >= 2 ? toolCall({ action: 'scroll', pixels: -100 }) : toolCall({ action: 'wait', time: 0 })),
  });
});
after(async () => {
  await policy?.close();
  await stack?.stop();
});

test('firstDifference: the first differing step, the end of the shorter sequence, or null', () => {
  assert.equal(firstDifference(['a', 'b'], ['a', 'c']), 1);
  assert.equal(firstDifference(['a'], ['a', 'b']), 1);
  assert.equal(firstDifference(['a', 'b'], ['a', 'b']), null);
});

test('verify-exploration: same seed at temperatures 0 and 0.7, both action sequences and where they part', async () => {
  const cfg = parseConfig({
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'openai', baseUrl: policy.url, model: 'scripted' },
    episode: { env: 'miniwob', task: 'scroll-text', seed: 7, maxSteps: 4, sessionStartTimeoutMs: 10_000 },
    stack: { home: stack.home },
  });
  const r = await verifyExploration(stack.client, cfg, [0, 0.7]);
  assert.deepEqual(r.a.actions, ['wait 0s', 'wait 0s', 'wait 0s', 'wait 0s']);
  assert.deepEqual(r.b.actions, ['wait 0s', 'wait 0s', 'scroll down 100px', 'scroll down 100px']);
  assert.equal(r.firstDifference, 2);
  assert.deepEqual([...new Set(policy.requests.map((q) => q.temperature))].sort(), [0, 0.7], 'each episode sampled at its temperature');
  assert.deepEqual([r.seed, r.task], [7, 'scroll-text']);
  const text = formatExploration(r);
  assert.match(text, /temperature 0 .* temperature 0\.7/);
  assert.match(text, /2\*\s+wait 0s\s+scroll down 100px/);
  assert.match(text, /part at step 2/);
});

test('halo verify-exploration refuses a temperature out of range, naming the flag', async () => {
  const run = promisify(execFile)(process.execPath, [join(REPO_ROOT, 'bin', 'halo.cjs'), 'verify-exploration', '--task', 'click-button', '--temperature-b', '9'], {
    cwd: REPO_ROOT,
  });
  await assert.rejects(run, (err: { code?: number; stderr?: string }) => {
    assert.equal(err.code, 2);
    assert.match(err.stderr ?? '', /--temperature-b 9: .*temperature/);
    return true;
  });
});
