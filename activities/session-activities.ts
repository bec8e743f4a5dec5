import { Context, heartbeat } from '@temporalio/activity';
import type { FinishSessionResult, ResetSessionInput, StartSessionInput, StartSessionResult, StepSessionInput, StepSessionResult } from '../lib/episode/episode-types';
import type { SessionManager } from './session';

/**
 * The browser worker's session activities: each a call into its SessionManager (activities/session.ts), with a
 * heartbeat every second so a dead worker is noticed within the heartbeat timeout.
 */

/** Heartbeats every second while `work` runs, so a dead worker is noticed within the heartbeat timeout. */
async function withHeartbeat<T>(work: (beat: (d: unknown) => void) => Promise<T>): Promise<T> {
  let details: unknown;
  const beat = (d: unknown) => {
    details = d;
    heartbeat(d);
  };
  heartbeat();
  const timer = setInterval(() => heartbeat(details), 1000);
  try {
    return await work(beat);
  } finally {
    clearInterval(timer);
  }
}

export function createSessionActivities(manager: SessionManager) {
  return {
    async startSession(input: StartSessionInput): Promise<StartSessionResult> {
      const { info, cancellationSignal } = Context.current();
      // A slot wait cut short by the activity's own timeout would end without saying why: end it first, with
      // time left for the reset and the replay.
      const budget = info.startToCloseTimeoutMs;
      const maxSlotWaitMs = budget > 0 ? Math.max(1_000, budget - Math.min(60_000, budget / 4)) : undefined;
      return withHeartbeat((beat) => manager.start(input, beat, { signal: cancellationSignal, ...(maxSlotWaitMs ? { maxSlotWaitMs } : {}) }));
    },
    async stepSession(input: StepSessionInput): Promise<StepSessionResult> {
      Context.current().log.debug('step', { sessionId: input.sessionId, index: input.index });
      return withHeartbeat(() => manager.step(input));
    },
    async resetSession(input: ResetSessionInput): Promise<StartSessionResult> {
      return withHeartbeat((beat) => manager.reset(input, beat));
    },
    async finishSession(input: { sessionId: string }): Promise<FinishSessionResult> {
      return withHeartbeat(() => manager.finish(input.sessionId));
    },
    async closeSession(input: { sessionId: string }): Promise<void> {
      await manager.close(input.sessionId);
    },
  };
}

export type SessionActivities = ReturnType<typeof createSessionActivities>;
