import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { createMetricsActivities } from '../../activities/metrics';
import {
  MetricsParseError,
  formatMetricsLine,
  isGrpoMetrics,
  isMctsMetrics,
  latestMetrics,
  parseMetricsJsonl,
  runIdProblem,
  validateRunId,
  type GrpoTrainingMetrics,
  type MctsTrainingMetrics,
  type MetricsLine,
} from '../../lib/training/run-metrics';
import { iterationMetrics, mctsIterationMetrics } from '../../lib/training/training-metrics';
import { emptyCounters } from '../../lib/search/mcts-search';

const TIME = '2025-01-02T03:04:05.000Z';

function metrics(meanReward = 0.25): GrpoTrainingMetrics {
  return {
    ...iterationMetrics({ groups: [{ rewards: [0, 0.5] }], episodes: [{ success: true, steps: 2, validActions: 2, shapedReturn: 1 }], phaseSeconds: { rollout: 1.5 } }),
    mean_reward: meanReward,
  };
}

function line(iteration: number, runId = 'run-1'): MetricsLine {
  return { run_id: runId, iteration, time: TIME, ...metrics() };
}

const fileLines = (path: string): string[] => readFileSync(path, 'utf8').split('\n');

function setup() {
  const root = mkdtempSync(join(tmpdir(), 'halo-runs-'));
  return { root, acts: createMetricsActivities(root), file: (run = 'run-1') => join(root, run, 'metrics.jsonl') };
}

const nonRetryable = (type: string, pattern: RegExp) => (err: unknown) => {
  assert.ok(err instanceof ApplicationFailure, `expected an ApplicationFailure, got ${String(err)}`);
  assert.equal(err.type, type);
  assert.equal(err.nonRetryable, true);
  assert.match(err.message, pattern);
  return true;
};

test('parseMetricsJsonl: blank lines skipped, a bad line named by its number', () => {
  const text = '\n' + formatMetricsLine(line(0)) + '   \n' + formatMetricsLine(line(1));
  assert.deepEqual(
    parseMetricsJsonl(text).map((l) => l.iteration),
    [0, 1],
  );
  assert.throws(
    () => parseMetricsJsonl(formatMetricsLine(line(0)) + '{"run_id": oops}\n' + formatMetricsLine(line(2))),
    (err: unknown) => err instanceof MetricsParseError && err.line === 2 && /^metrics\.jsonl line 2: not JSON/.test(err.message),
  );
  const bad = JSON.stringify({ ...line(5), success_rate: 2 });
  assert.throws(() => parseMetricsJsonl('\n\n' + bad + '\n', 'runs/x/metrics.jsonl'), /^MetricsParseError: runs\/x\/metrics\.jsonl line 3: not a metrics line: success_rate/);
  assert.throws(() => parseMetricsJsonl(JSON.stringify({ ...line(0), time: 'yesterday' }) + '\n'), /line 1: .*time/);
});

test('parseMetricsJsonl: a torn last line is ignored, a finished one without newline kept, first line per iteration wins', () => {
  const full = formatMetricsLine(line(0)) + formatMetricsLine(line(1));
  const torn = full + formatMetricsLine(line(2)).slice(0, 40);
  assert.deepEqual(
    parseMetricsJsonl(torn).map((l) => l.iteration),
    [0, 1],
  );
  assert.deepEqual(
    parseMetricsJsonl(full.trimEnd()).map((l) => l.iteration),
    [0, 1],
  );
  const dup = formatMetricsLine(line(0)) + formatMetricsLine({ ...line(0), mean_reward: 9 });
  assert.deepEqual(
    parseMetricsJsonl(dup).map((l) => l.mean_reward),
    [0.25],
  );
  assert.deepEqual(parseMetricsJsonl(''), []);
});

test('latestMetrics is the highest iteration', () => {
  assert.equal(latestMetrics([]), null);
  assert.equal(latestMetrics([line(3), line(7), line(5)])?.iteration, 7);
});

test('run ids cannot leave the runs folder', () => {
  for (const bad of ['', '..', '.', '../x', 'a/b', 'a\\b', 'a..b', '/abs', 'x y', 'a'.repeat(201)]) {
    assert.notEqual(runIdProblem(bad), null, bad);
    assert.throws(() => validateRunId(bad));
  }
  assert.equal(runIdProblem(42), 'run_id must be a non-empty string');
  for (const ok of ['run-1', 'grpo.v2_seed-3', 'R']) assert.equal(validateRunId(ok), ok);
});

test('appendIterationMetrics writes one line per iteration, even when retried', async () => {
  const { acts, file } = setup();
  assert.deepEqual(await acts.readRunMetrics({ run_id: 'run-1' }), []);
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 0, metrics: metrics(), time: TIME }), { appended: true });
  // the retry of the same activity (its first attempt wrote, then the worker died): nothing appended
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 0, metrics: metrics(0.9), time: TIME }), { appended: false });
  assert.deepEqual(fileLines(file()), [formatMetricsLine(line(0)).trimEnd(), '']);
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: metrics(0.5) }), { appended: true });
  const lines = await acts.readRunMetrics({ run_id: 'run-1' });
  assert.deepEqual(
    lines.map((l) => [l.iteration, l.mean_reward]),
    [
      [0, 0.25],
      [1, 0.5],
    ],
  );
  assert.equal(fileLines(file()).length, 3);
  assert.ok(!Number.isNaN(Date.parse(lines[1].time)), 'the activity stamps the time');
  // concurrent attempts on one worker still write once
  const results = await Promise.all([2, 2, 2].map((iteration) => acts.appendIterationMetrics({ run_id: 'run-1', iteration, metrics: metrics(), time: TIME })));
  assert.deepEqual(results.map((r) => r.appended).sort(), [false, false, true]);
  assert.deepEqual(
    (await acts.readRunMetrics({ run_id: 'run-1' })).map((l) => l.iteration),
    [0, 1, 2],
  );
  assert.equal(fileLines(file()).length, 4);
  // the retry lands on another worker process (a fresh activity object over the same folder): still once
  const { root } = setup();
  const first = createMetricsActivities(root);
  const second = createMetricsActivities(root);
  assert.deepEqual(await first.appendIterationMetrics({ run_id: 'run-1', iteration: 0, metrics: metrics(), time: TIME }), { appended: true });
  assert.deepEqual(await second.appendIterationMetrics({ run_id: 'run-1', iteration: 0, metrics: metrics(), time: TIME }), { appended: false });
  assert.equal(fileLines(join(root, 'run-1', 'metrics.jsonl')).length, 2);
});

test('a torn last line is ignored on read and repaired by the next append', async () => {
  const { root, acts, file } = setup();
  mkdirSync(join(root, 'run-1'));
  writeFileSync(file(), formatMetricsLine(line(0)) + formatMetricsLine(line(1)).slice(0, 50));
  assert.deepEqual(
    (await acts.readRunMetrics({ run_id: 'run-1' })).map((l) => l.iteration),
    [0],
  );
  // the torn iteration 1 was never written: its retry appends it, in place of the fragment
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: metrics(), time: TIME }), { appended: true });
  assert.equal(readFileSync(file(), 'utf8'), formatMetricsLine(line(0)) + formatMetricsLine(line(1)));

  // a line that lost only its newline counts as written; the newline is restored
  writeFileSync(file(), formatMetricsLine(line(0)) + formatMetricsLine(line(1)).trimEnd());
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: metrics(0.7), time: TIME }), { appended: false });
  assert.equal(readFileSync(file(), 'utf8'), formatMetricsLine(line(0)) + formatMetricsLine(line(1)));
  writeFileSync(file(), formatMetricsLine(line(0)).trimEnd());
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: metrics(), time: TIME }), { appended: true });
  assert.equal(readFileSync(file(), 'utf8'), formatMetricsLine(line(0)) + formatMetricsLine(line(1)));
});

test('bad run ids, bad metrics and corrupt files fail non-retryably with a clear message', async () => {
  const { root, acts, file } = setup();
  for (const run_id of ['../escape', 'a/b', '..']) {
    await assert.rejects(acts.appendIterationMetrics({ run_id, iteration: 0, metrics: metrics(), time: TIME }), nonRetryable('InvalidRunId', /run_id/));
    await assert.rejects(acts.readRunMetrics({ run_id }), nonRetryable('InvalidRunId', /run_id/));
  }
  assert.equal(existsSync(join(root, '..', 'escape')), false);
  await assert.rejects(
    acts.appendIterationMetrics({ run_id: 'run-1', iteration: 0, metrics: { ...metrics(), mean_reward: Number.NaN }, time: TIME }),
    nonRetryable('InvalidMetrics', /mean_reward/),
  );
  await assert.rejects(acts.appendIterationMetrics({ run_id: 'run-1', iteration: -1, metrics: metrics(), time: TIME }), nonRetryable('InvalidMetrics', /iteration/));
  mkdirSync(join(root, 'run-2'));
  writeFileSync(file('run-2'), formatMetricsLine(line(0, 'run-2')) + 'not json\n' + formatMetricsLine(line(1, 'run-2')));
  await assert.rejects(acts.readRunMetrics({ run_id: 'run-2' }), nonRetryable('InvalidMetricsFile', /metrics\.jsonl line 2: not JSON/));
  await assert.rejects(acts.appendIterationMetrics({ run_id: 'run-2', iteration: 2, metrics: metrics(), time: TIME }), nonRetryable('InvalidMetricsFile', /line 2/));
  assert.equal(fileLines(file('run-2')).length, 4, 'nothing appended to a corrupt file');
});

function mctsSearch(pairs = 3) {
  return {
    simulations: 6,
    stats: { nodes: 4, maxDepth: 1, totalVisits: 6, leaves: 3, terminalNodes: 1 },
    bestPath: { nodeIds: [0, 1], actions: ['click'], success: true, terminal: true, reward: 1 },
    pairs: { ref: 'sha256:x', count: pairs, meanAbsDeltaQ: 0.4, withRefLogprobs: 0 },
    counters: { ...emptyCounters(), candidates: 4, invalidCandidates: 1 },
  };
}

function mctsMetrics(pairs = 3): MctsTrainingMetrics {
  return mctsIterationMetrics({
    searches: [mctsSearch(pairs)],
    update: { loss: 0.69, reward_margin: 0, accuracy: 0.5, grad_norm: 4.4 },
    adapterVersion: 1,
    seconds: { search: 21.2 },
  });
}

test('one file for every algorithm: an MCTS row goes through the same activity and parser, its own keys in its section', async () => {
  const { acts, file } = setup();
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: mctsMetrics(), time: TIME }), { appended: true });
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: mctsMetrics(99), time: TIME }), { appended: false });
  const [row] = await acts.readRunMetrics({ run_id: 'run-1' });
  assert.ok(isMctsMetrics(row) && !isGrpoMetrics(row));
  assert.deepEqual([row.algorithm, row.success_rate, row.mean_return, row.loss, row.adapter_version, row.num_episodes], ['mcts', 1, 1, 0.69, 1, 1]);
  assert.deepEqual([row.mcts.pairs, row.mcts.simulations, row.mcts.update_skipped], [3, 6, false]);
  assert.equal('mean_reward' in row, false);
  // What the engine adds afterwards is kept.
  const withEval = { ...mctsMetrics(), eval: { success_rate: 0.5, mean_return: 0.5, episodes: 2 }, failed_episodes: 1, staleness: 0, sampled_adapter_version: 1 };
  await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 2, metrics: withEval, time: TIME });
  const second = parseMetricsJsonl(readFileSync(file(), 'utf8'))[1];
  assert.deepEqual([second.eval, second.failed_episodes, second.staleness], [withEval.eval, 1, 0]);
});

test('the browser work keys are common keys: written and read back the same way for GRPO and MCTS rows', async () => {
  const { acts } = setup();
  const grpo = iterationMetrics({
    groups: [{ rewards: [0, 1] }],
    episodes: [
      { success: true, steps: 2, validActions: 2, shapedReturn: 1, browser: { sessions: 7, steps: 6, replayedActions: 3 } },
      { success: false, steps: 3, validActions: 3, shapedReturn: 0 }, // recorded before the count: its steps stand in
    ],
    phaseSeconds: {},
  });
  const counters = { ...emptyCounters(), browserSteps: 11, replayedActions: 4 };
  counters.sessionReuse = { ...counters.sessionReuse, fresh: 3, reused: 2, spareSessions: 1, spareReplayedActions: 2 };
  const mcts = mctsIterationMetrics({ searches: [{ ...mctsSearch(), counters }], update: null, adapterVersion: 0, seconds: {} });
  await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 0, metrics: grpo, time: TIME });
  await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: mcts, time: TIME });
  const rows = await acts.readRunMetrics({ run_id: 'run-1' });
  const work = (r: MetricsLine) => [r.env_steps, r.sessions_opened, r.replayed_actions];
  assert.deepEqual(rows.map(work), [
    [9, undefined, undefined],
    [11, 4, 6],
  ]);
});

test('each algorithm needs its own keys; a row without an algorithm is a GRPO row from before', () => {
  const grpo = JSON.parse(formatMetricsLine(line(0)));
  assert.equal(grpo.algorithm, 'grpo', 'the writer names the algorithm');
  delete grpo.algorithm;
  const [old] = parseMetricsJsonl(JSON.stringify(grpo) + '\n');
  assert.equal(old.algorithm, 'grpo');
  assert.ok(isGrpoMetrics(old) && old.mean_reward === 0.25);
  const { mean_reward: _dropped, ...noMeanReward } = grpo;
  assert.throws(() => parseMetricsJsonl(JSON.stringify(noMeanReward) + '\n'), /line 1: not a metrics line: mean_reward: required when algorithm is grpo/);
  const mcts = { run_id: 'run-1', iteration: 1, time: TIME, ...mctsMetrics() };
  const { mcts: _section, ...noSection } = mcts;
  assert.throws(() => parseMetricsJsonl(JSON.stringify(noSection) + '\n'), /mcts: required when algorithm is mcts/);
  assert.throws(() => parseMetricsJsonl(JSON.stringify({ ...mcts, mcts: { ...mcts.mcts, pairs: -1 } }) + '\n'), /mcts\.pairs/);
  assert.throws(() => parseMetricsJsonl(JSON.stringify({ ...mcts, algorithm: 'ppo' }) + '\n'), /algorithm/);
});

/** A line of the mcts-metrics.jsonl that MCTS runs wrote before they shared metrics.jsonl. */
function legacyMctsLine(iteration: number, over: Record<string, unknown> = {}): string {
  return (
    JSON.stringify({
      run_id: 'old-mcts',
      iteration,
      time: TIME,
      searches: 2,
      simulations: 12,
      nodes: 9,
      best_path_success_rate: 0.5,
      pairs: 3,
      mean_abs_delta_q: 0.33,
      pairs_with_ref_logprobs: 1,
      dpo_loss: 0.69,
      reward_margin: 0.1,
      accuracy: 0.5,
      grad_norm: 4.4,
      adapter_version: iteration,
      update_skipped: false,
      candidates: 3,
      invalid_candidates: 1,
      critic_calls: 1,
      critic_failures: 0,
      session_rebuilds: 0,
      eval_success_rate: null,
      seconds: { search: 21.2, update: 3 },
      ...over,
    }) + '\n'
  );
}

test('an old MCTS run: its mcts-metrics.jsonl reads as rows of the one schema when it has no metrics.jsonl', async () => {
  const { root, acts } = setup();
  mkdirSync(join(root, 'old-mcts'));
  const legacy = join(root, 'old-mcts', 'mcts-metrics.jsonl');
  writeFileSync(
    legacy,
    legacyMctsLine(1) +
      legacyMctsLine(2, {
        update_skipped: true,
        pairs: 0,
        dpo_loss: null,
        reward_margin: null,
        accuracy: null,
        grad_norm: null,
        mean_abs_delta_q: null,
        adapter_version: 1,
        eval_success_rate: 0.25,
        failed_searches: 1,
      }) +
      legacyMctsLine(3).slice(0, 30),
  );
  const rows = await acts.readRunMetrics({ run_id: 'old-mcts' });
  assert.deepEqual(
    rows.map((r) => [r.iteration, r.algorithm, r.success_rate, r.mean_return, r.loss, r.grad_norm, r.adapter_version, r.num_episodes, r.failed_episodes]),
    [
      [1, 'mcts', 0.5, 0.5, 0.69, 4.4, 1, 2, undefined],
      [2, 'mcts', 0.5, 0.5, null, null, null, 2, 1], // no update ran: no adapter version, as the new rows have it
    ],
  );
  assert.deepEqual(rows[0].mcts, {
    simulations: 12,
    nodes: 9,
    pairs: 3,
    mean_abs_delta_q: 0.33,
    pairs_with_ref_logprobs: 1,
    reward_margin: 0.1,
    accuracy: 0.5,
    update_skipped: false,
    candidates: 3,
    invalid_candidates: 1,
    critic_calls: 1,
    critic_failures: 0,
    session_rebuilds: 0,
  });
  assert.equal(rows[1].mcts?.eval_success_rate, 0.25);
  assert.equal(rows[1].eval, undefined, 'the old file has no return and episode count for the evaluation');
  // A bad old line is named as one.
  writeFileSync(legacy, legacyMctsLine(1, { best_path_success_rate: 2 }));
  await assert.rejects(
    acts.readRunMetrics({ run_id: 'old-mcts' }),
    nonRetryable('InvalidMetricsFile', /mcts-metrics\.jsonl line 1: not an MCTS metrics line \(mcts-metrics\.jsonl\): best_path_success_rate/),
  );
  // Once the run has a metrics.jsonl, that is its file (even an empty one).
  writeFileSync(join(root, 'old-mcts', 'metrics.jsonl'), '');
  assert.deepEqual(await acts.readRunMetrics({ run_id: 'old-mcts' }), []);
  await acts.appendIterationMetrics({ run_id: 'old-mcts', iteration: 3, metrics: mctsMetrics(), time: TIME });
  assert.deepEqual(
    (await acts.readRunMetrics({ run_id: 'old-mcts' })).map((r) => r.iteration),
    [3],
  );
});
