/**
 * What does step grouping cost in the browser? At step k, `runGroup` (workflows/episode.ts) forks N sessions
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
 */
import { cpus } from 'node:os';
import { parseArgs } from 'node:util';
import type { Action } from '../lib/actions';
import { parseRewardWeights } from '../lib/rewards/weights';
import type { StartSessionResult } from '../lib/episode-types';
import { fmt, load, median, runBench } from './bench-run';
import { startInProcessSessions } from './in-process-sessions';

const { values } = parseArgs({
  options: {
    repeats: { type: 'string', default: '5' },
    n: { type: 'string', default: '8' },
    ks: { type: 'string', default: '0,1,5,10' },
    task: { type: 'string', default: 'click-button' },
    seed: { type: 'string', default: '1' },
    action: { type: 'string', default: 'click' },
  },
});
const repeats = Number(values.repeats);
const N = Number(values.n);
const ks = values.ks!.split(',').map(Number);
const spec = { env: 'miniwob' as const, task: values.task!, seed: Number(values.seed) };
const action: Action =
  values.action === 'scroll'
    ? { type: 'scroll', direction: 'down', amount: 300 }
    : { type: 'click', x: 900, y: 500, button: 'left', count: 1 };

const secs = (ms: number) => fmt(ms, 3);

async function main() {
  const sessions = await startInProcessSessions();
  const { manager } = sessions;
  const rewardWeights = parseRewardWeights({});
  const start = (k: number) =>
    manager.start({ spec, replay: Array.from({ length: k }, () => action), episodeId: 'bench-fork', rewardWeights });

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
  console.log(`| k (actions replayed) | ${N} forks at once, wall s | per fork latency s (in the ${N}) | 1 fork alone s | one plain step s | ${N} forks / plain step | load avg 1/5/15 min |`);
  console.log('|---|---|---|---|---|---|---|');
  for (const k of ks) {
    const f = fork[k];
    const all = median(f.all);
    console.log(
      `| ${k} | ${secs(all)} | ${secs(median(f.each))} | ${secs(median(f.single))} | ${secs(step)} | ${(all / step).toFixed(1)}x | ${f.loads.at(-1)} |`,
    );
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

runBench(main);
