import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { WorkflowFailedError } from '@temporalio/client';
import { ApplicationFailure } from '@temporalio/common';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { parseConfig } from '../../lib/config/config';
import { episodeFootprint } from '../../lib/config/history-budget';
import type { EpisodeInput, EpisodeResult } from '../../lib/episode/episode-types';
import { click, sessionGone, type FakeBrowser, type FakeBrowserOptions, type FakeControl, type PolicyScript } from '../helpers/fake-activities';
import { withFakeWorkers } from '../helpers/fake-workers';
import { recordHistories, startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';

// `episode` with every activity mocked: lost sessions and their rebuilds, and step groups (forked sessions).

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/** The one place an episode input is built (its shape follows lib/episode/episode-types.ts). */
function episodeInput(
  q: TestQueues,
  o: { maxSteps: number; maxSessionRebuilds?: number; sessionStartTimeoutMs?: number; env?: 'miniwob' | 'real'; grouping?: EpisodeInput['grouping'] },
): EpisodeInput {
  return {
    task: { env: o.env ?? 'miniwob', task: 'click-button', seed: 7 },
    maxSteps: o.maxSteps,
    policy: parseConfig({ policy: { backend: 'openai', model: 'fake-model' } }).policy,
    mode: 'test',
    run: {
      runId: 'episode-test',
      browserTaskQueue: q.browser,
      gpuTaskQueue: q.gpu,
      learnerHeartbeatTimeoutMs: 10_000,
      maxSessionRebuilds: o.maxSessionRebuilds ?? 5,
      sessionStartTimeoutMs: o.sessionStartTimeoutMs ?? 10_000,
      heartbeatTimeoutMs: 5_000,
    },
    ...(o.grouping ? { grouping: o.grouping } : {}),
  };
}

/**
 * Runs one episode on the fake workers (control, browser, session; the learner is never asked). With `record`,
 * its history goes to HALO_RECORD_HISTORY under that label, for test/integration/replay.test.ts.
 */
async function runEpisode(
  name: string,
  input: (q: TestQueues) => EpisodeInput,
  browserOpts: FakeBrowserOptions,
  policy?: PolicyScript,
  record?: string,
): Promise<{ browser: FakeBrowser; control: FakeControl; outcome: { ok: true; result: EpisodeResult } | { ok: false; error: unknown } }> {
  return withFakeWorkers(env, name, { browser: browserOpts, policy }, async ({ q, runId, browser, control }) => {
    try {
      const workflowId = runId;
      const handle = await env.client.workflow.start('episode', { taskQueue: q.control, workflowId, args: [input(q)] });
      const result = await handle.result();
      if (record) await recordHistories(env, workflowId, handle.firstExecutionRunId, record);
      return { browser, control, outcome: { ok: true as const, result: result as EpisodeResult } };
    } catch (error) {
      return { browser, control, outcome: { ok: false as const, error } };
    }
  });
}

function failureCause(outcome: { ok: boolean; error?: unknown }): ApplicationFailure {
  assert.equal(outcome.ok, false, 'the episode should have failed');
  const err = (outcome as { error: unknown }).error;
  assert.ok(err instanceof WorkflowFailedError, `expected WorkflowFailedError, got ${String(err)}`);
  assert.ok(err.cause instanceof ApplicationFailure, `expected an ApplicationFailure cause, got ${String(err.cause)}`);
  return err.cause;
}

// Its tests run at once: each waits mostly on the dev server's round trips, under a run id of its own (the routed workers).
describe('episode: lost sessions', { timeout: 600_000, concurrency: true }, () => {
  test('a session lost at every step gives up with a non-retryable SessionLost after maxSessionRebuilds rebuilds, each replaying the action prefix', async () => {
    // Step 1 works; from then on the session's worker fails every step (a retryable failure = session lost).
    const { browser, control, outcome } = await runEpisode('lost-always', (q) => episodeInput(q, { maxSteps: 5, maxSessionRebuilds: 2 }), {
      step: (c) => (c.index === 0 ? { shaped: 0.1 } : sessionGone()),
    });
    const cause = failureCause(outcome);
    assert.equal(cause.type, 'SessionLost');
    assert.equal(cause.nonRetryable, true);
    assert.match(cause.message, /lost 3 times/);
    const a1 = click(100, 100);
    // The reset, then two rebuilds, both replaying the one action taken before the losses.
    assert.deepEqual(
      browser.starts.map((s) => s.replay),
      [[], [a1], [a1]],
    );
    // Step 2 was tried once in each of the three sessions, always as action index 1 with the same action.
    assert.deepEqual(
      browser.steps.filter((s) => s.index === 1).map((s) => s.sessionId),
      ['s1', 's2', 's3'],
    );
    assert.equal(new Set(browser.steps.filter((s) => s.index === 1).map((s) => JSON.stringify(s.action))).size, 1);
    // The rebuild re-ran the same action: the policy was asked for step 2 once.
    assert.deepEqual(
      control.samples.map((s) => s.step),
      [0, 1],
    );
    // No session outlives the failed episode.
    assert.deepEqual([...browser.closes].sort(), ['s1', 's2', 's3']);
  });

  test('a session whose worker is gone (nobody polls its queue) counts as lost after sessionStartTimeoutMs', async () => {
    const { browser, outcome } = await runEpisode('lost-timeout', (q) => episodeInput(q, { maxSteps: 3, maxSessionRebuilds: 1, sessionStartTimeoutMs: 1000 }), {
      sessionQueue: (n) => `nobody-polls-this-${process.pid}-${n}`,
    });
    const cause = failureCause(outcome);
    assert.equal(cause.type, 'SessionLost');
    assert.equal(cause.nonRetryable, true);
    assert.match(cause.message, /lost 2 times/);
    assert.deepEqual(
      browser.starts.map((s) => s.replay),
      [[], []],
    );
    assert.equal(browser.steps.length, 0, 'no step can have run: the session queues have no worker');
  });

  test('a session lost mid-episode is rebuilt by replaying the prefix, and the episode goes on with the same actions', async () => {
    let failed = false;
    const { browser, control, outcome } = await runEpisode(
      'lost-once',
      (q) => episodeInput(q, { maxSteps: 3, maxSessionRebuilds: 2 }),
      {
        step: (c) => {
          if (c.index === 1 && !failed) {
            failed = true;
            sessionGone('renderer crashed');
          }
          return { shaped: 0.25, done: c.index === 2, success: c.index === 2 };
        },
      },
      undefined,
      'session-lost-once',
    );
    assert.ok(outcome.ok, `episode failed: ${String((outcome as { error?: unknown }).error)}`);
    const r = outcome.result;
    const [a1, a2, a3] = [click(100, 100), click(100, 101), click(100, 102)];
    assert.deepEqual(r.actionPath, [a1, a2, a3]);
    assert.equal(r.sessionRebuilds, 1);
    assert.equal(r.steps, 3);
    assert.equal(r.success, true);
    assert.equal(r.shapedReturn, 0.75);
    assert.deepEqual(
      browser.starts.map((s) => s.replay),
      [[], [a1]],
    );
    // Step 2 failed in s1 and ran again in s2 as the same action at the same index; step 3 followed in s2.
    assert.deepEqual(
      browser.steps.map((s) => `${s.sessionId} #${s.index} ${s.action.type === 'click' ? s.action.y : '?'}`),
      ['s1 #0 100', 's1 #1 101', 's2 #1 101', 's2 #2 102'],
    );
    // The step the lost session never answered is not counted; the rebuild is a session and replays one action.
    assert.deepEqual(r.browser, { sessions: 2, steps: 3, replayedActions: 1 });
    assert.deepEqual(
      control.samples.map((s) => s.step),
      [0, 1, 2],
      'one sample per step: the rebuild does not sample again',
    );
    assert.deepEqual([...browser.closes].sort(), ['s1', 's2']);
  });
});

describe('episode: step groups', { timeout: 600_000, concurrency: true }, () => {
  test("grouping 'best' continues in the fork whose candidate got the highest shaped reward and closes the others", async () => {
    // Three candidates per state; the shaped reward is the candidate's x / 1000, so the best is known:
    // step 1: x = 100, 300, 200 → candidate 2; step 2: x = 500, 400, 600 → candidate 3.
    const xs = [
      [100, 300, 200],
      [500, 400, 600],
    ];
    const policy: PolicyScript = (step) => xs[step].map((x) => click(x, 10 + step));
    const { browser, control, outcome } = await runEpisode(
      'group-best',
      // REAL at the step cap asks the episode's session to finish: that shows which session the episode kept.
      (q) => episodeInput(q, { maxSteps: 2, env: 'real', grouping: { n: 3, choose: 'best' } }),
      { step: (c) => ({ shaped: c.action.type === 'click' ? c.action.x / 1000 : 0 }) },
      policy,
      'step-group-forks',
    );
    assert.ok(outcome.ok, `episode failed: ${String((outcome as { error?: unknown }).error)}`);
    const r = outcome.result;
    const best1 = click(300, 10);
    const best2 = click(600, 11);
    assert.deepEqual(r.actionPath, [best1, best2]);
    assert.equal(r.groups, 2);
    assert.equal(r.shapedReturn, 0.9);
    assert.deepEqual(
      control.samples.map((s) => s.n),
      [3, 3],
    );

    // Each candidate ran in its own fork: three forks per step, the step-2 forks replaying step 1's winner.
    assert.equal(browser.starts.length, 1 + 3 + 3);
    // The browser work counts every fork and every candidate's step: N·T steps in 1 + N·T sessions, while the
    // episode's own steps are T.
    assert.equal(r.steps, 2);
    assert.deepEqual(r.browser, { sessions: 1 + 3 * 2, steps: 3 * 2, replayedActions: 3 * 1 });
    assert.equal(r.browser!.steps, browser.steps.length);
    assert.equal(
      r.browser!.replayedActions,
      browser.starts.reduce((n, s) => n + s.replay.length, 0),
    );
    assert.deepEqual(
      browser.starts.slice(1, 4).map((s) => s.replay),
      [[], [], []],
    );
    assert.deepEqual(
      browser.starts.slice(4).map((s) => s.replay),
      [[best1], [best1], [best1]],
    );
    const winner1 = browser.sessionThatRan(best1, 0)!;
    const winner2 = browser.sessionThatRan(best2, 1)!;
    assert.ok(winner1 && winner2);
    // Every fork ran exactly one candidate.
    for (const s of browser.starts.slice(1)) assert.equal(browser.steps.filter((x) => x.sessionId === s.sessionId).length, 1);

    // The episode ended in step 2's winning fork (the step-cap finish ran there), and closed it after that.
    assert.deepEqual(browser.finishes, [winner2]);
    assert.ok(browser.events.indexOf(`close ${winner2}`) > browser.events.indexOf(`finish ${winner2}`));
    // Losing forks were closed, and so was each session the episode left behind (the reset session, then step 1's winner).
    const losers = browser.starts
      .slice(1)
      .map((s) => s.sessionId)
      .filter((id) => id !== winner1 && id !== winner2);
    assert.equal(losers.length, 4);
    assert.deepEqual([...browser.closes].sort(), ['s1', winner1, winner2, ...losers].sort());
    assert.equal(new Set(browser.closes).size, browser.closes.length, 'each session closed once');
  });

  test("the history of a step-grouped episode stays within the config check's bound (lib/config/history-budget.ts)", async () => {
    const shape = { n: 4, forks: true, maxSteps: 6, maxTokens: 256 };
    const policy: PolicyScript = (step, n) => Array.from({ length: n }, (_, i) => click(100 + 10 * i, 10 + step));
    const events = await withFakeWorkers(env, 'group-budget', { browser: {}, policy }, async ({ q, runId }) => {
      const id = runId;
      const r = (await env.client.workflow.execute('episode', {
        taskQueue: q.control,
        workflowId: id,
        args: [episodeInput(q, { maxSteps: shape.maxSteps, grouping: { n: shape.n, choose: 'best' } })],
      })) as EpisodeResult;
      assert.equal(r.steps, shape.maxSteps);
      return (await env.client.workflow.getHandle(id).fetchHistory()).events?.length ?? 0;
    });
    const bound = episodeFootprint(shape).events;
    console.error(`step-grouped episode, n ${shape.n}, ${shape.maxSteps} steps: ${events} history events, bound ${bound}`);
    // Upper bound, not a guess far above: the check must not refuse configs that fit many times over.
    assert.ok(events <= bound && events >= bound / 4, `${events} events against the bound ${bound}`);
  });
});

describe('episode: dynamic sampling', { timeout: 600_000, concurrency: true }, () => {
  test('dynamic sampling: a group whose candidates all failed alike draws n more (exploring) until one differs, up to maxCandidates; the episode goes on from its own draw', async () => {
    // Draw 0 and draw 1 score 0 everywhere; draw 2 holds a click worth 1. Step 2's first draw differs: no extra draw.
    const draws = new Map<number, number>();
    const xs = (step: number, d: number) => (step === 1 ? [600, 100] : d < 2 ? [100 + 10 * d, 105 + 10 * d] : [700, 130]);
    const policy: PolicyScript = (step) => {
      const d = draws.get(step) ?? 0;
      draws.set(step, d + 1);
      return xs(step, d).map((x) => click(x, 10 + step + d));
    };
    const { browser, control, outcome } = await runEpisode(
      'group-dynamic',
      (q) => episodeInput(q, { maxSteps: 2, env: 'real', grouping: { n: 2, choose: 'best', maxCandidates: 8, explore: 0.5 } }),
      { step: (c) => ({ shaped: c.action.type === 'click' && c.action.x >= 500 ? 1 : 0 }) },
      policy,
    );
    assert.ok(outcome.ok, `episode failed: ${String((outcome as { error?: unknown }).error)}`);
    assert.deepEqual(
      control.samples.map((s) => [s.step, s.n]),
      [
        [0, 2],
        [0, 2],
        [0, 2],
        [1, 2],
      ],
    );
    assert.deepEqual(control.groups, [
      { rewards: [0, 0, 0, 0, 1, 0], chosen: 0, firstDraw: 2 },
      { rewards: [1, 0], chosen: 0 },
    ]);
    // The episode played a candidate of step 1's own draw (the extra draws only teach), then step 2's best.
    assert.deepEqual(outcome.result.actionPath, [click(100, 10), click(600, 11)]);
    // Every extra candidate ran in a fork of its own, closed once scored: 1 + 6 + 2 sessions, each closed once.
    assert.equal(browser.starts.length, 1 + 6 + 2);
    assert.equal(new Set(browser.closes).size, browser.closes.length);
    assert.equal(browser.closes.length, browser.starts.length);
  });

  test('dynamic sampling stops at maxCandidates, and a group with a success draws no more', async () => {
    const policy: PolicyScript = (step, n) => Array.from({ length: n }, (_, i) => click(100 + 10 * i, 10 + step));
    const capped = await runEpisode(
      'group-capped',
      (q) => episodeInput(q, { maxSteps: 1, env: 'real', grouping: { n: 2, choose: 'best', maxCandidates: 5 } }),
      { step: () => ({ shaped: 0 }) },
      policy,
    );
    assert.ok(capped.outcome.ok);
    // 5 allows one extra draw of 2 (a third would make 6).
    assert.deepEqual(capped.control.groups, [{ rewards: [0, 0, 0, 0], chosen: 0, firstDraw: 2 }]);
    const solved = await runEpisode(
      'group-solved',
      (q) => episodeInput(q, { maxSteps: 1, env: 'real', grouping: { n: 2, choose: 'best', maxCandidates: 8 } }),
      { step: () => ({ shaped: 1, done: true, success: true }) },
      policy,
    );
    assert.ok(solved.outcome.ok);
    assert.deepEqual(solved.control.groups, [{ rewards: [1, 1], chosen: 0 }]);
  });
});
