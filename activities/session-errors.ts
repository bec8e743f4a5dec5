import { ApplicationFailure } from '@temporalio/activity';
import { UnscorableTaskError } from '../env/real-eval';
import { SiteUnreachableError } from '../env/real-site';
import { UnknownRealTaskError } from '../env/real-tasks';
import { SiteSlotTimeoutError } from '../env/site-limits';

/** A snapshot fork whose /finish or URL differs from its parent's. */
export class ForkMismatch extends Error {}

/** Known permanent environment errors become non-retryable failures that say what is wrong. */
export function permanentEnvError(err: unknown): ApplicationFailure | undefined {
  if (err instanceof UnknownRealTaskError || err instanceof UnscorableTaskError || err instanceof SiteUnreachableError) {
    return ApplicationFailure.nonRetryable((err as Error).message, (err as Error).name);
  }
  return undefined;
}

/**
 * No site slot in time: the site is busy with other episodes, which end and free their slots, so this is
 * transient. Retryable: Temporal retries the start with backoff (and a workflow counts a start that still
 * fails as a lost session within its rebuild budget); the message names the numbers to change when it persists.
 */
export function sessionStartFailure(err: unknown): unknown {
  if (err instanceof SiteSlotTimeoutError) return ApplicationFailure.retryable(err.message, 'SiteSlotTimeout');
  return permanentEnvError(err) ?? err;
}
