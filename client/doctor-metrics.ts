import { firstLine } from '../env/page-actions';
import type { HaloConfig } from '../lib/config/config';
import { describeHealth, metricsEndpoints, parsePrometheus, QUEUE_WAIT_WARN_MS, queueWaits, scrapeUrl, workerHealth, type Sample, type WorkerHealth } from './worker-metrics';
import type { DoctorCheck } from './doctor-check';
import { learnerSettings } from './stack';

// The stack's own health as its workers' SDK metrics tell it (client/worker-metrics.ts): `halo doctor` rows and the
// lines `halo status` prints under a run.

/** One worker's metrics endpoint, read; throws when it does not answer. */
async function readSamples(endpoint: string, timeoutMs: number): Promise<Sample[]> {
  const res = await fetch(scrapeUrl(endpoint), { signal: AbortSignal.timeout(timeoutMs) });
  if (!res.ok) throw new Error(`HTTP ${res.status} from ${scrapeUrl(endpoint)}`);
  return parsePrometheus(await res.text());
}

/** One worker's metrics endpoint, read and summarised; throws when it does not answer. */
export async function readWorkerHealth(endpoint: string, timeoutMs: number): Promise<WorkerHealth> {
  return workerHealth(await readSamples(endpoint, timeoutMs));
}

/**
 * A row per watched queue (the learner's `gpu` queue, the browser queue with each browser worker's own), from the
 * samples of every worker that answered: how long its activities wait for a worker to start them.
 */
function queueChecks(cfg: HaloConfig, samples: Sample[]): DoctorCheck[] {
  const queues = { gpu: cfg.train.gpuTaskQueue, browser: cfg.temporal.browserTaskQueue };
  const waits = queueWaits(samples, queues);
  return (['gpu', 'browser'] as const).map((kind): DoctorCheck => {
    const w = waits[kind];
    const id = `queue.${kind}`;
    const name = `${kind} queue wait`;
    if (!w) return { id, name, status: 'pass', detail: `${queues[kind]}: no activities yet` };
    const slow = w.meanMs > QUEUE_WAIT_WARN_MS[kind];
    return {
      id,
      name,
      status: slow ? 'warn' : 'pass',
      detail: `${queues[kind]}: activities wait ${Math.round(w.meanMs)} ms on average to start (${w.count}; warns above ${QUEUE_WAIT_WARN_MS[kind]} ms)`,
      ...(slow
        ? {
            fix:
              kind === 'gpu'
                ? 'the learner is stalled, restarting or gone: see the learner row and <home>/logs/learner.log'
                : 'too few browser workers (stack.browserWorkers) or one stalled: see <home>/logs',
          }
        : {}),
    };
  });
}

/** The endpoints of this stack's workers, named as `halo doctor` names the workers. */
function namedEndpoints(cfg: HaloConfig, env: NodeJS.ProcessEnv): { id: string; name: string; endpoint: string }[] | null {
  const e = metricsEndpoints(env, cfg.stack.browserWorkers);
  if (!e) return null;
  return [
    { id: 'metrics.control', name: 'control worker metrics', endpoint: e.control },
    ...e.browsers.map((endpoint, i) => ({ id: `metrics.browser-${i}`, name: `browser worker ${i} metrics`, endpoint })),
    // A learner on another host (HALO_LEARNER=0 here) serves its metrics there.
    ...(learnerSettings(env).enabled ? [{ id: 'metrics.learner', name: 'learner metrics', endpoint: e.learner }] : []),
  ];
}

export async function workerMetricsChecks(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs: number): Promise<DoctorCheck[]> {
  let endpoints: ReturnType<typeof namedEndpoints>;
  try {
    endpoints = namedEndpoints(cfg, env);
  } catch (err) {
    return [{ id: 'metrics', name: 'worker metrics', status: 'fail', detail: (err as Error).message, fix: 'set HALO_METRICS_PORT to a free port, or unset it' }];
  }
  if (!endpoints) {
    return [
      {
        id: 'metrics',
        name: 'worker metrics',
        status: 'skip',
        detail: 'off',
        fix: 'HALO_METRICS_PORT=9464 npx halo up serves the workers’ Prometheus metrics (schedule-to-start latency, failures, free slots) and lets halo doctor read them',
      },
    ];
  }
  const scraped: Sample[] = [];
  const rows = await Promise.all(
    endpoints.map(async ({ id, name, endpoint }): Promise<DoctorCheck> => {
      try {
        const samples = await readSamples(endpoint, timeoutMs);
        scraped.push(...samples);
        const h = describeHealth(workerHealth(samples));
        return {
          id,
          name,
          status: h.attention ? 'warn' : 'pass',
          detail: `${endpoint}: ${h.text}`,
          ...(h.attention
            ? {
                fix: 'tasks wait for a worker (start more with stack.browserWorkers, or look for a stalled one in <home>/logs) or workflow tasks fail (a replay problem: see the worker log)',
              }
            : {}),
        };
      } catch (err) {
        return {
          id,
          name,
          status: 'fail',
          detail: `${endpoint}: ${firstLine((err as Error).message)}`,
          fix: 'the worker is down or was started without metrics: npx halo down && npx halo up with HALO_METRICS_PORT set',
        };
      }
    }),
  );
  return [...rows, ...queueChecks(cfg, scraped)];
}

/** Lines for `halo status`: each worker's health, or nothing when metrics are off or unreadable settings. */
export async function stackHealthLines(cfg: HaloConfig, env: NodeJS.ProcessEnv, timeoutMs = 2_000): Promise<string[]> {
  let endpoints: ReturnType<typeof namedEndpoints>;
  try {
    endpoints = namedEndpoints(cfg, env);
  } catch {
    return [];
  }
  if (!endpoints) return [];
  return Promise.all(
    endpoints.map(async ({ name, endpoint }) => {
      try {
        const h = describeHealth(await readWorkerHealth(endpoint, timeoutMs));
        return `${name.replace(/ metrics$/, '')}: ${h.text}${h.attention ? ' (needs attention: halo doctor)' : ''}`;
      } catch (err) {
        return `${name.replace(/ metrics$/, '')}: no metrics at ${endpoint} (${firstLine((err as Error).message)})`;
      }
    }),
  );
}
