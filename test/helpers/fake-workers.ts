import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { FakeBrowser, FakeControl, FakeLearner, type FakeBrowserOptions, type PolicyScript } from './fake-activities';
import { testQueues, withWorkers, type TestQueues } from './workflow-env';

/** The mocks behind one test's workers, and the queues and run id they serve. */
export interface FakeWorkers {
  q: TestQueues;
  /** `<name>-<pid>`: the workflow id a test gives its run. */
  runId: string;
  browser: FakeBrowser;
  control: FakeControl;
  learner: FakeLearner;
}

export interface FakeWorkerOptions {
  browser?: FakeBrowserOptions;
  /** What the control worker's sampler proposes (FakeControl's default otherwise). */
  policy?: PolicyScript;
}

/**
 * Runs `fn` while in-process workers serve fresh queues named after `name`: the production workflows with
 * the control activities, the browser and session queues of one FakeBrowser, and a FakeLearner on the gpu
 * queue. Every production workflow schedules on some of these four, so one layout fits them all.
 */
export async function withFakeWorkers<T>(env: TestWorkflowEnvironment, name: string, opts: FakeWorkerOptions, fn: (w: FakeWorkers) => Promise<T>): Promise<T> {
  const q = testQueues(name);
  const w: FakeWorkers = {
    q,
    runId: `${name}-${process.pid}`,
    browser: new FakeBrowser(q, opts.browser),
    control: new FakeControl(opts.policy),
    learner: new FakeLearner(),
  };
  return withWorkers(
    env,
    [
      { taskQueue: q.control, workflows: true, activities: w.control.activities() },
      { taskQueue: q.browser, activities: w.browser.browserActivities() },
      { taskQueue: q.session, activities: w.browser.sessionActivities() },
      { taskQueue: q.gpu, activities: w.learner.activities() },
    ],
    () => fn(w),
  );
}
