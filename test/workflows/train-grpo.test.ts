import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { ApplicationFailure } from '@temporalio/common';
import { WorkflowFailedError } from '@temporalio/client';
import type { TrainingResult } from '../../workflows/train-engine';
import { grpoConfig, withFakeWorkers } from '../helpers/fake-workers';
import { pauseResumeStopTraining } from '../helpers/run-control-scenario';
import { continueAsNewChain, recordHistories, startWorkflowEnv } from '../helpers/workflow-env';
import { resumeSignal, statusQuery, stopSignal } from '../../workflows/messages';

// `trainGrpo` with mocked episodes' activities, batch, metrics and learner: one iteration per workflow run,
// and an operator's pause, resume and stop.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/** Opening a session fails for good for the named episodes (a site that does not come back). */
const failingEpisodes = (...suffixes: string[]) => ({
  start: (input: { episodeId: string }) => {
    if (suffixes.some((s) => input.episodeId.endsWith(s))) throw ApplicationFailure.nonRetryable(`site down for ${input.episodeId}`, 'SiteDown');
  },
});

// Its tests run at once: each waits mostly on the dev server's round trips, under a run id of its own (the routed workers).
describe('trainGrpo', { timeout: 600_000, concurrency: true }, () => {
  test('runs one iteration per workflow run: 3 iterations, 3 updates (v1..v3), metrics once each', async () => {
    await withFakeWorkers(env, 'grpo-can', {}, async ({ q, runId, control, learner }) => {
      const handle = await env.client.workflow.start('trainGrpo', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: grpoConfig(q, runId, 3) }],
      });
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 3, adapterVersion: 3, stoppedEarly: false });
      assert.deepEqual(
        learner.updates.map((u) => [u.kind, u.run_id, u.version]),
        [
          ['grpo', runId, 1],
          ['grpo', runId, 2],
          ['grpo', runId, 3],
        ],
      );
      // Each iteration samples its two episodes with the adapter the previous iteration wrote.
      assert.deepEqual(
        learner.samples.map((s) => s.version),
        [0, 0, 1, 1, 2, 2],
      );
      // The sampler's tokens travel as blob references: the learner is asked to store them, nothing is inline.
      assert.ok(learner.samples.every((s) => s.storeTokens));
      const tokens = control.trajectories.flatMap((t) => t.tokens);
      assert.ok(tokens.length > 0 && tokens.every((t) => t?.startsWith('sha256:')), `trajectory tokens: ${tokens.join(', ')}`);
      assert.deepEqual(control.grpoMetrics, [1, 2, 3]);
      assert.deepEqual(
        control.grpoBatches.map((b) => [b.iteration, b.trajectories]),
        [
          [1, 2],
          [2, 2],
          [3, 2],
        ],
      );
      assert.deepEqual(await continueAsNewChain(env, runId, handle.firstExecutionRunId), ['ContinuedAsNew', 'ContinuedAsNew', 'Completed']);
      await recordHistories(env, runId, handle.firstExecutionRunId, 'engine');
    });
  });

  test('maxStaleness 1: the next rollouts sample from the newest adapter while the update runs; v1..v4 once, staleness ≤ 1 recorded', async () => {
    await withFakeWorkers(env, 'grpo-pipe', {}, async ({ q, runId, control, learner }) => {
      learner.updateHolds.hold(1);
      const handle = await env.client.workflow.start('trainGrpo', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: grpoConfig(q, runId, 4, { maxStaleness: 1 }) }],
      });
      // While the update to v1 is held, iteration 2's two episodes sample (from v0): the halves overlap.
      await learner.updateHolds.reached(1);
      const deadline = Date.now() + 30_000;
      while (learner.samples.length < 4 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
      assert.equal(learner.samples.length, 4, "iteration 2's rollouts did not run during the update on iteration 1");
      assert.deepEqual(control.grpoMetrics, [], 'no metrics before the first update completes');
      learner.updateHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 4, adapterVersion: 4, stoppedEarly: false });
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1, 2, 3, 4],
        'each version written once, in order',
      );
      // Iteration i samples from v<i − 2> (v0 for the first two): one update behind the on-policy adapter.
      assert.deepEqual(
        learner.samples.map((s) => s.version),
        [0, 0, 0, 0, 1, 1, 2, 2],
      );
      assert.deepEqual(control.grpoMetrics, [1, 2, 3, 4]);
      assert.deepEqual(
        control.grpoMetricLines.map((m) => [m.sampled_adapter_version, m.staleness, m.adapter_version]),
        [
          [0, 0, 1],
          [0, 1, 2],
          [1, 1, 3],
          [2, 1, 4],
        ],
      );
      assert.deepEqual(
        control.grpoBatches.map((b) => [b.iteration, b.trajectories]),
        [
          [1, 2],
          [2, 2],
          [3, 2],
          [4, 2],
        ],
      );
      // Runs: rollouts 1 | rollouts 2 + update 1 | rollouts 3 + update 2 | rollouts 4 + update 3, then update 4.
      assert.deepEqual(await continueAsNewChain(env, runId, handle.firstExecutionRunId), ['ContinuedAsNew', 'ContinuedAsNew', 'ContinuedAsNew', 'Completed']);
    });
  });

  test('maxStaleness 1: a stop still learns from the rollouts already collected', async () => {
    await withFakeWorkers(env, 'grpo-pipe-stop', {}, async ({ q, runId, control, learner }) => {
      learner.updateHolds.hold(1);
      const handle = await env.client.workflow.start('trainGrpo', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: grpoConfig(q, runId, 5, { maxStaleness: 1 }) }],
      });
      await learner.updateHolds.reached(1);
      await handle.signal(stopSignal);
      learner.updateHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      // Iteration 2's rollouts ran beside update 1; the stop ends the run after learning from them.
      assert.deepEqual(result, { runId, iterations: 2, adapterVersion: 2, stoppedEarly: true });
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1, 2],
      );
      assert.deepEqual(control.grpoMetrics, [1, 2]);
    });
  });

  test('maxStaleness 1: a stop that arrives while the collected batch is being stored survives continue-as-new', async () => {
    await withFakeWorkers(env, 'grpo-pipe-stop-store', {}, async ({ q, runId, control, learner }) => {
      control.collectedStoreHolds.hold(1);
      const handle = await env.client.workflow.start('trainGrpo', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: grpoConfig(q, runId, 5, { maxStaleness: 1 }) }],
      });
      // The first run has collected iteration 1 and decided to go on; its batch is being stored.
      await control.collectedStoreHolds.reached(1);
      await handle.signal(stopSignal);
      control.collectedStoreHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      // The next run learns from iteration 1's batch and collects nothing more.
      assert.deepEqual(result, { runId, iterations: 1, adapterVersion: 1, stoppedEarly: true });
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1],
      );
      assert.equal(learner.samples.length, 2, "only iteration 1's two episodes sampled");
      assert.deepEqual(control.grpoMetrics, [1]);
      assert.deepEqual(await continueAsNewChain(env, runId, handle.firstExecutionRunId), ['ContinuedAsNew', 'Completed']);
      await recordHistories(env, runId, handle.firstExecutionRunId, 'stop-while-storing');
    });
  });

  test('pause waits before the next iteration, resume continues, stop ends after the current iteration', async () => {
    await withFakeWorkers(env, 'grpo-pause', {}, async (w) => {
      const { control, learner } = w;
      const s = await pauseResumeStopTraining<TrainingResult>(env, w, 'trainGrpo', grpoConfig(w.q, w.runId, 3), () => learner.samples.length + learner.updates.length);
      assert.equal(s.afterResume.iteration, 2);
      assert.deepEqual(
        learner.samples.map((s) => s.version),
        [0, 0, 1, 1],
      );
      assert.deepEqual(control.grpoMetrics, [1, 2]);
    });
  });

  test('a failed episode is counted and left out of the batch; the run goes on', async () => {
    await withFakeWorkers(env, 'grpo-fail1', { browser: failingEpisodes('-it1-ep3') }, async ({ q, runId, control }) => {
      const cfg = grpoConfig(q, runId, 2, { episodesPerIteration: 2 }); // 2 tasks × N=2: 4 episodes per iteration
      const result = (await env.client.workflow.execute('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] })) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 2, adapterVersion: 2, stoppedEarly: false });
      assert.deepEqual(
        control.grpoBatches.map((b) => [b.iteration, b.trajectories]),
        [
          [1, 3],
          [2, 4],
        ],
      );
      assert.equal(control.grpoMetricLines[0].failed_episodes, 1);
      assert.equal(control.grpoMetricLines[1].failed_episodes, undefined);
    });
  });

  test('more failed episodes than train.maxFailedEpisodeShare fail the run, naming the reasons', async () => {
    await withFakeWorkers(env, 'grpo-fail2', { browser: failingEpisodes('-it1-ep1', '-it1-ep3') }, async ({ q, runId, control }) => {
      const cfg = grpoConfig(q, runId, 2, { episodesPerIteration: 2, maxFailedEpisodeShare: 0.25 });
      const err = await env.client.workflow.execute('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] }).then(
        () => assert.fail('the run should fail'),
        (e: unknown) => e,
      );
      assert.ok(err instanceof WorkflowFailedError);
      const cause = err.cause as ApplicationFailure;
      assert.equal(cause.type, 'TooManyFailures');
      assert.match(cause.message, /2 of 4 episodes of iteration 1 failed, more than train\.maxFailedEpisodeShare = 0\.25/);
      assert.match(cause.message, /site down for .*-it1-ep1/);
      assert.deepEqual(control.grpoBatches, [], 'no update from an iteration with too many failures');
    });
  });

  test('below the free-disk threshold an iteration does not start: the run pauses with the reason, resume checks again', async () => {
    await withFakeWorkers(env, 'grpo-disk', {}, async ({ q, runId, control, browser, learner }) => {
      control.freeDiskBytes = 1.5 * 2 ** 30; // below the default stack.minFreeDiskGiB (2)
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: grpoConfig(q, runId, 1) }] });
      let st: { paused: boolean; pauseReason?: string } = { paused: false };
      for (let i = 0; i < 200 && !st.pauseReason; i++) {
        st = await handle.query(statusQuery);
        if (!st.pauseReason) await new Promise((r) => setTimeout(r, 100));
      }
      assert.equal(st.paused, true);
      assert.match(st.pauseReason ?? '', /disk almost full: 1\.50 GiB free at \/fake-home, below stack\.minFreeDiskGiB \(2\.00 GiB\).*halo gc/);
      assert.equal(browser.starts.length, 0, 'no episode started on a full disk');
      // A resume with the disk still full pauses again; after space is freed it goes on.
      await handle.signal(resumeSignal);
      for (let i = 0; i < 200; i++) {
        st = await handle.query(statusQuery);
        if (control.diskChecks.length >= 2 && st.paused) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.deepEqual([st.paused, control.diskChecks.length, browser.starts.length], [true, 2, 0]);
      control.freeDiskBytes = 50 * 2 ** 30;
      await handle.signal(resumeSignal);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual([result.iterations, result.stoppedEarly], [1, false]);
      assert.equal(learner.updates.length, 1);
      assert.equal(control.diskChecks.length, 3);
    });
  });

  // Two one-step episodes per iteration: 2 environment steps each. Every 3 steps: past 3 in iteration 2, past 6
  // in iteration 3, none in iteration 4 (8 steps); the same when iterations are pipelined.
  for (const maxStaleness of [0, 1]) {
    test(`train.evalEverySteps: held-out evaluation after the iterations that pass a multiple of K steps (maxStaleness ${maxStaleness})`, async () => {
      await withFakeWorkers(env, `grpo-evalsteps${maxStaleness}`, {}, async ({ q, runId, control }) => {
        const cfg = grpoConfig(q, runId, 4, { evalEverySteps: 3, heldOutTasks: ['click-link'], maxStaleness });
        const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
        const result = (await handle.result()) as TrainingResult;
        assert.equal(result.iterations, 4);
        if (maxStaleness === 1) await recordHistories(env, runId, handle.firstExecutionRunId, 'engine-pipelined-eval');
        assert.deepEqual(
          control.grpoMetricLines.map((l) => (l.eval as { episodes: number } | undefined)?.episodes ?? 0),
          [0, 1, 1, 0],
        );
      });
    });
  }
});
