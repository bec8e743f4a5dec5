import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { ApplicationFailure } from '@temporalio/common';
import type { TrainingResult } from '../../workflows/train-engine';
import { grpoConfig, withFakeWorkers } from '../helpers/fake-workers';
import { continueAsNewChain, eventually, recordHistories, startWorkflowEnv, type TestQueues } from '../helpers/workflow-env';
import { pauseSignal, resumeSignal, statusQuery, stopSignal } from '../../workflows/messages';

// `trainGrpo` with train.rollout stream, on mocked episodes' activities, batch, metrics and learner: slots kept
// busy through updates, the staleness bound, retries in fresh sessions, whole-group drops and continue-as-new.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/** Episode groups of two one-step rollouts, one group per update, four episodes in flight at most. */
function streamConfig(q: TestQueues, runId: string, iterations: number, train: Record<string, unknown> = {}) {
  return grpoConfig(q, runId, iterations, { parallelism: 4, rollout: 'stream', ...train });
}

type Row = { stream?: Record<string, number>; staleness?: number; sampled_adapter_version?: number; adapter_version?: number };

// Its tests run at once: each waits mostly on the dev server's round trips, under a run id of its own (the routed workers).
describe('trainGrpo, train.rollout stream', { timeout: 600_000, concurrency: true }, () => {
  test('maxStaleness 0 samples as the synchronous iterations do: each group from the adapter before its update', async () => {
    await withFakeWorkers(env, 'stream-k0', {}, async ({ q, runId, control, learner }) => {
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: streamConfig(q, runId, 3, { maxStaleness: 0 }) }] });
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 3, adapterVersion: 3, stoppedEarly: false });
      assert.deepEqual(
        learner.samples.map((s) => s.version),
        [0, 0, 1, 1, 2, 2],
      );
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1, 2, 3],
      );
      const rows = control.grpoMetricLines as Row[];
      assert.deepEqual(
        rows.map((m) => [m.staleness, m.stream?.groups_dropped_stale, m.stream?.in_flight]),
        [
          [0, 0, 0],
          [0, 0, 0],
          [0, 0, 0],
        ],
      );
    });
  });

  test('maxStaleness 1: episodes keep starting while an update runs, then sample from the adapter it wrote', async () => {
    await withFakeWorkers(env, 'stream-k1', {}, async ({ q, runId, control, learner }) => {
      learner.updateHolds.hold(1);
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: streamConfig(q, runId, 4, { maxStaleness: 1 }) }] });
      await learner.updateHolds.reached(1);
      // The bound lets (k + 0 + 1) = 2 groups in before the first update ends: the second group's two episodes run now.
      await eventually('the next group sampled during update 1', () => (learner.samples.length >= 4 ? true : undefined), 120_000);
      const status = (await handle.query(statusQuery)) as { stream?: { samplingVersion: number; buffered: number } };
      assert.equal(status.stream?.samplingVersion, 0);
      await new Promise((r) => setTimeout(r, 500));
      assert.equal(learner.samples.length, 4, 'no third group before update 1 ends (the bound)');
      learner.updateHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 4, adapterVersion: 4, stoppedEarly: false });
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1, 2, 3, 4],
      );
      const versions = learner.samples.map((s) => s.version);
      assert.deepEqual(versions.slice(0, 4), [0, 0, 0, 0]);
      assert.ok(
        versions.slice(4).every((v) => v >= 1),
        `after update 1 every episode samples from v1 or newer: ${versions}`,
      );
      const rows = control.grpoMetricLines as Row[];
      assert.ok(
        rows.every((m) => m.staleness !== undefined && m.staleness <= 1),
        JSON.stringify(rows.map((m) => m.staleness)),
      );
      assert.equal(rows[1].staleness, 1, 'the group collected during update 1 is one update behind');
    });
  });

  test('a group sampled more than k updates before its use is dropped and counted; a replacement fills the batch', async () => {
    await withFakeWorkers(env, 'stream-stale', {}, async ({ q, runId, control, learner, browser }) => {
      browser.startHolds.hold(1); // the first group's first episode stalls in its session start
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: streamConfig(q, runId, 4, { maxStaleness: 1 }) }] });
      await browser.startHolds.reached(1);
      await eventually('two updates while the first group stalls', () => (learner.updates.length >= 2 ? true : undefined), 120_000);
      browser.startHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 4, adapterVersion: 4, stoppedEarly: false });
      const rows = control.grpoMetricLines as Row[];
      const dropped = rows.reduce((n, m) => n + (m.stream?.groups_dropped_stale ?? 0), 0);
      assert.equal(dropped, 1, `rows: ${JSON.stringify(rows.map((m) => m.stream))}`);
      assert.ok(rows.every((m) => (m.staleness ?? 0) <= 1));
    });
  });

  test('a failed episode runs again in a fresh session; one that keeps failing drops its whole group, which is replaced', async () => {
    const failing = {
      start: (input: { episodeId: string }) => {
        // Group 0's first rollout fails once; group 1's second rollout fails on every attempt.
        if (/-it1-ep0$/.test(input.episodeId) || /-it2-ep1(-r\d+)?$/.test(input.episodeId)) {
          throw ApplicationFailure.nonRetryable(`site down for ${input.episodeId}`, 'SiteDown');
        }
      },
    };
    await withFakeWorkers(env, 'stream-fail', { browser: failing }, async ({ q, runId, control, learner, browser }) => {
      const cfg = streamConfig(q, runId, 3, { maxStaleness: 1, maxFailedEpisodeShare: 1, stream: { episodeRetries: 1 } });
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 3, adapterVersion: 3, stoppedEarly: false });
      const starts = browser.starts.map((s) => s.episodeId);
      assert.ok(
        starts.some((id) => id.endsWith('-it1-ep0-r1')),
        `a fresh session for the failed rollout: ${starts}`,
      );
      const rows = control.grpoMetricLines as Row[];
      const sum = (k: string) => rows.reduce((n, m) => n + (m.stream?.[k] ?? 0), 0);
      assert.equal(sum('episodes_retried'), 2, 'it1-ep0 once, it2-ep1 once');
      assert.equal(sum('groups_dropped_failed'), 1);
      // Every batch holds whole groups: two trajectories each, never the surviving half of group 1.
      assert.deepEqual(
        control.grpoBatches.map((b) => b.trajectories),
        [2, 2, 2],
      );
      assert.equal(learner.updates.length, 3);
    });
  });

  test('continues as new every updatesPerRun updates, carrying the buffer; every version written once', async () => {
    await withFakeWorkers(env, 'stream-can', {}, async ({ q, runId, control, learner }) => {
      const cfg = streamConfig(q, runId, 5, { maxStaleness: 2, stream: { updatesPerRun: 2 } });
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 5, adapterVersion: 5, stoppedEarly: false });
      assert.deepEqual(
        learner.updates.map((u) => u.version),
        [1, 2, 3, 4, 5],
      );
      assert.deepEqual(control.grpoMetrics, [1, 2, 3, 4, 5]);
      assert.deepEqual(await continueAsNewChain(env, runId, handle.firstExecutionRunId), ['ContinuedAsNew', 'ContinuedAsNew', 'Completed']);
      // 5 groups of 2 rollouts, each episode once (k = 2 admits no more than the run needs).
      assert.equal(learner.samples.length, 10);
      await recordHistories(env, runId, handle.firstExecutionRunId, 'stream');
    });
  });

  test('a stop drains the episodes in flight, learns from the complete batches, and ends', async () => {
    await withFakeWorkers(env, 'stream-stop', {}, async ({ q, runId, learner }) => {
      learner.updateHolds.hold(1);
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: streamConfig(q, runId, 6, { maxStaleness: 1 }) }] });
      await learner.updateHolds.reached(1);
      await eventually('the second group sampled', () => (learner.samples.length >= 4 ? true : undefined), 120_000);
      await handle.signal(stopSignal);
      learner.updateHolds.release(1);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 2, adapterVersion: 2, stoppedEarly: true });
      assert.equal(learner.samples.length, 4, 'no episode starts after the stop');
    });
  });
  test('a pause starts no episode and no update (the update in flight still ends); resume goes on', async () => {
    await withFakeWorkers(env, 'stream-pause', {}, async ({ q, runId, learner }) => {
      learner.updateHolds.hold(1);
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: streamConfig(q, runId, 3, { maxStaleness: 1 }) }] });
      await learner.updateHolds.reached(1);
      await eventually('the second group sampled', () => (learner.samples.length >= 4 ? true : undefined), 120_000);
      await handle.signal(pauseSignal);
      learner.updateHolds.release(1);
      const paused = await eventually(
        'the run paused after its update',
        async () => {
          const st = (await handle.query(statusQuery)) as unknown as { phase: string; adapterVersion: number; iteration: number };
          return st.phase === 'paused' && st.adapterVersion === 1 ? st : undefined;
        },
        120_000,
      );
      assert.equal(paused.iteration, 2, 'the next update is the second');
      await new Promise((r) => setTimeout(r, 1000));
      assert.equal(learner.samples.length, 4, 'no episode starts while paused');
      assert.equal(learner.updates.length, 1, 'and no update: the complete second group waits');
      await handle.signal(resumeSignal);
      const result = (await handle.result()) as TrainingResult;
      assert.deepEqual(result, { runId, iterations: 3, adapterVersion: 3, stoppedEarly: false });
      assert.equal(learner.samples.length, 6);
    });
  });
  test('evaluation episodes take their slots from the stream: never more than parallelism episodes at once', async () => {
    await withFakeWorkers(env, 'stream-eval-slots', {}, async ({ q, runId, learner, browser }) => {
      // The second group's two episodes (session starts 3 and 4) stall while update 1 is written and evaluated.
      browser.startHolds.hold(3);
      browser.startHolds.hold(4);
      const config = streamConfig(q, runId, 2, { parallelism: 2, maxStaleness: 1, evalEvery: 1, heldOutTasks: ['click-button'], evalSeeds: [100000, 100001] });
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config }] });
      const evalStarts = () => browser.starts.filter((st) => /-it\d+-eval\d+$/.test(st.episodeId)).length;
      try {
        await browser.startHolds.reached(3);
        await browser.startHolds.reached(4);
        await eventually('update 1 while the second group stalls', () => (learner.updates.length >= 1 ? true : undefined), 120_000);
        await new Promise((r) => setTimeout(r, 1500));
        assert.equal(evalStarts(), 0, `the evaluation waits: both slots are the stream episodes in flight (${browser.events.join(', ')})`);
      } finally {
        browser.startHolds.release(3);
        browser.startHolds.release(4);
      }
      const { iterations, adapterVersion, stoppedEarly } = (await handle.result()) as TrainingResult;
      assert.deepEqual({ iterations, adapterVersion, stoppedEarly }, { iterations: 2, adapterVersion: 2, stoppedEarly: false });
      assert.equal(evalStarts(), 4, 'two evaluations of two episodes each');
      let open = 0;
      let most = 0;
      for (const e of browser.events) {
        if (e.startsWith('start ')) most = Math.max(most, ++open);
        else if (e.startsWith('close ')) open--;
      }
      assert.equal(most, 2, `sessions open at once (an episode holds one from its start to its close): ${browser.events.join(', ')}`);
      await recordHistories(env, runId, handle.firstExecutionRunId, 'eval-slots');
    });
  });

  test('served adapters: the status names the adapter new episodes sample from, for halo up to reload into a restarted vLLM', async () => {
    await withFakeWorkers(env, 'stream-served', {}, async ({ q, runId, learner }) => {
      learner.updateHolds.hold(2);
      const cfg = {
        ...streamConfig(q, runId, 3, { maxStaleness: 1, vllmBaseUrl: 'http://vllm:8000/v1' }),
        policy: { backend: 'openai', baseUrl: 'http://vllm:8000/v1', model: 'base', temperature: 1, maxTokens: 32 },
      };
      const handle = await env.client.workflow.start('trainGrpo', { taskQueue: q.control, workflowId: runId, args: [{ config: cfg }] });
      await learner.updateHolds.reached(2);
      const st = (await handle.query(statusQuery)) as unknown as { servedAdapter?: { lora_name: string; lora_path: string } };
      assert.equal(st.servedAdapter?.lora_name, `${runId}-v1`);
      assert.equal(st.servedAdapter?.lora_path, `/checkpoints/${runId}/v1`);
      learner.updateHolds.release(2);
      const result = (await handle.result()) as TrainingResult;
      assert.equal(result.adapterVersion, 3);
    });
  });
});
