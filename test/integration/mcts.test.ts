import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Command } from 'commander';
import { Worker } from '@temporalio/worker';
import { parseConfig, type HaloConfig } from '../../lib/config/config';
import { getNode } from '../../lib/search/mcts';
import { isMctsMetrics, parseMetricsJsonl } from '../../lib/training/run-metrics';
import { register as registerMcts, startOrAttachMcts } from '../../client/commands/mcts';
import { temporalBinary } from '../../client/processes';
import type { MctsPair, MctsProgress, MctsSearchResult, MctsTreeView } from '../../lib/search/mcts-search';
import type { TrainingResult } from '../../workflows/train-engine';
import { BlobStore } from '../../blob/store';
import { mctsParams } from '../../lib/search/mcts-params';
import type { MctsSearchInput } from '../../workflows/mcts-search';
import { startBranchingPolicyServer } from '../../testing/branching-policy-server';
import { startFakeCriticServer, type FakeCriticServer } from '../../testing/fake-critic-server';
import { startTestStack, type TestStack } from '../../testing/stack';

// Agent-Q-style MCTS on the real stack: Temporal, Chromium with MiniWoB++ pages, the Python learner with the
// colocated tiny-random Qwen3-VL (sampling and update_dpo); only the critic is a local fake speaking the
// OpenAI protocol. During the search the browser worker and the control worker are SIGKILLed and restarted.
let stack: TestStack;
let critic: FakeCriticServer;
before(async () => {
  // Steps long enough (each waits 400 ms before the page is read) that a kill lands in one: with replays that
  // skip the waits (activities/session-replay.ts) the instant policies leave a step little time otherwise.
  process.env.HALO_MINIWOB_SETTLE_MS = '400';
  [stack, critic] = await Promise.all([
    startTestStack({ browserWorkers: 1, learner: true }),
    // Candidates mentioning "click" first (valid clicks before unparseable outputs), value 0.7.
    startFakeCriticServer({ kind: 'prefer', substring: 'click', value: 0.7 }),
  ]);
});
after(async () => {
  delete process.env.HALO_MINIWOB_SETTLE_MS;
  await stack?.stop();
  await critic?.close();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
const isBrowser = (p: ChildProcess) => p.spawnargs.some((a) => a.endsWith('browser.ts'));
const isControl = (p: ChildProcess) => p.spawnargs.some((a) => a.endsWith('control.ts'));

async function kill(p: ChildProcess): Promise<void> {
  p.kill('SIGKILL');
  if (alive(p)) await new Promise((r) => p.once('exit', r));
}

/** Resolves once one of `types` is a STARTED pending activity of the workflow (false after the timeout). */
async function waitForStarted(workflowId: string, types: string[], timeoutMs: number): Promise<string | false> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const d = await stack.client.workflow
      .getHandle(workflowId)
      .describe()
      .catch(() => undefined);
    const hit = (d?.raw.pendingActivities ?? []).find((a) => types.includes(a.activityType?.name ?? '') && a.state === 2 /* STARTED */);
    if (hit) return hit.activityType!.name!;
    if (d && d.status.name !== 'RUNNING' && d.status.name !== 'CONTINUED_AS_NEW') return false;
    await sleep(40);
  }
  return false;
}

/** The run ids of a workflow's continue-as-new chain, oldest first. */
async function chainRuns(workflowId: string): Promise<string[]> {
  const runs: { runId: string; start: number }[] = [];
  for await (const w of stack.client.workflow.list({ query: `WorkflowId = '${workflowId}'` })) runs.push({ runId: w.runId, start: w.startTime.getTime() });
  return runs.sort((a, b) => a.start - b.start).map((r) => r.runId);
}

/** With HALO_RECORD_MCTS_HISTORY=<dir>: `temporal workflow show --output json` of one run into `<dir>/<workflowId>.<label>.json`. */
function recordHistory(workflowId: string, runId: string, label: string): void {
  const out = process.env.HALO_RECORD_MCTS_HISTORY;
  if (!out) return;
  const json = execFileSync(
    temporalBinary(),
    ['workflow', 'show', '--address', stack.address, '--namespace', stack.namespace, '--workflow-id', workflowId, '--run-id', runId, '--output', 'json'],
    { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 },
  );
  writeFileSync(join(out, `${workflowId}.${label}.json`), json);
}

function config(runId: string): HaloConfig {
  return parseConfig({
    temporal: { address: stack.address, controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    stack: { home: stack.home },
    policy: { backend: 'colocated', model: 'tiny-random', maxTokens: 24, timeoutMs: 60_000 },
    episode: { env: 'miniwob', sessionStartTimeoutMs: 4_000, heartbeatTimeoutMs: 3_000 },
    train: { gpuTaskQueue: stack.gpuQueue, learnerHeartbeatTimeoutS: 10 },
    mcts: {
      runId,
      iterations: 1,
      tasks: ['click-button'],
      numSimulations: 6,
      maxChildren: 3,
      maxDepth: 3,
      continueAsNewEvery: 2,
      critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic', timeoutMs: 5_000 },
      learningRate: 1e-3,
    },
  });
}

test('trainMcts with the colocated tiny-random policy survives SIGKILLed workers: tree intact, 6 simulations exactly, DPO pairs, adapter v1 once', async (t) => {
  const runId = 'mcts-test';
  const searchId = `${runId}-it1-click-button`;
  const cfg = config(runId);
  const { handle, attached } = await startOrAttachMcts(stack.client, cfg);
  assert.equal(attached, false);

  // Sample the `tree` query all along: node and simulation counts never go down.
  const sampler = sampleTree(searchId);

  // 1. The browser worker dies while the search restores the root state (its session is lost mid-simulation).
  assert.equal(await waitForStarted(searchId, ['startSession'], 120_000), 'startSession', 'the search reached the browser');
  await kill(stack.workers.find((w) => alive(w) && isBrowser(w))!);
  const browserBack = stack.startWorker('browser');
  // 2. The control worker (the one holding the search's workflow state) dies while the learner samples.
  const during = await waitForStarted(searchId, ['sample_actions', 'critiqueCandidates', 'stepSession'], 120_000);
  assert.ok(during, 'the search went on after the browser worker died');
  await kill(stack.workers.find((w) => alive(w) && isControl(w))!);
  await Promise.all([browserBack, stack.startWorker('control')]);

  const result = (await handle.result()) as TrainingResult;
  const samples = await sampler.stop();
  assert.deepEqual(result, { runId, iterations: 1, adapterVersion: 1, stoppedEarly: false });

  // The tree query: counts never dropped, and the search ended with exactly numSimulations simulations.
  assert.ok(samples.length > 3, `the tree query answered (${samples.length} samples)`);
  for (let i = 1; i < samples.length; i++) {
    assert.ok(samples[i].nodes >= samples[i - 1].nodes, `node count dropped: ${JSON.stringify(samples.slice(i - 1, i + 1))}`);
    assert.ok(samples[i].simulations >= samples[i - 1].simulations, `simulation count dropped: ${JSON.stringify(samples.slice(i - 1, i + 1))}`);
  }
  for (const s of samples) assert.equal(s.visits, s.simulations, 'root visits = simulations (each backed up once)');
  const search = (await stack.client.workflow.getHandle(searchId).result()) as MctsSearchResult;
  t.diagnostic(`killed the control worker during ${during}; tree: ${JSON.stringify(search.stats)}; counters: ${JSON.stringify(search.counters)}; ${search.pairs.count} pairs`);
  assert.equal(search.simulations, 6);
  assert.equal(search.stats.totalVisits, 6, 'the root was visited once per simulation, no simulation counted twice');
  assert.ok(search.runs >= 3, `continued as new with a snapshot (${search.runs} runs)`);
  assert.ok(search.stats.nodes >= 2 && search.stats.nodes <= 1 + 3 * 6);
  assert.ok(search.counters.criticCalls >= 1 && search.counters.criticFailures === 0);
  assert.ok(search.counters.candidates >= 3);

  // DPO pairs (the critic's ranking separates siblings), the update wrote v1 and only v1.
  assert.ok(search.pairs.count > 0 && search.pairs.ref, 'DPO pairs were collected');
  const blobs = new BlobStore(join(stack.home, 'blobs'));
  const pairs = await blobs.getJson<MctsPair[]>(search.pairs.ref!);
  assert.equal(pairs.length, search.pairs.count);
  for (const p of pairs) {
    assert.ok(p.delta_q >= 0.1 - 1e-9);
    assert.match(p.prompt_ref, /^sha256:[0-9a-f]{64}\.json$/);
    assert.notEqual(p.chosen_ref, p.rejected_ref);
    assert.equal(p.ref_chosen_logprob === null, p.ref_rejected_logprob === null);
  }
  assert.deepEqual(readdirSync(join(stack.checkpoints, runId)).sort(), ['v1']);
  const lines = parseMetricsJsonl(readFileSync(join(stack.home, runId, 'metrics.jsonl'), 'utf8')).filter(isMctsMetrics);
  assert.deepEqual(
    lines.map((l) => l.iteration),
    [1],
  );
  assert.equal(lines[0].mcts.pairs, search.pairs.count);
  assert.equal(lines[0].adapter_version, 1);
  assert.equal(lines[0].mcts.simulations, 6);
  assert.ok(lines[0].mcts.mean_abs_delta_q! >= 0.1 - 1e-9);
  assert.ok(Number.isFinite(lines[0].loss));

  // Every run of the search's continue-as-new chain replays against the current code; HALO_RECORD_MCTS_HISTORY=<dir>
  // records the first one (worker kills, root expansion, continue-as-new) as a fixture for test/integration/replay.test.ts.
  const runs = await chainRuns(searchId);
  assert.equal(runs.length, search.runs);
  for (const r of runs) {
    await Worker.runReplayHistory({ workflowsPath: require.resolve('../../workflows') }, await stack.client.workflow.getHandle(searchId, r).fetchHistory(), searchId);
  }
  recordHistory(searchId, runs[0], 'chaos-first-run');

  // `halo mcts tree RUN TASK --json`, in process (the command module as the CLI registers it).
  const printed: string[] = [];
  const log = console.log;
  console.log = (s: string) => void printed.push(s);
  try {
    const program = new Command('halo').option('-c, --config <file>').exitOverride();
    registerMcts(program, { loadConfig: () => cfg });
    await program.parseAsync(['node', 'halo', 'mcts', 'tree', runId, 'click-button', '--json']);
  } finally {
    console.log = log;
  }
  const view = JSON.parse(printed.join('\n'));
  assert.equal(view.workflowId, searchId);
  assert.equal(view.simulations, 6);
  assert.equal(view.tree.nodes.length, search.stats.nodes);
  assert.equal(view.pairList.length, search.pairs.count);
  assert.deepEqual(view.pairList, pairs);
});

/** Samples the `tree` query every 100 ms until stopped; returns the samples. */
function sampleTree(workflowId: string) {
  const samples: { nodes: number; simulations: number; visits: number }[] = [];
  let on = true;
  const done = (async () => {
    while (on) {
      const v = await stack.client.workflow
        .getHandle(workflowId)
        .query<MctsTreeView>('tree')
        .catch(() => undefined);
      if (v) samples.push({ nodes: v.stats.nodes, simulations: v.simulations, visits: v.tree ? getNode(v.tree, 0).visits : v.stats.totalVisits });
      await sleep(100);
    }
  })();
  return {
    samples,
    async stop() {
      on = false;
      await done;
      return samples;
    },
  };
}

/** Waits until the search has done `sims` simulations and only browser activities are running (none of the control worker's). */
async function waitForBrowserOnly(workflowId: string, sims: number, types: string[], timeoutMs = 120_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let seen = 'no progress answered';
  while (Date.now() < deadline) {
    const h = stack.client.workflow.getHandle(workflowId);
    const p = await h.query<MctsProgress>('progress').catch(() => undefined);
    if (p) seen = `simulation ${p.simulations}`;
    if (p && p.simulations >= sims) {
      const d = await h.describe().catch(() => undefined);
      const pending = d?.raw.pendingActivities ?? [];
      const names = pending.map((a) => a.activityType?.name ?? '');
      seen = `simulation ${p.simulations}, ${d?.status.name ?? 'not described'}, pending [${pending.map((a) => `${a.activityType?.name} state ${a.state} attempt ${a.attempt}`).join(', ')}]`;
      if (pending.some((a) => types.includes(a.activityType?.name ?? '') && a.state === 2) && names.every((n) => ['startSession', 'stepSession', 'closeSession'].includes(n)))
        return;
    }
    await sleep(30);
  }
  throw new Error(`${workflowId} did not reach simulation ${sims} with a browser activity running within ${timeoutMs / 1000}s (last seen: ${seen})`);
}

test('a deeper search (branching scripted policy): control worker SIGKILL in a continued run, browser worker SIGKILL mid-step; tree intact, simulations exact', async (t) => {
  const policy = await startBranchingPolicyServer();
  const searchId = 'mcts-deep-search';
  try {
    const cfg = parseConfig({
      policy: { backend: 'openai', baseUrl: policy.url, model: 'scripted', maxTokens: 64, timeoutMs: 5_000 },
      mcts: {
        numSimulations: 9,
        maxChildren: 3,
        maxDepth: 4,
        continueAsNewEvery: 3,
        critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic', timeoutMs: 5_000 },
      },
    });
    const input: MctsSearchInput = {
      runId: 'mcts-deep',
      task: { env: 'miniwob', task: 'enter-text', seed: 2 },
      params: mctsParams(cfg),
      policy: cfg.policy,
      adapterVersion: 0,
      browserTaskQueue: stack.browserQueue,
      gpuTaskQueue: stack.gpuQueue,
      learnerHeartbeatTimeoutMs: 10_000,
      maxSessionRebuilds: 5,
      sessionStartTimeoutMs: 4_000,
      heartbeatTimeoutMs: 3_000,
    };
    const handle = await stack.client.workflow.start('mctsSearch', { taskQueue: stack.controlQueue, workflowId: searchId, args: [input] });
    const sampler = sampleTree(searchId);

    // 1. The control worker dies in the second run (its tree came from a snapshot) while a browser activity runs.
    await waitForBrowserOnly(searchId, 4, ['startSession', 'stepSession']);
    const before = await handle.query<MctsTreeView>('tree');
    await kill(stack.workers.find((w) => alive(w) && isControl(w))!);
    await stack.startWorker('control');
    // 2. The browser worker dies in the middle of a step (the simulation's session is lost and rebuilt).
    await waitForBrowserOnly(searchId, 6, ['stepSession']);
    await kill(stack.workers.find((w) => alive(w) && isBrowser(w))!);
    await stack.startWorker('browser');

    const res = (await handle.result()) as MctsSearchResult;
    const samples = await sampler.stop();
    t.diagnostic(`tree: ${JSON.stringify(res.stats)}; counters: ${JSON.stringify(res.counters)}; ${res.pairs.count} pairs; ${samples.length} tree samples`);
    assert.equal(res.simulations, 9);
    assert.equal(res.stats.totalVisits, 9, 'root visits = simulations: none lost, none counted twice');
    assert.equal(res.runs, 3, 'continued as new after simulations 3 and 6');
    assert.ok(res.stats.maxDepth >= 2, `a deeper tree (depth ${res.stats.maxDepth})`);
    assert.ok(res.counters.browserSteps >= 9);
    assert.ok(samples.length > 5);
    for (let i = 1; i < samples.length; i++) {
      assert.ok(samples[i].nodes >= samples[i - 1].nodes, `node count dropped: ${JSON.stringify(samples.slice(i - 1, i + 1))}`);
      assert.ok(samples[i].simulations >= samples[i - 1].simulations);
    }
    // The tree as it was before the control worker died is a prefix of the final one: same nodes, same actions.
    const final = await handle.query<MctsTreeView>('tree');
    const beforeTree = before.tree!;
    const finalTree = final.tree!;
    for (const n of beforeTree.nodes) {
      const f = finalTree.nodes[n.id];
      assert.deepEqual([f.parent, f.actionKey, f.depth], [n.parent, n.actionKey, n.depth]);
      assert.ok(f.visits >= n.visits);
    }
    assert.equal(res.pairs.count > 0, res.pairs.ref !== null);
    if (res.pairs.count > 0) assert.ok(res.pairs.meanAbsDeltaQ! >= 0.1 - 1e-9);

    // Every run of the chain replays against the current code; HALO_RECORD_MCTS_HISTORY=<dir> records them.
    const runs = await chainRuns(searchId);
    assert.equal(runs.length, 3);
    for (const [i, r] of runs.entries()) {
      await Worker.runReplayHistory({ workflowsPath: require.resolve('../../workflows') }, await stack.client.workflow.getHandle(searchId, r).fetchHistory(), searchId);
      recordHistory(searchId, r, `run${i + 1}-of-3`);
    }
  } finally {
    await policy.close();
  }
});
