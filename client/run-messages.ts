import { type Connection, type WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError } from '@temporalio/client';
import { pauseSignal, pauseUpdate, resumeSignal, resumeUpdate, stopSignal, stopUpdate, type RunStatus } from '../workflows/messages';

export type ControlMessage = 'pause' | 'resume' | 'stop';

/** How long `halo pause|resume|stop` waits for the run to answer before it leaves the change as a signal: HALO_CONTROL_TIMEOUT_S, default 30. */
export function controlTimeoutMs(env: NodeJS.ProcessEnv = process.env): number {
  const raw = env.HALO_CONTROL_TIMEOUT_S?.trim();
  if (!raw) return 30_000;
  const s = Number(raw);
  if (!Number.isFinite(s) || s <= 0) throw new Error(`HALO_CONTROL_TIMEOUT_S ${JSON.stringify(raw)}: seconds, above 0`);
  return s * 1000;
}

/**
 * Pause, resume or stop a run as a Workflow Update, so the answer is the run's status once it took the change.
 * An update needs a control worker to run it; when none answers in time (the stack is down), the change is
 * sent as the signal of the same name instead, which the run takes when a worker next runs it (both are
 * idempotent, so the update that may still be delivered later changes nothing more).
 */
export async function sendRunControl(
  connection: Connection,
  handle: WorkflowHandle,
  message: ControlMessage,
  timeoutMs: number,
): Promise<{ status: RunStatus } | { signalled: true }> {
  const update = { pause: pauseUpdate, resume: resumeUpdate, stop: stopUpdate }[message];
  try {
    return { status: await connection.withDeadline(Date.now() + timeoutMs, () => handle.executeUpdate(update)) };
  } catch (err) {
    if (!(err instanceof WorkflowUpdateRPCTimeoutOrCancelledError)) throw err;
  }
  await handle.signal({ pause: pauseSignal, resume: resumeSignal, stop: stopSignal }[message]);
  return { signalled: true };
}

/** One line for the operator: the status after the change, or that it went as a signal. */
export function describeControl(run: string, message: ControlMessage, r: { status: RunStatus } | { signalled: true }, timeoutMs: number): string {
  if ('signalled' in r) return `${message} sent to run ${run} as a signal (no control worker answered in ${timeoutMs / 1000} s; the run takes it when one runs it)`;
  const s = r.status;
  return `run ${run}: ${message} taken; phase ${s.phase}, paused ${s.paused}, stopping ${s.stopping}${s.pauseReason ? ` (${s.pauseReason})` : ''}`;
}
