import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { deferred, testQueues, withWorkers, type ActivityMap, type TestQueues } from './workflow-env';

/** The activities one run is served by, on each of the four queues. */
export interface RunActivities {
  control: ActivityMap;
  browser: ActivityMap;
  session: ActivityMap;
  gpu: ActivityMap;
}

/**
 * One set of workers (the production workflows and control activities, browser, session and gpu queues) shared by
 * many runs, each served by its own mocks: an activity goes to the mocks of the run whose id its workflow id is or
 * starts with (`<runId>-…`: the run's episodes, evaluations and searches). A workflow worker loads the whole
 * workflow bundle into a thread of its own (seconds of CPU); tests that start one per run spent most of their time
 * there.
 */
export class RoutedWorkers {
  readonly q: TestQueues;
  private readonly runs = new Map<string, RunActivities>();
  private readonly stopped = deferred();
  private running?: Promise<void>;

  constructor(name: string) {
    this.q = testQueues(name);
  }

  /** Starts the workers; `names` lists every activity any run's mocks register, per queue. */
  async start(env: TestWorkflowEnvironment, names: Record<keyof RunActivities, string[]>): Promise<void> {
    const ready = deferred();
    const route = (queue: keyof RunActivities) => Object.fromEntries(names[queue].map((name) => [name, (input: unknown) => this.activity(queue, name)(input)])) as ActivityMap;
    this.running = withWorkers(
      env,
      [
        { taskQueue: this.q.control, workflows: true, activities: route('control') },
        { taskQueue: this.q.browser, activities: route('browser') },
        { taskQueue: this.q.session, activities: route('session') },
        { taskQueue: this.q.gpu, activities: route('gpu') },
      ],
      async () => {
        ready.resolve();
        await this.stopped.promise;
      },
    );
    // A worker that fails to start fails this call, not the first run served.
    await Promise.race([ready.promise, this.running]);
  }

  /** Serves `runId`'s activities with `acts` while `fn` runs. */
  async serve<T>(runId: string, acts: RunActivities, fn: () => Promise<T>): Promise<T> {
    if (this.runs.has(runId)) throw new Error(`run ${runId} is served already`);
    this.runs.set(runId, acts);
    try {
      return await fn();
    } finally {
      this.runs.delete(runId);
    }
  }

  async stop(): Promise<void> {
    this.stopped.resolve();
    await this.running;
  }

  private activity(queue: keyof RunActivities, name: string): ActivityMap[string] {
    const workflowId = Context.current().info.workflowExecution?.workflowId ?? '';
    const runId = runOf(workflowId, [...this.runs.keys()]);
    const fn = runId === undefined ? undefined : this.runs.get(runId)?.[queue][name];
    if (!fn) throw ApplicationFailure.nonRetryable(`no ${queue} activity ${name} is served for workflow ${workflowId} (runs: ${[...this.runs.keys()].join(', ')})`);
    return fn;
  }
}

/**
 * The run a workflow belongs to: the run id it is, or the longest one it starts with followed by `-` (a run's episodes,
 * evaluations and searches are named `<runId>-…`; `run-1` must not take `run-1-x`'s when both are served).
 */
export function runOf(workflowId: string, runIds: string[]): string | undefined {
  return runIds.filter((id) => workflowId === id || workflowId.startsWith(`${id}-`)).sort((a, b) => b.length - a.length)[0];
}
