import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { BlobStore } from '../../blob/store';
import { parseMetricsJsonl } from '../../lib/training/run-metrics';
import { startOrAttachTrain } from '../../client/train';
import type { TrainingResult } from '../../workflows/train-engine';
import { stackGrpoConfig } from '../../testing/grpo-config';
import { startFakePolicyServer, toolCall, type FakePolicyServer } from '../../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../../testing/stack';
import { stackPromptIds } from '../../testing/model-prompt-ids';

// Grouping `anchor` end to end: MiniWoB++ in Chromium, Temporal, the Python learner with the tiny-random
// Qwen3-VL. The N rollouts of one task + seed start from the same reset page, so their first steps share a
// state key and form an anchor group without any fork.
let stack: TestStack;
let policy: FakePolicyServer;
before(async () => {
  stack = await startTestStack({ browserWorkers: 1, learner: true });
  // Rollouts alternate between "garbage, then wait" and "wait, then garbage": equal returns (the episode term
  // is 0) but different step returns at the one page neither action changes, so only the step term separates
  // them, and the steps of one rollout get different advantages.
  let episodes = 0;
  policy = await startFakePolicyServer(
    {
      kind: 'custom',
      answer: ({ previous }) => {
        if (previous.length === 0) episodes++;
        const garbageFirst = episodes % 2 === 1;
        const garbage = (previous.length === 0) === garbageFirst;
        return garbage ? 'I am not sure what to do here.' : toolCall({ action: 'wait', time: 0 });
      },
    },
    { promptIds: stackPromptIds(stack.home) },
  );
});
after(async () => {
  await policy?.close();
  await stack?.stop();
});

/** The buildGrpoBatch call of a run's first workflow run: its input and its result. */
async function batchCall(workflowId: string): Promise<{ input: { trajectory_refs: string[] }; result: { batch_ref: string; items: number } }> {
  const history = await stack.client.workflow.getHandle(workflowId).fetchHistory();
  const decode = (p: { data?: Uint8Array | null } | undefined) => JSON.parse(Buffer.from(p!.data!).toString('utf8'));
  const events = history.events ?? [];
  const scheduled = events.find((e) => e.activityTaskScheduledEventAttributes?.activityType?.name === 'buildGrpoBatch');
  assert.ok(scheduled, 'buildGrpoBatch was scheduled');
  const id = scheduled.eventId;
  const done = events.find((e) => String(e.activityTaskCompletedEventAttributes?.scheduledEventId) === String(id));
  assert.ok(done, 'buildGrpoBatch completed');
  return {
    input: decode(scheduled.activityTaskScheduledEventAttributes!.input!.payloads![0]),
    result: decode(done.activityTaskCompletedEventAttributes!.result!.payloads![0]),
  };
}

test('anchor grouping with the colocated tiny model: a run completes and its batch has step-level groups', async () => {
  const cfg = stackGrpoConfig(stack, {
    runId: 'anchor-tiny',
    iterations: 1,
    maxSteps: 2,
    episode: { sessionStartTimeoutMs: 10_000 },
    train: { grouping: 'anchor', numGenerations: 3 },
  });
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  const result = (await handle.result()) as TrainingResult;
  assert.deepEqual(result, { runId: 'anchor-tiny', iterations: 1, adapterVersion: 1, stoppedEarly: false });
  const [line] = parseMetricsJsonl(readFileSync(join(stack.home, 'anchor-tiny', 'metrics.jsonl'), 'utf8'));
  assert.equal(line.num_episodes, 3, 'N rollouts of one task + seed, as with episode grouping');
  assert.ok((line.anchor_groups ?? 0) > 0, `anchor_groups ${line.anchor_groups}`);
  assert.ok((line.anchor_group_size_mean ?? 0) >= 2);
  assert.ok((line.anchor_group_size_max ?? 0) >= 3, 'the three first steps share the reset state');
  assert.ok((line.step_signal_share ?? 0) > 0 && (line.step_signal_share ?? 0) <= 1);
});

test('anchor grouping: the steps of one rollout get different advantages where only the step term differs', async () => {
  const cfg = stackGrpoConfig(stack, {
    runId: 'anchor-steps',
    iterations: 1,
    maxSteps: 2,
    // Sampled by the local OpenAI-compatible stand-in (scripted answers above), learned by the tiny model.
    policy: { backend: 'openai', baseUrl: policy.url, model: 'scripted' },
    episode: { sessionStartTimeoutMs: 10_000 },
    train: { grouping: 'anchor', numGenerations: 2, anchor: { episodeWeight: 1, stepWeight: 1, discount: 0.5, balanceGroups: true } },
  });
  const { handle } = await startOrAttachTrain(stack.client, cfg);
  const result = (await handle.result()) as TrainingResult;
  assert.equal(result.adapterVersion, 1);
  const [line] = parseMetricsJsonl(readFileSync(join(stack.home, 'anchor-steps', 'metrics.jsonl'), 'utf8'));
  assert.ok((line.anchor_groups ?? 0) > 0, `anchor_groups ${line.anchor_groups}`);

  const blobs = new BlobStore(join(stack.home, 'blobs'));
  const call = await batchCall('anchor-steps');
  assert.equal(call.input.trajectory_refs.length, 2);
  type Traj = { steps: { shaped: { total: number }; completion: { valid: boolean }; observation: { stateKey?: string } }[] };
  const trajs = await Promise.all(call.input.trajectory_refs.map((r) => blobs.getJson<Traj>(r)));
  for (const t of trajs) {
    assert.equal(t.steps.length, 2);
    for (const s of t.steps) assert.equal(typeof s.observation.stateKey, 'string', 'the trajectory keeps the state key before each step');
  }
  // Neither action changes the page: all four steps act from one state.
  const keys = new Set(trajs.flatMap((t) => t.steps.map((s) => s.observation.stateKey)));
  assert.equal(keys.size, 1);
  assert.deepEqual(
    trajs.map((t) => t.steps.map((s) => s.completion.valid)),
    [
      [false, true],
      [true, false],
    ],
  );

  // Advantages by hand with γ = 0.5 from the recorded shaped rewards (rollout A: a0, a1; B: b0, b1):
  //   episode terms ±(R_A − R_B)/2; step returns G_A = [a0 + 0.5·a1, a1], G_B = [b0 + 0.5·b1, b1];
  //   one anchor group of all four steps, so each step term is G − (sum of the four G)/4, scaled by
  //   balanceGroups to N / 4 = 1/2 (the group has twice as many members as there are rollouts).
  // Garbage and a wait are rewarded differently, so the two steps of one rollout differ.
  const [[a0, a1], [b0, b1]] = trajs.map((t) => t.steps.map((s) => s.shaped.total));
  assert.notEqual(a0, a1, 'an invalid output and a valid wait are rewarded differently');
  const e = (a0 + a1 - (b0 + b1)) / 2;
  const g = [a0 + 0.5 * a1, a1, b0 + 0.5 * b1, b1];
  const m = (g[0] + g[1] + g[2] + g[3]) / 4;
  const expected = [e + (g[0] - m) / 2, e + (g[1] - m) / 2, -e + (g[2] - m) / 2, -e + (g[3] - m) / 2];
  const batch = await blobs.getJson<{ items: { advantage: number }[] }>(call.result.batch_ref);
  const got = batch.items.map((it) => it.advantage);
  assert.equal(got.length, 4, 'every step has a non-zero advantage');
  got.forEach((v, i) => assert.ok(Math.abs(v - expected[i]) < 1e-6, `item ${i}: ${v}, expected ${expected[i]}`));
  assert.notEqual(got[0], got[1], 'the two steps of the first rollout differ');
  assert.notEqual(got[2], got[3], 'the two steps of the second rollout differ');
});
