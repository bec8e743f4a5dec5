import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createMetricsActivities } from '../../activities/metrics';
import type { TrainingMetrics } from '../../lib/training/run-metrics';
import { iterationMetrics } from '../../lib/training/training-metrics';

const TIME = '2025-01-02T03:04:05.000Z';

test("a metrics object carrying run_id, iteration or time cannot override the line's own", async () => {
  const root = mkdtempSync(join(tmpdir(), 'halo-runs-keys-'));
  const acts = createMetricsActivities(root);
  const metrics = {
    ...iterationMetrics({ groups: [{ rewards: [0, 1] }], episodes: [{ success: true, steps: 1, validActions: 1, shapedReturn: 1 }], phaseSeconds: {} }),
    run_id: 'other-run',
    iteration: 99,
    time: '1999-01-01T00:00:00.000Z',
  } as unknown as TrainingMetrics;
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-a', iteration: 2, time: TIME, metrics }), { appended: true });
  const lines = readFileSync(join(root, 'run-a', 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l));
  assert.equal(lines.length, 1);
  assert.equal(lines[0].run_id, 'run-a');
  assert.equal(lines[0].iteration, 2);
  assert.equal(lines[0].time, TIME);
  assert.equal(existsSync(join(root, 'other-run')), false);
  // The exactly-once check keys on the real iteration: the same call again appends nothing.
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-a', iteration: 2, time: TIME, metrics }), { appended: false });
  assert.deepEqual(
    (await acts.readRunMetrics({ run_id: 'run-a' })).map((l) => [l.run_id, l.iteration]),
    [['run-a', 2]],
  );
});
