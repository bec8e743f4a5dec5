import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { WorkflowHandle } from '@temporalio/client';
import { followStatus } from '../../client/train';
import type { TrainingStatus } from '../../workflows/train-engine';

/** A handle whose status query answers the given statuses in turn; its result comes with the poll after the last. */
function scriptedHandle(statuses: Partial<TrainingStatus>[]): WorkflowHandle {
  let i = 0;
  let finish: (v: unknown) => void = () => {};
  const done = new Promise((resolve) => {
    finish = resolve;
  });
  return {
    query: async () => {
      const st = statuses[Math.min(i, statuses.length - 1)];
      i++;
      if (i > statuses.length) finish({ runId: 'r', iterations: 3, adapterVersion: 3 });
      return { phase: 'rollout', paused: false, adapterVersion: 0, lastMetrics: null, ...st };
    },
    result: () => done,
  } as unknown as WorkflowHandle;
}

test("progress keeps the run's iteration total while a continued run has not read its config yet (it answers 0)", async () => {
  const lines: string[] = [];
  const handle = scriptedHandle([
    { iteration: 1, iterations: 0 },
    { iteration: 1, iterations: 3 },
    { iteration: 2, iterations: 0 },
    { iteration: 3, iterations: 3 },
  ]);
  const result = await followStatus(
    handle,
    (st) => `iteration ${st.iteration}/${st.iterations}`,
    (l) => lines.push(l),
    5,
  );
  assert.equal(result.adapterVersion, 3);
  assert.deepEqual(lines, ['iteration 1/0', 'iteration 1/3', 'iteration 2/3', 'iteration 3/3'], 'only before any total is known does it show 0');
});
