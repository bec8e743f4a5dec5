import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describeHealth, metricsEndpoints, parsePrometheus, QUEUE_WAIT_WARN_MS, queueWaits, scrapeUrl, SLOW_SCHEDULE_TO_START_MS, workerHealth } from '../../client/worker-metrics';

test('HALO_METRICS_PORT gives the control worker its port, each browser worker the ports after it, then the learner', () => {
  assert.equal(metricsEndpoints({}, 2), null);
  assert.deepEqual(metricsEndpoints({ HALO_METRICS_PORT: '9464' }, 2), {
    control: '127.0.0.1:9464',
    browsers: ['127.0.0.1:9465', '127.0.0.1:9466'],
    learner: '127.0.0.1:9467',
  });
  assert.deepEqual(metricsEndpoints({ HALO_METRICS_PORT: '9464', HALO_METRICS_HOST: '0.0.0.0' }, 1), {
    control: '0.0.0.0:9464',
    browsers: ['0.0.0.0:9465'],
    learner: '0.0.0.0:9466',
  });
  assert.throws(() => metricsEndpoints({ HALO_METRICS_PORT: 'ninety' }, 1), /HALO_METRICS_PORT "ninety": a port from 1 to 65533/);
  assert.throws(() => metricsEndpoints({ HALO_METRICS_PORT: '65534' }, 1), /HALO_METRICS_PORT/);
  assert.equal(scrapeUrl('0.0.0.0:9464'), 'http://127.0.0.1:9464/metrics');
  assert.equal(scrapeUrl('10.0.0.5:9465'), 'http://10.0.0.5:9465/metrics');
});

const TEXT = `# HELP temporal_workflow_task_schedule_to_start_latency Schedule-to-start latency
# TYPE temporal_workflow_task_schedule_to_start_latency histogram
temporal_workflow_task_schedule_to_start_latency_bucket{halo_worker="control-worker",task_queue="halo-control",le="100"} 3
temporal_workflow_task_schedule_to_start_latency_sum{halo_worker="control-worker",task_queue="halo-control"} 60
temporal_workflow_task_schedule_to_start_latency_count{halo_worker="control-worker",task_queue="halo-control"} 3
temporal_activity_schedule_to_start_latency_sum{task_queue="halo-browser"} 24000
temporal_activity_schedule_to_start_latency_count{task_queue="halo-browser"} 2
temporal_activity_execution_failed{activity_type="stepSession"} 4
temporal_worker_task_slots_available{worker_type="WorkflowWorker",task_queue="a"} 40
temporal_worker_task_slots_available{worker_type="ActivityWorker",task_queue="a"} 90
temporal_worker_task_slots_available{worker_type="ActivityWorker",task_queue="b"} 10
temporal_odd{label="with \\"quote\\""} 1
not a sample
`;

test('worker health from the SDK metrics: mean schedule-to-start, failures, free slots', () => {
  const samples = parsePrometheus(TEXT);
  assert.equal(samples.length, 10);
  assert.deepEqual(samples.at(-1), { name: 'temporal_odd', labels: { label: 'with "quote"' }, value: 1 });
  const h = workerHealth(samples);
  assert.deepEqual(h, {
    workflowTaskWait: { meanMs: 20, count: 3 },
    activityWait: { meanMs: 12_000, count: 2 },
    workflowTaskFailures: 0,
    activityFailures: 4,
    slotsAvailable: { WorkflowWorker: 40, ActivityWorker: 100 },
  });
  // Activities wait 12 s for a worker on average: past the threshold, so it needs attention.
  assert.ok(12_000 > SLOW_SCHEDULE_TO_START_MS);
  const d = describeHealth(h);
  assert.equal(
    d.text,
    'workflow tasks wait 20 ms on average (3), activities wait 12000 ms on average (2); failed: 0 workflow tasks, 4 activities; free slots: Workflow 40, Activity 100',
  );
  assert.equal(d.attention, true);
  assert.equal(describeHealth({ ...h, activityWait: { meanMs: 30, count: 2 } }).attention, false);
  assert.equal(describeHealth({ ...h, activityWait: undefined, workflowTaskFailures: 1 }).attention, true, 'a failing workflow task (e.g. nondeterminism after an upgrade)');
  assert.match(describeHealth(workerHealth([])).text, /^no workflow tasks yet, no activities yet; failed: 0 workflow tasks, 0 activities$/);
});

test('queue waits: activity schedule-to-start per watched queue over every worker, a browser worker’s own queue counting as the browser queue', () => {
  const samples = parsePrometheus(`temporal_activity_schedule_to_start_latency_sum{halo_worker="learner",task_queue="gpu"} 90000
temporal_activity_schedule_to_start_latency_count{halo_worker="learner",task_queue="gpu"} 1
temporal_activity_schedule_to_start_latency_sum{halo_worker="browser-0",task_queue="halo-browser"} 300
temporal_activity_schedule_to_start_latency_count{halo_worker="browser-0",task_queue="halo-browser"} 2
temporal_activity_schedule_to_start_latency_sum{halo_worker="browser-1",task_queue="halo-browser@browser-1"} 100
temporal_activity_schedule_to_start_latency_count{halo_worker="browser-1",task_queue="halo-browser@browser-1"} 2
temporal_activity_schedule_to_start_latency_sum{halo_worker="control",task_queue="halo-control"} 7000
temporal_activity_schedule_to_start_latency_count{halo_worker="control",task_queue="halo-control"} 1
temporal_activity_schedule_to_start_latency_sum{task_queue="halo-browser-other"} 9999
temporal_activity_schedule_to_start_latency_count{task_queue="halo-browser-other"} 1
`);
  assert.deepEqual(queueWaits(samples, { gpu: 'gpu', browser: 'halo-browser' }), { gpu: { meanMs: 90_000, count: 1 }, browser: { meanMs: 100, count: 4 } });
  assert.deepEqual(queueWaits(samples, { gpu: 'learner-b', browser: 'nothing' }), {});
  assert.ok(QUEUE_WAIT_WARN_MS.gpu > QUEUE_WAIT_WARN_MS.browser);
});
