import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeInput, EpisodeResult } from '../../lib/episode/episode-types';
import type { TrajectoryInput } from '../../lib/training/experience';
import { click, FakeBrowser, FakeControl, type PolicyScript } from '../helpers/fake-activities';
import { startWorkflowEnv, testQueues, withWorkers, type ActivityMap } from '../helpers/workflow-env';

// The sampler's finish reason travels with every completion an episode records (lib/training/experience.ts): the played
// steps (episode and anchor grouping train on them) and every candidate of a step group.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/** Candidate i of the sample at observation step k stopped on max_tokens when i + k is odd. */
const finishReasonOf = (k: number, i: number): string => ((i + k) % 2 === 1 ? 'length' : 'stop');

/** Runs one episode on fake workers whose sampler gives finish reasons by index; returns what recordTrajectory received. */
async function recordedTrajectory(name: string, grouping?: EpisodeInput['grouping']): Promise<TrajectoryInput> {
  const q = testQueues(name);
  const policy: PolicyScript = (step, n) => Array.from({ length: n }, (_, i) => click(100 + 100 * i, 10 + step));
  const browser = new FakeBrowser(q, { step: (c) => ({ shaped: c.action.type === 'click' ? c.action.x / 1000 : 0 }) });
  const control = new FakeControl(policy);
  const acts = control.activities();
  const recorded: TrajectoryInput[] = [];
  const activities: ActivityMap = {
    ...acts,
    samplePolicy: async (input: unknown) => {
      const k = (input as { observation: { step: number } }).observation.step;
      const res = (await acts.samplePolicy(input)) as { candidates: Record<string, unknown>[] };
      return { ...res, candidates: res.candidates.map((c, i) => ({ ...c, finishReason: finishReasonOf(k, i) })) };
    },
    recordTrajectory: async (input: unknown) => {
      recorded.push(input as TrajectoryInput);
      return acts.recordTrajectory(input);
    },
  };
  const input: EpisodeInput = {
    task: { env: 'miniwob', task: 'click-button', seed: 7 },
    maxSteps: 2,
    policy: parseConfig({ policy: { backend: 'openai', model: 'fake-model' } }).policy,
    mode: 'test',
    run: {
      runId: name,
      browserTaskQueue: q.browser,
      gpuTaskQueue: q.gpu,
      learnerHeartbeatTimeoutMs: 10_000,
      maxSessionRebuilds: 2,
      sessionStartTimeoutMs: 10_000,
      heartbeatTimeoutMs: 5_000,
    },
    ...(grouping ? { grouping } : {}),
  };
  const result = await withWorkers(
    env,
    [
      { taskQueue: q.control, workflows: true, activities },
      { taskQueue: q.browser, activities: browser.browserActivities() },
      // As a browser worker's own queue: a fork starts there first (near its episode's session).
      { taskQueue: q.session, activities: { ...browser.browserActivities(), ...browser.sessionActivities() } },
    ],
    () => env.client.workflow.execute('episode', { taskQueue: q.control, workflowId: `${name}-${q.control}`, args: [input] }) as Promise<EpisodeResult>,
  );
  assert.equal(result.steps, 2);
  assert.equal(recorded.length, 1);
  return recorded[0];
}

describe('episode: finish reasons in the trajectory', { timeout: 600_000 }, () => {
  test('a step group records every candidate’s finish reason, and the played step the chosen one’s', async () => {
    const t = await recordedTrajectory('finish-group', { n: 3, choose: 'best' });
    // Candidate x = 100, 200, 300: the best (index 2) is played.
    assert.deepEqual(
      t.groups?.map((g) => [g.chosen, g.candidates.map((c) => c.completion.finishReason)]),
      [
        [2, ['stop', 'length', 'stop']],
        [2, ['length', 'stop', 'length']],
      ],
    );
    assert.deepEqual(
      t.steps.map((s) => s.completion.finishReason),
      ['stop', 'length'],
    );
  });

  test('a plain episode records each step’s finish reason', async () => {
    const t = await recordedTrajectory('finish-plain');
    assert.equal(t.groups, undefined);
    assert.deepEqual(
      t.steps.map((s) => s.completion.finishReason),
      ['stop', 'length'],
    );
  });
});
