import { ApplicationFailure, type Context } from '@temporalio/activity';
import type { ActivityExecuteInput, ActivityInboundCallsInterceptor, Next } from '@temporalio/worker';

/**
 * Every activity ends with a failure the SDK can report. The SDK turns any thrown value into an ApplicationFailure
 * by reading its `message`, `name` and `stack` (`ensureApplicationFailure`); a thrown value whose properties throw
 * when read (a revoked Proxy, a hostile getter from page-evaluated data) makes that conversion throw in turn, and
 * the attempt is never completed: its slot stays taken until the heartbeat timeout. Errors pass through untouched
 * (their classification, retryable or not, is the activity's); anything else becomes a retryable ApplicationFailure
 * whose message was read safely.
 */
export function activityErrorsInterceptor() {
  return (_ctx: Context): { inbound: ActivityInboundCallsInterceptor } => ({
    inbound: {
      execute: async (input: ActivityExecuteInput, next: Next<ActivityInboundCallsInterceptor, 'execute'>) => {
        try {
          return await next(input);
        } catch (err) {
          if (readable(err)) throw err;
          throw ApplicationFailure.create({ message: `activity threw a value that is not an Error: ${describe(err)}`, type: 'NonErrorThrown' });
        }
      },
    },
  });
}

/** An Error whose message, name and stack can all be read. */
function readable(err: unknown): boolean {
  try {
    return err instanceof Error && typeof String(err.message) === 'string' && typeof String(err.name) === 'string' && typeof String(err.stack) === 'string';
  } catch {
    return false;
  }
}

function describe(value: unknown): string {
  try {
    if (typeof value === 'object' && value !== null) return `${Object.prototype.toString.call(value)} ${JSON.stringify(value)?.slice(0, 200) ?? ''}`.trim();
    return String(value).slice(0, 200);
  } catch {
    return `an unreadable ${typeof value}`;
  }
}
