import { ActivityFailure, ApplicationFailure, ChildWorkflowFailure, isCancellation } from '@temporalio/workflow';

/**
 * Runs `fn` over `items` with at most `limit` calls in flight, results in item order. Deterministic in
 * workflow code: items are taken in order, and each worker loop only resumes on its own call's result.
 */
export async function pool<T, R>(items: T[], limit: number, fn: (item: T, i: number) => Promise<R>): Promise<R[]> {
  const out = new Array<R>(items.length);
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(Math.max(1, limit), items.length) }, async () => {
      while (next < items.length) {
        const i = next++;
        out[i] = await fn(items[i], i);
      }
    }),
  );
  return out;
}

export interface Failed<T> {
  index: number;
  item: T;
  error: string;
  /** The failure itself (in memory only): the run's own failure keeps the first one as its cause. */
  cause?: Error;
}

/**
 * The reason behind a failure: a child workflow's failure wraps the child's own failure, which wraps the
 * activity failure, which wraps what the activity threw; the innermost message says what went wrong.
 */
export function failureMessage(err: unknown): string {
  let e: unknown = err;
  while ((e instanceof ChildWorkflowFailure || e instanceof ActivityFailure || e instanceof ApplicationFailure) && e.cause instanceof Error) e = e.cause;
  return e instanceof Error ? e.message : String(e);
}

/**
 * Like `pool`, but a call that fails is recorded rather than failing the others: one episode whose site was
 * briefly unreachable must not end a run. Cancellation still propagates.
 */
export async function poolSettled<T, R>(items: T[], limit: number, fn: (item: T, i: number) => Promise<R>): Promise<{ ok: R[]; failed: Failed<T>[] }> {
  const settled = await pool(items, limit, async (item, i): Promise<{ value: R } | { failed: Failed<T> }> => {
    try {
      return { value: await fn(item, i) };
    } catch (err) {
      if (isCancellation(err)) throw err;
      return { failed: { index: i, item, error: failureMessage(err).slice(0, 500), ...(err instanceof Error ? { cause: err } : {}) } };
    }
  });
  const ok: R[] = [];
  const failed: Failed<T>[] = [];
  for (const s of settled) {
    if ('failed' in s) failed.push(s.failed);
    else ok.push(s.value);
  }
  return { ok, failed };
}

/** Fails the run (non-retryable, naming the reasons) when more than `maxShare` of `total` units failed. */
export function checkFailureShare(failed: Failed<unknown>[], total: number, maxShare: number, what: string, setting: string): void {
  if (failed.length === 0 || failed.length <= maxShare * total) return;
  const reasons = failed
    .slice(0, 3)
    .map((f) => `#${f.index}: ${f.error}`)
    .join('; ');
  // The first failure rides along as the cause, so a client reads which child, activity and error type it was.
  throw ApplicationFailure.create({
    message: `${failed.length} of ${total} ${what} failed, more than ${setting} = ${maxShare} allows (${reasons}${failed.length > 3 ? '; …' : ''})`,
    type: 'TooManyFailures',
    nonRetryable: true,
    ...(failed[0].cause ? { cause: failed[0].cause } : {}),
  });
}
