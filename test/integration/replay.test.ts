import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Worker } from '@temporalio/worker';

// Committed histories (recorded with `temporal workflow show --output json` from real runs) must replay
// against the current workflow code: a change that breaks determinism for runs already in flight fails here.
// Re-record them only together with a versioning plan (patched() / a new workflow type) for old runs.
// File names are `<workflow id>.<what>.json`: the workflow id matters (trainGrpo checks it against its run id).
const dir = join(__dirname, '..', 'fixtures', 'histories');

for (const file of readdirSync(dir)
  .filter((f) => f.endsWith('.json'))
  .sort()) {
  test(`replays ${file}`, async () => {
    const history = JSON.parse(readFileSync(join(dir, file), 'utf8'));
    assert.ok(history.events.length > 10, 'a real history');
    await Worker.runReplayHistory({ workflowsPath: require.resolve('../../workflows') }, history, file.split('.')[0]);
  });
}

test('a replay that diverges is caught (the check can fail)', async () => {
  const history = JSON.parse(readFileSync(join(dir, 'replay-episode.enter-text.json'), 'utf8'));
  // Pretend the first activity the episode scheduled was a different one: the current code would not do that.
  const scheduled = history.events.find((e: { activityTaskScheduledEventAttributes?: unknown }) => e.activityTaskScheduledEventAttributes);
  scheduled.activityTaskScheduledEventAttributes.activityType.name = 'somethingElse';
  await assert.rejects(Worker.runReplayHistory({ workflowsPath: require.resolve('../../workflows') }, history, 'tampered'), /[Nn]ondeterminism|DeterminismViolation/);
});
