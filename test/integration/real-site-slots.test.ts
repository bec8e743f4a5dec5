import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { DefaultLogger, NativeConnection, Runtime, Worker } from '@temporalio/worker';
import { singleEpisodeInput } from '../../client/episode-input';
import { startOrAttachTrain } from '../../client/train';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { parseMetricsJsonl } from '../../lib/training/run-metrics';
import type { UpdatePolicyOutputWire } from '../../lib/training/learner-types';
import type { TrainingResult } from '../../workflows/train-engine';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startFakeRealSite, type FakeRealSite } from '../../testing/fake-real-site';
import { startTestStack, type TestStack } from '../../testing/stack';

// GRPO with step grouping on REAL (the local REAL-protocol site through HALO_REAL_ORIGIN), the openai backend
// against the fake policy server, and ONE site slot per browser worker: a step group opens N=3 forks while its
// main session holds that slot, so the forks must share it (slots count episodes) or the run never gets past
// its first step group. Then the browser worker is SIGKILLed in the middle of a step group: the slots die with
// it, its successor admits the episodes at once, and the run completes. The learner is a stub on the gpu
// queue (the update is not what this test is about).
let site: FakeRealSite;
let policy: FakePolicyServer;
let stack: TestStack;
let learner: { worker: Worker; connection: NativeConnection; done: Promise<void> } | undefined;
const saved = { ...process.env };
const updates: number[] = [];

before(async () => {
  site = await startFakeRealSite();
  policy = await startFakePolicyServer({
    kind: 'scripted',
    email: { to: 'brian.king@example.com', subject: 'Meeting notes', body: 'Hi Brian, could you please send me the notes?' },
  });
  // Inherited by the browser workers: the old limiter (one slot per session, an endless wait) deadlocks here
  // for certain; a leaked slot fails a start with the limiter's message within the minute.
  process.env.HALO_REAL_ORIGIN = site.origin;
  process.env.HALO_SITE_CONCURRENCY = '1';
  process.env.HALO_SITE_SLOT_TIMEOUT_MS = '60000';
  stack = await startTestStack({ browserWorkers: 1 });
  Runtime.install({ logger: new DefaultLogger('WARN') });
  const connection = await NativeConnection.connect({ address: stack.address });
  const worker = await Worker.create({
    connection,
    namespace: stack.namespace,
    taskQueue: stack.gpuQueue,
    activities: {
      async update_policy(input: { run_id: string; version: number }): Promise<UpdatePolicyOutputWire> {
        updates.push(input.version);
        return {
          run_id: input.run_id,
          version: input.version,
          adapter_path: `/nonexistent/${input.run_id}/v${input.version}`,
          loss: 0,
          grad_norm: 0,
          tokens: 1,
          seconds: 0,
          reused: false,
          retokenized: 0,
          token_mismatch_rate: 0,
        };
      },
    },
  });
  learner = { worker, connection, done: worker.run() };
});
after(async () => {
  if (learner) {
    learner.worker.shutdown();
    await learner.done.catch(() => {});
    await learner.connection.close();
  }
  await stack?.stop();
  await policy?.close();
  await site?.close();
  for (const k of ['HALO_REAL_ORIGIN', 'HALO_SITE_CONCURRENCY', 'HALO_SITE_SLOT_TIMEOUT_MS']) {
    if (saved[k] === undefined) delete process.env[k];
    else process.env[k] = saved[k];
  }
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
const isBrowser = (p: ChildProcess) => p.spawnargs.some((a) => a.endsWith('browser.ts'));

async function kill(p: ChildProcess): Promise<void> {
  p.kill('SIGKILL');
  if (alive(p)) await new Promise((r) => p.once('exit', r));
}

/** Steps an episode has recorded (0 when it has not started or cannot answer yet). */
async function stepsDone(workflowId: string): Promise<number> {
  const p = await stack.client.workflow
    .getHandle(workflowId)
    .query<{ step: number }>('episodeProgress')
    .catch(() => undefined);
  return p?.step ?? 0;
}

async function sessionWorkRunning(workflowId: string): Promise<boolean> {
  const d = await stack.client.workflow
    .getHandle(workflowId)
    .describe()
    .catch(() => undefined);
  return (d?.raw.pendingActivities ?? []).some((a) => ['startSession', 'stepSession'].includes(a.activityType?.name ?? '') && a.state === 2 /* STARTED */);
}

/**
 * Resolves with the episode that is in its second step group: its first group is recorded and a fork is being
 * opened or stepped (with step grouping every session activity between two steps belongs to a group).
 */
async function waitForSecondStepGroup(episodes: string[], timeoutMs = 120_000): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    for (const id of episodes) if ((await stepsDone(id)) >= 1 && (await sessionWorkRunning(id))) return id;
    await sleep(50);
  }
  throw new Error(`no episode of ${episodes.join(', ')} reached its second step group within ${timeoutMs / 1000}s (forks waiting for the site slot their own episode holds?)`);
}

test('REAL step groups with more forks than site slots complete; a browser worker SIGKILL mid-group leaks no slot', { timeout: 240_000 }, async () => {
  const runId = 'real-slots';
  const iterations = 2;
  const numGenerations = 3;
  const cfg = parseConfig({
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'openai', baseUrl: policy.url, model: 'fake-qwen', temperature: 1, maxTokens: 64, timeoutMs: 10_000 },
    episode: { env: 'real', maxSteps: 2, sessionStartTimeoutMs: 5_000, heartbeatTimeoutMs: 3_000 },
    train: {
      runId,
      iterations,
      episodesPerIteration: 2,
      parallelism: 2,
      tasks: ['gomail-18'],
      grouping: 'step',
      numGenerations,
      gpuTaskQueue: stack.gpuQueue,
      learnerHeartbeatTimeoutS: 5,
      // Every episode must complete: none may be dropped as a tolerated failure.
      maxFailedEpisodeShare: 0,
    },
  });
  const { handle } = await startOrAttachTrain(stack.client, cfg);

  // 1. The first step group of iteration 1 completes (one slot, three forks plus the main session); the
  //    browser worker dies in the middle of the next one, and a new one takes over.
  const killedIn = await waitForSecondStepGroup([`${runId}-it1-ep0`, `${runId}-it1-ep1`]);
  await kill(stack.workers.find((w) => alive(w) && isBrowser(w))!);
  await stack.startWorker('browser');

  // 2. The run completes: the episode caught by the kill, the one waiting for its slot and iteration 2's.
  const result = (await handle.result()) as TrainingResult;
  assert.deepEqual(result, { runId, iterations, adapterVersion: iterations, stoppedEarly: false });
  assert.deepEqual(updates, [1, 2], 'one update per iteration, none with a missing episode');
  for (let it = 1; it <= iterations; it++) {
    for (const ep of [0, 1]) {
      const id = `${runId}-it${it}-ep${ep}`;
      const r = (await stack.client.workflow.getHandle(id).result()) as EpisodeResult;
      const note = id === killedIn ? ' (the browser worker was killed in its second step group)' : '';
      assert.equal(r.steps, 2, `${id} ran both steps${note}`);
      assert.equal(r.groups, 2, `${id} ran a step group of ${numGenerations} forks per step${note}`);
      // Step 2's forks copy the parent's client state (real.forkMode snapshot) instead of replaying step 1.
      if (it === iterations) assert.equal((r.forkSnapshots ?? 0) + (r.forkReplayFallbacks ?? 0), numGenerations, `${id}: ${JSON.stringify(r)}`);
    }
  }
  const rows = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8'));
  // The scripted first action opens the composer, which lives in the page's scripts: a copy of the parent's storage
  // opens without it, so the page check sends those forks to replay. Either way they are counted.
  const last = rows.at(-1);
  assert.ok((last?.fork_snapshots ?? 0) + (last?.fork_replay_fallbacks ?? 0) > 0, `forks counted in the metrics: ${JSON.stringify(last)}`);
  // Each row says how its REAL episodes were judged: a training run's default scoring.
  assert.deepEqual(
    rows.map((r) => r.scoring),
    rows.map(() => 'training'),
  );
  const samples = policy.requests.filter((r) => r.goal !== '');
  assert.ok(samples.length >= 2 * iterations * 2, 'one sampling request per step');
  assert.ok(
    samples.every((r) => r.n === numGenerations),
    'every step sampled its group',
  );

  // 3. Nothing holds the site's only slot now: a new episode on the site starts at once (with a leaked slot its
  //    start would wait out HALO_SITE_SLOT_TIMEOUT_MS and fail).
  const started = Date.now();
  const single = (await stack.client.workflow.execute('episode', {
    taskQueue: stack.controlQueue,
    workflowId: `${runId}-after`,
    args: [
      singleEpisodeInput(
        parseConfig({
          temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
          policy: { baseUrl: policy.url, model: 'fake-qwen', timeoutMs: 10_000 },
          episode: { env: 'real', task: 'gomail-18', seed: 0, maxSteps: 1 },
        }),
        `${runId}-after`,
      ),
    ],
  })) as EpisodeResult;
  assert.equal(single.steps, 1);
  assert.ok(Date.now() - started < 30_000, `the episode after the run took ${Date.now() - started} ms`);
});
