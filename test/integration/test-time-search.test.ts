import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeInput, EpisodeResult } from '../../lib/episode/episode-types';
import { testTimeSearchParams } from '../../lib/eval/eval-config';
import type { MctsSearchResult, MctsTreeView } from '../../lib/search/mcts-search';
import { startFakeCriticServer, type FakeCriticServer } from '../../testing/fake-critic-server';
import { startFakePolicyServer, toolCall, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../../testing/stack';

// Test-time MCTS on the real stack (Temporal, Chromium, MiniWoB++ click-button): a local OpenAI-compatible
// policy whose first sample clicks a wrong button and whose other samples click the right one by element id,
// and a local critic. Greedy decoding fails; the search plays what the critic prefers, and it never reads the
// task's success signal: with a critic that prefers the wrong button it fails although its tree holds the
// winning click.
let stack: TestStack;
let policy: FakePolicyServer;
let critic: FakeCriticServer;
before(async () => {
  [stack, policy, critic] = await Promise.all([
    startTestStack({ browserWorkers: 1 }),
    startFakePolicyServer({
      kind: 'custom',
      answer: ({ goal, tree, choice }) => {
        const target = /Click on the "(.+?)" button/.exec(goal)?.[1];
        const buttons = tree.filter((l) => l.role === 'button');
        const right = buttons.find((b) => b.name === target);
        const wrong = buttons.find((b) => b.name !== target);
        if (!right || !wrong) return toolCall({ action: 'wait', time: 0 });
        return choice === 0 ? toolCall({ action: 'left_click', coordinate: [wrong.x, wrong.y] }) : toolCall({ action: 'click_element', element_id: right.id });
      },
    }),
    startFakeCriticServer({ kind: 'prefer', substring: 'click element', value: 0.5, outcomeValue: 0.6 }),
  ]);
});
after(async () => {
  await Promise.all([stack?.stop(), policy?.close(), critic?.close()]);
});

function episodeInput(search: boolean): EpisodeInput {
  const cfg = parseConfig({
    policy: { backend: 'openai', baseUrl: policy.url, model: 'fake', maxTokens: 64, timeoutMs: 5_000, temperature: 0 },
    mcts: { maxChildren: 2, critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic', timeoutMs: 5_000 } },
  });
  return {
    task: { env: 'miniwob', task: 'click-button', seed: 4 },
    maxSteps: 3,
    policy: cfg.policy,
    browserTaskQueue: stack.browserQueue,
    sessionStartTimeoutMs: 5_000,
    heartbeatTimeoutMs: 5_000,
    runId: 'tts',
    mode: search ? 'qwen3vl_mcts' : 'greedy',
    ...(search ? { search: { params: testTimeSearchParams(cfg, { simulations: 3 }) } } : {}),
  };
}

async function runEpisode(id: string, input: EpisodeInput): Promise<EpisodeResult> {
  return (await stack.client.workflow.execute('episode', { taskQueue: stack.controlQueue, workflowId: id, args: [input] })) as EpisodeResult;
}

test('greedy fails where test-time search, guided by the critic, succeeds; ended states are judged by the critic', async (t) => {
  const greedy = await runEpisode('tts-greedy', episodeInput(false));
  assert.equal(greedy.success, false, 'the first sample clicks a wrong button');
  assert.equal(greedy.actionPath[0].type, 'click');

  critic.requests.length = 0;
  const searched = await runEpisode('tts-search', episodeInput(true));
  assert.equal(searched.success, true, JSON.stringify(searched));
  assert.equal(searched.steps, 1);
  assert.equal(searched.actionPath[0].type, 'click_element');

  // The step's search: a child workflow rooted at the empty prefix, 3 simulations, its decision played.
  const handle = stack.client.workflow.getHandle('tts-search-search1');
  const res = (await handle.result()) as MctsSearchResult;
  t.diagnostic(`search: ${JSON.stringify(res.stats)}; decision ${JSON.stringify(res.decision)}`);
  assert.equal(res.simulations, 3);
  assert.deepEqual(res.decision?.action, searched.actionPath[0]);
  assert.equal(res.decision?.visits, 2);
  const view = await handle.query<MctsTreeView>('tree');
  const children = view.tree!.nodes.filter((n) => n.parent === 0);
  assert.equal(children.length, 2);
  // Both buttons end the episode (one succeeds, one fails): both are valued by the critic's judgement 0.6.
  for (const c of children) assert.deepEqual([c.terminal, c.reward], [true, 0.6]);
  const outcomes = critic.requests.filter((r) => r.kind === 'outcome');
  assert.equal(outcomes.length, 2, 'each ended state was judged once');
  for (const r of outcomes) assert.equal(r.actions.length, 1);
  assert.equal(critic.requests.filter((r) => r.kind === 'rank').length, 1, 'the root was ranked once');
  assert.equal(res.counters.criticCalls, 3);
});

test('the search never reads the success signal: a critic that prefers the wrong button makes it fail', async () => {
  critic.setMode({ kind: 'prefer', substring: 'click (', value: 0.5, outcomeValue: 0.6 });
  try {
    const searched = await runEpisode('tts-search-wrong', episodeInput(true));
    assert.equal(searched.success, false);
    assert.equal(searched.actionPath[0].type, 'click');
    const view = await stack.client.workflow.getHandle('tts-search-wrong-search1').query<MctsTreeView>('tree');
    const winning = view.tree!.nodes.find((n) => n.parent === 0 && n.action?.type === 'click_element');
    assert.ok(winning && winning.visits >= 1 && winning.terminal, 'the winning click was explored');
    assert.equal(winning.reward, 0.6, 'and valued like any ended episode');
  } finally {
    critic.setMode({ kind: 'prefer', substring: 'click element', value: 0.5, outcomeValue: 0.6 });
  }
});
