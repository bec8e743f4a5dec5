/**
 * Soak: does anything get lost when workers die again and again? On a private stack (Temporal dev server,
 * control worker, two browser workers, the Python tiny-random learner) this runs, for `--minutes`:
 *
 * - a stream of independent MiniWoB++ episodes, `--parallel` at a time (the scripted fake policy server);
 * - a small GRPO run (step grouping, N = `--n`, scripted policy, real learner updates) that keeps iterating;
 * - a chaos loop: every 1–3 minutes (`--chaos-min` / `--chaos-max` seconds) SIGKILL of a random worker (control,
 *   a browser worker) or the learner, restarted at once as a supervisor would.
 *
 * At the end it stops the run gracefully, waits for the episodes in flight, and reports: episodes started /
 * completed / failed / lost (never finished), adapter versions (each exactly once, contiguous), metrics rows
 * (each iteration exactly once), session rebuilds, recovery time after each kill (kill → the next episode or
 * iteration completed, p50 / p95), and blob-store growth per iteration before and after `halo gc`.
 * With `--gc-every S`, `halo gc`'s sweep (the same mark and sweep over histories, the home folder and live text
 * blobs, deleting) runs every S seconds during the soak with a `--gc-grace` of G seconds (default 120, far below the
 * CLI's 10-minute minimum: the point is to find a live blob it would take); a run that breaks or an episode lost
 * then names gc.
 * With `--shared-home` a second namespace (`soak-b`: its own control and browser worker, its own stream of episodes)
 * shares the stack's home and blob store, as two teams on one machine do. Each sweep first asks `halo gc`'s own
 * path for namespace A alone, which must refuse (B has recorded itself as a writer), then sweeps with both
 * namespaces' histories read. At the end every blob that a history of either namespace names must still be there.
 * Not part of CI; a run takes `--minutes` plus the stack's start and the final drain. Whole-machine preemptions
 * (every process at once, vLLM included, then `./launch.sh resume`) during a served GRPO run and an MCTS run:
 * bench/preemption-soak.ts.
 *
 *   node --import tsx bench/soak.ts [--minutes 30] [--parallel 2] [--n 2] [--chaos-min 60] [--chaos-max 180] [--seed 1]
 *                                   [--gc-every 180 [--gc-grace 120] [--shared-home]]
 */
import type { ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { WorkflowHandle } from '@temporalio/client';
import { startOrAttachTrain } from '../client/train';
import type { Client } from '@temporalio/client';
import { BlobStore } from '../blob/store';
import { collectBlobGarbage, formatBytes, MIN_GC_GRACE_MS, REF_PATTERN } from '../host/blob-gc';
import { gcBlobs, historyTexts } from '../client/commands/gc';
import type { HaloConfig } from '../lib/config/config';
import { episodeInput, type EpisodeResult } from '../lib/episode/episode-types';
import { samplingPolicy } from '../lib/serving/iteration-policy';
import { runContextFromConfig } from '../lib/episode/run-context';
import { startFakePolicyServer } from '../testing/fake-policy-server';
import { stackPromptIds } from '../testing/model-prompt-ids';
import { scriptedPolicy, stackGrpoConfig } from '../testing/grpo-config';
import { startTestStack, type TestStack } from '../testing/stack';
import { stopSignal } from '../workflows/messages';
import { load, median, printBenchHeader, printLoadAtEnd, rng, runBench } from './bench-run';

const { values } = parseArgs({
  options: {
    minutes: { type: 'string', default: '30' },
    parallel: { type: 'string', default: '2' },
    n: { type: 'string', default: '2' },
    'chaos-min': { type: 'string', default: '60' },
    'chaos-max': { type: 'string', default: '180' },
    seed: { type: 'string', default: '1' },
    tasks: { type: 'string', default: 'click-button,click-link,enter-text' },
    'gc-every': { type: 'string', default: '0' },
    'gc-grace': { type: 'string', default: '120' },
    'shared-home': { type: 'boolean', default: false },
  },
});
const minutes = Number(values.minutes);
const parallel = Number(values.parallel);
const chaosMin = Number(values['chaos-min']) * 1000;
const chaosMax = Number(values['chaos-max']) * 1000;
const tasks = values.tasks!.split(',');
const gcEveryMs = Number(values['gc-every']) * 1000;
const gcGraceMs = Number(values['gc-grace']) * 1000;
const sharedHome = values['shared-home'] === true;
if (sharedHome && gcEveryMs <= 0) throw new Error('--shared-home is about gc on a shared home: give --gc-every S too');

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
const kindOf = (p: ChildProcess): 'learner' | 'browser' | 'control' =>
  p.spawnargs.includes('halo_learner.worker') ? 'learner' : p.spawnargs.some((a) => a.endsWith('browser.ts')) ? 'browser' : 'control';

function percentile(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

function folderBytes(dir: string): number {
  if (!existsSync(dir)) return 0;
  let n = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) n += folderBytes(p);
    else if (e.isFile()) n += statSync(p).size;
  }
  return n;
}

/**
 * The learner, waited for as long as it takes (a busy machine can take minutes to import torch and build the
 * tiny model): the stack helper's own wait gives up after 3 minutes, and then the process is still starting.
 */
async function startLearnerPatiently(stack: TestStack, timeoutMs = 15 * 60_000): Promise<void> {
  const before = new Set(stack.workers);
  const started = stack.startLearner().catch((err: Error) => err);
  const child = stack.workers.find((p) => !before.has(p));
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const res = await stack.connection.workflowService.describeTaskQueue({ namespace: stack.namespace, taskQueue: { name: stack.gpuQueue }, taskQueueType: 2 });
    if (child && (res.pollers ?? []).some((x) => x.identity?.startsWith(`${child.pid}@`))) break;
    if (child && !alive(child)) throw new Error(`the learner exited (${child.exitCode ?? child.signalCode}); see ${stack.home}/learner-*.log`);
    if (Date.now() > deadline) throw new Error(`the learner does not poll ${stack.gpuQueue} after ${timeoutMs / 1000}s`);
    await sleep(500);
  }
  await started;
}

interface Kill {
  victim: string;
  at: number;
  back?: number;
  recovered?: number;
}

async function main(): Promise<void> {
  printBenchHeader('soak');
  const random = rng(Number(values.seed));
  const stack: TestStack = await startTestStack({ browserWorkers: 2 });
  await startLearnerPatiently(stack);
  const policy = await startFakePolicyServer({ kind: 'scripted' }, { promptIds: stackPromptIds(stack.home) });
  // The second team: its own namespace and workers, the same home (and so the same blob store).
  const teamB = sharedHome
    ? await stack.addNamespace('soak-b', 1).catch(async (err) => {
        await stack.stop();
        await policy.close();
        throw err;
      })
    : undefined;
  const teamBProcs = new Set(teamB?.workers ?? []);
  const namespaces: Client[] = teamB ? [stack.client, teamB.client] : [stack.client];
  async function* allHistories(): AsyncGenerator<string> {
    for (const c of namespaces) yield* historyTexts(c);
  }
  const runId = 'soak-grpo';
  const cfg = stackGrpoConfig(stack, {
    runId,
    iterations: 100_000,
    maxSteps: 3,
    policy: scriptedPolicy(policy.url),
    // Tight timeouts (as test/integration/chaos.test.ts): a dead worker's activities are retried within seconds.
    episode: { heartbeatTimeoutMs: 3_000, sessionStartTimeoutMs: 5_000 },
    train: { tasks, numGenerations: Number(values.n), learnerHeartbeatTimeoutS: 5 },
  });
  const blobsDir = join(stack.home, 'blobs');
  const metricsFile = join(stack.home, runId, 'metrics.jsonl');
  const metricsRows = (): { iteration: number }[] =>
    existsSync(metricsFile)
      ? readFileSync(metricsFile, 'utf8')
          .trim()
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l) as { iteration: number })
      : [];

  const t0 = Date.now();
  const end = t0 + minutes * 60_000;
  let progress = 0; // units of work completed: episodes and iterations
  let lastProgressAt = t0;
  const bump = () => {
    progress++;
    lastProgressAt = Date.now();
  };

  // The GRPO run.
  const { handle: run } = await startOrAttachTrain(stack.client, cfg);
  let iterationsSeen = 0;
  const blobBytesAtIteration: { iteration: number; bytes: number }[] = [{ iteration: 0, bytes: folderBytes(blobsDir) }];

  // Independent episodes.
  const ep = { started: 0, completed: 0, failed: [] as string[], rebuilds: 0, inFlight: new Map<string, Promise<void>>() };
  const ctx = runContextFromConfig(cfg, 'soak-episodes');
  const sampling = samplingPolicy({ policy: { ...cfg.policy, temperature: 0 }, runId: 'soak-episodes', adapterVersion: 0 });
  // With a shared home every other episode is team B's (its namespace, its workers).
  const startEpisode = (k: number) => {
    const inB = teamB !== undefined && k % 2 === 1;
    const id = `soak-ep-${k}`;
    ep.started++;
    const work = (async () => {
      try {
        const h: WorkflowHandle = await (inB ? teamB.client : stack.client).workflow.start('episode', {
          taskQueue: inB ? teamB.controlQueue : stack.controlQueue,
          workflowId: id,
          args: [
            episodeInput({
              run: inB ? { ...ctx, browserTaskQueue: teamB.browserQueue } : ctx,
              task: { env: 'miniwob', task: tasks[k % tasks.length], seed: k },
              maxSteps: 3,
              sampling,
              mode: 'soak',
            }),
          ],
        });
        const r = (await h.result()) as EpisodeResult;
        ep.completed++;
        ep.rebuilds += r.sessionRebuilds;
        bump();
      } catch (err) {
        ep.failed.push(`${id}: ${(err as Error & { cause?: Error }).cause?.message ?? (err as Error).message}`.slice(0, 300));
      } finally {
        ep.inFlight.delete(id);
      }
    })();
    ep.inFlight.set(id, work);
  };

  // Chaos.
  const kills: Kill[] = [];
  let nextKill = t0 + chaosMin + random() * (chaosMax - chaosMin);
  const chaos = async () => {
    const candidates = stack.workers.filter((p) => alive(p) && !teamBProcs.has(p));
    const victim = candidates[Math.floor(random() * candidates.length)];
    const kind = kindOf(victim);
    const k: Kill = { victim: `${kind} (pid ${victim.pid})`, at: Date.now() };
    kills.push(k);
    const before = progress;
    victim.kill('SIGKILL');
    if (alive(victim)) await new Promise((r) => victim.once('exit', r));
    if (kind === 'learner') await startLearnerPatiently(stack);
    else await stack.startWorker(kind);
    k.back = Date.now();
    console.log(`[${((k.at - t0) / 1000).toFixed(0)}s] SIGKILL ${k.victim}, back after ${((k.back - k.at) / 1000).toFixed(1)}s (load ${load()})`);
    // Recovered: the next unit of work completed after the restart.
    void (async () => {
      while (progress === before || lastProgressAt < k.back!) {
        if (Date.now() > end + 600_000) return;
        await sleep(200);
      }
      k.recovered = lastProgressAt;
    })();
  };

  // gc while everything runs: every sweep deletes what nothing names and is older than the grace.
  const sweeps: { at: number; removed: number; bytesFreed: number; error?: string }[] = [];
  const guard = { refused: 0, notRefused: [] as string[] };
  // halo gc's own path, for namespace A alone: team B recorded itself as a writer of this store, so it must refuse.
  // Garbage to find: blobs nothing names, old enough to go, put before each sweep (the live ones must all stay).
  const planted: string[] = [];
  const plantGarbage = async () => {
    const store = new BlobStore(blobsDir);
    const old = (Date.now() - 2 * gcGraceMs - 60_000) / 1000;
    for (let i = 0; i < 5; i++) {
      const ref = await store.put(`garbage ${planted.length} of the soak at ${Date.now()}`, 'txt');
      utimesSync(store.pathOf(ref), old, old);
      planted.push(ref);
    }
  };
  const oneNamespaceSweep = async () => {
    try {
      const r = await gcBlobs({} as HaloConfig, stack.client, { home: stack.home, graceMs: MIN_GC_GRACE_MS, dryRun: false });
      guard.notRefused.push(`swept for ${stack.namespace} alone: removed ${r.removed}`);
    } catch (err) {
      if (/soak-b also writes to the blob store/.test((err as Error).message)) guard.refused++;
      else guard.notRefused.push((err as Error).message.slice(0, 200));
    }
  };
  let nextGc = gcEveryMs > 0 ? t0 + gcEveryMs : Infinity;
  const sweep = async () => {
    const at = Date.now();
    if (teamB) {
      await plantGarbage();
      await oneNamespaceSweep();
    }
    try {
      const r = await collectBlobGarbage({ blobsDir, rootPaths: [stack.home], rootTexts: allHistories(), graceMs: gcGraceMs });
      sweeps.push({ at, removed: r.removed, bytesFreed: r.bytesFreed });
      console.log(`[${((at - t0) / 1000).toFixed(0)}s] gc: removed ${r.removed} blobs (${formatBytes(r.bytesFreed)}), live ${r.live}, young ${r.young}`);
    } catch (err) {
      // gc refuses to guess (a history it could not read): nothing deleted, counted.
      sweeps.push({ at, removed: 0, bytesFreed: 0, error: (err as Error).message.slice(0, 200) });
      console.log(`[${((at - t0) / 1000).toFixed(0)}s] gc stopped: ${(err as Error).message.slice(0, 200)}`);
    }
  };

  let k = 0;
  let lastIteration = 0;
  while (Date.now() < end) {
    while (ep.inFlight.size < parallel) startEpisode(k++);
    const rows = metricsRows();
    if (rows.length > lastIteration) {
      for (let i = lastIteration; i < rows.length; i++) bump();
      lastIteration = rows.length;
      iterationsSeen = rows.length;
      blobBytesAtIteration.push({ iteration: rows.length, bytes: folderBytes(blobsDir) });
    }
    if (Date.now() >= nextKill) {
      await chaos();
      nextKill = Date.now() + chaosMin + random() * (chaosMax - chaosMin);
    }
    if (Date.now() >= nextGc) {
      await sweep();
      nextGc = Date.now() + gcEveryMs;
    }
    await sleep(500);
  }

  // Drain: stop the run (its current iteration finishes), let the episodes in flight finish.
  console.log(`[${((Date.now() - t0) / 1000).toFixed(0)}s] stopping: run ${runId} and ${ep.inFlight.size} episodes in flight`);
  await run.signal(stopSignal).catch(() => undefined);
  const drainDeadline = Date.now() + 10 * 60_000;
  const runResult = await Promise.race([
    run.result().then(
      (r) => r as { iterations: number },
      (err: Error & { cause?: Error & { cause?: Error } }) => {
        console.log(`the GRPO run failed: ${[err.message, err.cause?.message, err.cause?.cause?.message].filter(Boolean).join(' ← ').slice(0, 600)}`);
        return undefined;
      },
    ),
    sleep(10 * 60_000).then(() => undefined),
  ]);
  while (ep.inFlight.size > 0 && Date.now() < drainDeadline) await sleep(500);
  const lost = ep.inFlight.size;
  const rows = metricsRows();
  if (rows.length > lastIteration) blobBytesAtIteration.push({ iteration: rows.length, bytes: folderBytes(blobsDir) });
  iterationsSeen = rows.length;

  // Exactly once: adapters v1..vK, one metrics row per iteration.
  const runCk = join(stack.checkpoints, runId);
  const versions = existsSync(runCk)
    ? readdirSync(runCk)
        .filter((d) => /^v\d+$/.test(d))
        .map((d) => Number(d.slice(1)))
        .sort((a, b) => a - b)
    : [];
  const iters = rows.map((r) => r.iteration);
  const dupIters = iters.filter((x, i) => iters.indexOf(x) !== i);
  const contiguous = (xs: number[]) => xs.every((x, i) => x === i + 1);

  // Disk: growth per iteration, then a gc (nothing runs now: no grace needed) and the same per iteration.
  const before = folderBytes(blobsDir);
  const gc = await collectBlobGarbage({ blobsDir, rootPaths: [stack.home], rootTexts: allHistories(), graceMs: 0 });
  const after = folderBytes(blobsDir);
  // Lost: a blob that some history of either namespace names and the store no longer has.
  const store = new BlobStore(blobsDir);
  const named = new Set<string>();
  for await (const text of allHistories()) for (const m of text.matchAll(REF_PATTERN)) named.add(m[0]);
  const missing: string[] = [];
  for (const ref of named) if (!(await store.exists(ref))) missing.push(ref);
  const garbageLeft = (await Promise.all(planted.map((r) => store.exists(r)))).filter(Boolean).length;
  const its = Math.max(1, iterationsSeen);

  const recov = kills.filter((x) => x.recovered !== undefined).map((x) => (x.recovered! - x.at) / 1000);
  console.log('');
  console.log(`duration ${minutes} min, ${parallel} parallel episodes, GRPO N=${values.n}, chaos every ${chaosMin / 1000}-${chaosMax / 1000} s`);
  console.log(`episodes: started ${ep.started}, completed ${ep.completed}, failed ${ep.failed.length}, lost ${lost} (never finished)`);
  for (const f of ep.failed.slice(0, 5)) console.log(`  failed: ${f}`);
  console.log(`GRPO: ${iterationsSeen} iterations${runResult ? ` (run ended after ${runResult.iterations})` : ' (run failed, or did not end within 10 min of the stop)'}`);
  console.log(
    `adapter versions: ${versions.length ? `v${versions[0]}..v${versions.at(-1)}` : 'none'} (${versions.length}), ` +
      `${contiguous(versions) && versions.length === iterationsSeen ? 'each exactly once' : `NOT exactly once: ${versions.join(',')}`}`,
  );
  console.log(`metrics rows: ${rows.length}, ${dupIters.length === 0 && contiguous(iters) ? 'each iteration exactly once' : `NOT exactly once: ${iters.join(',')}`}`);
  console.log(`session rebuilds (independent episodes): ${ep.rebuilds}`);
  console.log(`kills: ${kills.length} (${kills.map((x) => x.victim.split(' ')[0]).join(', ') || 'none'})`);
  console.log(`recovery (kill → next episode or iteration done): p50 ${median(recov).toFixed(1)} s, p95 ${percentile(recov, 95).toFixed(1)} s over ${recov.length} kills`);
  console.log(
    `blob store: ${formatBytes(before)} after ${iterationsSeen} iterations and ${ep.completed} episodes = ${formatBytes(before / its)} per iteration; ` +
      `after halo gc ${formatBytes(after)} = ${formatBytes(after / its)} per iteration (freed ${formatBytes(gc.bytesFreed)}, ${gc.removed} blobs; ${gc.live} live)`,
  );
  for (const b of blobBytesAtIteration.slice(0, 12)) console.log(`  iteration ${b.iteration}: ${formatBytes(b.bytes)}`);
  if (gcEveryMs > 0) {
    const stopped = sweeps.filter((x) => x.error);
    console.log(
      `gc during the soak (every ${gcEveryMs / 1000} s, grace ${gcGraceMs / 1000} s): ${sweeps.length} sweeps, removed ` +
        `${sweeps.reduce((n, x) => n + x.removed, 0)} blobs (${formatBytes(sweeps.reduce((n, x) => n + x.bytesFreed, 0))}); ${stopped.length} stopped without deleting`,
    );
    console.log(`runs broken: ${runResult ? 0 : 1} (the GRPO run ${runResult ? 'ended by its stop signal' : 'did not end'}); episodes failed ${ep.failed.length}, lost ${lost}`);
  }
  if (teamB) {
    const inB = Math.floor(ep.started / 2);
    console.log(
      `shared home: namespaces ${stack.namespace} and ${teamB.namespace} (${inB} of ${ep.started} episodes); one-namespace sweeps refused ` +
        `${guard.refused} of ${sweeps.length}${guard.notRefused.length ? `, NOT refused: ${guard.notRefused.join('; ')}` : ''}; ` +
        `planted garbage ${planted.length} blobs, ${planted.length - garbageLeft} removed`,
    );
  }
  console.log(`blobs named by the histories: ${named.size}, missing from the store: ${missing.length}${missing.length ? ` (${missing.slice(0, 3).join(', ')})` : ''}`);
  printLoadAtEnd();
  await stack.stop();
  await policy.close();
  const guardFailed = teamB !== undefined && guard.notRefused.length > 0;
  if (lost > 0 || dupIters.length > 0 || missing.length > 0 || guardFailed || (gcEveryMs > 0 && (!runResult || ep.failed.length > 0))) process.exitCode = 1;
}

runBench(main);
