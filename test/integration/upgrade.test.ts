import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, utimesSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import type { WorkflowHandle } from '@temporalio/client';
import type { TestWorkflowEnvironment } from '@temporalio/testing';
import { Worker } from '@temporalio/worker';
import { parseConfig } from '../../lib/config/config';
import { down, up, waitForPollers } from '../../client/stack';
import { readPid, spawnBackground, workerCommand } from '../../client/processes';
import { buildIdOf, buildWorkflowBundle, KEPT_BUNDLES, type WorkflowBundle } from '../../workers/workflow-bundle';
import { openRuns, UpgradeRefused, upgradeWorkflowWorker } from '../../workers/upgrade-check';
import { startWorkflowEnv, testQueues } from '../helpers/workflow-env';

// Upgrading a control worker with runs in flight: the open workflows are replayed against the new bundle first,
// and the old worker keeps them when one would not replay. The probe workflow (test/test-workflows/upgrade-probe/)
// stands in for changed workflow code: the repository's own workflows cannot be edited by a test.

let env: TestWorkflowEnvironment;
let dir: string;
const probe = (name: string) => require.resolve(`../test-workflows/upgrade-probe/${name}`);

before(async () => {
  env = await startWorkflowEnv();
  dir = mkdtempSync(join(tmpdir(), 'halo-upgrade-'));
});

after(async () => {
  await env?.teardown();
  rmSync(dir, { recursive: true, force: true });
});

const steps: string[] = [];
const activities = {
  step: async (name: string) => {
    steps.push(name);
    return name;
  },
  warmUp: async () => 'warm',
};

function probeWorker(taskQueue: string, bundle: WorkflowBundle): Promise<Worker> {
  return Worker.create({ connection: env.nativeConnection, taskQueue, workflowBundle: { codePath: bundle.path }, activities });
}

async function until(what: string, ok: () => Promise<boolean>) {
  for (let i = 0; i < 600; i++) {
    if (await ok()) return;
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`gave up waiting for ${what}`);
}

/** Started runs that did their first step and now wait for `go`, listed as open (visibility lags the history). */
async function runsInFlight(taskQueue: string, n: number): Promise<WorkflowHandle[]> {
  const handles = await Promise.all(Array.from({ length: n }, (_, i) => env.client.workflow.start('upgradeProbe', { taskQueue, workflowId: `probe-${i}-${taskQueue}` })));
  await until('the first steps', async () =>
    (await Promise.all(handles.map((h) => h.fetchHistory()))).every((h) => (h.events ?? []).some((e) => e.activityTaskCompletedEventAttributes)),
  );
  await until('the open runs to be listed', async () => (await openRuns(env.client, taskQueue)).length === n);
  return handles;
}

test('an incompatible workflow change is refused before the worker restarts; a patched one takes over the runs in flight', { timeout: 240_000 }, async () => {
  const v1 = await buildWorkflowBundle(dir, probe('v1'));
  const incompatible = await buildWorkflowBundle(dir, probe('incompatible'));
  const patchedBundle = await buildWorkflowBundle(dir, probe('patched'));
  // The build id is the hash of the bundle's bytes: other code, another build; the same code, the same file.
  assert.equal(new Set([v1.buildId, incompatible.buildId, patchedBundle.buildId]).size, 3);
  assert.equal(v1.buildId, buildIdOf(readFileSync(v1.path, 'utf8')));
  assert.deepEqual(await buildWorkflowBundle(dir, probe('v1')), v1);
  // Old bundles go: the newest KEPT_BUNDLES stay, the one just built among them.
  const pruned = join(dir, 'pruned');
  mkdirSync(pruned);
  for (let i = 0; i < KEPT_BUNDLES + 2; i++) {
    const old = join(pruned, `sha256-${String(i).padStart(32, '0')}.js`);
    writeFileSync(old, '// an older build');
    utimesSync(old, new Date(1_000_000 + i * 1000), new Date(1_000_000 + i * 1000));
  }
  const rebuilt = await buildWorkflowBundle(pruned, probe('v1'));
  const kept = readdirSync(pruned).sort();
  assert.equal(kept.length, KEPT_BUNDLES);
  assert.ok(kept.includes(`${rebuilt.buildId}.js`) && !kept.includes(`sha256-${'0'.repeat(32)}.js`), kept.join(', '));

  const queue = testQueues('upgrade').control;
  const old = await probeWorker(queue, v1);
  const oldRunning = old.run();
  const handles = await runsInFlight(queue, 2);
  const runIds = await Promise.all(handles.map(async (h) => (await h.describe()).runId));

  let restarts = 0;
  await assert.rejects(
    upgradeWorkflowWorker(env.client, queue, incompatible, async () => {
      restarts++;
    }),
    (err: Error) => {
      assert.ok(err instanceof UpgradeRefused, String(err));
      assert.equal(err.failures.length, 2);
      handles.forEach((h, i) => assert.match(err.message, new RegExp(`upgradeProbe ${h.workflowId} \\(run ${runIds[i]}\\): .*[Nn]ondeterminism`)));
      assert.match(
        err.message,
        new RegExp(`^upgrade refused: the new workflow code \\(${incompatible.buildId}\\) cannot continue 2 open workflow\\(s\\), so no worker was restarted`),
      );
      return true;
    },
  );
  assert.equal(restarts, 0, 'the restart never ran');
  assert.equal(old.getState(), 'RUNNING', 'the old worker keeps the runs');

  let fresh: Worker | undefined;
  let freshRunning: Promise<void> | undefined;
  const { check } = await upgradeWorkflowWorker(env.client, queue, patchedBundle, async () => {
    old.shutdown();
    await oldRunning;
    fresh = await probeWorker(queue, patchedBundle);
    freshRunning = fresh.run();
  });
  assert.deepEqual(check.failures, []);
  assert.deepEqual(check.replayed.map((r) => r.workflowId).sort(), handles.map((h) => h.workflowId).sort());
  try {
    for (const h of handles) await h.signal('go');
    // The runs started on the old code finish on the new one, through its patched branch.
    assert.deepEqual(await Promise.all(handles.map((h) => h.result())), [
      ['a', 'c', 'b'],
      ['a', 'c', 'b'],
    ]);
  } finally {
    fresh?.shutdown();
    await freshRunning;
  }
});

test('halo up replays the open workflows before it starts or restarts a control worker: refused with the old worker left running, then an upgrade onto the checked bundle', {
  timeout: 300_000,
}, async () => {
  const queues = testQueues('up-upgrade');
  const home = join(dir, 'home');
  const cfg = parseConfig({
    temporal: { address: env.address, namespace: 'default', controlTaskQueue: queues.control, browserTaskQueue: queues.browser },
    stack: { home },
  });
  // A run in flight on the control queue whose workflow type today's code no longer has.
  const v1 = await buildWorkflowBundle(dir, probe('v1'));
  const old = await probeWorker(queues.control, v1);
  const oldRunning = old.run();
  const [handle] = await runsInFlight(queues.control, 1);
  old.shutdown();
  await oldRunning;

  const said: string[] = [];
  await assert.rejects(
    up(cfg, (m) => said.push(m), { roles: ['control'] }),
    (err: Error) => {
      assert.ok(err instanceof UpgradeRefused, String(err));
      assert.match(err.message, new RegExp(`upgradeProbe ${handle.workflowId} \\(run ${(err as UpgradeRefused).failures[0].runId}\\)`));
      return true;
    },
  );
  assert.equal(readPid(home, 'control-worker'), undefined, 'no control worker was started');
  assert.ok(!existsSync(join(home, 'logs', 'control-worker.log')), said.join('\n'));

  // A control worker of an earlier release runs (started by hand here, as `halo up` did before the check): an
  // upgrade with that run still open is refused, and the old worker is left running.
  const oldWorker = spawnBackground(home, 'control-worker', workerCommand('control').command, workerCommand('control').args, {
    ...process.env,
    TEMPORAL_ADDRESS: env.address,
    TEMPORAL_NAMESPACE: 'default',
    HALO_HOME: home,
    HALO_CONTROL_QUEUE: queues.control,
    HALO_BROWSER_QUEUE: queues.browser,
  });
  try {
    await waitForPollers(env.connection, 'default', [{ name: queues.control, type: 'workflow', process: oldWorker }], home);
    await assert.rejects(
      up(cfg, (m) => said.push(m), { roles: ['control'], upgrade: true }),
      UpgradeRefused,
    );
    assert.equal(readPid(home, 'control-worker'), oldWorker.pid, 'the old control worker still runs');
    assert.ok(!said.some((m) => /stopped control worker|starting control worker/.test(m)), said.join('\n'));

    // Once that run is gone, the upgrade goes through: the old worker stops, the new one polls with the build it
    // was checked against.
    await handle.terminate('replaced by a compatible release');
    await until('the run to close', async () => (await openRuns(env.client, queues.control)).length === 0);
    await up(cfg, (m) => said.push(m), { roles: ['control'], upgrade: true });
    assert.ok(said.includes(`stopped control worker (pid ${oldWorker.pid})`), said.join('\n'));
    const started = said.find((m) => m.startsWith('starting control worker on workflow build '));
    const buildId = /build (sha256-[0-9a-f]{32})/.exec(started ?? '')?.[1];
    assert.ok(buildId, said.join('\n'));
    const pollers = await env.client.workflowService.describeTaskQueue({ namespace: 'default', taskQueue: { name: queues.control }, taskQueueType: 1 });
    const pid = readPid(home, 'control-worker');
    assert.notEqual(pid, oldWorker.pid);
    assert.ok(
      (pollers.pollers ?? []).some((p) => p.identity === `${pid}@${hostname()} halo-control build=${buildId}`),
      JSON.stringify(pollers.pollers),
    );
    assert.ok(existsSync(join(home, 'bundles', `${buildId}.js`)));
  } finally {
    await down(cfg, () => {}, { roles: ['control'] });
  }
});
