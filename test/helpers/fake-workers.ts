import { after } from 'node:test';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { FakeBrowser, FakeControl, FakeLearner, type FakeBrowserOptions, type PolicyScript } from './fake-activities';
import { RoutedWorkers, type RunActivities } from './routed-workers';
import { testQueues, type ActivityMap, type TestQueues } from './workflow-env';

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
  /** Wraps each queue's mocks (a test that watches or holds every activity). */
  wrap?: (acts: ActivityMap) => ActivityMap;
}

/** Every activity name the mocks register, per queue (shared workers register each one, routed). */
function activityNames(): Record<keyof RunActivities, string[]> {
  const browser = new FakeBrowser(testQueues('names'));
  return {
    control: Object.keys(new FakeControl().activities()),
    browser: Object.keys(browser.browserActivities()),
    session: Object.keys(browser.sessionActivities()),
    gpu: Object.keys(new FakeLearner().activities()),
  };
}

// One set of workers per dev server, shared by the file's tests and stopped when its tests are done (before the file's
// own `after` tears the server down: hooks run in the order they were registered, and this module is imported first).
const shared = new Map<TestWorkflowEnvironment, Promise<RoutedWorkers>>();
after(async () => {
  const all = [...shared.values()];
  shared.clear();
  for (const w of all) await (await w).stop();
});

function sharedWorkers(env: TestWorkflowEnvironment): Promise<RoutedWorkers> {
  let w = shared.get(env);
  if (!w) {
    const workers = new RoutedWorkers('fake');
    w = workers.start(env, activityNames()).then(() => workers);
    shared.set(env, w);
  }
  return w;
}

/**
 * Runs `fn` while in-process workers serve the production workflows with the control activities, the browser and
 * session queues of one FakeBrowser, and a FakeLearner on the gpu queue: every production workflow schedules on some
 * of these four, so one layout fits them all. The workers are the file's shared ones (RoutedWorkers), routing the
 * activities of workflow `runId` and those named `runId-…` to this test's mocks.
 */
export async function withFakeWorkers<T>(env: TestWorkflowEnvironment, name: string, opts: FakeWorkerOptions, fn: (w: FakeWorkers) => Promise<T>): Promise<T> {
  const workers = await sharedWorkers(env);
  const q = workers.q;
  const w: FakeWorkers = {
    q,
    runId: `${name}-${process.pid}`,
    browser: new FakeBrowser(q, opts.browser),
    control: new FakeControl(opts.policy),
    learner: new FakeLearner(),
  };
  const wrap = opts.wrap ?? ((acts: ActivityMap) => acts);
  const acts = {
    control: wrap(w.control.activities()),
    browser: wrap(w.browser.browserActivities()),
    session: wrap(w.browser.sessionActivities()),
    gpu: wrap(w.learner.activities()),
  };
  return workers.serve(w.runId, acts, () => fn(w));
}

/** The one place a GRPO run's config is written: two one-step episodes per iteration, sampled by the colocated learner. */
export function grpoConfig(q: TestQueues, runId: string, iterations: number, train: Record<string, unknown> = {}) {
  return {
    temporal: { controlTaskQueue: q.control, browserTaskQueue: q.browser },
    policy: { backend: 'colocated', model: 'fake-model', temperature: 1, maxTokens: 32 },
    episode: { env: 'miniwob', maxSteps: 1, heartbeatTimeoutMs: 5000 },
    train: {
      runId,
      iterations,
      episodesPerIteration: 1,
      grouping: 'episode',
      numGenerations: 2,
      parallelism: 2,
      tasks: ['click-button'],
      gpuTaskQueue: q.gpu,
      ...train,
    },
  };
}
