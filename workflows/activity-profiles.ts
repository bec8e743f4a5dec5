import type { ActivityOptions, RetryPolicy } from '@temporalio/workflow';
import { clipSummary } from '../lib/model-io/text';

// Retry and timeout profiles, declared once. Retries belong to Temporal (clients inside activities never
// retry on their own); these say how long and how often. Summaries are clipped here (lib/model-io/text.ts clipSummary):
// they name page URLs, which can be kilobytes long.

/**
 * The learner (Python, `gpu` queue). A retry of a killed learner's attempt is queued when its successor starts
 * (halo_learner/inflight.py), so the first interval is what a restart waits for; out-of-memory retries back
 * off from there.
 */
export const LEARNER_RETRY: RetryPolicy = { initialInterval: '1s', backoffCoefficient: 2, maximumInterval: '2m', maximumAttempts: 10 };
/** One update of the 8B takes minutes. */
export const LEARNER_UPDATE_TIMEOUT = '2h';
/** Colocated sampling of N completions (queued behind an update on the same GPU). */
export const LEARNER_SAMPLE_TIMEOUT = '30m';

/** Blob and file work of the control worker (configs, batches, metrics, snapshots): retried patiently. */
export const CONTROL_RETRY: RetryPolicy = { initialInterval: '1s', maximumInterval: '30s', maximumAttempts: 20 };

/** A model server that is down or failing: backoff from 1 s doubling to 30 s, `maxAttempts` in all. */
export function modelRetry(maxAttempts: number): RetryPolicy {
  return { initialInterval: '1s', backoffCoefficient: 2, maximumInterval: '30s', maximumAttempts: maxAttempts };
}

/** Run-level control activities (config, batch, metrics, adapter loading). */
export function runActivities(startToCloseTimeout: ActivityOptions['startToCloseTimeout'] = '10m'): ActivityOptions {
  return { startToCloseTimeout, retry: CONTROL_RETRY };
}

/**
 * Model calls (policy sampling, critic): the client times out on its own after `timeoutMs`; the margin covers
 * blob reads and writes and bounds how long a call that died with its worker waits before its retry.
 */
export function modelCall(timeoutMs: number, maxAttempts: number, summary: string, marginMs = 30_000): ActivityOptions {
  return { summary: clipSummary(summary), startToCloseTimeout: timeoutMs + marginMs, retry: modelRetry(maxAttempts) };
}

/**
 * Opening a session: a few attempts, then the caller's own rebuild logic decides. Long enough for a wait for a
 * REAL site slot (HALO_SITE_SLOT_TIMEOUT_MS, 10 min by default) to end with its own message; the heartbeat
 * still notices a dead worker. `scheduleToStartMs`: on a worker's own queue, how long to wait for that worker.
 */
export function sessionOpen(taskQueue: string, heartbeatTimeoutMs: number, summary: string, scheduleToStartMs?: number): ActivityOptions {
  return {
    summary: clipSummary(summary),
    taskQueue,
    startToCloseTimeout: '15m',
    heartbeatTimeout: heartbeatTimeoutMs,
    retry: { maximumAttempts: 3, initialInterval: '1s' },
    ...(scheduleToStartMs !== undefined ? { scheduleToStartTimeout: scheduleToStartMs } : {}),
  };
}

/**
 * Work on an open session goes to the one worker holding the page. One attempt: a failure there means the
 * session is suspect, and the caller rebuilds it rather than retrying into a dead queue.
 */
export function onSession(taskQueue: string, scheduleToStartMs: number, heartbeatTimeoutMs: number, summary: string): ActivityOptions {
  return {
    summary: clipSummary(summary),
    taskQueue,
    scheduleToStartTimeout: scheduleToStartMs,
    startToCloseTimeout: '2m',
    heartbeatTimeout: heartbeatTimeoutMs,
    retry: { maximumAttempts: 1 },
  };
}
