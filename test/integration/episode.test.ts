import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { WorkflowFailedError } from '@temporalio/client';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { temporalBinary } from '../../client/processes';
import { episodeFootprint } from '../../lib/config/history-budget';
import { parseConfig } from '../../lib/config/config';
import type { EpisodeResult } from '../../lib/episode/episode-types';
import { singleEpisodeInput } from '../../client/episode-input';
import { BlobStore } from '../../blob/store';
import { join } from 'node:path';
import { startFakePolicyServer, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../../testing/stack';
import type { Trajectory } from '../../lib/training/experience';

// Real Temporal dev server, real Chromium, real MiniWoB++ pages; only the model server is a local fake.
const exec = promisify(execFile);
let stack: TestStack;
let policy: FakePolicyServer;

before(async () => {
  policy = await startFakePolicyServer();
  stack = await startTestStack({ browserWorkers: 1 });
});
after(async () => {
  await stack?.stop();
  await policy?.close();
});

function input(task: string, seed: number, maxSteps = 10, policyOverrides: Record<string, unknown> = {}) {
  const cfg = parseConfig({
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { baseUrl: policy.url, model: 'fake-qwen', timeoutMs: 10_000, ...policyOverrides },
    episode: { task, seed, maxSteps, sessionStartTimeoutMs: 5_000, heartbeatTimeoutMs: 3_000 },
  });
  return singleEpisodeInput(cfg, `episode-test-${task}-${seed}`);
}

/** Messages of a failure and its causes, outermost first. */
function failureText(err: unknown): string {
  const parts: string[] = [];
  for (let e = err as { message?: string; cause?: unknown } | undefined; e; e = e.cause as typeof e) parts.push(String(e.message));
  return parts.join(' <- ');
}

let counter = 0;
async function run(task: string, seed: number, maxSteps = 10): Promise<EpisodeResult> {
  return stack.client.workflow.execute('episode', {
    taskQueue: stack.controlQueue,
    workflowId: `test-${task}-${seed}-${++counter}-${Date.now()}`,
    args: [input(task, seed, maxSteps)],
  });
}

describe('durable episode on MiniWoB++', () => {
  test('click-button succeeds with the scripted policy', async () => {
    policy.setMode({ kind: 'scripted' });
    const before = policy.requests.length;
    const r = await run('click-button', 3);
    assert.equal(r.success, true, JSON.stringify(r));
    assert.ok(r.reward > 0);
    assert.equal(r.steps, 1);
    assert.equal(r.actionValidity, 1);
    assert.equal(r.actionPath[0].type, 'click');
    // Dense reward: valid action, the page's own reward and the task-success bonus, each in the breakdown.
    const traj0 = await new BlobStore(join(stack.home, 'blobs')).getJson<{ steps: { shaped: { total: number; terms: { term: string; value: number }[] } }[] }>(r.trajectoryRef);
    const terms = Object.fromEntries(traj0.steps[0].shaped.terms.map((t) => [t.term, t.value]));
    assert.equal(terms.valid_action, 0.1);
    assert.equal(terms.env_reward, r.reward);
    assert.equal(terms.task_success, 10);
    assert.equal(r.shapedReturn, traj0.steps[0].shaped.total);
    const req = policy.requests[before];
    assert.equal(req.hasImage, true, 'the screenshot goes to the policy as an image');
    assert.equal(req.model, 'fake-qwen');
    assert.match(req.goal, /Click on the ".+" button/);
    const blobs = new BlobStore(join(stack.home, 'blobs'));
    const traj = await blobs.getJson<Trajectory>(r.trajectoryRef);
    assert.equal(traj.steps.length, 1);
    assert.equal(traj.success, true);
    assert.match(traj.goal, /Click on the/);
    // The trajectory names the completion's text by reference, whole in its blob.
    assert.match((await blobs.get(traj.steps[0].completion.ref!)).toString('utf8'), /<tool_call>/);
    assert.equal((await blobs.get(traj.steps[0].observation.screenshotRef)).subarray(1, 4).toString(), 'PNG');
  });

  test('garbage from the model ends with validity 0 and no crash', async () => {
    policy.setMode({ kind: 'garbage' });
    const r = await run('click-button', 3, 4);
    assert.equal(r.actionValidity, 0);
    assert.equal(r.validActions, 0);
    assert.equal(r.steps, 4);
    assert.equal(r.success, false);
    assert.equal(r.actionPath.length, 0);
    assert.equal(r.shapedReturn, -2, 'each unparseable output costs 0.5');
  });

  test('a model server rejecting the request fails the episode at once with its reason', async () => {
    policy.setMode({ kind: 'status', status: 400 });
    const before = policy.requests.length;
    await assert.rejects(run('click-button', 3), (err: unknown) => {
      assert.ok(err instanceof WorkflowFailedError);
      const text = failureText(err);
      assert.match(text, /policy request rejected.*HTTP 400/);
      return true;
    });
    assert.equal(policy.requests.length - before, 1, '4xx is not retried');
    policy.setMode({ kind: 'scripted' });
  });

  test('a policy server that is down: retried by Temporal, then a clear error naming the URL', async () => {
    const down = await startFakePolicyServer();
    const url = down.url;
    await down.close();
    const id = `test-down-${Date.now()}`;
    await assert.rejects(
      stack.client.workflow.execute('episode', {
        taskQueue: stack.controlQueue,
        workflowId: id,
        args: [input('click-button', 3, 2, { baseUrl: url, maxAttempts: 2 })],
      }),
      (err: unknown) => {
        assert.match(failureText(err), new RegExp(`policy server ${url.replace(/[.]/g, '\\.')} unreachable`));
        return true;
      },
    );
    const history = await stack.client.workflow.getHandle(id).fetchHistory();
    const failed = (history.events ?? []).find((e) => e.activityTaskFailedEventAttributes);
    assert.equal(failed?.activityTaskFailedEventAttributes?.retryState, 4 /* MAXIMUM_ATTEMPTS_REACHED */);
  });

  test('an unknown task is a clear, non-retryable error', async () => {
    await assert.rejects(run('click-buton', 1), (err: unknown) => {
      assert.ok(err instanceof WorkflowFailedError);
      assert.match(failureText(err), /unknown MiniWoB task.*click-button/i);
      return true;
    });
  });

  test('a 10-step episode history has no image bytes and stays under 111 KB', async () => {
    policy.setMode({ kind: 'scripted' });
    // The scripted policy only waits on this task, so the episode runs all 10 steps.
    const id = `test-history-${Date.now()}`;
    const r: EpisodeResult = await stack.client.workflow.execute('episode', {
      taskQueue: stack.controlQueue,
      workflowId: id,
      args: [input('click-checkboxes', 1, 10)],
    });
    assert.equal(r.steps, 10);
    assert.equal(r.actionValidity, 1);
    // The history as `temporal workflow show --output json` (and the UI's download) gives it, payloads base64.
    const { stdout: text } = await exec(temporalBinary(), ['workflow', 'show', '--address', stack.address, '--workflow-id', id, '--output', 'json'], { maxBuffer: 64 << 20 });
    const events: unknown[] = JSON.parse(text).events;
    const compact = JSON.stringify(JSON.parse(text));
    console.error(`10-step episode: ${events.length} events, ${Buffer.byteLength(compact)} bytes of compact history JSON`);
    assert.ok(events.length > 40, `history has ${events.length} events`);
    const bytes = Buffer.byteLength(compact);
    // The config check's bound (lib/config/history-budget.ts) holds for a real history of this shape.
    const bound = episodeFootprint({ n: 1, forks: false, maxSteps: 10, maxTokens: input('click-checkboxes', 1).policy.maxTokens });
    assert.ok(events.length <= bound.events, `${events.length} events against the bound ${bound.events}`);
    assert.ok(bytes <= bound.historyBytes, `${bytes} bytes against the bound ${bound.historyBytes}`);
    // On failure, say which events take the room.
    const byType = new Map<string, number>();
    for (const e of events as Record<string, unknown>[]) {
      const type = String(e.eventType ?? Object.keys(e).find((k) => k.endsWith('Attributes')) ?? '?');
      byType.set(type, (byType.get(type) ?? 0) + Buffer.byteLength(JSON.stringify(e)));
    }
    const largest = [...byType.entries()]
      .sort((x, y) => y[1] - x[1])
      .slice(0, 5)
      .map(([t, b]) => `${t} ${b}`)
      .join(', ');
    // 111 KB: each step also carries the references of its completion's token ids and log-probs (never the arrays), and
    // its completion record's validity and log-prob sum (109.7 KB before the record, 110.4 KB with it: the text and the
    // action are left out of recordTrajectory's input where a blob holds them).
    assert.ok(bytes < 111_000, `history JSON is ${bytes} bytes (largest: ${largest})`);
    const described = await stack.client.workflow.getHandle(id).describe();
    assert.ok((described.historySize ?? Infinity) < 111_000, `server counts ${described.historySize} bytes`);
    let payloads = 0;
    // Readable activity summaries in the UI: the action text, the URL, the previous reward.
    const summaries = events
      .map((e) => (e as { userMetadata?: { summary?: { data?: string } } }).userMetadata?.summary?.data)
      .filter((d): d is string => Boolean(d))
      .map((d) => JSON.parse(Buffer.from(d, 'base64').toString('utf8')) as string);
    assert.ok(
      // The page as the policy sees it: at the fixed origin, never the local server's port.
      summaries.some((t) => /^step 3: wait 0s on http:\/\/miniwob\.local\/miniwob\/click-checkboxes\.html$/.test(t)),
      summaries.join('\n'),
    );
    assert.ok(
      summaries.some((t) => /^sample step 4 .* · last reward -?[0-9.]+$/.test(t)),
      summaries.join('\n'),
    );
    // Payload data is base64 inside the history; decode each payload and look for PNG bytes / data URLs.
    for (const m of compact.matchAll(/"data":"([A-Za-z0-9+/=]+)"/g)) {
      payloads++;
      const decoded = Buffer.from(m[1], 'base64');
      assert.ok(!decoded.includes(Buffer.from([0x89, 0x50, 0x4e, 0x47])), 'a PNG is in the history');
      assert.ok(!decoded.toString('latin1').includes('data:image'), 'a data URL is in the history');
      assert.ok(!decoded.toString('latin1').includes('iVBORw0KGgo'), 'base64 PNG is in the history');
    }
    assert.ok(payloads > 40, `only ${payloads} payloads were scanned`);
  });

  test('SIGKILL of the browser worker mid-episode: a new worker replays the prefix, same path and result', async () => {
    policy.setMode({ kind: 'scripted' });
    const reference = await run('enter-text', 5);
    assert.equal(reference.success, true, JSON.stringify(reference));
    assert.equal(reference.actionPath.length, 2);
    assert.equal(reference.sessionRebuilds, 0);

    const victim = stack.workers.find((w) => w.exitCode === null && w.spawnargs.some((a) => a.endsWith('browser.ts')))!;
    const start = policy.requests.length;
    let killed = false;
    policy.onRequest = async (index) => {
      // The second sample: the first action has run in the victim's page.
      if (index === start + 1 && !killed) {
        killed = true;
        victim.kill('SIGKILL');
        await new Promise((r) => victim.once('exit', r));
        await stack.startWorker('browser');
      }
    };
    try {
      const r = await run('enter-text', 5);
      assert.equal(killed, true);
      assert.equal(r.sessionRebuilds, 1);
      assert.deepEqual(r.actionPath, reference.actionPath);
      assert.equal(r.success, reference.success);
      assert.equal(r.reward, reference.reward);
      assert.equal(r.steps, reference.steps);
    } finally {
      policy.onRequest = undefined;
    }
  });

  test('a crashed browser: the worker relaunches Chromium and the episode replays its prefix', async () => {
    policy.setMode({ kind: 'scripted' });
    const worker = stack.workers.find((w) => w.exitCode === null && w.signalCode === null && w.spawnargs.some((a) => a.endsWith('browser.ts')))!;
    const start = policy.requests.length;
    let crashed = false;
    policy.onRequest = async (index) => {
      if (index === start + 1 && !crashed) {
        crashed = true;
        // Chromium's main process is the worker's direct child.
        const { stdout } = await exec('pgrep', ['-P', String(worker.pid)]);
        for (const pid of stdout.split('\n').filter(Boolean)) process.kill(Number(pid), 'SIGKILL');
      }
    };
    try {
      const r = await run('enter-text', 5);
      assert.equal(crashed, true);
      assert.equal(worker.exitCode, null, 'the worker survives its browser');
      assert.equal(r.sessionRebuilds, 1);
      assert.equal(r.success, true);
      assert.equal(r.actionPath.length, 2);
    } finally {
      policy.onRequest = undefined;
    }
  });
});
