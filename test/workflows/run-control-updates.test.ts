import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { TrainingResult } from '../../workflows/train-engine';
import { withFakeWorkers } from '../helpers/fake-workers';
import { pauseResumeStopTraining } from '../helpers/run-control-scenario';
import { startWorkflowEnv } from '../helpers/workflow-env';
import { describeControl, sendRunControl } from '../../client/run-messages';

// Pause, resume and stop as Workflow Updates: the same run-control scenario as the signals, and each update
// answers with the run's status right after the change.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

test('pause, resume and stop as updates: each answers with the status after the change; the run pauses, goes on and stops', { timeout: 600_000 }, async () => {
  await withFakeWorkers(env, 'grpo-updates', {}, async (w) => {
    const config = {
      temporal: { controlTaskQueue: w.q.control, browserTaskQueue: w.q.browser },
      policy: { backend: 'colocated', model: 'fake-model', temperature: 1, maxTokens: 32 },
      episode: { env: 'miniwob', maxSteps: 1, heartbeatTimeoutMs: 5000 },
      train: { runId: w.runId, iterations: 3, episodesPerIteration: 1, grouping: 'episode', numGenerations: 2, parallelism: 2, tasks: ['click-button'], gpuTaskQueue: w.q.gpu },
    };
    const s = await pauseResumeStopTraining<TrainingResult>(env, w, 'trainGrpo', config, () => w.learner.samples.length + w.learner.updates.length, 'update');
    const a = s.answers;
    assert.ok(a, 'the updates answered');
    // Paused while iteration 1's update was in flight: the answer already says paused, not yet stopping.
    assert.deepEqual([a.pause.runId, a.pause.paused, a.pause.stopping, a.pause.iteration], [w.runId, true, false, 1]);
    assert.deepEqual([a.resume.paused, a.resume.stopping, a.resume.iteration], [false, false, 2]);
    assert.deepEqual([a.stop.paused, a.stop.stopping, a.stop.iteration], [false, true, 2]);
  });
});

test('halo stop: the update answers with the status after the change; with no worker to answer, it goes as the signal', { timeout: 600_000 }, async () => {
  await withFakeWorkers(env, 'grpo-stop-cli', {}, async (w) => {
    const config = {
      temporal: { controlTaskQueue: w.q.control, browserTaskQueue: w.q.browser },
      policy: { backend: 'colocated', model: 'fake-model', temperature: 1, maxTokens: 32 },
      episode: { env: 'miniwob', maxSteps: 1, heartbeatTimeoutMs: 5000 },
      train: { runId: w.runId, iterations: 3, episodesPerIteration: 1, grouping: 'episode', numGenerations: 2, parallelism: 2, tasks: ['click-button'], gpuTaskQueue: w.q.gpu },
    };
    w.learner.updateHolds.hold(1);
    const handle = await env.client.workflow.start('trainGrpo', { taskQueue: w.q.control, workflowId: w.runId, args: [{ config }] });
    await w.learner.updateHolds.reached(1);
    const answer = await sendRunControl(env.connection, handle, 'stop', 30_000);
    assert.ok('status' in answer, JSON.stringify(answer));
    assert.deepEqual([answer.status.runId, answer.status.stopping, answer.status.paused], [w.runId, true, false]);
    assert.match(describeControl(w.runId, 'stop', answer, 30_000), new RegExp(`^run ${w.runId}: stop taken; phase .*, paused false, stopping true$`));
    w.learner.updateHolds.release(1);
    assert.deepEqual(await handle.result(), { runId: w.runId, iterations: 1, adapterVersion: 1, stoppedEarly: true });
  });

  // A run on a queue no worker polls: the update cannot be answered, so the stop goes as a signal and waits in its history.
  const handle = await env.client.workflow.start('trainGrpo', { taskQueue: `nobody-polls-${process.pid}`, workflowId: `unattended-${process.pid}`, args: [{ config: {} }] });
  try {
    const answer = await sendRunControl(env.connection, handle, 'stop', 1_500);
    assert.deepEqual(answer, { signalled: true });
    assert.match(describeControl('unattended', 'stop', answer, 1_500), /^stop sent to run unattended as a signal \(no control worker answered in 1\.5 s/);
    const history = await handle.fetchHistory();
    assert.ok(history.events?.some((e) => e.workflowExecutionSignaledEventAttributes?.signalName === 'stop'));
  } finally {
    await handle.terminate('test over');
  }
});
