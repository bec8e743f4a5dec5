import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { parseConfig } from '../../lib/config';
import type { EvalModePlan, EvaluateInput } from '../../lib/eval-types';
import type { EvaluateResult } from '../../workflows/evaluate';
import type { FakeBrowserOptions } from '../helpers/fake-activities';
import { withFakeWorkers } from '../helpers/fake-workers';
import { pauseResumeStop } from '../helpers/run-control-scenario';
import { startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';

// `evaluate` with mocked episodes' activities: every mode × task × seed runs, a failed episode is a
// recorded failure, and pause / resume / stop hold or drop the episodes not yet started.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

function mode(label: string, backend: 'openai' | 'colocated', adapterVersion = 0): EvalModePlan {
  return {
    label,
    name: backend === 'openai' ? 'openai_baseline' : 'qwen3vl_grpo',
    backend,
    policy: parseConfig({ policy: { backend, model: backend === 'openai' ? 'fake-openai' : 'fake-model' } }).policy,
    runId: backend === 'openai' ? 'eval-openai' : 'grpo-run',
    adapterVersion,
    describe: `${label} (test)`,
  };
}

/** The one place an evaluation input is built (its shape follows lib/eval-types.ts). */
function evaluateInput(q: TestQueues, evalId: string, o: { modes: EvalModePlan[]; tasks: string[]; seeds: number[]; parallelism: number }): EvaluateInput {
  return {
    evalId,
    env: 'miniwob',
    tasks: o.tasks.map((task) => ({ task, site: 'miniwob' })),
    seeds: o.seeds,
    maxSteps: 1,
    parallelism: o.parallelism,
    modes: o.modes,
    skipped: [],
    notes: [],
    controlTaskQueue: q.control,
    run: {
      runId: evalId,
      browserTaskQueue: q.browser,
      gpuTaskQueue: q.gpu,
      learnerHeartbeatTimeoutMs: 10_000,
      maxSessionRebuilds: 1,
      sessionStartTimeoutMs: 10_000,
      heartbeatTimeoutMs: 5_000,
    },
  };
}

describe('evaluate', { timeout: 90_000 }, () => {
  test('runs an episode for every mode × task × seed and records a failed episode instead of failing', async () => {
    const broken = '-grpo-enter-text-s2';
    const browserOpts: FakeBrowserOptions = {
      start: (input) => {
        if (input.episodeId.endsWith(broken)) throw ApplicationFailure.nonRetryable('the task page does not load', 'SiteDown');
      },
      step: () => ({ done: true, success: true, shaped: 1 }),
    };
    await withFakeWorkers(env, 'eval-grid', { browser: browserOpts }, async ({ q, runId: evalId, control, learner }) => {
      const input = evaluateInput(q, evalId, {
        modes: [mode('base', 'openai'), mode('grpo', 'colocated', 2)],
        tasks: ['click-button', 'enter-text'],
        seeds: [1, 2],
        parallelism: 3,
      });
      const result = (await env.client.workflow.execute('evaluate', { taskQueue: q.control, workflowId: evalId, args: [input] })) as EvaluateResult;

      const ids = result.episodes.map((e) => e.workflowId).sort();
      const expected = ['base', 'grpo'].flatMap((m) => ['click-button', 'enter-text'].flatMap((t) => [1, 2].map((s) => `${evalId}-${m}-${t}-s${s}`))).sort();
      assert.deepEqual(ids, expected);
      assert.equal(result.stoppedEarly, false);

      const failed = result.episodes.filter((e) => e.error);
      assert.equal(failed.length, 1);
      assert.equal(failed[0].workflowId, `${evalId}${broken}`);
      assert.equal(failed[0].success, false);
      assert.equal(failed[0].error, 'the task page does not load', 'the failure is recorded with the reason the activity gave');
      assert.ok(result.episodes.filter((e) => !e.error).every((e) => e.success && e.steps === 1));

      const row = (m: string) => result.summary.rows.find((r) => r.mode === m && r.site === 'miniwob')!;
      assert.deepEqual([row('base').n, row('base').successes, row('base').errors], [4, 4, 0]);
      assert.deepEqual([row('grpo').n, row('grpo').successes, row('grpo').errors], [4, 3, 1]);

      // Each mode sampled from its own policy: the openai mode through samplePolicy, greedily; the colocated
      // mode from the learner with its run's adapter v2 (the broken episode never reached a sample).
      assert.deepEqual(control.samples.map((s) => s.model), ['fake-openai', 'fake-openai', 'fake-openai', 'fake-openai']);
      assert.deepEqual(learner.samples.map((s) => [s.run_id, s.version]), [
        ['grpo-run', 2],
        ['grpo-run', 2],
        ['grpo-run', 2],
      ]);
      // The stored results are what the workflow returned.
      const stored = (await control.activities().loadJson({ ref: result.resultsRef })) as { episodes: unknown[] };
      assert.equal(stored.episodes.length, 8);
    });
  });

  test('pause holds episodes not yet started, resume goes on, stop leaves the rest out', async () => {
    await withFakeWorkers(env, 'eval-pause', { browser: { step: () => ({ done: true, success: true }) } }, async ({ q, runId: evalId, browser }) => {
      const s = await pauseResumeStop<EvaluateResult>({
        start: async () => {
          const input = evaluateInput(q, evalId, { modes: [mode('base', 'openai')], tasks: ['click-button'], seeds: [1, 2, 3, 4], parallelism: 1 });
          return env.client.workflow.start('evaluate', { taskQueue: q.control, workflowId: evalId, args: [input] });
        },
        units: browser.startHolds,
        pausedBeforeSecond: (st) => st.done === 1 && st.running === 0,
        work: () => browser.starts.length,
      });
      assert.equal(s.whilePaused.paused, true);
      assert.equal(s.whilePaused.phase, 'paused');
      assert.equal(s.afterResume.paused, false);
      assert.equal(s.whileStopping.stopping, true);
      const r = s.result;
      assert.equal(r.stoppedEarly, true);
      assert.deepEqual(
        r.episodes.map((e) => e.workflowId),
        [`${evalId}-base-click-button-s1`, `${evalId}-base-click-button-s2`],
      );
      assert.ok(r.episodes.every((e) => e.success));
      assert.equal(browser.starts.length, 2, 'no episode started after the stop');
      assert.ok(r.summary.notes.some((n) => /stopped early: 2 of 4/.test(n.note)), JSON.stringify(r.summary.notes));
    });
  });
});
