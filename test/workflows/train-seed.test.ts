import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { defaultPayloadConverter } from '@temporalio/common';
import { grpoConfig, withFakeWorkers } from '../helpers/fake-workers';
import { startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';

// train.seed (`halo train --seed`): with a seed, the tasks and task seeds of a run's episodes come from the
// seed, not the run id, so two runs with different ids and one seed play the same episodes.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

function config(q: TestQueues, runId: string, seed?: number) {
  const tasks = ['click-button', 'enter-text', 'focus-text', 'click-link'];
  return grpoConfig(q, runId, 1, { episodesPerIteration: 3, parallelism: 3, tasks, ...(seed === undefined ? {} : { seed }) });
}

/** The (task, seed) of each episode of iteration 1, read from the children's start events. */
async function episodes(runId: string): Promise<string[]> {
  const out: string[] = [];
  // Episode grouping: each pick runs numGenerations (2) times, as ep2j and ep2j+1.
  for (const j of [0, 2, 4]) {
    const h = await env.client.workflow.getHandle(`${runId}-it1-ep${j}`).fetchHistory();
    const input = defaultPayloadConverter.fromPayload(h.events![0].workflowExecutionStartedEventAttributes!.input!.payloads![0]) as { task: { task: string; seed: number } };
    out.push(`${input.task.task}#${input.task.seed}`);
  }
  return out;
}

test('train.seed replaces the run id as the source of tasks and seeds', { timeout: 600_000 }, async () => {
  const played: Record<string, string[]> = {};
  for (const [name, seed] of [
    ['seed-a', 7],
    ['seed-b', 7],
    ['seed-c', undefined],
  ] as const) {
    await withFakeWorkers(env, name, {}, async ({ q, runId }) => {
      await env.client.workflow.execute('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: config(q, runId, seed) }] });
      played[name] = await episodes(runId);
    });
  }
  assert.deepEqual(played['seed-a'], played['seed-b'], 'same seed, different run ids: the same episodes');
  assert.notDeepEqual(played['seed-c'], played['seed-a'], 'no seed: the run id decides');
});
