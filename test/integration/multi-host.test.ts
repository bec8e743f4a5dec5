import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Client, type Connection } from '@temporalio/client';
import { parseConfig, type HaloConfig } from '../../lib/config/config';
import { REPO_ROOT, readPid, isAlive, type ManagedProcess } from '../../client/processes';
import { prepareNamespace, startDevServerOnFreePort } from '../../client/temporal-server';
import { startOrAttachTrain } from '../../client/train';
import { startOrAttachMcts } from '../../client/commands/mcts';
import { blobStoreFor } from '../../blob/store';
import { startLocalS3, type LocalS3 } from '../../testing/s3-server';
import { startFakeCriticServer, type FakeCriticServer } from '../../testing/fake-critic-server';
import type { TrainingResult } from '../../workflows/train-engine';
import type { EpisodeResult } from '../../lib/episode/episode-types';

/**
 * Three "hosts" on this machine that share nothing but Temporal and an S3-compatible object store (moto's
 * server on loopback): a browser host, a control host and a GPU host with the learner, each with its own home
 * folder and started by `halo up --role …`. A GRPO run and an MCTS search complete; adapters are in the bucket
 * once per version; the browser host's worker is SIGKILLed mid-run and restarted, and the run recovers.
 */
const exec = promisify(execFile);
const PREFIX = 'halo-multi';
const RUN = 'mh-grpo';
const MCTS_RUN = 'mh-mcts';

let s3: LocalS3;
let critic: FakeCriticServer;
let temporal: ManagedProcess;
let temporalHome: string;
let address: string;
let connection: Connection;
let client: Client;
let cfgFile: string;
const homes = { browser: '', control: '', learner: '' };
type Role = keyof typeof homes;

function hostEnv(): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, ...s3.env(PREFIX), TEMPORAL_ADDRESS: address, TEMPORAL_NAMESPACE: 'default', HALO_MODEL: 'tiny-random', HF_HUB_OFFLINE: '1' };
  delete env.HALO_CHECKPOINTS;
  delete env.HALO_HOME;
  return env;
}

function halo(...args: string[]) {
  return exec(process.execPath, [join(REPO_ROOT, 'bin', 'halo.cjs'), ...args, '--config', cfgFile], { cwd: REPO_ROOT, env: hostEnv(), timeout: 240_000 });
}

const upRole = (role: Role) => halo('up', '--role', role, '--home', homes[role], '--json');

before(async () => {
  [s3, critic] = await Promise.all([startLocalS3(), startFakeCriticServer({ kind: 'prefer', substring: 'click', value: 0.7 })]);
  // "The remote Temporal": a dev server with its own folder, reached by address only.
  temporalHome = mkdtempSync(join(tmpdir(), 'halo-mh-temporal-'));
  ({ server: temporal, address, connection } = await startDevServerOnFreePort({ home: temporalHome }));
  await prepareNamespace(connection, 'default', 1);
  client = new Client({ connection, namespace: 'default' });
  for (const r of Object.keys(homes) as Role[]) homes[r] = mkdtempSync(join(tmpdir(), `halo-mh-${r}-`));
  cfgFile = join(temporalHome, 'halo.yaml');
  writeFileSync(
    cfgFile,
    ['temporal:', `  address: ${address}`, '  controlTaskQueue: halo-control', '  browserTaskQueue: halo-browser', 'stack:', '  browserWorkers: 1', ''].join('\n'),
  );
  await Promise.all((Object.keys(homes) as Role[]).map(upRole));
});

after(async () => {
  await Promise.allSettled((Object.keys(homes) as Role[]).filter((r) => homes[r]).map((r) => halo('down', '--role', r, '--home', homes[r])));
  await connection?.close();
  if (temporal && isAlive(temporal.pid)) process.kill(temporal.pid, 'SIGTERM');
  await Promise.allSettled([s3?.stop(), critic?.close()]);
  if (!process.env.HALO_KEEP_TEST_HOME) for (const h of [temporalHome, ...Object.values(homes)]) if (h) rmSync(h, { recursive: true, force: true });
});

function runConfig(): HaloConfig {
  return parseConfig({
    temporal: { address, controlTaskQueue: 'halo-control', browserTaskQueue: 'halo-browser' },
    policy: { backend: 'colocated', model: 'tiny-random', temperature: 1, maxTokens: 24, timeoutMs: 120_000 },
    episode: { env: 'miniwob', maxSteps: 2, sessionStartTimeoutMs: 10_000, heartbeatTimeoutMs: 3_000 },
    train: {
      runId: RUN,
      iterations: 2,
      episodesPerIteration: 1,
      parallelism: 1,
      tasks: ['click-button'],
      grouping: 'step',
      numGenerations: 2,
      learningRate: 1e-3,
      gpuTaskQueue: 'gpu',
    },
    mcts: {
      runId: MCTS_RUN,
      iterations: 1,
      tasks: ['click-button'],
      numSimulations: 3,
      maxChildren: 2,
      maxDepth: 2,
      continueAsNewEvery: 2,
      critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic', timeoutMs: 5_000 },
      learningRate: 1e-3,
    },
  });
}

async function bucketKeys(under: string): Promise<string[]> {
  const { ListObjectsV2Command } = await import('@aws-sdk/client-s3');
  const keys: string[] = [];
  let token: string | undefined;
  do {
    const res = await s3.client.send(new ListObjectsV2Command({ Bucket: s3.bucket, Prefix: under, ContinuationToken: token }));
    for (const o of res.Contents ?? []) keys.push(o.Key!);
    token = res.IsTruncated ? res.NextContinuationToken : undefined;
  } while (token);
  return keys;
}

/** Adapter versions committed in the bucket for a run, with how many adapter weight files each holds. */
async function bucketAdapters(run: string): Promise<Record<string, { manifests: number; weights: number }>> {
  const out: Record<string, { manifests: number; weights: number }> = {};
  for (const k of await bucketKeys(`${PREFIX}/checkpoints/${run}/`)) {
    const m = new RegExp(`^${PREFIX}/checkpoints/${run}/(v\\d+)/(.*)$`).exec(k);
    assert.ok(m, `unexpected key ${k}`);
    out[m[1]] ??= { manifests: 0, weights: 0 };
    const v = out[m[1]];
    if (m[2] === 'manifest.json') v.manifests++;
    if (/^files\/[0-9a-f]{64}-adapter_model\.safetensors$/.test(m[2])) v.weights++;
  }
  return out;
}

async function waitForStarted(workflowId: string, types: string[], timeoutMs: number): Promise<string | false> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const d = await client.workflow
      .getHandle(workflowId)
      .describe()
      .catch(() => undefined);
    const hit = (d?.raw.pendingActivities ?? []).find((a) => types.includes(a.activityType?.name ?? '') && a.state === 2 /* STARTED */);
    if (hit) return hit.activityType!.name!;
    if (d && d.status.name !== 'RUNNING') return false;
    await new Promise((r) => setTimeout(r, 50));
  }
  return false;
}

test('GRPO across three hosts sharing only Temporal and the bucket; the browser host loses its worker mid-run', async () => {
  const cfg = runConfig();
  const { handle } = await startOrAttachTrain(client, cfg);

  // The browser host's worker dies while the first episode steps; `halo up --role browser` brings it back.
  const during = await waitForStarted(`${RUN}-it1-ep0`, ['stepSession', 'startSession'], 180_000);
  assert.ok(during, 'the episode reached the browser host');
  const pid = readPid(homes.browser, 'browser-worker-0');
  assert.ok(pid, 'the browser host runs its worker');
  process.kill(pid, 'SIGKILL');
  while (isAlive(pid)) await new Promise((r) => setTimeout(r, 50));
  await upRole('browser');
  assert.notEqual(readPid(homes.browser, 'browser-worker-0'), pid);

  const result = (await handle.result()) as TrainingResult;
  assert.deepEqual(result, { runId: RUN, iterations: 2, adapterVersion: 2, stoppedEarly: false });
  // The browser activity that was running when the worker died was retried, or failed and its session was
  // rebuilt on the restarted worker.
  const history = await client.workflow.getHandle(`${RUN}-it1-ep0`).fetchHistory();
  const types = new Map<string, string>();
  let interrupted = 0;
  for (const e of history.events ?? []) {
    if (e.activityTaskScheduledEventAttributes) types.set(String(e.eventId), e.activityTaskScheduledEventAttributes.activityType?.name ?? '');
    const started = e.activityTaskStartedEventAttributes;
    if (started && (started.attempt ?? 1) > 1 && types.get(String(started.scheduledEventId)) === during) interrupted++;
    const ended = e.activityTaskFailedEventAttributes ?? e.activityTaskTimedOutEventAttributes;
    if (ended && types.get(String(ended.scheduledEventId)) === during) interrupted++;
  }
  assert.ok(interrupted >= 1, `${during} was interrupted by the kill and the episode went on`);

  // Adapters v1..v2, each exactly once in the bucket; the learner's host keeps a cache, nobody else has any.
  assert.deepEqual(await bucketAdapters(RUN), { v1: { manifests: 1, weights: 1 }, v2: { manifests: 1, weights: 1 } });
  assert.ok(existsSync(join(homes.learner, 'checkpoints', RUN, 'v2', 'adapter_model.safetensors')));
  for (const r of ['browser', 'control'] as Role[]) assert.ok(!existsSync(join(homes[r], 'checkpoints')), `${r} host has no checkpoints`);
  // No blob folder on any host: every screenshot, prompt, trajectory and batch went to the bucket.
  for (const r of Object.keys(homes) as Role[]) assert.ok(!existsSync(join(homes[r], 'blobs')), `${r} host has no blob folder`);
  const blobs = blobStoreFor(homes.control, { ...process.env, ...s3.env(PREFIX) });
  const ep = (await client.workflow.getHandle(`${RUN}-it2-ep0`).result()) as EpisodeResult;
  const trajectory = await blobs.getJson<{ steps: { screenshotRef?: string }[] }>(ep.trajectoryRef);
  assert.ok(trajectory.steps.length >= 1);
  assert.ok((await bucketKeys(`${PREFIX}/blobs/`)).length > 5);
  // The control host wrote the run's metrics in its own home.
  const metrics = readFileSync(join(homes.control, RUN, 'metrics.jsonl'), 'utf8')
    .trim()
    .split('\n');
  assert.equal(metrics.length, 2);
});

test('an MCTS search across the same three hosts: DPO pairs, adapter v1 once in the bucket', async () => {
  const { handle } = await startOrAttachMcts(client, runConfig());
  const result = (await handle.result()) as TrainingResult;
  assert.deepEqual(result, { runId: MCTS_RUN, iterations: 1, adapterVersion: 1, stoppedEarly: false });
  assert.deepEqual(await bucketAdapters(MCTS_RUN), { v1: { manifests: 1, weights: 1 } });
  assert.deepEqual(
    readdirSync(join(homes.learner, 'checkpoints', MCTS_RUN)).filter((d) => /^v\d+$/.test(d)),
    ['v1'],
  );
});
