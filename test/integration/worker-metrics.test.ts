import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:net';
import { TestWorkflowEnvironment } from '@temporalio/testing';
import pino from 'pino';
import { workerMetricsChecks, stackHealthLines, readWorkerHealth } from '../../client/doctor-metrics';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeInput } from '../../lib/episode/episode-types';
import { ALL_SEARCH_ATTRIBUTES } from '../../lib/episode/search-attributes';
import { parsePrometheus, scrapeUrl } from '../../client/worker-metrics';
import { installRuntime } from '../../workers/runtime';
import { withFakeWorkers } from '../helpers/fake-workers';
import { temporalExecutable } from '../helpers/workflow-env';

// The workers' runtime as the control and browser workers install it, with HALO_METRICS_ADDRESS: the SDK serves
// Prometheus metrics there, and `halo doctor` / `halo status` read the stack's health from them.

async function freePort(): Promise<number> {
  const srv = createServer();
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  const port = (srv.address() as { port: number }).port;
  await new Promise((r) => srv.close(r));
  return port;
}

let env: TestWorkflowEnvironment;
let port: number;
/** What the worker's pino logger wrote, one parsed line each. */
const logged: Record<string, unknown>[] = [];
before(async () => {
  port = await freePort();
  process.env.HALO_METRICS_ADDRESS = `127.0.0.1:${port}`;
  // INFO: Core says at that level when it starts a worker, which is the line the forwarding test looks for.
  process.env.HALO_TEMPORAL_LOG_LEVEL = 'info';
  installRuntime('control-worker', pino({ name: 'control-worker', level: 'debug' }, { write: (line: string) => logged.push(JSON.parse(line)) }));
  env = await TestWorkflowEnvironment.createLocal({
    server: { executable: { type: 'existing-path', path: temporalExecutable() }, searchAttributes: ALL_SEARCH_ATTRIBUTES, log: { format: 'pretty', level: 'error' } },
  });
});
after(async () => {
  await env?.teardown();
});

test('the workers serve SDK metrics on HALO_METRICS_ADDRESS; doctor and status read the stack health from them', { timeout: 120_000 }, async () => {
  const input = (q: { browser: string; gpu: string }): EpisodeInput => ({
    task: { env: 'miniwob', task: 'click-button', seed: 7 },
    maxSteps: 2,
    // Colocated: the policy samples on the gpu queue (the fake learner), so both watched queues see activities.
    policy: parseConfig({ policy: { backend: 'colocated', model: 'fake-model' } }).policy,
    mode: 'test',
    run: {
      runId: 'metrics-test',
      browserTaskQueue: q.browser,
      gpuTaskQueue: q.gpu,
      learnerHeartbeatTimeoutMs: 10_000,
      maxSessionRebuilds: 1,
      sessionStartTimeoutMs: 10_000,
      heartbeatTimeoutMs: 5_000,
    },
  });
  let queues = { control: '', browser: '', gpu: '' };
  await withFakeWorkers(env, 'metrics', {}, async ({ q, runId }) => {
    queues = q;
    await env.client.workflow.execute('episode', { taskQueue: q.control, workflowId: runId, args: [input(q)] });
  });
  // Core's (Rust) own lines reach the worker's pino logger, marked as the SDK's, next to the TypeScript SDK's.
  const core = logged.filter((l) => l.sdkComponent === 'core' && l.taskQueue === queues.control);
  assert.ok(
    core.some((l) => l.msg === 'Initializing worker' && l.name === 'control-worker' && l.sdk === true && l.level === 30),
    JSON.stringify(logged.slice(0, 5)),
  );
  const text = await (await fetch(scrapeUrl(`127.0.0.1:${port}`))).text();
  const samples = parsePrometheus(text);
  assert.ok(samples.length > 0 && samples.every((s) => s.labels.halo_worker === 'control-worker'), 'every sample is tagged with the worker');
  const h = await readWorkerHealth(`127.0.0.1:${port}`, 5_000);
  // The episode's workflow tasks and activities went through this process's workers.
  assert.ok((h.workflowTaskWait?.count ?? 0) >= 3, JSON.stringify(h));
  assert.ok((h.activityWait?.count ?? 0) >= 3, JSON.stringify(h));
  assert.deepEqual([h.workflowTaskFailures, h.activityFailures], [0, 0]);
  assert.ok((h.slotsAvailable.WorkflowWorker ?? 0) > 0, JSON.stringify(h.slotsAvailable));

  // halo doctor with HALO_METRICS_PORT: the control worker's row from this endpoint; browser worker 0 and the
  // learner (the next ports) serve nothing here, which is a failed row saying what to do.
  // The gpu and browser queues' rows: the activities of those queues this process's workers started.
  const cfg = parseConfig({ temporal: { browserTaskQueue: queues.browser }, train: { gpuTaskQueue: queues.gpu } });
  const checks = await workerMetricsChecks(cfg, { HALO_METRICS_PORT: String(port) }, 5_000);
  assert.deepEqual(
    checks.map((c) => [c.id, c.status]),
    [
      ['metrics.control', 'pass'],
      ['metrics.browser-0', 'fail'],
      ['metrics.learner', 'fail'],
      ['queue.gpu', 'pass'],
      ['queue.browser', 'pass'],
    ],
  );
  assert.match(checks[3].detail, new RegExp(`^${queues.gpu}: activities wait \\d+ ms on average to start \\([1-9]\\d*; warns above 60000 ms\\)$`));
  assert.match(checks[4].detail, new RegExp(`^${queues.browser}: activities wait \\d+ ms on average to start \\([1-9]\\d*; warns above 5000 ms\\)$`));
  // Queues nobody scraped served: a row that says so, not a warning.
  assert.deepEqual(
    (await workerMetricsChecks(parseConfig({}), { HALO_METRICS_PORT: String(port) }, 5_000)).slice(3).map((c) => [c.id, c.status, c.detail]),
    [
      ['queue.gpu', 'pass', 'gpu: no activities yet'],
      ['queue.browser', 'pass', 'halo-browser: no activities yet'],
    ],
  );
  assert.match(checks[0].detail, new RegExp(`^127\\.0\\.0\\.1:${port}: workflow tasks wait \\d+ ms on average \\(\\d+\\), activities wait \\d+ ms`));
  assert.match(checks[1].fix ?? '', /HALO_METRICS_PORT/);
  // Without it: one skipped row that says how to turn it on.
  assert.deepEqual(
    (await workerMetricsChecks(cfg, {}, 5_000)).map((c) => [c.id, c.status]),
    [['metrics', 'skip']],
  );
  const lines = await stackHealthLines(cfg, { HALO_METRICS_PORT: String(port) });
  assert.equal(lines.length, 3);
  assert.match(lines[0], /^control worker: workflow tasks wait \d+ ms on average/);
  assert.match(lines[1], /^browser worker 0: no metrics at 127\.0\.0\.1:\d+/);
  assert.match(lines[2], new RegExp(`^learner: no metrics at 127\\.0\\.0\\.1:${port + 2} `));
  // A learner on another host (HALO_LEARNER=0 here) has no row.
  assert.deepEqual(
    (await workerMetricsChecks(cfg, { HALO_METRICS_PORT: String(port), HALO_LEARNER: '0' }, 5_000)).map((c) => c.id),
    ['metrics.control', 'metrics.browser-0', 'queue.gpu', 'queue.browser'],
  );
});
