/**
 * How fast does the durable MCTS search simulate, and how much of its time goes into restoring node states
 * (a fresh browser session replaying the node's action path)? Runs `mctsSearch` workflows on a real dev
 * server with worker processes, MiniWoB++ in Chromium, an instant scripted policy that proposes K different
 * actions per state (the scripted solution plus clicks elsewhere in the task area) and the instant fake
 * critic; valueMode rollout and valueMode critic side by side in one run.
 *
 *   node --import tsx bench/mcts-sims.ts [--sims 30] [--task enter-text] [--k 3] [--max-depth 5] [--repeats 1]
 *
 * Prints simulations per minute, the share of wall time in restores (startSession with replay, from the
 * workflow histories: scheduled → completed), the mean replay length, and the other phases.
 */
import { parseArgs } from 'node:util';
import type { Client } from '@temporalio/client';
import { parseConfig } from '../lib/config';
import { mctsParams } from '../lib/mcts-params';
import type { MctsSearchResult } from '../lib/mcts-search';
import type { MctsSearchInput } from '../workflows/mcts-search';
import { startBranchingPolicyServer } from '../testing/branching-policy-server';
import { startFakeCriticServer } from '../testing/fake-critic-server';
import { startTestStack } from '../testing/stack';
import { runBench } from './bench-run';

interface Timing {
  restore: number;
  restores: number;
  step: number;
  sample: number;
  critic: number;
  close: number;
}

/** Activity time (scheduled → completed/failed/timed out) per activity type over every run of a search's chain. */
async function activityTimes(client: Client, workflowId: string): Promise<Timing> {
  const t: Timing = { restore: 0, restores: 0, step: 0, sample: 0, critic: 0, close: 0 };
  const ms = (ts: { seconds?: unknown; nanos?: number | null } | null | undefined) => Number(ts?.seconds ?? 0) * 1000 + (ts?.nanos ?? 0) / 1e6;
  for await (const w of client.workflow.list({ query: `WorkflowId = '${workflowId}'` })) {
    const history = await client.workflow.getHandle(workflowId, w.runId).fetchHistory();
    const scheduled = new Map<string, { type: string; at: number }>();
    for (const e of history.events ?? []) {
      const s = e.activityTaskScheduledEventAttributes;
      if (s) scheduled.set(String(e.eventId), { type: s.activityType?.name ?? '', at: ms(e.eventTime) });
      const end = e.activityTaskCompletedEventAttributes ?? e.activityTaskFailedEventAttributes ?? e.activityTaskTimedOutEventAttributes;
      if (!end) continue;
      const from = scheduled.get(String(end.scheduledEventId));
      if (!from) continue;
      const d = (ms(e.eventTime) - from.at) / 1000;
      if (from.type === 'startSession') {
        t.restore += d;
        t.restores++;
      } else if (from.type === 'stepSession') t.step += d;
      else if (from.type === 'samplePolicy') t.sample += d;
      else if (from.type === 'critiqueCandidates') t.critic += d;
      else if (from.type === 'closeSession') t.close += d;
    }
  }
  return t;
}

async function main() {
  const { values } = parseArgs({
    options: {
      sims: { type: 'string', default: '30' },
      task: { type: 'string', default: 'enter-text' },
      k: { type: 'string', default: '3' },
      'max-depth': { type: 'string', default: '5' },
      repeats: { type: 'string', default: '1' },
    },
  });
  const sims = Number(values.sims);
  const repeats = Number(values.repeats);
  const [policy, critic, stack] = await Promise.all([
    startBranchingPolicyServer(),
    startFakeCriticServer({ kind: 'prefer', substring: 'type', value: 0.6 }),
    startTestStack({ browserWorkers: 1 }),
  ]);
  const rows: { mode: string; wall: number; sims: number; nodes: number; depth: number; t: Timing; replayed: number; restores: number; steps: number; rolloutSteps: number }[] = [];
  try {
    const base = {
      temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
      policy: { backend: 'openai', baseUrl: policy.url, model: 'scripted', maxTokens: 64 },
      mcts: {
        numSimulations: sims,
        maxChildren: Number(values.k),
        maxDepth: Number(values['max-depth']),
        continueAsNewEvery: 10,
        critic: { backend: 'openai', baseUrl: critic.url, model: 'fake-critic' },
      },
    };
    let n = 0;
    // Warm-up (browser launch, workflow bundle), then the two modes alternately.
    for (let r = 0; r <= repeats; r++) {
      for (const valueMode of ['rollout', 'critic'] as const) {
        if (r === 0 && valueMode === 'critic') continue;
        const cfg = parseConfig({ ...base, mcts: { ...base.mcts, valueMode, numSimulations: r === 0 ? 3 : sims } });
        const input: MctsSearchInput = {
          runId: 'bench',
          task: { env: 'miniwob', task: values.task!, seed: 1 },
          params: mctsParams(cfg),
          policy: cfg.policy,
          adapterVersion: 0,
          browserTaskQueue: stack.browserQueue,
          gpuTaskQueue: stack.gpuQueue,
          learnerHeartbeatTimeoutMs: 60_000,
          maxSessionRebuilds: 5,
          sessionStartTimeoutMs: 20_000,
          heartbeatTimeoutMs: 10_000,
        };
        const id = `bench-mcts-${valueMode}-${Date.now()}-${n++}`;
        const t0 = performance.now();
        const res: MctsSearchResult = await stack.client.workflow.execute('mctsSearch', { taskQueue: stack.controlQueue, workflowId: id, args: [input] });
        const wall = (performance.now() - t0) / 1000;
        if (r === 0) continue;
        const t = await activityTimes(stack.client, id);
        rows.push({
          mode: valueMode,
          wall,
          sims: res.simulations,
          nodes: res.stats.nodes,
          depth: res.stats.maxDepth,
          t,
          replayed: res.counters.replayedActions,
          restores: res.counters.restores,
          steps: res.counters.browserSteps,
          rolloutSteps: res.counters.rolloutSteps,
        });
        console.error(`${valueMode}: ${res.simulations} simulations in ${wall.toFixed(1)} s, ${res.stats.nodes} nodes, depth ${res.stats.maxDepth}, restore ${t.restore.toFixed(1)} s`);
      }
    }
  } finally {
    await stack.stop();
    await policy.close();
    await critic.close();
  }
  const pct = (x: number, of: number) => `${((x / of) * 100).toFixed(1)}%`;
  console.log(`mctsSearch on MiniWoB++ ${values.task} seed 1: ${sims} simulations, K=${values.k}, maxDepth ${values['max-depth']}, instant scripted policy and critic, ${repeats} run(s) per mode`);
  console.log('| valueMode | wall s | simulations/min | nodes | depth | restores | mean replay (actions) | restore share | step share | policy share | critic share | close share |');
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    console.log(
      `| ${r.mode} | ${r.wall.toFixed(1)} | ${((r.sims / r.wall) * 60).toFixed(1)} | ${r.nodes} | ${r.depth} | ${r.restores} | ${(r.replayed / Math.max(1, r.restores)).toFixed(2)} | ` +
        `${pct(r.t.restore, r.wall)} | ${pct(r.t.step, r.wall)} | ${pct(r.t.sample, r.wall)} | ${pct(r.t.critic, r.wall)} | ${pct(r.t.close, r.wall)} |`,
    );
  }
  console.log('Shares are activity time (scheduled → completed, from the histories) over wall time; closes overlap the next simulation.');
}

runBench(main);
