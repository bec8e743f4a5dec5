import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { temporal } from '@temporalio/proto';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeInput, EpisodeResult } from '../../lib/episode/episode-types';
import { ledgerDir, WORKER_RESTARTED } from '../../workers/inflight';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../../testing/stack';

// A worker killed mid-activity, restarted at once: its successor fails the attempts it left running (task
// tokens on disk, workers/inflight.ts), so the episode goes on now instead of after the timeouts, which are
// set to 3 minutes here: longer than this test may take.
let stack: TestStack;
let policy: FakePolicyServer;
before(async () => {
  [stack, policy] = await Promise.all([startTestStack({ browserWorkers: 1 }), startFakePolicyServer({ kind: 'scripted' })]);
});
after(async () => {
  await Promise.all([stack?.stop(), policy?.close()]);
});

const EventType = temporal.api.enums.v1.EventType;
const LONG_MS = 180_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
const isKind = (kind: string) => (p: ChildProcess) => p.spawnargs.some((a) => a.endsWith(`${kind}.ts`));

async function kill(p: ChildProcess): Promise<void> {
  p.kill('SIGKILL');
  if (alive(p)) await new Promise((r) => p.once('exit', r));
}

/**
 * Resolves once an activity of `type` of the workflow is in a worker's ledger: running, and recorded (the
 * server marks an activity started a moment before the worker's interceptor records it; a worker killed in
 * between leaves nothing to release, and the timeouts take over).
 */
async function waitForRecorded(workflowId: string, type: string): Promise<void> {
  const dir = ledgerDir(stack.home);
  const deadline = Date.now() + 60_000;
  for (;;) {
    for (const f of existsSync(dir) ? readdirSync(dir) : []) {
      try {
        const l = JSON.parse(readFileSync(join(dir, f), 'utf8')) as { running: { type: string; workflowId: string }[] };
        if (l.running.some((e) => e.type === type && e.workflowId === workflowId)) return;
      } catch {
        // Removed or replaced while reading: look again.
      }
    }
    assert.ok(Date.now() < deadline, `${type} never ran`);
    await sleep(5);
  }
}

function input(task: string): EpisodeInput {
  const cfg = parseConfig({ policy: { backend: 'openai', baseUrl: policy.url, model: 'fake', timeoutMs: LONG_MS, maxAttempts: 3 } });
  return {
    task: { env: 'miniwob', task, seed: 1 },
    maxSteps: 4,
    policy: cfg.policy,
    browserTaskQueue: stack.browserQueue,
    heartbeatTimeoutMs: LONG_MS,
    sessionStartTimeoutMs: LONG_MS,
  };
}

test('browser worker SIGKILLed during a step: the restarted worker fails that step, the session is rebuilt at once', async () => {
  const id = 'restart-browser';
  const handle = await stack.client.workflow.start('episode', { taskQueue: stack.controlQueue, workflowId: id, args: [input('enter-text')] });
  await waitForRecorded(id, 'stepSession');
  await kill(stack.workers.find((w) => alive(w) && isKind('browser')(w))!);
  await stack.startWorker('browser');
  const res = (await Promise.race([handle.result(), sleep(LONG_MS / 2).then(() => null)])) as EpisodeResult | null;
  assert.ok(res, 'the episode did not finish within half the timeouts: the dead worker’s step was not released');
  assert.equal(res.success, true);
  assert.ok(res.sessionRebuilds >= 1);
  const failed = [];
  for (const e of (await handle.fetchHistory()).events ?? []) {
    if (e.eventType === EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED) failed.push(e.activityTaskFailedEventAttributes?.failure);
  }
  assert.ok(
    failed.some((f) => f?.applicationFailureInfo?.type === WORKER_RESTARTED && /browser-worker process \d+ died during this attempt/.test(f.message ?? '')),
    JSON.stringify(failed.map((f) => f?.message)),
  );
  // The dead worker's ledger is gone; the live worker's holds nothing while idle.
  const dir = ledgerDir(stack.home);
  assert.deepEqual(existsSync(dir) ? readdirSync(dir) : [], []);
});

test('control worker SIGKILLed during a policy call: its successor fails the call and the retry starts at once', async () => {
  const id = 'restart-control';
  policy.delayMs = 1500;
  try {
    const handle = await stack.client.workflow.start('episode', { taskQueue: stack.controlQueue, workflowId: id, args: [input('click-button')] });
    await waitForRecorded(id, 'samplePolicy');
    await kill(stack.workers.find((w) => alive(w) && isKind('control')(w))!);
    policy.delayMs = 0;
    await stack.startWorker('control');
    const res = (await Promise.race([handle.result(), sleep(LONG_MS / 2).then(() => null)])) as EpisodeResult | null;
    assert.ok(res, 'the episode did not finish within half the timeouts: the dead worker’s policy call was not released');
    assert.equal(res.success, true);
    // The retried call's start event carries the failure of the attempt before it.
    const events = (await handle.fetchHistory()).events ?? [];
    const retried = events
      .map((e) => e.activityTaskStartedEventAttributes)
      .filter((a) => a && (a.attempt ?? 1) >= 2 && a.lastFailure?.applicationFailureInfo?.type === WORKER_RESTARTED);
    assert.equal(retried.length, 1, 'one policy call was failed by the restarted control worker and retried');
  } finally {
    policy.delayMs = 0;
  }
});
