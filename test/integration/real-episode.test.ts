import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { WorkflowFailedError } from '@temporalio/client';
import { BlobStore } from '../../blob/store';
import { singleEpisodeInput } from '../../client/episode-input';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';
import { startTestStack, type TestStack } from '../../testing/stack';

// A REAL v2 task through the whole durable path: episode workflow, browser worker, RealEnv against a local
// site that speaks the REAL protocol, milestone rewards from the page and the client state, and the task's
// real agisdk eval script judging the final /finish state.
let site: FakeRealSite;
let policy: FakePolicyServer;
let stack: TestStack;
const TASK = 'gomail-18';

before(async () => {
  site = await startFakeRealSite();
  policy = await startFakePolicyServer({
    kind: 'scripted',
    email: { to: 'brian.king@example.com', subject: 'Meeting notes', body: 'Hi Brian, could you please send me the notes from our meeting? Thanks!' },
  });
  process.env.HALO_REAL_ORIGIN = site.origin; // inherited by the browser worker
  stack = await startTestStack({ browserWorkers: 1 });
});
after(async () => {
  await stack?.stop();
  await policy?.close();
  await site?.close();
});

function input(task: string, maxSteps: number, real: Record<string, unknown> = {}) {
  return singleEpisodeInput(
    parseConfig({
      temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      policy: { baseUrl: policy.url, model: 'fake-qwen', timeoutMs: 10_000 },
      episode: { env: 'real', task, seed: 0, maxSteps },
      real,
    }),
    `real-${task}`,
  );
}

let n = 0;
const run = (task: string, maxSteps: number, real: Record<string, unknown> = {}): Promise<EpisodeResult> =>
  stack.client.workflow.execute('episode', { taskQueue: stack.controlQueue, workflowId: `real-${++n}-${Date.now()}`, args: [input(task, maxSteps, real)] });

test('gomail episode: milestones fire once each, the real eval script says SUCCESS, +10 task success', async () => {
  const r = await run(TASK, 10);
  assert.equal(r.success, true, JSON.stringify(r));
  assert.equal(r.reward, 1);
  assert.equal(r.actionPath.at(-1)?.type, 'answer');
  const blobs = new BlobStore(join(stack.home, 'blobs'));
  const traj = await blobs.getJson<{ steps: { shaped: { terms: { term: string; value: number }[] } }[] }>(r.trajectoryRef);
  const terms = traj.steps.flatMap((s) => s.shaped.terms.map((t) => t.term));
  for (const m of ['compose_opened', 'recipient_filled', 'subject_filled', 'send_visible', 'sent_confirmation']) {
    assert.equal(terms.filter((t) => t === `milestone:gomail.${m}`).length, 1, `${m} fires exactly once: ${terms.join(', ')}`);
  }
  assert.equal(terms.filter((t) => t === 'task_success').length, 1);
  assert.ok(r.shapedReturn > 10 + 1.4, `shaped return ${r.shapedReturn}`);
  // The protocol: /config for this task before the agent page.
  const config = site.hits('/config').at(-1);
  assert.equal(config?.query.task_id, `v2.${TASK}`);
  assert.equal(config?.query.run_id, '0');
});

test('step cap: reward 0 without evaluation by default, evaluated when switched on', async () => {
  const capped = await run(TASK, 3);
  assert.equal(capped.done, true);
  assert.equal(capped.success, false);
  assert.equal(capped.reward, 0);
  const evaluated = await run(TASK, 6, { evaluateAtCap: true });
  // Six steps reach "sent" but not the answer: the evaluation at the cap judges the sent email.
  assert.equal(evaluated.steps, 6);
  assert.equal(evaluated.success, true, JSON.stringify(evaluated));
  assert.equal(evaluated.reward, 1);
});

test('an unscorable task and an unknown task fail at once with clear reasons', async () => {
  for (const [task, pattern] of [
    ['gocalendar-11', /gocalendar-11.*(empty|unscorable)/i],
    ['gomail-999', /unknown REAL task "gomail-999"/],
  ] as const) {
    await assert.rejects(run(task, 3), (err: unknown) => {
      assert.ok(err instanceof WorkflowFailedError);
      const msgs: string[] = [];
      for (let e: unknown = err; e instanceof Error; e = e.cause) msgs.push(e.message);
      assert.match(msgs.join(' <- '), pattern);
      return true;
    });
  }
});
