import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { renderChartSvg } from '../../client/report-charts';
import { loadConfigFile } from '../../host/config-file';
import { parseConfig } from '../../lib/config/config';
import { summarizeGroup, type EvalEpisodeRecord, type EvalSummaryRow } from '../../lib/eval/eval-summary';
import {
  comparisonProblems,
  cumulativeEnvSteps,
  curveSpec,
  evalCurve,
  methodRow,
  methodsMarkdown,
  parseMethods,
  parseRowConfigs,
  rowConfigProblems,
  sampleEfficiencySpec,
  taskThresholds,
  type MethodsReport,
  type TaskEvalEpisode,
} from '../../bench/methods-table';
import { parseMetricsLine, type MetricsLine } from '../../lib/training/run-metrics';
import { TIME, grpo } from '../helpers/metrics-lines';

function mcts(iteration: number, simulations: number, evalRate?: number): MetricsLine {
  return parseMetricsLine(
    JSON.stringify({
      run_id: 'm',
      iteration,
      time: TIME,
      algorithm: 'mcts',
      success_rate: 0.5,
      mean_return: 0.5,
      loss: null,
      grad_norm: null,
      adapter_version: null,
      num_episodes: 2,
      seconds: { search: 30, update: 4 },
      ...(evalRate !== undefined ? { eval: { success_rate: evalRate, mean_return: 0, episodes: 16 } } : {}),
      mcts: {
        simulations,
        nodes: 10,
        pairs: 0,
        mean_abs_delta_q: null,
        pairs_with_ref_logprobs: 0,
        reward_margin: null,
        accuracy: null,
        update_skipped: true,
        candidates: 10,
        invalid_candidates: 0,
        critic_calls: 0,
        critic_failures: 0,
        session_rebuilds: 0,
      },
    }),
    1,
  );
}

/** A final-evaluation summary row with `successes` of `n`. */
function summary(mode: string, successes: number, n: number): EvalSummaryRow {
  const eps: EvalEpisodeRecord[] = Array.from({ length: n }, (_, i) => ({
    mode,
    task: 't',
    site: 'miniwob',
    seed: i,
    workflowId: `w${i}`,
    success: i < successes,
    reward: i < successes ? 1 : 0,
    shapedReturn: 0,
    steps: 1,
    validActions: 1,
    actionValidity: 1,
    done: true,
    reason: null,
  }));
  return summarizeGroup(mode, 'miniwob', eps);
}

function report(rows: MethodsReport['rows'], o: Partial<MethodsReport> = {}): MethodsReport {
  return {
    command: 'node --import tsx bench/methods.ts --tag t1',
    env: 'miniwob',
    tasks: ['click-a', 'click-b'],
    seeds: [100000, 100001],
    threshold: 0.8,
    search: null,
    rows,
    perTask: { ok: true },
    notes: [],
    ...o,
  };
}

test('measured env steps: cumulative sums in iteration order, threshold at the first evaluation reaching 0.8', () => {
  // Out of order on purpose: the sums follow the iterations.
  const rows = [grpo(3, { env_steps: 20, evalRate: 0.8 }), grpo(1, { env_steps: 10, evalRate: 0.25 }), grpo(4, { env_steps: 5, evalRate: 1 }), grpo(2, { env_steps: 15 })];
  assert.deepEqual(
    cumulativeEnvSteps(rows).map((c) => [c.iteration, c.envSteps, c.estimated]),
    [
      [1, 10, false],
      [2, 25, false],
      [3, 45, false],
      [4, 50, false],
    ],
  );
  assert.deepEqual(
    evalCurve(rows).map((p) => [p.iteration, p.envSteps, p.successRate]),
    [
      [1, 10, 0.25],
      [3, 45, 0.8],
      [4, 50, 1],
    ],
  );
  const r = methodRow({ method: 'grpo-step', runId: 'x-grpo-step', metrics: rows, greedy: summary('grpo-step', 12, 16) });
  assert.equal(r.envSteps, 50);
  assert.equal(r.envStepsEstimated, false);
  assert.equal(r.stepsToThreshold, 45, 'exactly 0.8 counts as reached');
  assert.equal(r.iterations, 4);
  assert.equal(r.trainingEpisodes, 16);
  assert.equal(r.wallSeconds, 4 * 12.5);
  assert.equal(r.learnerSeconds, 8);
  assert.equal(methodRow({ method: 'grpo-step', metrics: rows }, 0.9).stepsToThreshold, 50, 'a higher threshold is met later');
});

test('without env_steps the numbers are estimates, marked as such', () => {
  // GRPO: episode_length × num_episodes = 2.5 × 4 = 10; a later measured row keeps the sum an estimate.
  const rows = [grpo(1, { evalRate: 0.5 }), grpo(2, { env_steps: 7, evalRate: 0.9 })];
  const r = methodRow({ method: 'grpo-episode', metrics: rows });
  assert.equal(r.envSteps, 17);
  assert.equal(r.envStepsEstimated, true);
  assert.equal(r.stepsToThreshold, 17);
  assert.equal(r.stepsToThresholdEstimated, true);
  // MCTS: one step per simulation.
  const m = methodRow({ method: 'mcts-dpo', metrics: [mcts(1, 16, 0.5), mcts(2, 16, 0.75), mcts(3, 12, 0.875)] });
  assert.equal(m.envSteps, 44);
  assert.equal(m.envStepsEstimated, true);
  assert.equal(m.stepsToThreshold, 44);
  assert.equal(m.trainingEpisodes, 6);
  const measured = methodRow({ method: 'grpo-step', metrics: [grpo(1, { env_steps: 30, evalRate: 0.9 })] });
  const md = methodsMarkdown(report([r, m, measured]));
  const line = (method: string) => md.split('\n').find((l) => l.startsWith(`| ${method} |`))!;
  assert.match(line('grpo-episode'), /\| ~17 \|.*\| ~17 \| not recorded \|$/);
  assert.match(line('mcts-dpo'), /\| 6 searches \| ~44 \|/);
  assert.match(line('grpo-step'), /\| 30 \|.*\| 30 \| not recorded \|$/, 'measured numbers carry no mark');
  assert.match(md, /~: estimated/);
  assert.doesNotMatch(methodsMarkdown(report([measured])), /~: estimated/, 'no estimate, no footnote');
});

test('sessions and replays: summed when recorded, a lower bound when only some rows have them', () => {
  const all = methodRow({ method: 'grpo-step', metrics: [grpo(1, { sessions_opened: 5, replayed_actions: 3 }), grpo(2, { sessions_opened: 6, replayed_actions: 4 })] });
  assert.equal(all.browserSessions, 11);
  assert.equal(all.browserSessionsPartial, false);
  assert.equal(all.replayedActions, 7);
  const some = methodRow({ method: 'grpo-step', metrics: [grpo(1), grpo(2, { sessions_opened: 6 })] });
  assert.equal(some.browserSessions, 6);
  assert.equal(some.browserSessionsPartial, true);
  const none = methodRow({ method: 'grpo-step', metrics: [grpo(1)] });
  assert.equal(none.browserSessions, null);
  // Sessions to the threshold: opened up to the first evaluation that reached it, not after.
  const reached = methodRow({
    method: 'grpo-anchor',
    metrics: [grpo(1, { sessions_opened: 32, evalRate: 0 }), grpo(2, { sessions_opened: 32, evalRate: 1 }), grpo(3, { sessions_opened: 32, evalRate: 1 })],
  });
  assert.equal(reached.sessionsToThreshold, 64);
  assert.match(methodsMarkdown(report([reached])), /\| 96 \|.*\| 64 \|$/m);
  assert.equal(methodRow({ method: 'grpo-anchor', metrics: [grpo(1, { sessions_opened: 32, evalRate: 0.5 })] }).sessionsToThreshold, null, 'never reached');
  assert.equal(
    methodRow({ method: 'grpo-anchor', metrics: [grpo(1, { evalRate: 0.5 }), grpo(2, { sessions_opened: 6, evalRate: 1 })] }).sessionsToThreshold,
    null,
    'an iteration before it did not count',
  );
  const md = methodsMarkdown(report([all, some, none]));
  assert.match(md, /\| 11 \|/);
  assert.match(md, /\| ≥6 \|/);
  assert.match(md, /\| not recorded \|/);
});

test('the table: command first, failed rows kept, not reached vs not evaluated, search column only with search', () => {
  const base = methodRow({ method: 'base', metrics: [], greedy: summary('base', 2, 16), search: summary('base-search', 4, 16) });
  const failed = methodRow({
    method: 'grpo-anchor',
    runId: 'x-grpo-anchor',
    metrics: [grpo(1, { env_steps: 9, evalRate: 0.1 })],
    failed: 'run x-grpo-anchor failed: learner out of memory',
  });
  const never = methodRow({
    method: 'grpo-step',
    metrics: [grpo(1, { env_steps: 9, evalRate: 0.5 })],
    greedy: summary('grpo-step', 8, 16),
    searchFailed: 'not in evaluation t1-eval',
  });
  const unevaluated = methodRow({ method: 'mcts-dpo', metrics: [mcts(1, 16)], greedy: summary('mcts-dpo', 16, 16) });
  const md = methodsMarkdown(report([base, failed, never, unevaluated], { search: { simulations: 16 } }));
  const lines = md.split('\n');
  assert.equal(lines[0], 'node --import tsx bench/methods.ts --tag t1');
  assert.match(lines[2], /\| with test-time MCTS \(16 sims\/step\) \|/);
  const row = (method: string) => lines.find((l) => l.startsWith(`| ${method} |`))!.split(' | ');
  // base: 2/16 = 12.5%, Wilson interval from lib/eval/eval-summary; no training numbers.
  assert.match(row('base')[1], /^12\.5% \(\d+\.\d–\d+\.\d%\), 2\/16$/);
  assert.match(row('base')[2], /^25\.0% .*4\/16$/);
  assert.deepEqual(row('base').slice(3, 8), ['–', '–', '–', '–', '–']);
  assert.equal(row('grpo-anchor')[1], 'failed: run x-grpo-anchor failed: learner out of memory');
  assert.equal(row('grpo-anchor')[2], 'failed: run x-grpo-anchor failed: learner out of memory');
  assert.equal(row('grpo-anchor')[4], '9', 'a failed run still shows what it trained');
  assert.equal(row('grpo-step')[2], 'failed: not in evaluation t1-eval');
  assert.match(lines.find((l) => l.startsWith('| grpo-step |'))!, /\| not reached \|$/);
  assert.match(lines.find((l) => l.startsWith('| mcts-dpo |'))!, /\| not evaluated \|$/);
  assert.doesNotMatch(methodsMarkdown(report([base])), /test-time MCTS \(/);
});

test('per task: the steps at the first evaluation where that task reached the threshold', () => {
  const rows = [grpo(1, { env_steps: 10, evalRate: 0.5 }), grpo(2, { env_steps: 10, evalRate: 0.75 }), grpo(3, { env_steps: 10, evalRate: 0.75 })];
  const ep = (iteration: number, task: string, wins: number, of: number): TaskEvalEpisode[] => Array.from({ length: of }, (_, i) => ({ iteration, task, success: i < wins }));
  const episodes = [
    ...ep(1, 'a', 4, 5),
    ...ep(1, 'b', 1, 5),
    ...ep(2, 'a', 5, 5),
    ...ep(2, 'b', 3, 5),
    ...ep(3, 'a', 5, 5),
    ...ep(3, 'b', 4, 5),
    ...ep(1, 'c', 0, 5),
    ...ep(2, 'c', 3, 5),
    ...ep(3, 'c', 1, 5),
  ];
  assert.deepEqual(
    taskThresholds(rows, episodes, 0.8).map((t) => [t.task, t.envSteps]),
    [
      ['a', 10],
      ['b', 30],
      ['c', null],
    ],
  );
  const r = methodRow({ method: 'grpo-step', metrics: rows, taskEpisodes: episodes });
  assert.equal(r.stepsToThreshold, null, 'over all tasks it never reached 0.8');
  assert.deepEqual(
    r.taskThresholds!.map((t) => t.envSteps),
    [10, 30, null],
  );
});

test('the charts: curve points per method, sample efficiency per task or over all tasks with the reason', async () => {
  const step = methodRow({
    method: 'grpo-step',
    metrics: [grpo(1, { env_steps: 10, evalRate: 0.5 }), grpo(2, { env_steps: 20, evalRate: 0.9 })],
    taskEpisodes: [
      { iteration: 1, task: 'click-a', success: true },
      { iteration: 1, task: 'click-b', success: false },
      { iteration: 2, task: 'click-a', success: true },
      { iteration: 2, task: 'click-b', success: true },
    ],
  });
  const dpo = methodRow({ method: 'mcts-dpo', metrics: [mcts(1, 16, 0.25)], taskEpisodes: [{ iteration: 1, task: 'click-a', success: false }] });
  const base = methodRow({ method: 'base', metrics: [] });
  const rep = report([base, step, dpo]);
  const curve = curveSpec(rep) as { data: { values: { method: string; env_steps: number; success_rate: number }[] } };
  assert.deepEqual(
    curve.data.values.map((v) => [v.method, v.env_steps, v.success_rate]),
    [
      ['grpo-step', 10, 0.5],
      ['grpo-step', 30, 0.9],
      ['mcts-dpo', 16, 0.25],
    ],
  );
  const perTask = sampleEfficiencySpec(rep) as {
    title: { text: string; subtitle: string[] };
    data: { values: { method: string; task: string; env_steps: number | null; label: string }[] };
  };
  assert.match(perTask.title.text, /per method and task/);
  assert.deepEqual(
    perTask.data.values.map((v) => [v.method, v.task, v.env_steps, v.label]),
    [
      ['grpo-step', 'click-a', 10, ''],
      ['grpo-step', 'click-b', 30, ''],
      ['mcts-dpo', 'click-a', null, 'not reached'],
      // A task of the comparison that the run never evaluated still gets its mark.
      ['mcts-dpo', 'click-b', null, 'not evaluated'],
    ],
  );
  assert.match(perTask.title.subtitle.join(' '), /estimated .* for mcts-dpo/);
  const pooled = sampleEfficiencySpec(report([base, step, dpo], { perTask: { ok: false, reason: 'evaluation episodes not readable from Temporal' } })) as typeof perTask;
  assert.match(pooled.title.text, /per method over all tasks$/);
  assert.equal(pooled.title.subtitle[0], 'not per task: evaluation episodes not readable from Temporal');
  assert.deepEqual(
    pooled.data.values.map((v) => [v.method, v.task, v.env_steps]),
    [
      ['grpo-step', 'all tasks', 30],
      ['mcts-dpo', 'all tasks', null],
    ],
  );
  // Both specs compile and render (vega-lite → vega → SVG), as `halo report` renders its charts.
  for (const spec of [curveSpec(rep), sampleEfficiencySpec(rep), pooled]) {
    const svg = await renderChartSvg(spec as Parameters<typeof renderChartSvg>[0]);
    assert.match(svg, /<svg/);
    assert.match(svg, /grpo-step/);
  }
});

test('--row-config: ROW=FILE pairs of trained rows among --rows, each once', () => {
  const rows = parseMethods('base,grpo-step,grpo-anchor,mcts-dpo');
  assert.deepEqual([...parseRowConfigs('', rows)], []);
  assert.deepEqual(
    [...parseRowConfigs(' grpo-anchor=configs/a.yaml , mcts-dpo=m.yaml', rows)],
    [
      ['grpo-anchor', 'configs/a.yaml'],
      ['mcts-dpo', 'm.yaml'],
    ],
  );
  assert.throws(() => parseRowConfigs('grpo-anchor', rows), /"grpo-anchor" is not ROW=FILE/);
  assert.throws(() => parseRowConfigs('grpo-anchor=', rows), /not ROW=FILE/);
  assert.throws(() => parseRowConfigs('=x.yaml', rows), /not ROW=FILE/);
  assert.throws(() => parseRowConfigs('grpo-episode=x.yaml', rows), /row "grpo-episode" is not among --rows/);
  assert.throws(() => parseRowConfigs('base=x.yaml', rows), /base trains nothing/);
  assert.throws(() => parseRowConfigs('grpo-step=a.yaml,grpo-step=b.yaml', rows), /given twice/);
});

test("a row's own config must train the same policy on the same tasks and be evaluated on the same seeds", () => {
  const tasks = ['click-a'];
  const seeds = [100000, 100001];
  const shared = parseConfig({ train: { tasks, heldOutTasks: tasks, evalSeeds: seeds, evalEvery: 4 }, mcts: { tasks, evalSeeds: seeds, evalEvery: 4 } });
  const own = (o: { train?: object; policy?: object; mcts?: object }) =>
    parseConfig({
      policy: o.policy ?? {},
      train: { tasks, heldOutTasks: tasks, evalSeeds: seeds, evalEvery: 4, ...o.train },
      mcts: { tasks, evalSeeds: seeds, evalEvery: 4, ...o.mcts },
    });
  assert.deepEqual(rowConfigProblems(shared, own({ train: { learningRate: 0.012, iterations: 16 } }), 'grpo-anchor'), [], 'its own learning rate and iterations');
  assert.match(rowConfigProblems(shared, own({ train: { evalSeeds: [100000, 100002] } }), 'grpo-anchor').join('\n'), /train\.evalSeeds \[100000,100002\] differs/);
  assert.match(rowConfigProblems(shared, own({ train: { tasks: ['click-b'] } }), 'grpo-anchor').join('\n'), /train\.tasks \["click-b"\] differs/);
  assert.match(rowConfigProblems(shared, own({ policy: { temperature: 0.5, actions: ['click_element'], constrained: true } }), 'grpo-step').join('\n'), /policy\.actions/);
  assert.match(rowConfigProblems(shared, own({ mcts: { tasks: ['click-b'] } }), 'mcts-dpo').join('\n'), /mcts\.tasks \["click-b"\] differs/);
  assert.match(rowConfigProblems(shared, own({ train: { evalEvery: 0 } }), 'grpo-anchor').join('\n'), /never evaluate/, 'and what the comparison needs of any config');
});

test("configs/multistep.yaml's companions can stand in its comparison: same task, policy and held-out seeds", () => {
  const dir = join(__dirname, '..', '..', 'configs');
  const shared = loadConfigFile(join(dir, 'multistep.yaml'));
  assert.deepEqual(comparisonProblems(shared, ['base', 'grpo-episode', 'grpo-step', 'grpo-anchor', 'mcts-dpo']), []);
  for (const file of ['multistep-anchor.yaml', 'multistep-anchor-immediate.yaml', 'multistep-anchor-balanced.yaml']) {
    const own = loadConfigFile(join(dir, file));
    assert.deepEqual(rowConfigProblems(shared, own, 'grpo-anchor'), [], file);
    assert.equal(own.train.grouping, 'anchor', file);
  }
});

test('rows: known names once each; the config must compare every method on the same tasks and seeds', () => {
  assert.deepEqual(parseMethods('base, grpo-step,mcts-dpo'), ['base', 'grpo-step', 'mcts-dpo']);
  assert.throws(() => parseMethods('grpo-step,grpo'), /unknown row "grpo"/);
  assert.throws(() => parseMethods('base,base'), /listed twice/);
  assert.throws(() => parseMethods(' , '), /at least one/);

  const tasks = ['click-a', 'click-b'];
  const seeds = [100000, 100001];
  const good = parseConfig({
    train: { tasks, heldOutTasks: tasks, evalSeeds: seeds, evalEvery: 1 },
    mcts: { tasks: ['click-b', 'click-a'], evalSeeds: seeds, evalEvery: 2 },
  });
  assert.deepEqual(comparisonProblems(good, ['base', 'grpo-step', 'mcts-dpo']), []);

  const bad = parseConfig({ train: { tasks, evalEvery: 0 }, mcts: { tasks: ['click-a'], evalSeeds: [0] } });
  const problems = comparisonProblems(bad, ['grpo-step', 'mcts-dpo']).join('\n');
  assert.match(problems, /train\.heldOutTasks is empty/);
  assert.match(problems, /train\.evalSeeds is not set/);
  assert.match(problems, /train\.evalEvery and train\.evalEverySteps are 0/);
  assert.match(problems, /mcts\.tasks \[click-a\] differ from train\.tasks \[click-a, click-b\]/);
  assert.match(problems, /mcts\.evalEvery and mcts\.evalEverySteps are 0/);
  // The MCTS section only matters when its row runs.
  const seedsDiffer = parseConfig({ train: { tasks, heldOutTasks: tasks, evalSeeds: seeds, evalEvery: 1 }, mcts: { tasks, evalSeeds: [1, 2], evalEvery: 1 } });
  assert.match(comparisonProblems(seedsDiffer, ['mcts-dpo']).join('\n'), /mcts\.evalSeeds \[1, 2\] differ from train\.evalSeeds \[100000, 100001\]/);
  assert.deepEqual(comparisonProblems(seedsDiffer, ['base', 'grpo-anchor']), []);
  const evalTasksDiffer = parseConfig({ train: { tasks, heldOutTasks: ['click-c'], evalSeeds: seeds, evalEvery: 1 }, mcts: { tasks, evalSeeds: seeds, evalEvery: 1 } });
  assert.match(comparisonProblems(evalTasksDiffer, ['mcts-dpo']).join('\n'), /the MCTS run evaluates on \[click-a, click-b\]/);
});
