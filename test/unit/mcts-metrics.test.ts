import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync, mkdtempSync, readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import {
  createMctsMetricsActivities,
  parseMctsMetricsJsonl,
} from '../../activities/mcts-metrics';
import type { MctsIterationMetrics } from '../../lib/mcts-metrics';
import { createMctsStoreActivities } from '../../activities/mcts-store';

const metrics = (over: Partial<MctsIterationMetrics> = {}): MctsIterationMetrics => ({
  searches: 1,
  simulations: 6,
  nodes: 4,
  best_path_success_rate: 0,
  pairs: 3,
  mean_abs_delta_q: 0.33,
  pairs_with_ref_logprobs: 0,
  dpo_loss: 0.69,
  reward_margin: 0,
  accuracy: 0,
  grad_norm: 4.4,
  adapter_version: 1,
  update_skipped: false,
  candidates: 3,
  invalid_candidates: 3,
  critic_calls: 1,
  critic_failures: 0,
  session_rebuilds: 0,
  eval_success_rate: null,
  seconds: { search: 21.2, update: 3 },
  ...over,
});

test('appendMctsMetrics writes one line per iteration, whatever the retries', async () => {
  const root = mkdtempSync(join(tmpdir(), 'halo-mcts-metrics-'));
  const acts = createMctsMetricsActivities(root);
  const file = join(root, 'run1', 'mcts-metrics.jsonl');
  assert.deepEqual(await acts.appendMctsMetrics({ run_id: 'run1', iteration: 1, metrics: metrics(), time: '2026-11-21T00:00:00.000Z' }), { appended: true });
  // A retried attempt (or a concurrent one on this worker) appends nothing; the first line wins.
  const again = await Promise.all([
    acts.appendMctsMetrics({ run_id: 'run1', iteration: 1, metrics: metrics({ pairs: 99 }) }),
    acts.appendMctsMetrics({ run_id: 'run1', iteration: 1, metrics: metrics({ pairs: 98 }) }),
  ]);
  assert.deepEqual(again, [{ appended: false }, { appended: false }]);
  assert.deepEqual(await acts.appendMctsMetrics({ run_id: 'run1', iteration: 2, metrics: metrics({ adapter_version: 2 }) }), { appended: true });
  const lines = await acts.readMctsMetrics({ run_id: 'run1' });
  assert.deepEqual(lines.map((l) => [l.iteration, l.pairs, l.adapter_version]), [[1, 3, 1], [2, 3, 2]]);
  assert.equal(readFileSync(file, 'utf8').split('\n').filter(Boolean).length, 2);

  // A torn last line (killed mid-write) is ignored by readers and cut away by the next append.
  appendFileSync(file, '{"run_id":"run1","iteration":3,"ti');
  assert.equal(parseMctsMetricsJsonl(readFileSync(file, 'utf8')).length, 2);
  assert.deepEqual(await acts.appendMctsMetrics({ run_id: 'run1', iteration: 3, metrics: metrics() }), { appended: true });
  assert.deepEqual(parseMctsMetricsJsonl(readFileSync(file, 'utf8')).map((l) => l.iteration), [1, 2, 3]);
  // A complete last line that only lost its newline counts as written.
  const line4 = JSON.stringify({ run_id: 'run1', iteration: 4, time: '2026-11-21T00:00:00.000Z', ...metrics() });
  appendFileSync(file, line4);
  assert.deepEqual(await acts.appendMctsMetrics({ run_id: 'run1', iteration: 4, metrics: metrics({ pairs: 7 }) }), { appended: false });
  assert.ok(readFileSync(file, 'utf8').endsWith(line4 + '\n'));
});

test('appendMctsMetrics rejects bad input, naming the field; bad run ids never become paths', async () => {
  const root = mkdtempSync(join(tmpdir(), 'halo-mcts-metrics-'));
  const acts = createMctsMetricsActivities(root);
  await assert.rejects(acts.appendMctsMetrics({ run_id: 'r', iteration: 1, metrics: metrics({ best_path_success_rate: 2 }) }), /best_path_success_rate/);
  await assert.rejects(acts.appendMctsMetrics({ run_id: '../x', iteration: 1, metrics: metrics() }), /run_id/);
  mkdirSync(join(root, 'bad'));
  writeFileSync(join(root, 'bad', 'mcts-metrics.jsonl'), 'not json\n');
  await assert.rejects(acts.readMctsMetrics({ run_id: 'bad' }), /line 1: not JSON/);
});

test('storeCompletions: content-addressed text blobs, one reference per text', async () => {
  const blobs = new BlobStore(mkdtempSync(join(tmpdir(), 'halo-mcts-blobs-')));
  const { storeCompletions } = createMctsStoreActivities(blobs, { writeDpoBatch: async () => 'unused' });
  const { refs } = await storeCompletions({ texts: ['a', 'b', 'a'] });
  assert.equal(refs.length, 3);
  assert.equal(refs[0], refs[2]);
  assert.match(refs[1], /^sha256:[0-9a-f]{64}\.txt$/);
  assert.equal((await blobs.get(refs[1])).toString('utf8'), 'b');
  await assert.rejects(storeCompletions({ texts: [1 as unknown as string] }), /texts/);
});
