import type { WorkerOptions } from '@temporalio/worker';

/**
 * Activity slots of a browser worker's two pollers. Each running activity may hold a Chromium page, so both
 * are capped: the shared queue's `startSession` (HALO_MAX_SESSIONS, default 4), and the worker's own queue
 * (HALO_SESSION_SLOTS, default 4 per session slot), where steps, resets and forks run; a fork opens a page of
 * its own, so an uncapped own queue would let forks open pages without limit.
 */
export interface BrowserSlots {
  shared: Pick<WorkerOptions, 'maxConcurrentActivityTaskExecutions'>;
  own: Pick<WorkerOptions, 'maxConcurrentActivityTaskExecutions'>;
}

/** Per session slot: a session's step, its fork and their reset or close can run at once. */
const OWN_SLOTS_PER_SESSION = 4;

function positiveInt(key: string, raw: string | undefined, fallback: number): number {
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1 || n > 10_000)
    throw new Error(`${key} must be a whole number from 1 to 10000 (activity slots of a browser worker); got ${JSON.stringify(raw)}`);
  return n;
}

/** The slot caps a browser worker's options carry, from the environment; a bad value is an error naming the variable. */
export function browserSlots(env: NodeJS.ProcessEnv = process.env): BrowserSlots {
  const sessions = positiveInt('HALO_MAX_SESSIONS', env.HALO_MAX_SESSIONS, 4);
  const own = positiveInt('HALO_SESSION_SLOTS', env.HALO_SESSION_SLOTS, OWN_SLOTS_PER_SESSION * sessions);
  return { shared: { maxConcurrentActivityTaskExecutions: sessions }, own: { maxConcurrentActivityTaskExecutions: own } };
}
