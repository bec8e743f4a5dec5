import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { TrainResult } from '../../workflows/train-grpo';
import { withFakeWorkers } from '../helpers/fake-workers';
import { pauseResumeStop } from '../helpers/run-control-scenario';
import { continueAsNewChain, startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';

// `trainGrpo` with mocked episodes' activities, batch, metrics and learner: one iteration per workflow run,
// and an operator's pause, resume and stop.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/** The one place a GRPO run's config is written: two one-step episodes per iteration, sampled by the colocated learner. */
function grpoConfig(q: TestQueues, runId: string, iterations: number) {
  return {
    temporal: { controlTaskQueue: q.control, browserTaskQueue: q.browser },
    policy: { backend: 'colocated', model: 'fake-model', temperature: 1, maxTokens: 32 },
    episode: { env: 'miniwob', maxSteps: 1, heartbeatTimeoutMs: 5000 },
    train: {
      runId,
      iterations,
      episodesPerIteration: 1,
      grouping: 'episode',
      numGenerations: 2,
      parallelism: 2,
      tasks: ['click-button'],
      gpuTaskQueue: q.gpu,
    },
  };
}

describe('trainGrpo', { timeout: 90_000 }, () => {
  test('runs one iteration per workflow run: 3 iterations, 3 updates (v1..v3), metrics once each', async () => {
    await withFakeWorkers(env, 'grpo-can', {}, async ({ q, runId, control, learner }) => {
      const handle = await env.client.workflow.start('trainGrpo', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: grpoConfig(q, runId, 3) }],
      });
      const result = (await handle.result()) as TrainResult;
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
    });
  });

  test('pause waits before the next iteration, resume continues, stop ends after the current iteration', async () => {
    await withFakeWorkers(env, 'grpo-pause', {}, async ({ q, runId, control, learner }) => {
      const s = await pauseResumeStop<TrainResult>({
        start: async () => {
          await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: grpoConfig(q, runId, 3) }] });
          return env.client.workflow.getHandle(runId);
        },
        units: learner.updateHolds,
        pausedBeforeSecond: (st) => st.iteration === 2,
        work: () => learner.samples.length + learner.updates.length,
      });
      assert.equal(s.whilePaused.paused, true);
      assert.equal(s.whilePaused.iteration, 2);
      assert.equal(s.whilePaused.phase, 'paused');
      assert.equal(s.afterResume.paused, false);
      assert.equal(s.afterResume.iteration, 2);
      assert.equal(s.whileStopping.stopping, true);
      assert.deepEqual(s.result, { runId, iterations: 2, adapterVersion: 2, stoppedEarly: true });
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1, 2],
      );
      assert.deepEqual(
        learner.samples.map((s) => s.version),
        [0, 0, 1, 1],
      );
      assert.deepEqual(control.grpoMetrics, [1, 2]);
    });
  });
});
