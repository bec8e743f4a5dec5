import { ActivityFailure, ApplicationFailure, TimeoutFailure } from '@temporalio/workflow';

/**
 * Session errors that mean "this browser session is gone" (its worker died, timed out, or was restarted):
 * rebuild the session elsewhere from its action prefix. Non-retryable failures are real answers, not losses.
 */
export function isSessionLost(err: unknown): boolean {
  if (!(err instanceof ActivityFailure)) return false;
  const cause = err.cause;
  if (cause instanceof TimeoutFailure) return true;
  if (cause instanceof ApplicationFailure) return !cause.nonRetryable;
  return false;
}
