import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { createControlActivities } from '../../activities/control';
import { loadAdapterIntoVllm } from '../../activities/adapters';
import { replicaStats } from '../../activities/replica-pools';
import { parseConfig, type PolicyConfig } from '../../lib/config/config';
import type { PromptObservationRef, SampledTokens, SampleInput } from '../../lib/episode/episode-types';
import { servedAdapterName } from '../../lib/serving/iteration-policy';
import { fakeTokenIds } from '../../testing/fake-policy-server';
import { writeAdapterFolder } from '../../testing/adapter-folder';
import { startFakeVllmServer, type FakeVllmServer } from '../../testing/fake-vllm-server';
import { failureOf } from '../helpers/application-failure';

// `samplePolicy` against several vLLM stand-ins as one pool (policy.baseUrls): balancing, draining a replica that
// stops answering, and each replica loading each adapter version before it samples with it, through a restart
// and a kill. Each test builds its own replicas, so each has a pool of its own (pools are per replica list).

let root: string;
let blobs: BlobStore;
let control: ReturnType<typeof createControlActivities>;
let observation: PromptObservationRef;
const open: FakeVllmServer[] = [];

async function replicas(k: number, delayMs = 0): Promise<FakeVllmServer[]> {
  const out: FakeVllmServer[] = [];
  for (let i = 0; i < k; i++) {
    const s = await startFakeVllmServer({ baseModel: 'base-model' });
    s.delayMs = delayMs;
    out.push(s);
    open.push(s);
  }
  return out;
}

const urls = (servers: FakeVllmServer[]) => servers.map((s) => `${s.url}/v1`);
const policyOn = (servers: FakeVllmServer[], model = 'base-model'): PolicyConfig =>
  parseConfig({ policy: { baseUrl: `${servers[0].url}/v1`, baseUrls: urls(servers), model, temperature: 0.7, maxAttempts: 1 } }).policy;

function sampleInput(servers: FakeVllmServer[], model = 'base-model', adapterPath?: string): SampleInput {
  const policy = policyOn(servers, model);
  return {
    policy,
    n: 2,
    observation,
    history: [],
    ...(adapterPath ? { adapter: { base_url: `${servers[0].url}/v1`, lora_name: model, lora_path: adapterPath } } : {}),
  };
}

/** Load requests a server got for adapter `name`. */
function loadsOf(s: FakeVllmServer, name: string): number {
  return s.requests.filter((r) => r.path === '/v1/load_lora_adapter' && (r.body as { lora_name?: string })?.lora_name === name).length;
}

before(async () => {
  root = mkdtempSync(join(tmpdir(), 'halo-policy-pool-'));
  blobs = new BlobStore(join(root, 'blobs'));
  control = createControlActivities(blobs);
  observation = {
    goal: 'Click on the "OK" button.',
    url: 'http://x/miniwob/click-button.html',
    step: 0,
    screenshotRef: await blobs.put(Buffer.from('\x89PNG fake'), 'png'),
    axtreeRef: await blobs.put('[4] button "OK" @(100,200)', 'txt'),
  };
});
after(async () => {
  await Promise.all(open.map((s) => s.close()));
  rmSync(root, { recursive: true, force: true });
});

test('requests go to the least-loaded replica: concurrent calls spread evenly, each answer from the replica it names', async () => {
  const servers = await replicas(3, 150);
  const input = sampleInput(servers);
  const results = await Promise.all(Array.from({ length: 6 }, () => control.samplePolicy(input)));
  assert.deepEqual(
    servers.map((s) => s.chats.length),
    [2, 2, 2],
  );
  for (const [i, s] of servers.entries()) assert.equal(results.filter((r) => r.replica === `${s.url}/v1`).length, 2, `replica ${i}`);
  // Token ids stay per request: each candidate's tokens are those its own replica answered.
  for (const c of results.flatMap((r) => r.candidates)) {
    const tokens = await blobs.getJson<SampledTokens>(c.tokensRef!);
    assert.deepEqual(tokens.token_ids, fakeTokenIds((await blobs.get(c.ref!)).toString('utf8'), c.finishReason ?? 'stop'));
  }
  const stats = replicaStats(input.policy);
  assert.deepEqual(
    stats.map((s) => [s.requests, s.failures, s.healthy]),
    [
      [2, 0, true],
      [2, 0, true],
      [2, 0, true],
    ],
  );
  assert.ok(
    stats.every((s) => (s.mean_latency_ms ?? 0) >= 150),
    'latency is counted per replica',
  );
});

test('a killed replica is drained and the others answer every request; back on its port it is asked again', async () => {
  const servers = await replicas(3);
  const input = sampleInput(servers);
  const dead = servers[1];
  const port = Number(new URL(dead.url).port);
  await dead.close();
  const results = [];
  for (let i = 0; i < 6; i++) results.push(await control.samplePolicy(input));
  assert.equal(results.length, 6, 'nothing lost');
  assert.ok(results.every((r) => r.replica !== `${dead.url}/v1`));
  assert.deepEqual([servers[0].chats.length, servers[2].chats.length], [3, 3]);
  const drained = replicaStats(input.policy)[1];
  assert.deepEqual([drained.requests, drained.failures, drained.healthy], [1, 1, false], 'asked once, then drained');

  // The same server restarted on its port: once its drain is over it takes requests again.
  const back = await startFakeVllmServer({ baseModel: 'base-model', port });
  open.push(back);
  while (!replicaStats(input.policy)[1].healthy) await new Promise((r) => setTimeout(r, 100));
  await control.samplePolicy(input);
  assert.equal(back.chats.length, 1, 'the least-loaded replica is the one that was away');
  assert.equal(replicaStats(input.policy)[1].healthy, true);
});

test('every replica down: the call fails retryably naming each; a request the server refuses drains nobody', async () => {
  const servers = await replicas(2);
  const input = sampleInput(servers);
  servers[0].failNext(503, 1);
  servers[1].failNext(500, 1);
  const f = await failureOf(control.samplePolicy(input));
  assert.equal(f.type, 'PolicyReplicasUnavailable');
  assert.equal(f.nonRetryable, false);
  assert.match(f.message, new RegExp(`${servers[0].url}/v1: .*503.*; ${servers[1].url}/v1: .*500`));
  // A 4xx is the request's own fault: the first replica's answer ends the call, and nobody is drained.
  const bad = sampleInput(servers, 'no-such-model');
  const rejected = await failureOf(control.samplePolicy(bad));
  assert.equal(rejected.type, 'PolicyRequestRejected');
  assert.equal(servers[0].unknownModels.length + servers[1].unknownModels.length, 1);
  assert.deepEqual(
    replicaStats(input.policy).map((s) => s.failures),
    [1, 1],
  );
});

test('each replica loads each adapter version before it samples with it: eager loads, a restart, a kill', async () => {
  const servers = await replicas(3);
  const run = 'pool-run';
  const v1 = writeAdapterFolder(join(root, 'checkpoints'), run, 1);
  const name1 = servedAdapterName(run, 1);
  // The engine's load after an update: into every replica of the pool.
  const loaded = await loadAdapterIntoVllm({ base_url: `${servers[0].url}/v1`, replicas: urls(servers), run_id: run, version: 1, adapter_path: v1 });
  assert.deepEqual(
    servers.map((s) => s.adapters.has(name1)),
    [true, true, true],
  );
  assert.deepEqual(
    loaded.pool?.map((p) => p.adapter_loads),
    [1, 1, 1],
  );
  const input = sampleInput(servers, name1, v1);
  for (let i = 0; i < 6; i++) await control.samplePolicy(input);
  assert.deepEqual(
    servers.map((s) => loadsOf(s, name1)),
    [1, 1, 1],
    'one load per replica: sampling knows each has it',
  );

  // Replica 0 restarts (forgets its runtime adapters): its next request is refused with a 404, it loads v1 again
  // and the request is answered by v1; the others are untouched.
  servers[0].restart();
  for (let i = 0; i < 3; i++) await control.samplePolicy(input);
  assert.deepEqual(
    servers.map((s) => loadsOf(s, name1)),
    [2, 1, 1],
  );
  assert.deepEqual(servers[0].unknownModels, [name1]);

  // v2 written while replica 2 is dead: the eager load skips it (drained), the others take it.
  const v2 = writeAdapterFolder(join(root, 'checkpoints'), run, 2);
  const name2 = servedAdapterName(run, 2);
  const dead = servers[2];
  const port = Number(new URL(dead.url).port);
  await dead.close();
  const second = await loadAdapterIntoVllm({ base_url: `${servers[0].url}/v1`, replicas: urls(servers), run_id: run, version: 2, adapter_path: v2, keep: 1 });
  assert.deepEqual(
    second.skipped?.map((s) => s.url),
    [`${dead.url}/v1`],
  );
  assert.equal(second.pool?.[2].healthy, false);
  const input2 = sampleInput(servers, name2, v2);
  const during = [];
  for (let i = 0; i < 4; i++) during.push(await control.samplePolicy(input2));
  assert.ok(during.every((r) => r.replica !== `${dead.url}/v1`));

  // It comes back empty (a restarted vLLM): once it is asked again it loads v2 before sampling with it.
  const back = await startFakeVllmServer({ baseModel: 'base-model', port });
  open.push(back);
  while (!replicaStats(input2.policy)[2].healthy) await new Promise((r) => setTimeout(r, 100));
  const res = await control.samplePolicy(input2);
  assert.equal(res.replica, `${back.url}/v1`);
  assert.equal(loadsOf(back, name2), 1);
  assert.deepEqual(res.adapterLoad && [res.adapterLoad.requests, res.adapterLoad.reloaded], [1, false]);

  // No off-policy sample anywhere: each answer is the version asked for (a replica without it answers 404, never
  // another version), and every replica answered only the versions it was asked for.
  assert.ok([...during, res].every((r) => r.model === name2));
  for (const s of [servers[0], servers[1], back]) assert.ok(s.chats.every((c) => c.model === name1 || c.model === name2));
  assert.deepEqual(
    [servers[0], servers[1], back].map((s) => s.chats.filter((c) => c.model === name2).length),
    [2, 2, 1],
  );
});

test('requests that meet a restarted replica at the same time share one load of the adapter', async () => {
  const servers = await replicas(2, 50);
  const run = 'pool-burst';
  const v1 = writeAdapterFolder(join(root, 'checkpoints'), run, 1);
  const name = servedAdapterName(run, 1);
  await loadAdapterIntoVllm({ base_url: `${servers[0].url}/v1`, replicas: urls(servers), run_id: run, version: 1, adapter_path: v1 });
  const input = sampleInput(servers, name, v1);
  for (const s of servers) s.restart();
  const results = await Promise.all(Array.from({ length: 8 }, () => control.samplePolicy(input)));
  assert.ok(results.every((r) => r.model === name));
  assert.deepEqual(
    servers.map((s) => loadsOf(s, name)),
    [2, 2],
    'the eager load, then one load per replica for the burst',
  );
});
