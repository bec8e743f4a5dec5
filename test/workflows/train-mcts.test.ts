import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { Action } from '../../lib/model-io/actions';
import type { TrainingResult } from '../../workflows/train-engine';
import { FakeBrowser, FakeControl, FakeLearner, fakeRef } from '../helpers/fake-activities';
import { withFakeWorkers } from '../helpers/fake-workers';
import { pauseResumeStopTraining } from '../helpers/run-control-scenario';
import {
  chainChildWorkflows,
  childWorkflows,
  continueAsNewChain,
  eventually,
  recordHistories,
  startWorkflowEnv,
  testQueues,
  withWorkers,
  type TestQueues,
} from '../helpers/workflow-env';

// `trainMcts` with a tiny search (2 simulations, 2 children, no critic) and every activity mocked: one
// iteration per workflow run, searches that continue as new from a stored tree, and pause, resume, stop.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/** The one place an MCTS run's config is written. */
function mctsConfig(q: TestQueues, runId: string, iterations: number, continueAsNewEvery = 10, mcts: Record<string, unknown> = {}, policy: Record<string, unknown> = {}) {
  return {
    temporal: { controlTaskQueue: q.control, browserTaskQueue: q.browser },
    policy: { backend: 'colocated', model: 'fake-model', temperature: 1, maxTokens: 32, ...policy },
    episode: { env: 'miniwob', heartbeatTimeoutMs: 5000 },
    train: { gpuTaskQueue: q.gpu },
    mcts: {
      runId,
      iterations,
      tasks: ['click-button'],
      numSimulations: 2,
      maxChildren: 2,
      maxDepth: 2,
      continueAsNewEvery,
      critic: { backend: 'none' },
      ...mcts,
    },
  };
}

/** Every first step ends the episode: the click at x = 100 succeeds, any other fails (so siblings differ). */
const succeedsAt100 = (c: { action: Action }) => ({ done: true, success: c.action.type === 'click' && c.action.x === 100 });

// Its tests run at once: each waits mostly on the dev server's round trips, under a run id of its own (the routed workers).
describe('trainMcts', { timeout: 600_000, concurrency: true }, () => {
  test('runs one iteration per workflow run, each search continuing as new from its stored tree', async () => {
    await withFakeWorkers(env, 'mcts-can', { browser: { step: succeedsAt100 } }, async ({ q, runId, browser, control, learner }) => {
      const handle = await env.client.workflow.start('trainMcts', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: mctsConfig(q, runId, 2, 1) }],
      });
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 2, adapterVersion: 2, stoppedEarly: false });
      assert.deepEqual(await continueAsNewChain(env, runId, handle.firstExecutionRunId), ['ContinuedAsNew', 'Completed']);
      assert.deepEqual(
        learner.updates.map((u) => [u.kind, u.run_id, u.version]),
        [
          ['dpo', runId, 1],
          ['dpo', runId, 2],
        ],
      );
      // One expansion (K = 2) per search, with the adapter the previous iteration wrote.
      assert.deepEqual(
        learner.samples.map((s) => [s.version, s.n]),
        [
          [0, 2],
          [1, 2],
        ],
      );
      assert.deepEqual(control.mctsMetrics, [
        { iteration: 1, adapterVersion: 1, pairs: 1 },
        { iteration: 2, adapterVersion: 2, pairs: 1 },
      ]);
      assert.equal(control.dpoBatches.length, 2);
      // Two simulations per search: each restored the root and ran one child; both children were tried.
      assert.deepEqual(
        browser.starts.map((s) => s.replay.length),
        [0, 0, 0, 0],
      );
      assert.deepEqual(browser.steps.map((s) => (s.action.type === 'click' ? s.action.x : -1)).sort(), [100, 100, 200, 200]);
      // continueAsNewEvery 1: the first iteration's search ran its second simulation in a new run, from the snapshot.
      const [search] = await childWorkflows(env, runId, handle.firstExecutionRunId);
      assert.equal(search.workflowId, `${runId}-it1-click-button`);
      assert.deepEqual(await continueAsNewChain(env, search.workflowId, search.runId), ['ContinuedAsNew', 'Completed']);
    });
  });

  test('searchesPerTask: several searches of one task per iteration, each on its own seed, their pairs in one update', async () => {
    await withFakeWorkers(env, 'mcts-repeats', { browser: { step: succeedsAt100 } }, async ({ q, runId, control, learner }) => {
      const handle = await env.client.workflow.start('trainMcts', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: mctsConfig(q, runId, 1, 10, { searchesPerTask: 3, parallelism: 2 }) }],
      });
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 1, adapterVersion: 1, stoppedEarly: false });
      const searches = await childWorkflows(env, runId, handle.firstExecutionRunId);
      assert.deepEqual(searches.map((c) => c.workflowId).sort(), [`${runId}-it1-click-button`, `${runId}-it1-click-button-2`, `${runId}-it1-click-button-3`]);
      const seeds = await Promise.all(
        searches.map(async (c) => {
          const history = await env.client.workflow.getHandle(c.workflowId, c.runId).fetchHistory();
          const payload = history.events?.[0]?.workflowExecutionStartedEventAttributes?.input?.payloads?.[0]?.data;
          return (JSON.parse(Buffer.from(payload ?? []).toString('utf8')) as { task: { seed: number } }).task.seed;
        }),
      );
      assert.equal(new Set(seeds).size, 3, `each search on its own seed: ${seeds}`);
      assert.equal(learner.samples.length, 3, 'one expansion per search');
      assert.deepEqual(control.mctsMetrics, [{ iteration: 1, adapterVersion: 1, pairs: 3 }], "the three searches' pairs in the one update");
      assert.equal(learner.updates.length, 1);
    });
  });

  test('valueMode shaped: children that never end are valued by their shaped return over shapedScale (rollout: 0 at the depth cap)', async () => {
    // No action ends the episode: the click at x = 100 reaches a new page (shaped 1), any other earns 0.25.
    const step = (c: { action: Action }) => ({ shaped: c.action.type === 'click' && c.action.x === 100 ? 1 : 0.25 });
    for (const [valueMode, expected] of [
      ['rollout', [0, 0]],
      ['shaped', [0.25, 0.0625]],
    ] as const) {
      await withFakeWorkers(env, `mcts-value-${valueMode}`, { browser: { step } }, async ({ q, runId, control }) => {
        const handle = await env.client.workflow.start('trainMcts', {
          taskQueue: q.control,
          workflowId: runId,
          args: [{ config: mctsConfig(q, runId, 1, 10, { valueMode, shapedScale: 2, maxDepth: 1 }) }],
        });
        await handle.result();
        const nodes = [...control.blobs.values()].flatMap((v) => (v as { nodes?: { depth: number; action: Action; valueSum: number; data: { shaped?: number } }[] }).nodes ?? []);
        const children = nodes.filter((n) => n.depth === 1).sort((a, b) => (a.action.type === 'click' ? a.action.x : 0) - (b.action.type === 'click' ? b.action.x : 0));
        assert.deepEqual(
          children.map((n) => [n.action.type === 'click' ? n.action.x : -1, n.data.shaped, n.valueSum]),
          [
            [100, 1, expected[0]],
            [200, 0.25, expected[1]],
          ],
        );
      });
    }
  });

  test('a session restored by replaying a path continues the shaping state recorded at its node, not a fresh one', async () => {
    // parkedSessions 0: every simulation opens a new session and replays its node's path. The fake step appends
    // `state-<n>` to the pages visited, and a new session starts with none.
    await withFakeWorkers(env, 'mcts-reward-state', {}, async ({ q, runId, browser }) => {
      const handle = await env.client.workflow.start('trainMcts', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: mctsConfig(q, runId, 1, 10, { numSimulations: 4, maxDepth: 2, parkedSessions: 0, valueMode: 'shaped' }) }],
      });
      await handle.result();
      const second = browser.steps.filter((s) => s.index === 1);
      assert.ok(
        browser.starts.some((s) => s.replay.length === 1),
        'a depth-1 node was restored by replay',
      );
      assert.ok(second.length > 0);
      for (const s of second) assert.deepEqual(s.visited, ['state-1'], `the second action (${s.sessionId}) is paid against the first one's pages`);
    });
  });

  test('pause waits before the next iteration, resume continues, stop ends after the current iteration', async () => {
    await withFakeWorkers(env, 'mcts-pause', { browser: { step: succeedsAt100 } }, async (w) => {
      const { browser, control, learner } = w;
      await pauseResumeStopTraining<TrainingResult>(env, w, 'trainMcts', mctsConfig(w.q, w.runId, 3), () => browser.starts.length + browser.resets.length + learner.samples.length);
      assert.deepEqual(
        control.mctsMetrics.map((m) => m.iteration),
        [1, 2],
      );
      // Each search's first simulation opens a spare at the root in the background (mcts.parkedSessions), which
      // its second one takes as it is: two sessions per search, nothing reset.
      assert.deepEqual([browser.starts.length, browser.resets.length], [4, 0], 'two searches of two simulations: no third iteration started');
      assert.deepEqual([...browser.closes].sort(), browser.starts.map((s) => s.sessionId).sort(), 'every session closed once when its search ended');
    });
  });

  test("mcts.rollout stream: searches stream into DPO updates, each update from the searches of one iteration's worth", async () => {
    await withFakeWorkers(env, 'mcts-stream', { browser: { step: succeedsAt100 } }, async ({ q, runId, control, learner }) => {
      learner.updateHolds.hold(1);
      const cfg = mctsConfig(q, runId, 3, 10, { rollout: 'stream', maxStaleness: 1, searchesPerTask: 1 });
      const handle = await env.client.workflow.start('trainMcts', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
      await learner.updateHolds.reached(1);
      // While the first DPO update is held, the second search runs (the bound admits k + 1 = 2 before it ends).
      await eventually('the second search sampling during update 1', () => (learner.samples.filter((s) => s.n === 2).length >= 2 ? true : undefined), 120_000);
      learner.updateHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 3, adapterVersion: 3, stoppedEarly: false });
      assert.deepEqual(
        learner.updates.map((u) => [u.kind, u.version]),
        [
          ['dpo', 1],
          ['dpo', 2],
          ['dpo', 3],
        ],
      );
      assert.deepEqual(
        control.grpoMetricLines.map((l) => [l.algorithm, l.staleness, (l.stream as { groups_dropped_stale: number }).groups_dropped_stale]),
        [
          ['mcts', 0, 0],
          ['mcts', 1, 0],
          ['mcts', 1, 0],
        ],
      );
    });
  });

  test('on the training engine: pipelined (maxStaleness 1) and evaluated on held-out tasks and seeds, one metrics row per iteration', async () => {
    await withFakeWorkers(env, 'mcts-engine', { browser: { step: succeedsAt100 } }, async ({ q, runId, control, learner }) => {
      const cfg = mctsConfig(q, runId, 2, 10, { maxStaleness: 1, evalEvery: 1, heldOutTasks: ['click-link'], evalSeeds: [3, 4] });
      const handle = await env.client.workflow.start('trainMcts', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
      const result = (await handle.result()) as TrainingResult;
      const { best, ...ended } = result;
      assert.deepEqual(ended, { runId, iterations: 2, adapterVersion: 2, stoppedEarly: false });
      // Both evaluations succeeded in every episode: the latest of equals is the best.
      assert.deepEqual(best, { version: 2, iteration: 2, success: 1 });
      // Iteration 2's search ran while the update on iteration 1 wrote v1: both searched with v0.
      assert.deepEqual(
        learner.samples.filter((s) => s.n === 2).map((s) => s.version),
        [0, 0],
      );
      assert.deepEqual(
        learner.updates.map((u) => [u.kind, u.version]),
        [
          ['dpo', 1],
          ['dpo', 2],
        ],
      );
      // The same row as GRPO's: held-out evaluation (1 task × 2 seeds) and staleness, the MCTS keys in their section.
      assert.deepEqual(
        control.grpoMetricLines.map((l) => [l.algorithm, (l.eval as { episodes: number }).episodes, l.staleness, (l.mcts as { pairs: number }).pairs]),
        [
          ['mcts', 2, 0, 1],
          ['mcts', 2, 1, 1],
        ],
      );
      const chained = await chainChildWorkflows(env, runId, handle.firstExecutionRunId);
      const children = chained.map((c) => c.workflowId);
      assert.deepEqual(
        children.filter((id) => id.includes('-eval')),
        [`${runId}-it1-eval0`, `${runId}-it1-eval1`, `${runId}-it2-eval0`, `${runId}-it2-eval1`],
      );
      await recordHistories(env, runId, handle.firstExecutionRunId, 'engine-pipelined-eval');
      // A search (parked sessions, proposals counted) and a greedy evaluation episode, as this code runs them.
      const search = chained.find((c) => !c.workflowId.includes('-eval'))!;
      const evalEpisode = chained.find((c) => c.workflowId.includes('-eval'))!;
      await recordHistories(env, search.workflowId, search.runId, 'search-parked-sessions');
      await recordHistories(env, evalEpisode.workflowId, evalEpisode.runId, 'greedy-eval');
    });
  });

  test('policy.constrained: every expansion and rollout samples under the page grammar, on both backends', async () => {
    // The first actions never end the episode, so each child is valued by a rollout (one more sample at its state).
    for (const backend of ['colocated', 'openai'] as const) {
      const q = testQueues(`mcts-constrained-${backend}`);
      const runId = `mcts-constrained-${backend}-${process.pid}`;
      const browser = new FakeBrowser(q, { step: () => ({ done: false }) });
      const control = new FakeControl().activities();
      const learner = new FakeLearner().activities();
      const grammars: string[] = [];
      const colocated: { n: number; grammarRef?: string }[] = [];
      const served: { n: number; constrained?: boolean }[] = [];
      await withWorkers(
        env,
        [
          {
            taskQueue: q.control,
            workflows: true,
            activities: {
              ...control,
              writePromptAndGrammar: async (input: { observation: { url: string; step: number } }) => {
                const grammarRef = fakeRef(`grammar:${input.observation.url}:${grammars.length}`);
                grammars.push(grammarRef);
                return { promptRef: fakeRef(`prompt:${input.observation.url}`), grammarRef };
              },
              samplePolicy: async (input: { policy: { constrained?: boolean; n: number; model: string }; n?: number; observation: { step: number } }) => {
                served.push({ n: input.n ?? input.policy.n, constrained: input.policy.constrained });
                return control.samplePolicy(input);
              },
            },
          },
          { taskQueue: q.browser, activities: browser.browserActivities() },
          { taskQueue: q.session, activities: browser.sessionActivities() },
          {
            taskQueue: q.gpu,
            activities: {
              ...learner,
              sample_actions: async (input: { run_id: string; version: number; n: number; prompt_ref: string; grammar_ref?: string }) => {
                colocated.push({ n: input.n, ...(input.grammar_ref ? { grammarRef: input.grammar_ref } : {}) });
                return learner.sample_actions(input);
              },
            },
          },
        ],
        async () => {
          const cfg = mctsConfig(q, runId, 1, 10, {}, { backend, constrained: true });
          const handle = await env.client.workflow.start('trainMcts', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
          await handle.result();
        },
      );
      // One expansion of the root (K = 2), then one rollout sample for each of its two children.
      if (backend === 'colocated') {
        assert.deepEqual(
          colocated.map((c) => c.n),
          [2, 1, 1],
        );
        assert.ok(
          colocated.every((c) => c.grammarRef !== undefined && grammars.includes(c.grammarRef)),
          `every sample_actions call names the grammar written for its page: ${JSON.stringify(colocated)}`,
        );
        assert.equal(served.length, 0);
      } else {
        assert.deepEqual(served, [
          { n: 2, constrained: true },
          { n: 1, constrained: true },
          { n: 1, constrained: true },
        ]);
        assert.equal(colocated.length, 0);
      }
    }
  });
});
