import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Worker } from '@temporalio/worker';
import { parseConfig } from '../../lib/config/config';
import { mctsParams } from '../../lib/search/mcts-params';
import type { MctsSearchResult, MctsTreeView } from '../../lib/search/mcts-search';
import type { MctsSearchInput } from '../../workflows/mcts-search';
import { startBranchingPolicyServer } from '../../testing/branching-policy-server';
import { startFakeCriticServer, type FakeCriticServer } from '../../testing/fake-critic-server';
import { startTestStack, type TestStack } from '../../testing/stack';

// Parked sessions (mcts.parkedSessions) change how node states are restored, never which states they are: the
// same search with a new session per simulation and with parked sessions grows the same tree, node for node,
// down to each node's observed state key, while the parked run opens fewer browser sessions.
let stack: TestStack;
let critic: FakeCriticServer;
before(async () => {
  [stack, critic] = await Promise.all([startTestStack({ browserWorkers: 1 }), startFakeCriticServer({ kind: 'prefer', substring: 'type', value: 0.6 })]);
});
after(async () => {
  await stack?.stop();
  await critic?.close();
});

/** Activities of a type scheduled over every run of a workflow's continue-as-new chain. */
async function scheduled(workflowId: string, type: string): Promise<number> {
  let n = 0;
  for await (const w of stack.client.workflow.list({ query: `WorkflowId = '${workflowId}'` })) {
    const history = await stack.client.workflow.getHandle(workflowId, w.runId).fetchHistory();
    for (const e of history.events ?? []) if (e.activityTaskScheduledEventAttributes?.activityType?.name === type) n++;
  }
  return n;
}

async function search(valueMode: 'rollout' | 'critic', parkedSessions: number): Promise<{ result: MctsSearchResult; view: MctsTreeView; starts: number }> {
  // A new policy server per search: its branching answers depend on the request count only, so equal trees
  // ask equal questions in the same order.
  const policy = await startBranchingPolicyServer();
  try {
    const cfg = parseConfig({
      policy: { backend: 'openai', baseUrl: policy.url, model: 'scripted', maxTokens: 64, timeoutMs: 5_000 },
      mcts: {
        numSimulations: 10,
        maxChildren: 3,
        maxDepth: 4,
        valueMode,
        continueAsNewEvery: 5,
        parkedSessions,
        critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic', timeoutMs: 5_000 },
      },
    });
    const input: MctsSearchInput = {
      runId: 'mcts-reuse',
      task: { env: 'miniwob', task: 'enter-text', seed: 3 },
      params: mctsParams(cfg),
      policy: cfg.policy,
      adapterVersion: 0,
      browserTaskQueue: stack.browserQueue,
      gpuTaskQueue: stack.gpuQueue,
      learnerHeartbeatTimeoutMs: 10_000,
      maxSessionRebuilds: 3,
      sessionStartTimeoutMs: 10_000,
      heartbeatTimeoutMs: 5_000,
    };
    const workflowId = `mcts-reuse-${valueMode}-${parkedSessions}`;
    const handle = await stack.client.workflow.start('mctsSearch', { taskQueue: stack.controlQueue, workflowId, args: [input] });
    const result = (await handle.result()) as MctsSearchResult;
    const view = await handle.query<MctsTreeView>('tree');
    // The parked run's history replays against the current code (the reuse is deterministic workflow state).
    if (parkedSessions > 0) {
      await Worker.runReplayHistory({ workflowsPath: require.resolve('../../workflows') }, await handle.fetchHistory(), workflowId);
    }
    return { result, view, starts: await scheduled(workflowId, 'startSession') };
  } finally {
    await policy.close();
  }
}

/** What must not depend on how states were restored: the tree's shape, actions, visits, values and observed states. */
function shape(view: MctsTreeView) {
  return view.tree!.nodes.map((n) => ({
    id: n.id,
    parent: n.parent,
    action: n.actionKey,
    visits: n.visits,
    valueSum: n.valueSum,
    terminal: n.terminal,
    reward: n.reward,
    state: n.observationRef?.stateKey ?? null,
  }));
}

for (const valueMode of ['critic', 'rollout'] as const) {
  test(`valueMode ${valueMode}: parkedSessions 2 grows the tree of parkedSessions 0 and opens fewer sessions`, async (t) => {
    const fresh = await search(valueMode, 0);
    const parked = await search(valueMode, 2);
    const f = fresh.result.counters;
    const p = parked.result.counters;
    t.diagnostic(`fresh: ${JSON.stringify(f)}`);
    t.diagnostic(`parked: ${JSON.stringify(p)}`);
    assert.equal(parked.result.simulations, 10);
    assert.ok(fresh.view.tree!.nodes.length > 4, `a tree worth comparing (${fresh.view.tree!.nodes.length} nodes)`);
    assert.deepEqual(shape(parked.view), shape(fresh.view));
    // Every restore of the first run opened a new session; the parked run served some from parked sessions.
    assert.deepEqual(f.sessionReuse, { reused: 0, advanced: 0, resetInPlace: 0, fresh: f.restores, prepared: 0 });
    const served = p.sessionReuse.reused + p.sessionReuse.advanced + p.sessionReuse.resetInPlace;
    assert.ok(served > 0, 'parked sessions served restores');
    assert.equal(served + p.sessionReuse.fresh, p.restores);
    assert.ok(p.sessionReuse.fresh < f.sessionReuse.fresh, `fewer restores from new sessions (${p.sessionReuse.fresh} vs ${f.sessionReuse.fresh})`);
    // New sessions in all (spares opened in the background included).
    t.diagnostic(`startSession: ${fresh.starts} without parking, ${parked.starts} with`);
    assert.equal(fresh.starts, f.restores);
    assert.ok(parked.starts < fresh.starts, `fewer sessions opened (${parked.starts} vs ${fresh.starts})`);
    // The search counts every session it opened: restores that needed a new one, and spares opened in the background.
    assert.equal(p.sessionReuse.fresh + (p.sessionReuse.spareSessions ?? 0), parked.starts);
    assert.equal(p.sessionRebuilds, 0);
  });
}
