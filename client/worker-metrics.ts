/**
 * The workers' own health, from the metrics the Temporal SDK exports (its Runtime's Prometheus endpoint, opt-in
 * with HALO_METRICS_PORT): where each worker listens, the text format read back, and what it says about the
 * stack. A task that waits long between being scheduled and a worker starting it is the first sign of a stalled
 * or too small pool of workers, before any run fails.
 */

export interface MetricsEndpoints {
  control: string;
  /** One per browser worker `halo up` starts, in order. */
  browsers: string[];
  /** The Python learner (the Python SDK's runtime serves the same series). */
  learner: string;
}

/**
 * Where the workers `halo up` starts expose metrics: the control worker on HALO_METRICS_PORT, browser worker i
 * on the port after it plus i, the learner on the port after the browser workers' (each process binds its own port). HALO_METRICS_HOST (default 127.0.0.1) is the
 * address they bind; 0.0.0.0 lets a Prometheus on another host scrape them. Null when HALO_METRICS_PORT is unset.
 */
export function metricsEndpoints(env: Record<string, string | undefined>, browserWorkers: number): MetricsEndpoints | null {
  const raw = env.HALO_METRICS_PORT?.trim();
  if (!raw) return null;
  const port = Number(raw);
  if (!Number.isInteger(port) || port < 1 || port + browserWorkers + 1 > 65_535) {
    throw new Error(
      `HALO_METRICS_PORT ${JSON.stringify(raw)}: a port from 1 to ${65_535 - browserWorkers - 1} (the ${browserWorkers} browser workers and the learner take the ports after it)`,
    );
  }
  const host = env.HALO_METRICS_HOST?.trim() || '127.0.0.1';
  return {
    control: `${host}:${port}`,
    browsers: Array.from({ length: browserWorkers }, (_, i) => `${host}:${port + 1 + i}`),
    learner: `${host}:${port + 1 + browserWorkers}`,
  };
}

/** Where to scrape an endpoint from this host: a wildcard bind address is reached on loopback. */
export function scrapeUrl(endpoint: string): string {
  const host = endpoint.replace(/:\d+$/, '');
  const port = endpoint.slice(host.length + 1);
  return `http://${host === '0.0.0.0' || host === '::' || host === '[::]' ? '127.0.0.1' : host}:${port}/metrics`;
}

export interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** Samples of the Prometheus text exposition format (comments and malformed lines skipped). */
export function parsePrometheus(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[3] ?? '').matchAll(/([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2].replace(/\\(.)/g, '$1');
    const value = Number(m[4]);
    if (!Number.isNaN(value)) out.push({ name: m[1], labels, value });
  }
  return out;
}

export interface WorkerHealth {
  /** Mean workflow-task schedule-to-start latency (ms) and how many tasks it covers; absent without workflow tasks. */
  workflowTaskWait?: { meanMs: number; count: number };
  activityWait?: { meanMs: number; count: number };
  workflowTaskFailures: number;
  activityFailures: number;
  /** Free slots per worker type (`WorkflowWorker`, `ActivityWorker`, `LocalActivityWorker`). */
  slotsAvailable: Record<string, number>;
}

const sum = (samples: Sample[], name: string) => samples.filter((s) => s.name === name).reduce((n, s) => n + s.value, 0);

function meanLatency(samples: Sample[], base: string): { meanMs: number; count: number } | undefined {
  const count = sum(samples, `${base}_count`);
  if (count === 0) return undefined;
  return { meanMs: sum(samples, `${base}_sum`) / count, count };
}

/** What a worker's metrics say; `prefix` is the SDK's metric prefix (`temporal_`). */
export function workerHealth(samples: Sample[], prefix = 'temporal_'): WorkerHealth {
  const slots: Record<string, number> = {};
  for (const s of samples)
    if (s.name === `${prefix}worker_task_slots_available` && s.labels.worker_type) slots[s.labels.worker_type] = (slots[s.labels.worker_type] ?? 0) + s.value;
  const wft = meanLatency(samples, `${prefix}workflow_task_schedule_to_start_latency`);
  const act = meanLatency(samples, `${prefix}activity_schedule_to_start_latency`);
  return {
    ...(wft ? { workflowTaskWait: wft } : {}),
    ...(act ? { activityWait: act } : {}),
    workflowTaskFailures: sum(samples, `${prefix}workflow_task_execution_failed`),
    activityFailures: sum(samples, `${prefix}activity_execution_failed`),
    slotsAvailable: slots,
  };
}

/** Mean schedule-to-start above this: tasks queue for a worker (too few, stalled, or busy with something else). */
export const SLOW_SCHEDULE_TO_START_MS = 5_000;

/** One line for a worker, and whether it calls for attention (tasks wait, or workflow tasks fail: a replay problem). */
export function describeHealth(h: WorkerHealth): { text: string; attention: boolean } {
  const wait = (w: { meanMs: number; count: number } | undefined, what: string) => (w ? `${what} wait ${Math.round(w.meanMs)} ms on average (${w.count})` : `no ${what} yet`);
  const slots = Object.entries(h.slotsAvailable)
    .map(([k, v]) => `${k.replace(/Worker$/, '')} ${v}`)
    .join(', ');
  const text =
    `${wait(h.workflowTaskWait, 'workflow tasks')}, ${wait(h.activityWait, 'activities')}; ` +
    `failed: ${h.workflowTaskFailures} workflow tasks, ${h.activityFailures} activities${slots ? `; free slots: ${slots}` : ''}`;
  const slow = [h.workflowTaskWait, h.activityWait].some((w) => w !== undefined && w.meanMs > SLOW_SCHEDULE_TO_START_MS);
  return { text, attention: slow || h.workflowTaskFailures > 0 };
}

/** The task queues whose activities `halo doctor` times: the learner's and the browser workers' (shared and own). */
export interface WatchedQueues {
  gpu: string;
  browser: string;
}

/**
 * Mean wait above this before a worker starts an activity of the queue: the browser queue's tasks are short and a
 * free browser worker takes one at once; the learner runs one update at a time, so a sampling call or update may
 * wait for the one before it.
 */
export const QUEUE_WAIT_WARN_MS: Readonly<Record<keyof WatchedQueues, number>> = { browser: SLOW_SCHEDULE_TO_START_MS, gpu: 60_000 };

/**
 * Activity schedule-to-start latency per watched queue, over the samples of every worker scraped: a browser
 * worker's own session queue (`<browser>@<worker>`) counts as the browser queue. Absent for a queue with no
 * activity yet.
 */
export function queueWaits(samples: Sample[], queues: WatchedQueues, prefix = 'temporal_'): Partial<Record<keyof WatchedQueues, { meanMs: number; count: number }>> {
  const kindOf = (q: string | undefined): keyof WatchedQueues | undefined =>
    q === queues.gpu ? 'gpu' : q === queues.browser || q?.startsWith(`${queues.browser}@`) ? 'browser' : undefined;
  const base = `${prefix}activity_schedule_to_start_latency`;
  const out: Partial<Record<keyof WatchedQueues, { meanMs: number; count: number }>> = {};
  for (const kind of ['gpu', 'browser'] as const) {
    const mine = samples.filter((s) => kindOf(s.labels.task_queue) === kind);
    const w = meanLatency(mine, base);
    if (w) out[kind] = w;
  }
  return out;
}
