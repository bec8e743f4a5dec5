import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, readFileSync, existsSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createCurvesSink, syncCurves, CurvesSyncError } from '../../host/curves';
import { createMetricsActivities } from '../../activities/metrics';
import { wandbOf } from '../../lib/training/curves';
import { parseConfig } from '../../lib/config/config';
import type { TrainingMetrics } from '../../lib/training/run-metrics';

// The metrics activities hand every append to the curves sink; the sink runs `python -m halo_learner.curves`
// (here a stand-in interpreter that records its arguments) one run at a time, in the background.
// workers/learner/tests/test_curves.py tests the writer itself with TensorBoard's reader.

/** A stand-in interpreter: records its arguments, then waits until `<dir>/gate` exists. */
function fakePython(dir: string, exitCode = 0, stderr = ''): { path: string; calls: () => string[][]; open: () => void } {
  const log = join(dir, 'calls.jsonl');
  const gate = join(dir, 'gate');
  const path = join(dir, 'python');
  writeFileSync(
    path,
    `#!/bin/sh
printf '%s\\n' "$*" >> ${JSON.stringify(log)}
while [ ! -e ${JSON.stringify(gate)} ]; do sleep 0.05; done
${stderr ? `echo ${JSON.stringify(stderr)} >&2` : ''}
[ ${exitCode} -eq 0 ] && echo '{"tensorboard": {"dir": "x", "written": 1, "iterations": [1]}, "wandb": null}'
exit ${exitCode}
`,
  );
  chmodSync(path, 0o755);
  return {
    path,
    calls: () =>
      existsSync(log)
        ? readFileSync(log, 'utf8')
            .trim()
            .split('\n')
            .map((l) => l.split(' '))
        : [],
    open: () => writeFileSync(gate, ''),
  };
}

function metrics(): TrainingMetrics {
  return {
    algorithm: 'grpo',
    mean_reward: 0.5,
    reward_std: 0.1,
    frac_reward_zero_std: 0,
    episode_length: 2,
    success_rate: 0.5,
    mean_return: 1,
    action_validity: 1,
    loss: 0.1,
    grad_norm: 0.2,
    adapter_version: 1,
    tokens: 10,
    seconds: { rollout: 1 },
    num_groups: 1,
    num_episodes: 1,
  };
}

test('every metrics append (a retry too) syncs the run curves, one sync at a time per run, W&B target passed on', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-curves-'));
  const py = fakePython(dir);
  const sink = createCurvesSink({ python: py.path });
  const acts = createMetricsActivities(join(dir, 'runs'), sink);
  const t = '2026-11-21T00:00:00.000Z';
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: metrics(), time: t }), { appended: true });
  // Three more appends while the first sync runs (one a retry of iteration 1) fold into one more sync.
  assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 1, metrics: metrics(), time: t }), { appended: false });
  await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 2, metrics: metrics(), time: t });
  await acts.appendIterationMetrics({ run_id: 'run-1', iteration: 3, metrics: metrics(), time: t, wandb: { project: 'halo', mode: 'offline' } });
  py.open();
  await sink.idle();
  const calls = py.calls();
  assert.equal(calls.length, 2, `two syncs: ${JSON.stringify(calls)}`);
  assert.deepEqual(calls[0], ['-m', 'halo_learner.curves', '--run-dir', join(dir, 'runs', 'run-1')]);
  assert.deepEqual(calls[1].slice(-5), [join(dir, 'runs', 'run-1'), '--wandb-project', 'halo', '--wandb-mode', 'offline'], 'the latest request wins');

  // An MCTS run's rows go through the same activity, file and sync.
  await acts.appendIterationMetrics({
    run_id: 'mcts-1',
    iteration: 1,
    time: t,
    metrics: {
      algorithm: 'mcts',
      success_rate: 0,
      mean_return: 0,
      loss: null,
      grad_norm: null,
      adapter_version: null,
      num_episodes: 1,
      seconds: { search: 1 },
      mcts: {
        simulations: 2,
        nodes: 3,
        pairs: 0,
        mean_abs_delta_q: null,
        pairs_with_ref_logprobs: 0,
        reward_margin: null,
        accuracy: null,
        update_skipped: true,
        candidates: 2,
        invalid_candidates: 0,
        critic_calls: 0,
        critic_failures: 0,
        session_rebuilds: 0,
      },
    },
  });
  await sink.idle();
  assert.deepEqual(py.calls()[2], ['-m', 'halo_learner.curves', '--run-dir', join(dir, 'runs', 'mcts-1')]);
  assert.match(readFileSync(join(dir, 'runs', 'mcts-1', 'metrics.jsonl'), 'utf8'), /"algorithm":"mcts"/);
  // The metrics line itself never carries the W&B target.
  assert.doesNotMatch(readFileSync(join(dir, 'runs', 'run-1', 'metrics.jsonl'), 'utf8'), /wandb/);
});

test('a failing sink is a warning (once per message), never a failed append', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'halo-curves-'));
  const py = fakePython(dir, 3, 'halo curves: the tensorboard package is not installed');
  py.open();
  const warnings: string[] = [];
  const sink = createCurvesSink({ python: py.path, warn: (m) => warnings.push(m) });
  const acts = createMetricsActivities(join(dir, 'runs'), sink);
  for (const iteration of [1, 2]) {
    assert.deepEqual(await acts.appendIterationMetrics({ run_id: 'run-1', iteration, metrics: metrics() }), { appended: true });
    await sink.idle();
  }
  assert.equal(py.calls().length, 2);
  assert.equal(warnings.length, 1);
  assert.match(warnings[0], /TensorBoard\) not written: halo curves: the tensorboard package is not installed/);
  await assert.rejects(syncCurves(join(dir, 'runs', 'run-1'), { python: py.path }), (e: Error) => e instanceof CurvesSyncError && e.missingPackage);
  await assert.rejects(syncCurves(join(dir, 'runs', 'run-1'), { python: join(dir, 'no-python') }), /not found \(set HALO_PYTHON/);
});

test('the wandb section: nothing unless a project is named', () => {
  assert.deepEqual(wandbOf(parseConfig({})), {});
  assert.deepEqual(wandbOf(parseConfig({ wandb: { project: 'halo' } })), { wandb: { project: 'halo' } });
  assert.deepEqual(wandbOf(parseConfig({ wandb: { project: 'halo', entity: 'me', mode: 'offline' } })), { wandb: { project: 'halo', entity: 'me', mode: 'offline' } });
  assert.throws(() => parseConfig({ wandb: { project: 'halo', mode: 'sometimes' } }), /wandb\.mode/);
  assert.throws(() => parseConfig({ wandb: { projekt: 'halo' } }), /wandb/);
});
