import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ApplicationFailure } from '@temporalio/common';
import { createMetricsActivities } from '../../activities/metrics';
import { iterationMetrics, type IterationMetrics } from '../../lib/grpo';
import { MetricsParseError, formatMetricsLine, latestMetrics, parseMetricsJsonl, runIdProblem, validateRunId, type MetricsLine } from '../../lib/run-metrics';

const TIME = '2025-01-02T03:04:05.000Z';

function metrics(meanReward = 0.25): IterationMetrics {
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
  assert.deepEqual(parseMetricsJsonl(text).map((l) => l.iteration), [0, 1]);
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
  assert.deepEqual(parseMetricsJsonl(torn).map((l) => l.iteration), [0, 1]);
  assert.deepEqual(parseMetricsJsonl(full.trimEnd()).map((l) => l.iteration), [0, 1]);
  const dup = formatMetricsLine(line(0)) + formatMetricsLine({ ...line(0), mean_reward: 9 });
  assert.deepEqual(parseMetricsJsonl(dup).map((l) => l.mean_reward), [0.25]);
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
  assert.deepEqual(lines.map((l) => [l.iteration, l.mean_reward]), [[0, 0.25], [1, 0.5]]);
  assert.equal(fileLines(file()).length, 3);
  assert.ok(!Number.isNaN(Date.parse(lines[1].time)), 'the activity stamps the time');
  // concurrent attempts on one worker still write once
  const results = await Promise.all([2, 2, 2].map((iteration) => acts.appendIterationMetrics({ run_id: 'run-1', iteration, metrics: metrics(), time: TIME })));
  assert.deepEqual(results.map((r) => r.appended).sort(), [false, false, true]);
  assert.deepEqual((await acts.readRunMetrics({ run_id: 'run-1' })).map((l) => l.iteration), [0, 1, 2]);
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
  assert.deepEqual((await acts.readRunMetrics({ run_id: 'run-1' })).map((l) => l.iteration), [0]);
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
