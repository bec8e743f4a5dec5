import { defineQuery, defineSignal, defineUpdate } from '@temporalio/workflow';

// The messages of every long-running workflow (trainGrpo, trainMcts, evaluate), defined once: workflows
// install handlers for them (run-control.ts) and the CLI sends them as these objects, never by string.

/** Pause before the next unit of work (iteration, or evaluation episode); work already started finishes. */
export const pauseSignal = defineSignal('pause');
export const resumeSignal = defineSignal('resume');
/** Graceful: the current iteration finishes (its adapter is kept), or no new evaluation episode starts. */
export const stopSignal = defineSignal('stop');

/** What every run reports; each workflow adds its own fields (iteration, adapter version, progress…). */
export interface RunStatus {
  runId: string;
  phase: string;
  paused: boolean;
  stopping: boolean;
  /** Why the run paused itself (e.g. the disk is full); absent when a user paused it or it runs. */
  pauseReason?: string;
}

export const statusQuery = defineQuery<RunStatus>('status');

/**
 * The same three changes as Workflow Updates, answered with the run's status once the change is made: the caller
 * learns that the run took it (a signal only says it was delivered). Same names as the signals; the change is
 * carried across continue-as-new like a signal's.
 */
export const pauseUpdate = defineUpdate<RunStatus>('pause');
export const resumeUpdate = defineUpdate<RunStatus>('resume');
export const stopUpdate = defineUpdate<RunStatus>('stop');
