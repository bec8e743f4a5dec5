import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { Worker } from '@temporalio/worker';
import * as workflows from '../../workflows';
import { historyCoverageProblems, patchCalls, summarizeHistory } from '../helpers/workflow-versions';
import { workflowBundle } from '../helpers/workflow-env';

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
    // One production bundle for every history (bundling per history takes seconds each).
    await Worker.runReplayHistory({ workflowBundle: { code: await workflowBundle() } }, history, file.split('.')[0]);
  });
}

test('the recorded histories cover every workflow type and the new branch of every patched() id', () => {
  const histories = readdirSync(dir)
    .filter((f) => f.endsWith('.json'))
    .map((f) => summarizeHistory(f, JSON.parse(readFileSync(join(dir, f), 'utf8'))));
  // Workflows are the functions the bundle exports; queries and signals are definitions (objects).
  const types = Object.entries(workflows)
    .filter(([, v]) => typeof v === 'function')
    .map(([name]) => name);
  assert.deepEqual([...types].sort(), ['episode', 'evaluate', 'mctsSearch', 'trainGrpo', 'trainMcts']);
  const root = join(__dirname, '..', '..', 'workflows');
  const sources = new Map(
    readdirSync(root, { recursive: true, encoding: 'utf8' })
      .filter((f) => f.endsWith('.ts'))
      .map((f) => [`workflows/${f}`, readFileSync(join(root, f), 'utf8')] as const),
  );
  const { calls, problems } = patchCalls(sources);
  assert.deepEqual(problems, []);
  assert.deepEqual(
    historyCoverageProblems(
      histories,
      types,
      calls.map((c) => c.id),
    ),
    [],
  );
});

test('a replay that diverges is caught (the check can fail)', async () => {
  const history = JSON.parse(readFileSync(join(dir, 'replay-episode.enter-text.json'), 'utf8'));
  // Pretend the first activity the episode scheduled was a different one: the current code would not do that.
  const scheduled = history.events.find((e: { activityTaskScheduledEventAttributes?: unknown }) => e.activityTaskScheduledEventAttributes);
  scheduled.activityTaskScheduledEventAttributes.activityType.name = 'somethingElse';
  await assert.rejects(Worker.runReplayHistory({ workflowBundle: { code: await workflowBundle() } }, history, 'tampered'), /[Nn]ondeterminism|DeterminismViolation/);
});
