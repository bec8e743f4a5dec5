import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { TrainingResult } from '../../workflows/train-engine';
import { withFakeWorkers } from '../helpers/fake-workers';
import { startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';

// A served GRPO run whose policy is a pool of replicas (policy.baseUrls): each new adapter is loaded into every
// replica, and each metrics row carries what the replicas did; a single server's run is as it was.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

const A = 'http://replica-a:8000/v1';
const B = 'http://replica-b:8000/v1';

function servedConfig(q: TestQueues, runId: string, policy: Record<string, unknown>) {
  return {
    temporal: { controlTaskQueue: q.control, browserTaskQueue: q.browser },
    policy: { backend: 'openai', model: 'fake-model', temperature: 1, maxTokens: 32, ...policy },
    episode: { env: 'miniwob', maxSteps: 1, heartbeatTimeoutMs: 5000 },
    train: { runId, iterations: 2, episodesPerIteration: 1, grouping: 'episode', numGenerations: 2, parallelism: 2, tasks: ['click-button'], gpuTaskQueue: q.gpu, vllmBaseUrl: A },
  };
}

describe('trainGrpo on a policy pool', { timeout: 600_000 }, () => {
  test('every adapter goes to every replica; the metrics rows say what each replica did', async () => {
    await withFakeWorkers(env, 'grpo-pool', {}, async ({ q, runId, control }) => {
      const handle = await env.client.workflow.start('trainGrpo', {
        taskQueue: q.control,
        workflowId: runId,
        args: [{ config: servedConfig(q, runId, { baseUrl: A, baseUrls: [A, B] }) }],
      });
      const result = (await handle.result()) as TrainingResult;
      assert.equal(result.adapterVersion, 2);
      assert.deepEqual(
        control.adapterLoads.map((l) => [l.version, l.base_url, l.replicas]),
        [
          [1, A, [A, B]],
          [2, A, [A, B]],
        ],
      );
      // Iteration 2 samples the adapter iteration 1 wrote, by its served name, from the pool.
      assert.deepEqual([...new Set(control.samples.map((s) => s.model))], ['fake-model', `${runId}-v1`]);
      assert.deepEqual(
        control.grpoMetricLines.map((m) => (m.policy_replicas as { url: string; adapter_loads: number }[]).map((r) => [r.url, r.adapter_loads])),
        [
          [
            [A, 1],
            [B, 1],
          ],
          [
            [A, 2],
            [B, 2],
          ],
        ],
      );
    });
  });

  test('one server: the load names no replicas and the rows carry no replica section', async () => {
    await withFakeWorkers(env, 'grpo-single', {}, async ({ q, runId, control }) => {
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: servedConfig(q, runId, { baseUrl: A }) }] });
      await handle.result();
      assert.deepEqual(
        control.adapterLoads.map((l) => [l.version, l.replicas]),
        [
          [1, undefined],
          [2, undefined],
        ],
      );
      assert.ok(control.grpoMetricLines.every((m) => m.policy_replicas === undefined));
    });
  });
});
