import { ApplicationFailure } from '@temporalio/activity';
import { UnscorableTaskError } from '../env/real-eval';
import { checkSiteHealth } from '../env/real-site';
import { getRealTask } from '../env/real-tasks';
import { assertMiniwobTask } from '../env/miniwob-tasks';
import type { TaskSpec } from '../env/types';
import type { RealScoring } from '../lib/episode/episode-types';
import { permanentEnvError } from './session-errors';

/**
 * The task's milestone site (REAL), null for MiniWoB; unknown tasks are permanent errors, and so are unscorable
 * ones except under official scoring, which plays them and counts their 0.
 */
export function validateTask(spec: TaskSpec, miniwobTasks: string[], scoring?: RealScoring): string | null {
  try {
    if (spec.env === 'miniwob') {
      assertMiniwobTask(spec.task, miniwobTasks);
      return null;
    }
    if (spec.env === 'real') {
      const task = getRealTask(spec.task);
      if (!task.scorable && scoring !== 'official') throw new UnscorableTaskError(task);
      return task.site;
    }
  } catch (err) {
    throw permanentEnvError(err) ?? ApplicationFailure.nonRetryable((err as Error).message, 'UnknownTask');
  }
  throw ApplicationFailure.nonRetryable(`unknown environment ${JSON.stringify((spec as { env: unknown }).env)}`, 'UnknownEnvironment');
}

/** A REAL URL on the origin that serves it here: its own, or the worker's override (a mirror, the test site). */
export function realUrl(url: string, override: string | undefined): string {
  if (!override) return url;
  const u = new URL(url);
  return new URL(u.pathname + u.search + u.hash, override).toString();
}

/** The REAL task's site answers; one that cannot be reached is a permanent error that says so. */
export async function checkRealTaskSite(taskId: string, override: string | undefined): Promise<void> {
  try {
    await checkSiteHealth(realUrl(getRealTask(taskId).startUrl, override));
  } catch (err) {
    throw permanentEnvError(err) ?? err;
  }
}
