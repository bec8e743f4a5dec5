import { test } from 'node:test';
import assert from 'node:assert/strict';
import { methodRow } from '../../bench/methods-table';
import { evalsCell, keptLines, repeatRun, repeatSummary, repeatsMarkdown, testRepeatsMarkdown, type RepeatRun, type TestRun } from '../../bench/repeat-runs';
import { grpo } from '../helpers/metrics-lines';

// Three runs of 4 iterations, 32 sessions and 64 env steps each, evaluated (16 episodes) after iterations 2 and 4.
const run = (runId: string, evals: [number, number]) =>
  repeatRun(
    methodRow({
      method: 'grpo-anchor',
      runId,
      metrics: [1, 2, 3, 4].map((i) => grpo(i, { sessions_opened: 32, env_steps: 64, ...(i % 2 === 0 ? { evalRate: evals[i / 2 - 1] } : {}) })),
    }),
  );

test('a repeat run: its evaluations in order, sessions and env steps to the threshold, totals', () => {
  const r = run('t-r1-grpo-anchor', [0.5, 1]);
  assert.deepEqual(
    r.evals.map((e) => [e.iteration, e.successRate, e.episodes]),
    [
      [2, 0.5, 16],
      [4, 1, 16],
    ],
  );
  assert.equal(r.sessionsToThreshold, 128);
  assert.equal(r.stepsToThreshold, 256);
  assert.equal(r.sessions, 128);
  assert.equal(evalsCell(r), '8 16 of 16');
  assert.throws(() => repeatRun(methodRow({ method: 'grpo-step', metrics: [] })), /without a run id/);
});

test('the summary counts runs that reached the threshold and runs that ended above it; spreads are over the runs that reached it', () => {
  const runs: RepeatRun[] = [run('a', [1, 1]), run('b', [0.875, 0.25]), run('c', [0, 0.5]), { ...run('d', [1, 1]), failed: 'the learner died' }];
  const s = repeatSummary('grpo-anchor', runs, 0.8);
  assert.equal(s.reached, 2, 'a and b; the failed run does not count');
  assert.equal(s.endedAbove, 1, 'only a');
  assert.deepEqual(s.sessionsToThreshold, { median: 64, min: 64, max: 64, n: 2 });
  // b reached it only at its second evaluation in another arrangement: the median is taken over what was reached.
  const later = repeatSummary('grpo-anchor', [run('a', [1, 1]), run('b', [0, 1]), run('c', [0, 0.9])], 0.8);
  assert.deepEqual(later.sessionsToThreshold, { median: 128, min: 64, max: 128, n: 3 });
  assert.deepEqual(later.stepsToThreshold, { median: 256, min: 128, max: 256, n: 3 });
  const none = repeatSummary('grpo-step', [run('x', [0, 0])], 0.8);
  assert.equal(none.reached, 0);
  assert.equal(none.sessionsToThreshold, null);
});

test("the table: one row per method with counts, spreads and each run's evaluations; a failed run says why", () => {
  const md = repeatsMarkdown({
    command: 'node --import tsx bench/repeats.ts --runs 2',
    threshold: 0.8,
    tasks: ['click-collapsible-nodelay'],
    seeds: [100000, 100001],
    summaries: [
      repeatSummary('grpo-step', [run('s1', [0, 1]), run('s2', [1, 1])], 0.8),
      repeatSummary('grpo-anchor', [run('a1', [0, 0]), { ...run('a2', [1, 1]), failed: 'Temporal | gone' }], 0.8),
    ],
    notes: ['row grpo-anchor trained with the config file x.yaml'],
  });
  const lines = md.split('\n');
  assert.equal(lines[0], 'node --import tsx bench/repeats.ts --runs 2');
  const step = lines.find((l) => l.startsWith('| grpo-step '));
  const anchor = lines.find((l) => l.startsWith('| grpo-anchor '));
  assert.ok(step && anchor, md);
  assert.match(step, /\| 2 \| 2 of 2 \| 2 of 2 \| 96 \(64–128\) \| 192 \(128–256\) \| s1: 0 16 of 16; s2: 16 16 of 16 \|$/);
  assert.match(anchor, /\| 2 \| 0 of 2 \| 0 of 2 \| – \| – \| a1: 0 0 of 16; a2: failed: Temporal \\\| gone \|$/);
  assert.match(md, /Note: row grpo-anchor trained with the config file x\.yaml/);
});

test('repeated test-file runs: kept lines are the per-seed and greedy results and the first failure; the table counts per file', () => {
  const out = [
    '▶ suite',
    'seed 1: 0.25 1.00 (last five 1.00)',
    'pairs per iteration: 4 5; greedy held-out (of 16): base 0, trained v9 16',
    'noise line',
    'AssertionError [ERR_ASSERTION]: 1 of 4 seeds reached 0.8',
    'Error: a second failure line',
  ].join('\n');
  assert.deepEqual(keptLines(out), [
    'seed 1: 0.25 1.00 (last five 1.00)',
    'pairs per iteration: 4 5; greedy held-out (of 16): base 0, trained v9 16',
    'AssertionError [ERR_ASSERTION]: 1 of 4 seeds reached 0.8',
  ]);
  const run = (file: string, passed: boolean, seconds: number): TestRun => ({
    file,
    passed,
    exitCode: passed ? 0 : 1,
    seconds,
    startedAt: 't',
    commit: 'c',
    loadAtEnd: 'l',
    lines: ['a|b'],
  });
  const md = testRepeatsMarkdown([run('a.test.ts', true, 10), run('b.test.ts', false, 30), run('a.test.ts', true, 20)], 'cmd');
  assert.match(md, /\| a\.test\.ts \| 2 \| 2 \| 0 \| 15 \| 10–20 \|/);
  assert.match(md, /\| b\.test\.ts \| 1 \| 0 \| 1 \| 30 \| 30–30 \|/);
  assert.match(md, /\*\*failed\*\* \(exit 1\)/);
  assert.match(md, /a\\\|b/, 'a pipe in a printed line does not break the table');
});
