/**
 * How much of a GRPO iteration is orchestration? A real run on a private stack (Temporal dev server, control
 * and browser workers, the Python learner with the colocated tiny-random Qwen3-VL), step grouping with
 * N = 8. From the Temporal histories of every trainGrpo run (one run = one iteration; first event →
 * continue-as-new / completion) and of its child episodes, the share of the iteration's wall time during
 * which no activity ran anywhere in the run:
 *
 *   share = 1 − |∪ activity intervals (ActivityTaskStarted → ActivityTaskCompleted, parent + children)| / wall
 *
 * Two policies, each one training run, measured one after the other on the same stack:
 * - `colocated`: policy.backend colocated, tiny-random (as test/integration/train.test.ts). Its random text
 *   almost never parses into an action, so most candidates are invalid and open no fork;
 * - `scripted`: the same learner for the update, but candidates from the local OpenAI-compatible scripted
 *   model of the tests (testing/fake-policy-server.ts). On tasks it cannot solve it answers a valid
 *   `wait 0`, so all N candidates of every step run in forked sessions (the browser-heavy path).
 *
 *   node --import tsx bench/grpo-orchestration.ts [--iterations 3] [--episodes 2] [--parallelism 2] [--n 8]
 *        [--max-steps 3] [--task click-checkboxes] [--modes colocated,scripted]
 *
 * Each mode runs iterations+1 iterations; the first (warm-up: fresh processes) is printed but left out of
 * the medians.
 */
import { parseArgs } from 'node:util';
import type { HaloConfig } from '../lib/config/config';
import { startOrAttachTrain } from '../client/train';
import { startFakePolicyServer, type FakePolicyServer } from '../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../testing/stack';
import { stackGrpoConfig, scriptedPolicy } from '../testing/grpo-config';
import { fmt, load, median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';
import { activityInterval, mergeIntervals, readChain, readIteration, unionLength, type Interval, type Iteration } from './temporal-history';
import { stackPromptIds } from '../testing/model-prompt-ids';

const { values } = parseArgs({
  options: {
    iterations: { type: 'string', default: '3' },
    episodes: { type: 'string', default: '2' },
    parallelism: { type: 'string', default: '2' },
    n: { type: 'string', default: '8' },
    'max-steps': { type: 'string', default: '3' },
    task: { type: 'string', default: 'click-checkboxes' },
    modes: { type: 'string', default: 'colocated,scripted' },
  },
});
const measured = Number(values.iterations);
const modes = values.modes!.split(',') as ('colocated' | 'scripted')[];

function config(stack: TestStack, mode: 'colocated' | 'scripted', runId: string, fake?: FakePolicyServer): HaloConfig {
  return stackGrpoConfig(stack, {
    runId,
    iterations: measured + 1,
    maxSteps: Number(values['max-steps']),
    policy: mode === 'scripted' ? scriptedPolicy(fake!.url) : undefined,
    train: {
      episodesPerIteration: Number(values.episodes),
      parallelism: Number(values.parallelism),
      tasks: [values.task!],
      numGenerations: Number(values.n),
    },
  });
}

interface IterationStats {
  iteration: number;
  wall: number;
  busy: number;
  outside: number;
  share: number;
  steps: number;
  forks: number;
  load: string;
  it: Iteration;
}

function analyse(it: Iteration, iteration: number, loadAt: (t: number) => string): IterationStats {
  const { start, end } = it.parent;
  const wall = end - start;
  const intervals = it.activities.map((a) => activityInterval(a)).filter((x): x is Interval => !!x);
  const busy = unionLength(intervals, start, end);
  const forks = it.activities.filter((a) => a.type === 'startSession' && a.outcome === 'completed').length - it.children.length;
  const steps = it.activities.filter((a) => a.type === 'sample_actions' || a.type === 'samplePolicy').length;
  return { iteration, wall, busy, outside: wall - busy, share: (wall - busy) / wall, steps, forks, load: loadAt(end), it };
}

/** Where the time outside activities goes: each gap in the union, labelled by the activities on its two sides. */
function gapLabels(it: Iteration): Map<string, number> {
  const { start, end } = it.parent;
  const acts = it.activities.filter((a) => activityInterval(a));
  const merged = mergeIntervals(
    acts.map((a) => activityInterval(a)!),
    start,
    end,
  );
  const out = new Map<string, number>();
  let prevEnd = start;
  let prevLabel = 'run start';
  for (const [a, b] of [...merged, [end, end] as Interval]) {
    if (a > prevEnd) {
      const next = a === end ? 'run end' : (acts.find((x) => x.started === a)?.type ?? '?');
      const label = `${prevLabel} → ${next}`;
      out.set(label, (out.get(label) ?? 0) + (a - prevEnd));
    }
    prevEnd = b;
    prevLabel = acts.filter((x) => x.ended === b).map((x) => x.type)[0] ?? '?';
  }
  return out;
}

function report(mode: string, stats: IterationStats[]) {
  const m = stats.slice(1);
  console.log('');
  console.log(`### ${mode}: per iteration (iteration 1 = warm-up, left out of the medians)`);
  console.log('');
  console.log('| iteration | wall s | activities busy s (union) | outside activities s | outside share | policy calls | forks run | load avg 1/5/15 at its end |');
  console.log('|---|---|---|---|---|---|---|---|');
  for (const s of stats) {
    console.log(
      `| ${s.iteration}${s.iteration === 1 ? ' (warm-up)' : ''} | ${fmt(s.wall)} | ${fmt(s.busy)} | ${fmt(s.outside)} | ${(s.share * 100).toFixed(1)}% | ${s.steps} | ${s.forks} | ${s.load} |`,
    );
  }
  const share = median(m.map((s) => s.share));
  console.log(
    `| **median 2..${stats.length}** | ${fmt(median(m.map((s) => s.wall)))} | ${fmt(median(m.map((s) => s.busy)))} | ${fmt(median(m.map((s) => s.outside)))} | **${(share * 100).toFixed(1)}%** | | | |`,
  );
  console.log('');
  console.log(`target: outside share < 5% → ${share < 0.05 ? 'MET' : 'NOT MET'} (${mode}, median ${(share * 100).toFixed(1)}%)`);

  // Per activity type, over the measured iterations.
  const types = new Map<string, { count: number; sum: number; durs: number[]; queue: number[]; busy: number[]; other: number }>();
  for (const s of m) {
    const perType = new Map<string, Interval[]>();
    for (const a of s.it.activities) {
      const t = types.get(a.type) ?? { count: 0, sum: 0, durs: [], queue: [], busy: [], other: 0 };
      types.set(a.type, t);
      const iv = activityInterval(a);
      if (a.started !== undefined) t.queue.push(a.started - a.scheduled);
      if (!iv) {
        t.other++;
        continue;
      }
      t.count++;
      t.sum += iv[1] - iv[0];
      t.durs.push(iv[1] - iv[0]);
      perType.set(a.type, [...(perType.get(a.type) ?? []), iv]);
    }
    for (const [type, ivs] of perType) types.get(type)!.busy.push(unionLength(ivs, s.it.parent.start, s.it.parent.end) / s.wall);
  }
  console.log('');
  console.log(`### ${mode}: per activity type (iterations 2..${stats.length}; per iteration = total / ${m.length})`);
  console.log('');
  console.log(
    '| activity | runs per iteration | activity-seconds per iteration | median run s | busy share of wall (union of that type, median) | median schedule→start s | not completed |',
  );
  console.log('|---|---|---|---|---|---|---|');
  const rows = [...types.entries()].sort((a, b) => b[1].sum - a[1].sum);
  for (const [type, t] of rows) {
    console.log(
      `| ${type} | ${(t.count / m.length).toFixed(1)} | ${fmt(t.sum / m.length)} | ${fmt(median(t.durs), 3)} | ${(median(t.busy.length ? t.busy : [0]) * 100).toFixed(1)}% | ${fmt(median(t.queue), 3)} | ${t.other} |`,
    );
  }

  // Where the outside-activity time goes.
  const gaps = new Map<string, number>();
  for (const s of m) for (const [k, v] of gapLabels(s.it)) gaps.set(k, (gaps.get(k) ?? 0) + v);
  const totalOutside = m.reduce((x, s) => x + s.outside, 0);
  console.log('');
  console.log(`### ${mode}: time outside activities, by the activities on either side of the gap (iterations 2..${stats.length})`);
  console.log('');
  console.log('| gap (last activity to end → next to start) | s per iteration | of the outside time |');
  console.log('|---|---|---|');
  for (const [k, v] of [...gaps.entries()].sort((a, b) => b[1] - a[1]).slice(0, 8)) {
    console.log(`| ${k} | ${fmt(v / m.length, 3)} | ${((v / totalOutside) * 100).toFixed(0)}% |`);
  }
  const wfts = m.flatMap((s) => [s.it.parent, ...s.it.children].flatMap((r) => r.workflowTasks)).filter((t) => t.completed !== undefined);
  console.log('');
  console.log(
    `workflow tasks (parent + children): ${(wfts.length / m.length).toFixed(0)} per iteration, median scheduled→completed ${fmt(median(wfts.map((t) => t.completed! - t.scheduled)), 3)} s, ` +
      `median started→completed ${fmt(median(wfts.filter((t) => t.started).map((t) => t.completed! - t.started!)), 3)} s`,
  );
}

async function main() {
  printBenchHeader('grpo-orchestration');
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  const fake = modes.includes('scripted') ? await startFakePolicyServer({ kind: 'scripted' }, { promptIds: stackPromptIds(stack.home) }) : undefined;
  const loads: { t: number; l: string }[] = [];
  const sampler = setInterval(() => loads.push({ t: Date.now(), l: load() }), 1000);
  const loadAt = (t: number) => (loads.find((x) => x.t >= t) ?? loads[loads.length - 1])?.l ?? load();
  try {
    for (const mode of modes) {
      const runId = `bench-orch-${mode}-${Date.now().toString(36)}`;
      const cfg = config(stack, mode, runId, fake);
      const t0 = Date.now();
      const { handle } = await startOrAttachTrain(stack.client, cfg);
      const firstRunId = (await handle.describe()).runId;
      await handle.result();
      console.error(`${mode}: ${measured + 1} iterations in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
      const chain = await readChain(stack.client, runId, firstRunId);
      const stats: IterationStats[] = [];
      for (const [i, run] of chain.entries()) stats.push(analyse(await readIteration(stack.client, run), i + 1, loadAt));
      console.log('');
      console.log(
        `## mode ${mode}: ${cfg.train.episodesPerIteration} episodes/iteration (parallelism ${cfg.train.parallelism}), task ${values.task}, ` +
          `N=${cfg.train.numGenerations}, step grouping, maxSteps ${cfg.episode.maxSteps}, policy ${cfg.policy.backend}/${cfg.policy.model}, learner tiny-random`,
      );
      report(mode, stats);
    }
  } finally {
    clearInterval(sampler);
    await fake?.close();
    await stack.stop();
  }
  printLoadAtEnd();
}

runBench(main);
