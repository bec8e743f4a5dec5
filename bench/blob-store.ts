/**
 * What does the blob store cost, in a local folder and in an S3-compatible object store (moto's server on
 * loopback, testing/s3-server.ts)? For screenshots (a real MiniWoB++ screenshot, and a REAL-sized 250 KB
 * image): put and get latency one at a time (median, p90) and throughput with `--concurrency` requests in
 * flight; then the share of an episode's wall time spent in the store: the same plain in-process episode
 * (bench/episode-overhead.ts's loop: SessionManager, the policy activity against the instant scripted policy,
 * the trajectory record) with each backend, timing every put/get.
 *
 *   node --import tsx bench/blob-store.ts [--n 100] [--concurrency 8] [--episodes 3] [--steps 5]
 *
 * An instant policy makes the episode share an upper bound: a real policy call adds seconds per step.
 * moto is a Python development server, so its numbers are those of "an S3 API on this machine", slower than
 * MinIO and without the network of a remote store; treat the S3 column as the protocol's cost here.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { type BlobStore, blobStoreFor } from '../blob/store';
import { SessionManager } from '../activities/session';
import { createControlActivities } from '../activities/control';
import { findMiniwobHtml, startMiniwobServer } from '../env/miniwob-server';
import { listMiniwobTasks } from '../env/miniwob-tasks';
import { describeAction, isTerminal, isValidAction } from '../lib/model-io/actions';
import { parseConfig } from '../lib/config/config';
import { singleEpisodeInput } from '../client/episode-input';
import { startFakePolicyServer } from '../testing/fake-policy-server';
import { startLocalS3 } from '../testing/s3-server';
import { median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '100' },
    concurrency: { type: 'string', default: '8' },
    episodes: { type: 'string', default: '3' },
    steps: { type: 'string', default: '5' },
    task: { type: 'string', default: 'click-checkboxes' },
  },
});
const N = Number(values.n);
const C = Number(values.concurrency);

const p90 = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor(xs.length * 0.9))];
const ms = (x: number) => x.toFixed(2);

/** Distinct variants of one image (a counter appended after the PNG's end: same size, new content). */
function variants(base: Buffer, n: number, tag: string): Buffer[] {
  return Array.from({ length: n }, (_, i) => Buffer.concat([base, Buffer.from(`${tag}-${i}-${randomBytes(4).toString('hex')}`)]));
}

async function timed<T>(f: () => Promise<T>): Promise<[T, number]> {
  const t0 = performance.now();
  const v = await f();
  return [v, performance.now() - t0];
}

async function pool<T>(items: T[], c: number, f: (x: T) => Promise<unknown>): Promise<number> {
  const t0 = performance.now();
  let next = 0;
  await Promise.all(
    Array.from({ length: c }, async () => {
      while (next < items.length) await f(items[next++]);
    }),
  );
  return performance.now() - t0;
}

interface Row {
  backend: string;
  image: string;
  kb: number;
  putMed: number;
  putP90: number;
  getMed: number;
  getP90: number;
  putPerS: number;
  putMBs: number;
  getPerS: number;
  getMBs: number;
  dupPut: number;
}

async function micro(backend: string, store: BlobStore, image: string, base: Buffer): Promise<Row> {
  const seq = variants(base, N, `${backend}-${image}-seq`);
  const puts: number[] = [];
  const refs: string[] = [];
  for (const b of seq) {
    const [ref, t] = await timed(() => store.put(b, 'png'));
    puts.push(t);
    refs.push(ref);
  }
  const gets: number[] = [];
  for (const r of refs) gets.push((await timed(() => store.get(r)))[1]);
  const dup: number[] = [];
  for (const b of seq.slice(0, 20)) dup.push((await timed(() => store.put(b, 'png')))[1]);
  const par = variants(base, N, `${backend}-${image}-par`);
  const parRefs: string[] = [];
  const putWall = await pool(par, C, async (b) => parRefs.push(await store.put(b, 'png')));
  const getWall = await pool(parRefs, C, (r) => store.get(r));
  const mb = (N * base.length) / 1e6;
  return {
    backend,
    image,
    kb: base.length / 1024,
    putMed: median(puts),
    putP90: p90(puts),
    getMed: median(gets),
    getP90: p90(gets),
    putPerS: N / (putWall / 1000),
    putMBs: mb / (putWall / 1000),
    getPerS: N / (getWall / 1000),
    getMBs: mb / (getWall / 1000),
    dupPut: median(dup),
  };
}

/** Wraps a store so every put/get/exists is timed (putJson/getJson go through put/get). */
function instrument(store: BlobStore) {
  const stats = { ms: 0, puts: 0, gets: 0, exists: 0 };
  for (const name of ['put', 'get', 'exists'] as const) {
    const orig = (store[name] as (...a: unknown[]) => Promise<unknown>).bind(store);
    (store as unknown as Record<string, unknown>)[name] = async (...a: unknown[]) => {
      const t0 = performance.now();
      try {
        return await orig(...a);
      } finally {
        stats.ms += performance.now() - t0;
        if (name === 'put') stats.puts++;
        if (name === 'get') stats.gets++;
        if (name === 'exists') stats.exists++;
      }
    };
  }
  return stats;
}

async function episodeShare(backend: string, store: BlobStore, policyUrl: string, miniwobBaseUrl: string) {
  const stats = instrument(store);
  const manager = new SessionManager({ blobs: store, miniwobBaseUrl, miniwobTasks: listMiniwobTasks(findMiniwobHtml()), workerTaskQueue: 'bench', workerName: 'bench' });
  const control = createControlActivities(store);
  const cfg = parseConfig({ policy: { baseUrl: policyUrl, model: 'scripted' }, episode: { env: 'miniwob', task: values.task, seed: 1, maxSteps: Number(values.steps) } });
  const input = singleEpisodeInput(cfg, 'bench-episode');
  const walls: number[] = [];
  const shares: number[] = [];
  let stepsTotal = 0;
  let storeTotal = 0;
  let opsTotal = 0;
  try {
    for (let e = 0; e <= Number(values.episodes); e++) {
      stats.ms = 0;
      const ops0 = stats.puts + stats.gets + stats.exists;
      const t0 = performance.now();
      const s = await manager.start({ spec: input.task, replay: [], episodeId: `bench-${backend}-${e}`, rewardWeights: cfg.rewards });
      let observation = s.observation;
      let rewardState = s.rewardState;
      const history: { step: number; action: string }[] = [];
      let steps = 0;
      for (let step = 1; step <= input.maxSteps; step++) {
        const sample = await control.samplePolicy({ policy: input.policy, observation, history });
        const action = sample.candidates[0].action;
        steps++;
        history.push({ step, action: describeAction(action) });
        if (!isValidAction(action)) continue;
        const out = await manager.step({ sessionId: s.sessionId, index: step - 1, action, rewardState });
        observation = { ...out.observation, goal: observation.goal };
        rewardState = out.rewardState;
        if (out.done || isTerminal(action)) break;
      }
      await manager.close(s.sessionId);
      await control.recordTrajectory({
        workflowId: `bench-${e}`,
        task: input.task,
        policyModel: input.policy.model,
        initial: s.observation,
        steps: [],
        success: false,
        reward: 0,
        reason: null,
      });
      const wall = performance.now() - t0;
      if (e === 0) continue; // warm-up: browser start
      walls.push(wall);
      shares.push(stats.ms / wall);
      stepsTotal += steps;
      storeTotal += stats.ms;
      opsTotal += stats.puts + stats.gets + stats.exists - ops0;
    }
  } finally {
    await manager.shutdown();
  }
  return { backend, wall: median(walls), share: median(shares), storeMsPerStep: storeTotal / stepsTotal, opsPerStep: opsTotal / stepsTotal };
}

async function main() {
  printBenchHeader('blob-store');
  const s3 = await startLocalS3();
  const policy = await startFakePolicyServer({ kind: 'scripted' });
  const miniwob = await startMiniwobServer({});
  const home = mkdtempSync(join(tmpdir(), 'halo-bench-blobs-'));
  try {
    const local = blobStoreFor(home, {});
    const remote = blobStoreFor(home, { ...process.env, ...s3.env('bench') });
    // A real MiniWoB++ screenshot, taken through the session code.
    const probe = new SessionManager({
      blobs: local,
      miniwobBaseUrl: miniwob.baseUrl,
      miniwobTasks: listMiniwobTasks(findMiniwobHtml()),
      workerTaskQueue: 'bench',
      workerName: 'probe',
    });
    const s = await probe.start({ spec: { env: 'miniwob', task: values.task!, seed: 1 }, replay: [], episodeId: 'probe', rewardWeights: parseConfig({}).rewards });
    const miniwobPng = await local.get(s.observation.screenshotRef);
    await probe.close(s.sessionId);
    await probe.shutdown();
    const realSized = Buffer.concat([miniwobPng.subarray(0, 8), randomBytes(250 * 1024)]);

    const rows: Row[] = [];
    for (const [backend, store] of [
      ['folder', local],
      ['s3 (moto)', remote],
    ] as const) {
      rows.push(await micro(backend, store, 'miniwob', miniwobPng));
      rows.push(await micro(backend, store, 'real-sized', realSized));
    }
    console.log('');
    console.log(`## put/get, ${N} distinct screenshots each; throughput with ${C} in flight`);
    console.log('');
    console.log('| backend | image | KiB | put ms (median / p90) | get ms (median / p90) | put again (exists) ms | puts/s | put MB/s | gets/s | get MB/s |');
    console.log('|---|---|---|---|---|---|---|---|---|---|');
    for (const r of rows) {
      console.log(
        `| ${r.backend} | ${r.image} | ${r.kb.toFixed(1)} | ${ms(r.putMed)} / ${ms(r.putP90)} | ${ms(r.getMed)} / ${ms(r.getP90)} | ${ms(r.dupPut)} | ${r.putPerS.toFixed(0)} | ${r.putMBs.toFixed(1)} | ${r.getPerS.toFixed(0)} | ${r.getMBs.toFixed(1)} |`,
      );
    }

    const shares = [];
    for (const [backend, store] of [
      ['folder', blobStoreFor(home, {})],
      ['s3 (moto)', blobStoreFor(home, { ...process.env, ...s3.env('bench-ep') })],
    ] as const) {
      shares.push(await episodeShare(backend, store, policy.url, miniwob.baseUrl));
    }
    console.log('');
    console.log(`## share of an episode's wall time in the store (${values.task}, ≤${values.steps} steps, instant scripted policy, median of ${values.episodes})`);
    console.log('');
    console.log('| backend | episode wall ms | store calls per step | store ms per step | share of wall time |');
    console.log('|---|---|---|---|---|');
    for (const r of shares) console.log(`| ${r.backend} | ${r.wall.toFixed(0)} | ${r.opsPerStep.toFixed(1)} | ${r.storeMsPerStep.toFixed(1)} | ${(r.share * 100).toFixed(1)}% |`);
    printLoadAtEnd();
  } finally {
    await Promise.allSettled([s3.stop(), policy.close(), miniwob.close()]);
    rmSync(home, { recursive: true, force: true });
  }
}

runBench(main);
