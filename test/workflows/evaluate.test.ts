import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ApplicationFailure } from '@temporalio/common';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { parseConfig } from '../../lib/config/config';
import type { EvalModePlan, EvaluateInput } from '../../lib/eval/eval-types';
import type { EvaluateResult } from '../../workflows/evaluate';
import type { FakeBrowserOptions } from '../helpers/fake-activities';
import { withFakeWorkers } from '../helpers/fake-workers';
import { pauseResumeStop } from '../helpers/run-control-scenario';
import { recordHistories, startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';
import type { EvalEpisodeRecord } from '../../lib/eval/eval-summary';
import type { FakeControl } from '../helpers/fake-activities';

/** The evaluation's records, read from the blob its result names. */
async function recordsOf(control: FakeControl, result: EvaluateResult): Promise<EvalEpisodeRecord[]> {
  assert.equal(result.episodes, undefined, 'records are not returned inline');
  const jsonl = (await control.activities().loadJson({ ref: result.recordsRef! })) as string;
  return jsonl.trim()
    ? jsonl
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as EvalEpisodeRecord)
    : [];
}

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

/** The one place an evaluation input is built (its shape follows lib/eval/eval-types.ts). */
function evaluateInput(
  q: TestQueues,
  evalId: string,
  o: { modes: EvalModePlan[]; tasks: string[]; seeds: number[]; parallelism: number; continueAsNewEvery?: number },
): EvaluateInput {
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
    ...(o.continueAsNewEvery ? { continueAsNewEvery: o.continueAsNewEvery } : {}),
  };
}

describe('evaluate', { timeout: 600_000 }, () => {
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
      const handle = await env.client.workflow.start('evaluate', { taskQueue: q.control, workflowId: evalId, args: [input] });
      const result = (await handle.result()) as EvaluateResult;
      await recordHistories(env, evalId, handle.firstExecutionRunId, 'grid-with-failure');
      const episodes = await recordsOf(control, result);

      const ids = episodes.map((e) => e.workflowId).sort();
      const expected = ['base', 'grpo'].flatMap((m) => ['click-button', 'enter-text'].flatMap((t) => [1, 2].map((s) => `${evalId}-${m}-${t}-s${s}`))).sort();
      assert.deepEqual(ids, expected);
      assert.equal(result.stoppedEarly, false);

      const failed = episodes.filter((e) => e.error);
      assert.equal(failed.length, 1);
      assert.equal(failed[0].workflowId, `${evalId}${broken}`);
      assert.equal(failed[0].success, false);
      assert.equal(failed[0].error, 'the task page does not load', 'the failure is recorded with the reason the activity gave');
      assert.ok(episodes.filter((e) => !e.error).every((e) => e.success && e.steps === 1));

      const row = (m: string) => result.summary.rows.find((r) => r.mode === m && r.site === 'miniwob')!;
      assert.deepEqual([row('base').n, row('base').successes, row('base').errors], [4, 4, 0]);
      assert.deepEqual([row('grpo').n, row('grpo').successes, row('grpo').errors], [4, 3, 1]);

      // Each mode sampled from its own policy: the openai mode through samplePolicy, greedily; the colocated
      // mode from the learner with its run's adapter v2 (the broken episode never reached a sample).
      assert.deepEqual(
        control.samples.map((s) => s.model),
        ['fake-openai', 'fake-openai', 'fake-openai', 'fake-openai'],
      );
      assert.deepEqual(
        learner.samples.map((s) => [s.run_id, s.version]),
        [
          ['grpo-run', 2],
          ['grpo-run', 2],
          ['grpo-run', 2],
        ],
      );
      // The stored results are what the workflow returned.
      const stored = (await control.activities().loadJson({ ref: result.resultsRef })) as { recordsRef: string; episodeCount: number };
      assert.deepEqual([stored.recordsRef, stored.episodeCount, result.episodeCount], [result.recordsRef, 8, 8]);
    });
  });

  test('pause holds episodes not yet started, resume goes on, stop leaves the rest out', async () => {
    await withFakeWorkers(env, 'eval-pause', { browser: { step: () => ({ done: true, success: true }) } }, async ({ q, runId: evalId, browser, control }) => {
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
      const episodes = await recordsOf(control, r);
      assert.deepEqual(
        episodes.map((e) => e.workflowId),
        [`${evalId}-base-click-button-s1`, `${evalId}-base-click-button-s2`],
      );
      assert.ok(episodes.every((e) => e.success));
      assert.equal(browser.starts.length, 2, 'no episode started after the stop');
      assert.ok(
        r.summary.notes.some((n) => /stopped early: 2 of 4/.test(n.note)),
        JSON.stringify(r.summary.notes),
      );
    });
  });

  test('an evaluation larger than one history continues as new every N episodes and keeps every record', async () => {
    const browserOpts: FakeBrowserOptions = {
      start: (input) => {
        if (input.episodeId.endsWith('-b-t1-s3')) throw ApplicationFailure.nonRetryable('site down', 'SiteDown');
      },
      step: () => ({ done: true, success: true, shaped: 1 }),
    };
    await withFakeWorkers(env, 'eval-chunks', { browser: browserOpts }, async ({ q, runId: evalId, control }) => {
      // 2 modes × 2 tasks × 3 seeds = 12 episodes, 3 per workflow run: 4 runs, 3 continue-as-new.
      const input = evaluateInput(q, evalId, { modes: [mode('a', 'openai'), mode('b', 'openai')], tasks: ['t0', 't1'], seeds: [1, 2, 3], parallelism: 2, continueAsNewEvery: 3 });
      const handle = await env.client.workflow.start('evaluate', { taskQueue: q.control, workflowId: evalId, args: [input] });
      const result = (await handle.result()) as EvaluateResult;
      await recordHistories(env, evalId, handle.firstExecutionRunId, 'record-chunks');
      const episodes = await recordsOf(control, result);
      const expected = ['a', 'b'].flatMap((m) => ['t0', 't1'].flatMap((t) => [1, 2, 3].map((s) => `${evalId}-${m}-${t}-s${s}`)));
      assert.deepEqual(
        episodes.map((e) => e.workflowId),
        expected,
        'every episode exactly once, in plan order',
      );
      assert.equal(result.episodeCount, 12);
      assert.equal(result.stoppedEarly, false);
      assert.deepEqual(
        episodes.filter((e) => e.error).map((e) => e.workflowId),
        [`${evalId}-b-t1-s3`],
      );
      const row = (m: string) => result.summary.rows.find((r) => r.mode === m)!;
      assert.deepEqual([row('a').n, row('a').successes, row('b').n, row('b').successes, row('b').errors], [6, 6, 6, 5, 1]);

      // The runs of the chain: the first three continued as new, each with a small carry.
      const runs: { status: string; carry?: { next: number; chunkRefs: string[] } }[] = [];
      for await (const ex of env.client.workflow.list({ query: `WorkflowId = '${evalId}'` })) {
        const h = env.client.workflow.getHandle(evalId, ex.runId);
        const first = (await h.fetchHistory()).events![0].workflowExecutionStartedEventAttributes!;
        const arg = (await env.client.options.loadedDataConverter.payloadConverter.fromPayload(first.input!.payloads![0])) as EvaluateInput;
        runs.push({ status: ex.status.name, carry: arg.carry });
      }
      assert.equal(runs.length, 4, JSON.stringify(runs));
      assert.equal(runs.filter((r) => r.status === 'CONTINUED_AS_NEW').length, 3);
      const carries = runs.map((r) => r.carry?.next ?? 0).sort((a, b) => a - b);
      assert.deepEqual(carries, [0, 3, 6, 9]);
      const last = runs.find((r) => r.carry?.next === 9)!;
      assert.equal(last.carry!.chunkRefs.length, 3, 'one records blob per finished chunk');
    });
  });

  test('an evaluation too large to run is refused up front, saying what to lower', async () => {
    await withFakeWorkers(env, 'eval-huge', { browser: { step: () => ({ done: true, success: true }) } }, async ({ q, runId: evalId, browser }) => {
      const seeds = Array.from({ length: 1000 }, (_, i) => i);
      const tasks = Array.from({ length: 101 }, (_, i) => `t${i}`);
      const input = evaluateInput(q, evalId, { modes: [mode('a', 'openai')], tasks, seeds, parallelism: 2 });
      await assert.rejects(env.client.workflow.execute('evaluate', { taskQueue: q.control, workflowId: evalId, args: [input] }), (err: Error & { cause?: Error }) => {
        assert.match(
          err.cause?.message ?? '',
          /modes × tasks × seeds = 1 × 101 × 1000 = 101000 episodes, more than one evaluation runs \(100000\): use fewer seeds, tasks or modes/,
        );
        return true;
      });
      assert.equal(browser.starts.length, 0);
    });
  });
});
