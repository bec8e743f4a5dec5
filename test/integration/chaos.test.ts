import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { parseMetricsJsonl } from '../../lib/training/run-metrics';
import { startOrAttachTrain } from '../../client/train';
import type { TrainingResult, TrainingStatus } from '../../workflows/train-engine';
import { stackGrpoConfig } from '../../testing/grpo-config';
import { startTestStack, within, type TestStack } from '../../testing/stack';

// Preemption, automated: during a GRPO run, SIGKILL the browser worker mid-episode, SIGKILL the learner in
// the middle of an update, restart the Temporal server. The run must finish as if nothing happened.
let stack: TestStack;
before(
  async () => {
    stack = await startTestStack({ browserWorkers: 1, learner: true });
  },
  { timeout: 5 * 60_000 },
);
after(
  async () => {
    await stack?.stop();
  },
  { timeout: 3 * 60_000 },
);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
// Locally a chaos run takes under a minute; a phase that outlasts its bound fails the test with what the run
// was waiting on, instead of holding the file until the runner's own timeout.
const PHASE_MS = 240_000;
const TEST_MS = 12 * 60_000;

/** What a stalled phase reports: the run's pending activities and the last lines of every process's log. */
async function diagnosis(runId: string): Promise<string> {
  const d = await stack.client.workflow
    .getHandle(runId)
    .describe()
    .catch((e: Error) => ({ error: e.message }));
  const pending = 'raw' in d ? (d.raw.pendingActivities ?? []).map((a) => `${a.activityType?.name} state ${a.state} attempt ${a.attempt}`).join('; ') : d.error;
  const logs = readdirSync(stack.home)
    .filter((f) => f.endsWith('.log'))
    .map((f) => `--- ${f}\n${readFileSync(join(stack.home, f), 'utf8').split('\n').slice(-15).join('\n')}`);
  return [`pending activities of ${runId}: ${pending || 'none'}`, ...logs].join('\n');
}

async function phase<T>(runId: string, what: string, work: Promise<T>, ms = PHASE_MS): Promise<T> {
  const done = await within(
    work.then((value) => ({ value })),
    ms,
  );
  if (!done) throw new Error(`${what}: not done within ${ms / 1000} s\n${await diagnosis(runId)}`);
  return done.value;
}
const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
const isLearner = (p: ChildProcess) => p.spawnargs.includes('halo_learner.worker');
const isBrowser = (p: ChildProcess) => p.spawnargs.some((a) => a.endsWith('browser.ts'));

async function kill(p: ChildProcess): Promise<void> {
  p.kill('SIGKILL');
  if (alive(p)) await new Promise((r) => p.once('exit', r));
}

/** Polls until `pred` holds on the workflow's pending activities (by type and state). */
async function waitForPending(runId: string, type: string, timeoutMs = PHASE_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const d = await stack.client.workflow
      .getHandle(runId)
      .describe()
      .catch(() => undefined);
    const pending = d?.raw.pendingActivities ?? [];
    if (pending.some((a) => a.activityType?.name === type && a.state === 2 /* STARTED */)) return;
    await sleep(50);
  }
  throw new Error(`no ${type} activity started within ${timeoutMs / 1000}s\n${await diagnosis(runId)}`);
}

async function waitForRolloutOfChild(runId: string, iteration: number, timeoutMs = PHASE_MS): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const child = `${runId}-it${iteration}-ep0`;
  while (Date.now() < deadline) {
    const d = await stack.client.workflow
      .getHandle(child)
      .describe()
      .catch(() => undefined);
    if ((d?.raw.pendingActivities ?? []).some((a) => a.activityType?.name === 'stepSession' || a.activityType?.name === 'startSession')) return;
    await sleep(50);
  }
  throw new Error(`episode ${child} did not reach the browser within ${timeoutMs / 1000}s\n${await diagnosis(runId)}`);
}

/**
 * The browser worker is SIGKILLed mid-episode of iteration `browserKillIteration`, the learner in the middle of
 * an update, the Temporal server restarted during iteration 2; the run must end with versions 1..3 written once,
 * one metrics row per iteration and every episode completed.
 */
async function chaosRun(runId: string, browserKillIteration: number, train: Record<string, unknown>) {
  const iterations = 3;
  const cfg = stackGrpoConfig(stack, {
    runId,
    iterations,
    maxSteps: 3,
    episode: { sessionStartTimeoutMs: 5_000, heartbeatTimeoutMs: 3_000 },
    train: { learnerHeartbeatTimeoutS: 5, ...train },
  });
  const { handle } = await startOrAttachTrain(stack.client, cfg);

  // 1. The browser worker dies in the middle of an episode.
  await waitForRolloutOfChild(runId, browserKillIteration);
  await phase(runId, 'SIGKILL of the browser worker', kill(stack.workers.find((w) => alive(w) && isBrowser(w))!));
  await phase(runId, 'a new browser worker polling', stack.startWorker('browser'));

  // 2. The learner dies in the middle of an update.
  await waitForPending(runId, 'update_policy');
  await phase(runId, 'SIGKILL of the learner', kill(stack.workers.find((w) => alive(w) && isLearner(w))!));
  await phase(runId, 'a new learner polling', stack.startLearner());

  // 3. The Temporal server restarts during iteration 2.
  await phase(
    runId,
    'the run reaching iteration 2',
    (async () => {
      for (;;) {
        const st = await handle.query<TrainingStatus>('status').catch(() => undefined);
        if (st && st.iteration >= 2) return;
        await sleep(200);
      }
    })(),
  );
  await phase(runId, 'the Temporal server restart', stack.restartServer());

  const result = (await phase(runId, 'the run finishing after the restart', handle.result(), 6 * 60_000)) as TrainingResult;
  assert.deepEqual(result, { runId, iterations, adapterVersion: iterations, stoppedEarly: false });

  const versions = readdirSync(join(stack.checkpoints, runId)).sort();
  assert.deepEqual(versions, ['v1', 'v2', 'v3'], 'exactly one adapter per version, no gap, no leftover temp folder');
  const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8'));
  assert.deepEqual(
    lines.map((l) => l.iteration),
    [1, 2, 3],
    'every iteration exactly once',
  );
  assert.deepEqual(
    lines.map((l) => l.adapter_version),
    [1, 2, 3],
  );

  for (let it = 1; it <= iterations; it++) {
    const d = await stack.client.workflow.getHandle(`${runId}-it${it}-ep0`).describe();
    assert.equal(d.status.name, 'COMPLETED', `episode of iteration ${it}`);
  }
  return lines;
}

test('browser worker SIGKILL, learner SIGKILL mid-update, Temporal restart: versions 1..I, metrics once each, no episode lost', { timeout: TEST_MS }, async () => {
  const lines = await chaosRun('chaos', 1, {});
  assert.ok(
    lines.every((l) => l.staleness === undefined),
    'an on-policy run records no staleness',
  );
});

test('the same with pipelined iterations (maxStaleness 1): kills while rollouts and an update overlap', { timeout: TEST_MS }, async () => {
  // Iteration 2's rollouts run beside the update on iteration 1: the browser dies there, then the learner.
  const lines = await chaosRun('chaos-pipe', 2, { maxStaleness: 1 });
  assert.deepEqual(
    lines.map((l) => [l.sampled_adapter_version, l.staleness]),
    [
      [0, 0],
      [0, 1],
      [1, 1],
    ],
  );
});

test('the same with streaming rollouts (k = 1, continue-as-new after 2 updates): kills while episodes stream beside an update', { timeout: TEST_MS }, async () => {
  // The next group's episode runs beside the update on the first: the browser dies there, then the learner; the
  // server restarts around the drain and continue-as-new.
  const lines = await chaosRun('chaos-stream', 2, { rollout: 'stream', maxStaleness: 1, stream: { updatesPerRun: 2 } });
  assert.ok(
    lines.every((l) => l.stream !== undefined && l.staleness !== undefined && l.staleness <= 1),
    JSON.stringify(lines.map((l) => [l.staleness, l.stream])),
  );
  assert.equal(
    lines.reduce((n, l) => n + (l.stream?.groups_dropped_failed ?? 0), 0),
    0,
    'no group lost to the kills',
  );
});
