import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Command } from 'commander';
import { Worker } from '@temporalio/worker';
import { parseConfig, type HaloConfig } from '../../lib/config';
import { getNode } from '../../lib/mcts';
import { parseMctsMetricsJsonl } from '../../activities/mcts-metrics';
import { register as registerMcts, startOrAttachMcts } from '../../client/commands/mcts';
import { temporalBinary } from '../../client/processes';
import type { MctsSearchResult, MctsTreeView, TrainMctsResult } from '../../workflows/mcts';
import { startFakeCriticServer, type FakeCriticServer } from '../helpers/fake-critic-server';
import { startTestStack, type TestStack } from '../helpers/stack';

// Agent-Q-style MCTS on the real stack: Temporal, Chromium with MiniWoB++ pages, the Python learner with the
// colocated tiny-random Qwen3-VL (sampling and update_dpo); only the critic is a local fake speaking the
// OpenAI protocol. During the search the browser worker and the control worker are SIGKILLed and restarted.
let stack: TestStack;
let critic: FakeCriticServer;
before(async () => {
  [stack, critic] = await Promise.all([
    startTestStack({ browserWorkers: 1, learner: true }),
    // Candidates mentioning "click" first (valid clicks before unparseable outputs), value 0.7.
    startFakeCriticServer({ kind: 'prefer', substring: 'click', value: 0.7 }),
  ]);
});
after(async () => {
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
    const d = await stack.client.workflow.getHandle(workflowId).describe().catch(() => undefined);
    const hit = (d?.raw.pendingActivities ?? []).find((a) => types.includes(a.activityType?.name ?? '') && a.state === 2 /* STARTED */);
    if (hit) return hit.activityType!.name!;
    if (d && d.status.name !== 'RUNNING' && d.status.name !== 'CONTINUED_AS_NEW') return false;
    await sleep(40);
  }
  return false;
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

test('trainMcts with the colocated tiny-random policy survives SIGKILLed workers: tree intact, 6 simulations exactly, DPO pairs, adapter v1 once', async () => {
  const runId = 'mcts-test';
  const searchId = `${runId}-it1-click-button`;
  const cfg = config(runId);
  const { handle, attached } = await startOrAttachMcts(stack.client, cfg);
  assert.equal(attached, false);

  // Sample the `tree` query all along: node and simulation counts never go down.
  const samples: { nodes: number; simulations: number; visits: number }[] = [];
  let sampling = true;
  const sampler = (async () => {
    while (sampling) {
      const v = await stack.client.workflow
        .getHandle(searchId)
        .query<MctsTreeView>('tree')
        .catch(() => undefined);
      if (v) samples.push({ nodes: v.stats.nodes, simulations: v.simulations, visits: v.tree ? getNode(v.tree, 0).visits : v.stats.totalVisits });
      await sleep(100);
    }
  })();

  // 1. The browser worker dies while the search restores the root state (its session is lost mid-simulation).
  assert.equal(await waitForStarted(searchId, ['startSession'], 120_000), 'startSession', 'the search reached the browser');
  await kill(stack.workers.find((w) => alive(w) && isBrowser(w))!);
  const browserBack = stack.startWorker('browser');
  // 2. The control worker (the one holding the search's workflow state) dies while the learner samples.
  const during = await waitForStarted(searchId, ['sample_actions', 'critiqueCandidates', 'stepSession'], 120_000);
  assert.ok(during, 'the search went on after the browser worker died');
  await kill(stack.workers.find((w) => alive(w) && isControl(w))!);
  await Promise.all([browserBack, stack.startWorker('control')]);

  const result = (await handle.result()) as TrainMctsResult;
  sampling = false;
  await sampler;
  assert.deepEqual(result, { runId, iterations: 1, adapterVersion: 1, stoppedEarly: false });

  // The tree query: counts never dropped, and the search ended with exactly numSimulations simulations.
  assert.ok(samples.length > 3, `the tree query answered (${samples.length} samples)`);
  for (let i = 1; i < samples.length; i++) {
    assert.ok(samples[i].nodes >= samples[i - 1].nodes, `node count dropped: ${JSON.stringify(samples.slice(i - 1, i + 1))}`);
    assert.ok(samples[i].simulations >= samples[i - 1].simulations, `simulation count dropped: ${JSON.stringify(samples.slice(i - 1, i + 1))}`);
  }
  for (const s of samples) assert.equal(s.visits, s.simulations, 'root visits = simulations (each backed up once)');
  const search = (await stack.client.workflow.getHandle(searchId).result()) as MctsSearchResult;
  assert.equal(search.simulations, 6);
  assert.equal(search.stats.totalVisits, 6, 'the root was visited once per simulation, no simulation counted twice');
  assert.ok(search.runs >= 3, `continued as new with a snapshot (${search.runs} runs)`);
  assert.ok(search.stats.nodes >= 2 && search.stats.nodes <= 1 + 3 * 6);
  assert.ok(search.counters.criticCalls >= 1 && search.counters.criticFailures === 0);
  assert.ok(search.counters.candidates >= 3);

  // DPO pairs (the critic's ranking separates siblings), the update wrote v1 and only v1.
  assert.ok(search.pairs.length > 0, 'DPO pairs were collected');
  for (const p of search.pairs) {
    assert.ok(p.delta_q >= 0.1 - 1e-9);
    assert.match(p.prompt_ref, /^sha256:[0-9a-f]{64}\.json$/);
    assert.notEqual(p.chosen_ref, p.rejected_ref);
    assert.equal(p.ref_chosen_logprob === null, p.ref_rejected_logprob === null);
  }
  assert.deepEqual(readdirSync(join(stack.checkpoints, runId)).sort(), ['v1']);
  const lines = parseMctsMetricsJsonl(readFileSync(join(stack.home, runId, 'mcts-metrics.jsonl'), 'utf8'));
  assert.deepEqual(lines.map((l) => l.iteration), [1]);
  assert.equal(lines[0].pairs, search.pairs.length);
  assert.equal(lines[0].adapter_version, 1);
  assert.equal(lines[0].simulations, 6);
  assert.ok(lines[0].mean_abs_delta_q! >= 0.1 - 1e-9);
  assert.ok(Number.isFinite(lines[0].dpo_loss));

  // Every run of the search's continue-as-new chain replays against the current code.
  const runs: { runId: string; start: number }[] = [];
  for await (const w of stack.client.workflow.list({ query: `WorkflowId = '${searchId}'` })) runs.push({ runId: w.runId, start: w.startTime.getTime() });
  runs.sort((a, b) => a.start - b.start);
  assert.equal(runs.length, search.runs);
  for (const r of runs) {
    const history = await stack.client.workflow.getHandle(searchId, r.runId).fetchHistory();
    await Worker.runReplayHistory({ workflowsPath: require.resolve('../../workflows') }, history, searchId);
  }
  // HALO_RECORD_MCTS_HISTORY=<dir>: record the first run (kills, root expansion, continue-as-new) as a fixture.
  const out = process.env.HALO_RECORD_MCTS_HISTORY;
  if (out) {
    const json = execFileSync(
      temporalBinary(),
      ['workflow', 'show', '--address', stack.address, '--namespace', stack.namespace, '--workflow-id', searchId, '--run-id', runs[0].runId, '--output', 'json'],
      { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 },
    );
    writeFileSync(join(out, `${searchId}.chaos-first-run.json`), json);
  }

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
  assert.equal(view.pairList.length, search.pairs.length);
});
