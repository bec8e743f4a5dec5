/**
 * Rollout sampling over a pool of vLLM replicas (policy.baseUrls): samples per minute with 1, 2 and 4 replicas, and
 * with one of 4 killed mid-run and brought back empty (as a restarted vLLM), through the control worker's real
 * sampling activity (`samplePolicy`: prompt and screenshot, the pool's routing, per-replica adapter loads, token
 * blobs). Each replica is the local server that keeps vLLM's contract (testing/fake-vllm-server.ts) behind a gate
 * that gives it a GPU's capacity: `--slots` requests decode at once (vLLM's batch), each taking `--latency-ms`, the
 * rest wait. `--concurrency` requests are kept in flight, as that many browser slots' episodes would.
 *
 *   node --import tsx bench/policy-replicas.ts [--seconds 30] [--replicas 1,2,4] [--latency-ms 1000] [--slots 4]
 *        [--concurrency 24] [--n 8] [--kill]
 *
 * Every request names adapter v1 of a run, loaded into each replica first (as the engine does after an update).
 * Counted per setting: requests answered and samples (n each) per minute, requests lost (failed after every replica
 * was tried), answers off-policy (a model other than the one asked for), and each replica's requests and adapter
 * loads. With --kill, the 4-replica setting is run again with replica 2 killed at a third of the run and restarted
 * empty (it forgot the adapter) at half. The rate counts what was answered within the window; requests still
 * queued at its end are answered after it (and counted as answered, not lost).
 */
import { parseArgs } from 'node:util';
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../blob/store';
import { createControlActivities } from '../activities/control';
import { loadAdapterIntoVllm } from '../activities/adapters';
import { replicaStats } from '../activities/replica-pools';
import { parseConfig } from '../lib/config/config';
import type { PromptObservationRef, SampleInput } from '../lib/episode/episode-types';
import { servedAdapterName } from '../lib/serving/iteration-policy';
import { writeAdapterFolder } from '../testing/adapter-folder';
import { startFakeVllmServer, type FakeVllmServer } from '../testing/fake-vllm-server';
import { printBenchHeader, printLoadAtEnd, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    seconds: { type: 'string', default: '30' },
    replicas: { type: 'string', default: '1,2,4' },
    'latency-ms': { type: 'string', default: '1000' },
    slots: { type: 'string', default: '4' },
    concurrency: { type: 'string', default: '24' },
    n: { type: 'string', default: '8' },
    kill: { type: 'boolean', default: false },
  },
});
const seconds = Number(values.seconds);
const latencyMs = Number(values['latency-ms']);
const slots = Number(values.slots);
const concurrency = Number(values.concurrency);
const n = Number(values.n);
const settings = values.replicas!.split(',').map(Number);
for (const [name, v] of Object.entries({ seconds, latencyMs, slots, concurrency, n })) {
  if (!Number.isInteger(v) || v < 1) throw new Error(`--${name}: a whole number ≥ 1, got ${v}`);
}
if (settings.some((k) => !Number.isInteger(k) || k < 1)) throw new Error(`--replicas: whole numbers ≥ 1, got ${values.replicas}`);

/** A replica: the contract-keeping server behind a gate of `slots` decode slots of `latencyMs` each, on one port. */
interface Replica {
  url: string;
  port: number;
  vllm: FakeVllmServer;
  gate: Server;
}

async function startReplica(port = 0): Promise<Replica> {
  const vllm = await startFakeVllmServer({ baseModel: 'base-model' });
  let busy = 0;
  const waiting: (() => void)[] = [];
  const slot = async () => {
    if (busy >= slots) await new Promise<void>((resolve) => waiting.push(resolve));
    busy++;
  };
  const release = () => {
    busy--;
    waiting.shift()?.();
  };
  const target = new URL(vllm.url);
  const gate = createServer((req: IncomingMessage, res: ServerResponse) => {
    const forward = () =>
      new Promise<void>((done) => {
        const up = httpRequest({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
          res.writeHead(r.statusCode ?? 502, r.headers);
          r.pipe(res);
          r.on('end', done);
        });
        up.on('error', () => {
          res.destroy();
          done();
        });
        req.pipe(up);
      });
    if (req.url?.startsWith('/v1/chat/completions')) {
      void (async () => {
        await slot();
        await new Promise((r) => setTimeout(r, latencyMs));
        await forward();
        release();
      })();
    } else void forward();
  });
  await new Promise<void>((resolve) => gate.listen(port, '127.0.0.1', resolve));
  const bound = (gate.address() as { port: number }).port;
  return { url: `http://127.0.0.1:${bound}/v1`, port: bound, vllm, gate };
}

async function stopReplica(r: Replica): Promise<void> {
  r.gate.closeAllConnections();
  await new Promise<void>((resolve) => r.gate.close(() => resolve()));
  await r.vllm.close();
}

interface Outcome {
  replicas: number;
  kill: boolean;
  answered: number;
  lost: number;
  offPolicy: number;
  samplesPerMin: number;
  perReplica: string;
}

async function runSetting(k: number, kill: boolean, observation: PromptObservationRef, control: ReturnType<typeof createControlActivities>, root: string): Promise<Outcome> {
  const replicas: Replica[] = [];
  for (let i = 0; i < k; i++) replicas.push(await startReplica());
  // A run of its own per setting: its own pool (pools are per replica list) and adapter.
  const run = `bench-${k}${kill ? '-kill' : ''}`;
  const dir = writeAdapterFolder(join(root, 'checkpoints'), run, 1);
  const name = servedAdapterName(run, 1);
  const urls = replicas.map((r) => r.url);
  await loadAdapterIntoVllm({ base_url: urls[0], replicas: urls, run_id: run, version: 1, adapter_path: dir });
  const policy = parseConfig({ policy: { baseUrl: urls[0], baseUrls: urls, model: name, temperature: 0.7, maxAttempts: 1 } }).policy;
  const input: SampleInput = { policy, n, observation, history: [], adapter: { base_url: urls[0], lora_name: name, lora_path: dir } };
  let answered = 0;
  let inWindow = 0;
  let lost = 0;
  let offPolicy = 0;
  const t0 = Date.now();
  const end = t0 + seconds * 1000;
  const events: Promise<void>[] = [];
  // Load requests each replica's server got, a killed instance's included (counted on the servers themselves).
  const earlierLoads = replicas.map(() => 0);
  const loadsOn = (r: Replica) => r.vllm.requests.filter((q) => q.path === '/v1/load_lora_adapter').length;
  if (kill && k > 1) {
    const victim = 1;
    events.push(
      (async () => {
        await new Promise((r) => setTimeout(r, (seconds * 1000) / 3));
        const port = replicas[victim].port;
        earlierLoads[victim] += loadsOn(replicas[victim]);
        await stopReplica(replicas[victim]);
        await new Promise((r) => setTimeout(r, (seconds * 1000) / 6));
        replicas[victim] = await startReplica(port); // restarted: no adapters
      })(),
    );
  }
  const worker = async () => {
    while (Date.now() < end) {
      try {
        const res = await control.samplePolicy(input);
        if (res.model !== name) offPolicy++;
        answered++;
        if (Date.now() <= end) inWindow++;
      } catch {
        lost++;
      }
    }
  };
  await Promise.all([...Array.from({ length: concurrency }, worker), ...events]);
  const stats = replicaStats(policy);
  const perReplica = stats
    .map((s, i) => {
      const loads = earlierLoads[i] + loadsOn(replicas[i]);
      return `r${i + 1} ${s.requests} req${s.failures ? ` (${s.failures} failed)` : ''}, ${loads} load${loads === 1 ? '' : 's'}`;
    })
    .join('; ');
  for (const r of replicas) await stopReplica(r);
  // The rate is that of the window: requests still queued at its end are answered (and counted as answered, not
  // lost) but not in the rate.
  return { replicas: k, kill, answered, lost, offPolicy, samplesPerMin: (inWindow * n * 60) / seconds, perReplica };
}

async function main() {
  printBenchHeader('policy-replicas');
  const root = mkdtempSync(join(tmpdir(), 'halo-bench-replicas-'));
  try {
    const blobs = new BlobStore(join(root, 'blobs'));
    const control = createControlActivities(blobs);
    const observation: PromptObservationRef = {
      goal: 'Click on the "OK" button.',
      url: 'http://x/miniwob/click-button.html',
      step: 0,
      screenshotRef: await blobs.put(Buffer.from('\x89PNG fake'), 'png'),
      axtreeRef: await blobs.put('[4] button "OK" @(100,200)', 'txt'),
    };
    console.log(`each replica: ${slots} requests decode at once, ${latencyMs} ms each; ${concurrency} requests in flight; n = ${n} samples per request; ${seconds} s per setting`);
    const rows: Outcome[] = [];
    for (const k of settings) rows.push(await runSetting(k, false, observation, control, root));
    if (values.kill) rows.push(await runSetting(4, true, observation, control, root));
    const base = rows[0].samplesPerMin;
    console.log('');
    console.log('| replicas | samples / min | vs 1 replica | requests answered | lost | off-policy | per replica (requests, adapter loads) |');
    console.log('|---|---|---|---|---|---|---|');
    for (const r of rows) {
      const label = r.kill ? `${r.replicas}, r2 killed at 1/3, back empty at 1/2` : String(r.replicas);
      console.log(`| ${label} | ${r.samplesPerMin.toFixed(0)} | ${(r.samplesPerMin / base).toFixed(2)} | ${r.answered} | ${r.lost} | ${r.offPolicy} | ${r.perReplica} |`);
    }
    printLoadAtEnd();
  } finally {
    rmSync(root, { recursive: true, force: true });
  }
}

runBench(main);
