/**
 * What does step grouping cost in the browser? At step k, `runGroup` (workflows/episode-group.ts) forks N sessions
 * with `startSession({ replay: actionPath })`, all at once. MiniWoB++ has no storage snapshot to restore, so a
 * fork is always: new browser context → reset(task, seed) → replay the k actions → observe. This bench runs
 * that with an in-process SessionManager (as bench/episode-overhead.ts does, no Temporal) and prints, per k,
 * the wall time of N concurrent forks next to the time of one plain step on an existing session.
 *
 *   node --import tsx bench/fork-cost.ts [--repeats 5] [--n 8] [--ks 0,1,5,10] [--task click-button]
 *                                        [--action click|scroll]
 *
 * The replayed action is harmless and valid on every step: a click on empty page space outside the task
 * (grid 900,500 = CSS 360,112; the task is the 160x210 px box in the top-left), or a scroll down.
 * The episode must still be running after max(k)+1 actions (checked), so every replayed action does work.
 *
 * REAL mode (`--env real`): the local REAL-protocol test site (testing/fake-real-site.ts) with a fixed delay
 * before every answer (`--latency`, default 150 ms, a hosted clone's round trip). Per k, a parent session
 * takes k actions (a goto to the site root: one round trip each, state kept), then one fork of it is started
 * with `real.forkMode: replay` (reset + k actions) and one with `snapshot` (copy of the parent's storage,
 * checked against its /finish). At k = 0 both are a plain reset: there is nothing to copy.
 *
 *   node --import tsx bench/fork-cost.ts --env real [--repeats 3] [--ks 0,5,10,20] [--latency 150]
 */
import { cpus } from 'node:os';
import { parseArgs } from 'node:util';
import type { Action } from '../lib/model-io/actions';
import { parseRewardWeights } from '../lib/rewards/weights';
import type { StartSessionResult } from '../lib/episode/episode-types';
import { fmt, load, median, runBench } from './bench-run';
import { startInProcessSessions } from './in-process-sessions';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SessionManager } from '../activities/session';
import { BlobStore } from '../blob/store';
import type { StartSessionInput } from '../lib/episode/episode-types';
import { startFakeRealSite } from '../testing/fake-real-site';

const { values } = parseArgs({
  options: {
    repeats: { type: 'string', default: '5' },
    n: { type: 'string', default: '8' },
    ks: { type: 'string', default: '0,1,5,10' },
    task: { type: 'string', default: 'click-button' },
    seed: { type: 'string', default: '1' },
    action: { type: 'string', default: 'click' },
    env: { type: 'string', default: 'miniwob' },
    latency: { type: 'string', default: '150' },
  },
});
const repeats = Number(values.repeats);
const N = Number(values.n);
const ks = values.ks!.split(',').map(Number);
const spec = { env: 'miniwob' as const, task: values.task!, seed: Number(values.seed) };
const action: Action = values.action === 'scroll' ? { type: 'scroll', direction: 'down', amount: 300 } : { type: 'click', x: 900, y: 500, button: 'left', count: 1 };

const secs = (ms: number) => fmt(ms, 3);

async function main() {
  const sessions = await startInProcessSessions();
  const { manager } = sessions;
  const rewardWeights = parseRewardWeights({});
  const start = (k: number) => manager.start({ spec, replay: Array.from({ length: k }, () => action), episodeId: 'bench-fork', rewardWeights });

  const plainStep: number[] = [];
  const fork: Record<number, { all: number[]; each: number[]; single: number[]; loads: string[] }> = {};
  for (const k of ks) fork[k] = { all: [], each: [], single: [], loads: [] };

  try {
    // Warm-up: browser launch, page cache; and the check that the episode is still running after max(k)+1 actions.
    const kmax = Math.max(...ks);
    const w = await start(kmax);
    const out = await manager.step({ sessionId: w.sessionId, index: kmax, action, rewardState: w.rewardState });
    if (out.done || out.actionError) throw new Error(`the ${values.action} action is not harmless on ${spec.task}: done=${out.done} error=${out.actionError}`);
    await manager.close(w.sessionId);

    for (let r = 0; r < repeats; r++) {
      // One plain step: the same action on a live session (apply + settle + observe + reward), as stepSession does.
      const s = await start(0);
      let rewardState = s.rewardState;
      for (let i = 0; i < 3; i++) {
        const t = performance.now();
        const o = await manager.step({ sessionId: s.sessionId, index: i, action, rewardState });
        plainStep.push(performance.now() - t);
        rewardState = o.rewardState;
      }
      await manager.close(s.sessionId);

      // Alternate the order of k between repeats so that drift in the machine's load hits every k.
      const order = r % 2 ? [...ks].reverse() : ks;
      for (const k of order) {
        // N forks at once, like Promise.all over startSession in runGroup.
        const t0 = performance.now();
        const each: number[] = [];
        const forks: StartSessionResult[] = await Promise.all(
          Array.from({ length: N }, async () => {
            const t = performance.now();
            const f = await start(k);
            each.push(performance.now() - t);
            return f;
          }),
        );
        fork[k].all.push(performance.now() - t0);
        fork[k].each.push(...each);
        fork[k].loads.push(load());
        for (const f of forks) if (f.replayed !== k) throw new Error(`replayed ${f.replayed}, expected ${k}`);
        await Promise.all(forks.map((f) => manager.close(f.sessionId)));
        // One fork alone, for reference.
        const t1 = performance.now();
        const one = await start(k);
        fork[k].single.push(performance.now() - t1);
        await manager.close(one.sessionId);
        console.error(`repeat ${r + 1}/${repeats} k=${k}: ${N} forks ${secs(fork[k].all.at(-1)!)} s, one fork ${secs(fork[k].single.at(-1)!)} s (load ${load()})`);
      }
    }
  } finally {
    await sessions.close();
  }

  const step = median(plainStep);
  console.log(
    `fork cost: ${spec.task} seed ${spec.seed}, replayed action ${JSON.stringify(action)}, N=${N} concurrent forks, ` +
      `${repeats} repeats (medians); in-process SessionManager, one Chromium; ${cpus().length} CPUs; ${new Date().toISOString()}`,
  );
  console.log('MiniWoB++ has no storage snapshot: every fork is a new context + reset + replay of the k actions + observe.');
  console.log('');
  console.log(
    `| k (actions replayed) | ${N} forks at once, wall s | per fork latency s (in the ${N}) | 1 fork alone s | one plain step s | ${N} forks / plain step | load avg 1/5/15 min |`,
  );
  console.log('|---|---|---|---|---|---|---|');
  for (const k of ks) {
    const f = fork[k];
    const all = median(f.all);
    console.log(`| ${k} | ${secs(all)} | ${secs(median(f.each))} | ${secs(median(f.single))} | ${secs(step)} | ${(all / step).toFixed(1)}x | ${f.loads.at(-1)} |`);
  }
  if (ks.length >= 2) {
    const [a, b] = [ks[0], ks[ks.length - 1]];
    const slope = (median(fork[b].all) - median(fork[a].all)) / (b - a);
    const slope1 = (median(fork[b].single) - median(fork[a].single)) / (b - a);
    console.log('');
    console.log(`replay slope: ${secs(slope1)} s per replayed action for one fork, ${secs(slope)} s per action for ${N} concurrent forks (k=${a}..${b})`);
  }
  console.log(`plain step: median of ${plainStep.length} steps ${secs(step)} s; load avg at the end ${load()}`);
}

async function mainReal() {
  const site = await startFakeRealSite({ latencyMs: Number(values.latency) });
  const blobRoot = await mkdtemp(join(tmpdir(), 'halo-fork-bench-'));
  const blobs = new BlobStore(blobRoot);
  const manager = new SessionManager({
    blobs,
    miniwobBaseUrl: 'http://127.0.0.1:9/',
    miniwobTasks: [],
    workerTaskQueue: 'in-process',
    workerName: 'bench',
    realOriginOverride: `${site.origin}/`,
  });
  const rewardWeights = parseRewardWeights({});
  const step: Action = { type: 'goto', url: `${site.origin}/` };
  const input = (episodeId: string, k: number, mode: 'snapshot' | 'replay'): StartSessionInput => ({
    spec: { env: 'real', task: 'gomail-18', seed: 0 },
    replay: Array.from({ length: k }, () => step),
    episodeId,
    rewardWeights,
    envOptions: { realRunId: '0', evaluateAtCap: false, realForkMode: mode },
  });
  const cost: Record<number, { replay: number[]; snapshot: number[]; kinds: string[] }> = {};
  for (const k of ks) cost[k] = { replay: [], snapshot: [], kinds: [] };
  const timed = async (i: StartSessionInput) => {
    const t = performance.now();
    const r = await manager.start(i);
    const ms = performance.now() - t;
    await manager.close(r.sessionId);
    return { ms, r };
  };
  try {
    await timed(input('warm-up', 0, 'replay'));
    for (let rep = 0; rep < repeats; rep++) {
      const order = rep % 2 ? [...ks].reverse() : ks;
      for (const k of order) {
        const episodeId = `bench-${rep}-${k}`;
        const parent = await manager.start(input(episodeId, 0, 'replay'));
        let rewardState = parent.rewardState;
        for (let i = 0; i < k; i++) rewardState = (await manager.step({ sessionId: parent.sessionId, index: i, action: step, rewardState })).rewardState;
        // Alternate which mode goes first, so the page cache favours neither.
        const modes: ('replay' | 'snapshot')[] = rep % 2 ? ['snapshot', 'replay'] : ['replay', 'snapshot'];
        for (const mode of modes) {
          const { ms, r } = await timed(input(episodeId, k, mode));
          cost[k]![mode].push(ms);
          if (mode === 'snapshot') cost[k]!.kinds.push(r.fork ?? 'reset');
          if (mode === 'replay' && r.replayed !== k) throw new Error(`replayed ${r.replayed}, expected ${k}`);
        }
        await manager.close(parent.sessionId);
        console.error(`repeat ${rep + 1}/${repeats} k=${k}: replay ${secs(cost[k]!.replay.at(-1)!)} s, snapshot ${secs(cost[k]!.snapshot.at(-1)!)} s (${cost[k]!.kinds.at(-1)})`);
      }
    }
  } finally {
    await manager.shutdown();
    await site.close();
    await rm(blobRoot, { recursive: true, force: true });
  }
  console.log(
    `fork cost, REAL: local REAL-protocol site with ${values.latency} ms before every answer, task gomail-18, one fork started next to a ` +
      `live parent at step k, ${repeats} repeats (medians); in-process SessionManager, one Chromium; ${cpus().length} CPUs; ${new Date().toISOString()}`,
  );
  console.log('');
  console.log('| k (parent actions) | replay fork s | snapshot fork s | replay / snapshot | snapshot forks kept |');
  console.log('|---|---|---|---|---|');
  for (const k of ks) {
    const c = cost[k]!;
    const kept = c.kinds.filter((x) => x === 'snapshot').length;
    console.log(
      `| ${k} | ${secs(median(c.replay))} | ${secs(median(c.snapshot))} | ${(median(c.replay) / median(c.snapshot)).toFixed(1)}x | ${k === 0 ? 'n/a (reset)' : `${kept}/${c.kinds.length}`} |`,
    );
  }
  console.log(`load avg at the end ${load()}`);
}

runBench(values.env === 'real' ? mainReal : main);
