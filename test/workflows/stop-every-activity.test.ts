import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import type { TrainingResult } from '../../workflows/train-engine';
import { stopUpdate } from '../../workflows/messages';
import { grpoConfig, withFakeWorkers } from '../helpers/fake-workers';
import { deferred, startWorkflowEnv, type ActivityMap, type TestQueues } from '../helpers/workflow-env';

// A stop sent while any one activity of a training iteration is in flight ends the run: stopped early, every
// iteration it collected learned from and written once, nothing collected past the stop. The activities of each
// run layout are listed by name; the first test of a layout fails when its iterations call an activity the list
// lacks, so a new activity is covered by adding its name.

let env: TestWorkflowEnvironment;
before(async () => {
  env = await startWorkflowEnv();
});
after(async () => {
  await env?.teardown();
});

/**
 * Holds the first call of one activity made after iteration 1's metrics row is written (in a continued run),
 * or, with `fromStart`, its first call of all (an activity only a run's first workflow run makes).
 */
class ActivityGate {
  /** Every activity called, and those called after iteration 1's metrics row. */
  readonly called = new Set<string>();
  readonly calledLater = new Set<string>();
  readonly reached = deferred();
  private readonly released = deferred();
  private armed: boolean;
  private fired = false;

  constructor(
    private readonly target?: string,
    fromStart = false,
  ) {
    this.armed = fromStart;
  }

  release(): void {
    this.released.resolve();
  }

  wrap(map: ActivityMap): ActivityMap {
    return Object.fromEntries(
      Object.entries(map).map(([name, fn]) => [
        name,
        async (input: unknown) => {
          this.called.add(name);
          if (this.armed) this.calledLater.add(name);
          if (this.armed && !this.fired && name === this.target) {
            this.fired = true;
            this.reached.resolve();
            await this.released.promise;
          }
          const out = await fn(input);
          if (name === 'appendIterationMetrics' && (input as { iteration: number }).iteration === 1) this.armed = true;
          return out;
        },
      ]),
    );
  }
}

interface Layout {
  name: string;
  workflow: 'trainGrpo' | 'trainMcts';
  iterations: number;
  config: (q: TestQueues, runId: string, iterations: number) => unknown;
  /** Every activity its iterations call. */
  activities: string[];
  /** Those only its first workflow run calls (held there; the rest are held in a continued run). */
  firstRunOnly: string[];
}

/** The GRPO runs' config: the fake workers' one (grpoConfig), evaluated on a held-out task after every update. */
const grpo = (q: TestQueues, runId: string, iterations: number) => grpoConfig(q, runId, iterations, { heldOutTasks: ['click-link'], evalEvery: 1 });

/** What a run's episodes call with the colocated sampler (its prompt, sample and parse activities), and its run's stores. */
const colocatedEpisodes = [
  'storeJson',
  'loadJson',
  'checkFreeDisk',
  'startSession',
  'sample_actions',
  'writePrompt',
  'parseCompletions',
  'stepSession',
  'closeSession',
  'recordTrajectory',
];

const layouts: Layout[] = [
  {
    name: 'GRPO, colocated, sequential',
    workflow: 'trainGrpo',
    iterations: 3,
    config: grpo,
    activities: [...colocatedEpisodes, 'buildGrpoBatch', 'update_policy', 'appendIterationMetrics'],
    firstRunOnly: ['storeJson'],
  },
  {
    name: 'GRPO, served, pipelined',
    workflow: 'trainGrpo',
    iterations: 4,
    config: (q, runId, iterations) => {
      const c = grpo(q, runId, iterations);
      return {
        ...c,
        policy: { backend: 'openai', model: 'fake-model', temperature: 1, maxTokens: 32, baseUrl: 'http://vllm:8000/v1' },
        train: { ...c.train, maxStaleness: 1, vllmBaseUrl: 'http://vllm:8000/v1' },
      };
    },
    activities: [
      'storeJson',
      'loadJson',
      'checkFreeDisk',
      'startSession',
      'samplePolicy',
      'stepSession',
      'closeSession',
      'recordTrajectory',
      'buildGrpoBatch',
      'update_policy',
      'loadAdapterIntoVllm',
      'appendIterationMetrics',
    ],
    firstRunOnly: [],
  },
  {
    name: 'MCTS, colocated',
    workflow: 'trainMcts',
    iterations: 3,
    config: (q, runId, iterations) => ({
      ...grpo(q, runId, iterations),
      train: { gpuTaskQueue: q.gpu },
      mcts: {
        runId,
        iterations,
        tasks: ['click-button'],
        numSimulations: 2,
        maxChildren: 2,
        maxDepth: 1,
        critic: { backend: 'none' },
        heldOutTasks: ['click-link'],
        evalEvery: 1,
      },
    }),
    activities: [...colocatedEpisodes, 'collectMctsPairs', 'writeMctsDpoBatch', 'update_dpo', 'appendIterationMetrics'],
    firstRunOnly: [],
  },
];

let runNo = 0;

/** One training run on the file's shared workers, its activities behind `gate`; `during` runs once the run is started. */
async function trainRun(layout: Layout, gate: ActivityGate, during: (handle: Awaited<ReturnType<typeof env.client.workflow.start>>) => Promise<void>) {
  return withFakeWorkers(env, `stop-every-${++runNo}`, { wrap: (acts) => gate.wrap(acts) }, async ({ q, runId, control, learner }) => {
    const handle = await env.client.workflow.start(layout.workflow, { taskQueue: q.control, workflowId: runId, args: [{ config: layout.config(q, runId, layout.iterations) }] });
    await during(handle);
    return { runId, result: (await handle.result()) as TrainingResult, control, learner };
  });
}

const upTo = (n: number) => Array.from({ length: n }, (_, i) => i + 1);

// Each test trains under its own run id on the file's shared workers (withFakeWorkers), eight at a time.
for (const layout of layouts) {
  describe(`a stop during each activity of a training iteration (${layout.name})`, { timeout: 600_000, concurrency: 8 }, () => {
    test('the list names every activity the iterations call', async () => {
      const gate = new ActivityGate();
      const { result } = await trainRun(layout, gate, async () => {});
      assert.equal(result.stoppedEarly, false);
      assert.deepEqual([...gate.called].sort(), [...layout.activities].sort());
      assert.deepEqual([...gate.calledLater].sort(), layout.activities.filter((a) => !layout.firstRunOnly.includes(a)).sort());
    });

    for (const activity of layout.activities) {
      test(`stop while ${activity} is in flight: the run ends with what it collected, nothing lost`, async () => {
        const gate = new ActivityGate(activity, layout.firstRunOnly.includes(activity));
        const { runId, result, control, learner } = await trainRun(layout, gate, async (handle) => {
          await gate.reached.promise;
          const answer = await handle.executeUpdate(stopUpdate);
          assert.equal(answer.stopping, true);
          gate.release();
        });
        assert.equal(result.runId, runId);
        assert.equal(result.stoppedEarly, true, JSON.stringify(result));
        assert.ok(result.iterations < layout.iterations, JSON.stringify(result));
        // Each iteration collected was learned from, served, evaluated and written once; none began after the stop.
        assert.equal(result.adapterVersion, result.iterations);
        assert.deepEqual(
          learner.updates.map((u) => u.version),
          upTo(result.iterations),
        );
        if (layout.workflow === 'trainGrpo') {
          assert.deepEqual(
            control.grpoBatches.map((b) => b.iteration),
            upTo(result.iterations),
          );
          assert.deepEqual(control.grpoMetrics, upTo(result.iterations));
        } else {
          assert.equal(control.dpoBatches.length, result.iterations);
          assert.deepEqual(
            control.mctsMetrics.map((m) => m.iteration),
            upTo(result.iterations),
          );
        }
        assert.ok(
          control.grpoMetricLines.every((m) => m.eval !== undefined),
          'every written iteration has its evaluation',
        );
        if (layout.activities.includes('loadAdapterIntoVllm')) {
          assert.deepEqual(
            control.adapterLoads.map((l) => l.version),
            upTo(result.iterations),
          );
        }
      });
    }
  });
}
