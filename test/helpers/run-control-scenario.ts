import assert from 'node:assert/strict';
import type { WorkflowHandle } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { pauseSignal, pauseUpdate, resumeSignal, resumeUpdate, statusQuery, stopSignal, stopUpdate, type RunStatus } from '../../workflows/messages';
import type { Holds } from './fake-activities';
import type { FakeWorkers } from './fake-workers';
import { eventually } from './workflow-env';

/** A run's status as the `status` query answers it: the common fields, plus each workflow's own (iteration, progress). */
export type RunStatusView = RunStatus & { [field: string]: unknown };

export interface RunControlScenario {
  /** Starts the run; the returned handle must follow its latest run (no run id). */
  start: () => Promise<WorkflowHandle>;
  /** Holds the run's first and second unit of work (keys 1 and 2) in flight: an iteration's update, an episode's start. */
  units: Holds;
  /** The status of a run that finished unit 1 and waits, paused, before unit 2. */
  pausedBeforeSecond: (st: RunStatusView) => boolean;
  /** A count that moves whenever the run starts work (samples, sessions). */
  work: () => number;
}

/** What the status query said at each point of the scenario, and the run's result. */
export interface RunControlOutcome<R> {
  whilePaused: RunStatusView;
  afterResume: RunStatusView;
  whileStopping: RunStatusView;
  result: R;
  /** With `via: 'update'`: what each update answered (the status right after the change). */
  answers?: { pause: RunStatusView; resume: RunStatusView; stop: RunStatusView };
}

/** How the operator's messages go: as signals, or as Workflow Updates that answer with the status after the change. */
export type ControlVia = 'signal' | 'update';

/**
 * Pause, resume and stop a run the way an operator does, with the CLI's message definitions: pause while
 * unit 1 is in flight → unit 1 completes and the run waits, paused, doing nothing (`work()` stays put);
 * resume → unit 2 starts; stop while it is in flight → the run ends after unit 2. Returns what the status
 * query said at each point and the run's result.
 */
export async function pauseResumeStop<R>(s: RunControlScenario, via: ControlVia = 'signal'): Promise<RunControlOutcome<R>> {
  const { units } = s;
  const answers: Partial<NonNullable<RunControlOutcome<R>['answers']>> = {};
  const send = async (name: 'pause' | 'resume' | 'stop') => {
    if (via === 'signal') return handle.signal({ pause: pauseSignal, resume: resumeSignal, stop: stopSignal }[name]);
    answers[name] = { ...(await handle.executeUpdate({ pause: pauseUpdate, resume: resumeUpdate, stop: stopUpdate }[name])) };
  };
  units.hold(1);
  units.hold(2);
  const handle = await s.start();
  // Each workflow answers with more than the common fields; the predicates read those by name.
  const status = async (): Promise<RunStatusView> => ({ ...(await handle.query(statusQuery)) });
  await units.reached(1);
  await send('pause');
  units.release(1);

  await eventually('the run to wait, paused, before its next unit of work', async () => {
    const st = await status();
    return st.paused && s.pausedBeforeSecond(st) ? st : undefined;
  });
  const idleAt = s.work();
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(s.work(), idleAt, 'a paused run starts no work');
  const whilePaused = await status();

  await send('resume');
  await units.reached(2);
  const afterResume = await status();
  await send('stop');
  const whileStopping = await eventually('the status to say stopping', async () => {
    const st = await status();
    return st.stopping ? st : undefined;
  });
  units.release(2);
  const result = (await handle.result()) as R;
  return { whilePaused, afterResume, whileStopping, result, ...(via === 'update' ? { answers: answers as NonNullable<RunControlOutcome<R>['answers']> } : {}) };
}

/**
 * `pauseResumeStop` for a training loop (`trainGrpo`, `trainMcts`) on the fake workers, its units the learner's
 * updates: paused while iteration 1 updates, stopped while iteration 2 does. Checks what every training loop
 * must show: paused before iteration 2, running after the resume, stopping, and a result of 2 iterations and
 * adapter v2, stopped early, with updates to v1 and v2 only. `work` counts what the loop starts besides updates.
 */
export async function pauseResumeStopTraining<R>(
  env: TestWorkflowEnvironment,
  w: FakeWorkers,
  workflowType: 'trainGrpo' | 'trainMcts',
  config: unknown,
  work: () => number,
  via: ControlVia = 'signal',
): Promise<RunControlOutcome<R>> {
  const s = await pauseResumeStop<R>(
    {
      start: async () => {
        await env.client.workflow.start(workflowType, { taskQueue: w.q.control, workflowId: w.runId, args: [{ config }] });
        return env.client.workflow.getHandle(w.runId);
      },
      units: w.learner.updateHolds,
      pausedBeforeSecond: (st) => st.iteration === 2,
      work,
    },
    via,
  );
  assert.equal(s.whilePaused.paused, true);
  assert.equal(s.whilePaused.iteration, 2);
  assert.equal(s.whilePaused.phase, 'paused');
  assert.equal(s.afterResume.paused, false);
  assert.equal(s.whileStopping.stopping, true);
  assert.deepEqual(s.result, { runId: w.runId, iterations: 2, adapterVersion: 2, stoppedEarly: true });
  assert.deepEqual(
    w.learner.updates.map((u) => u.version),
    [1, 2],
  );
  return s;
}
