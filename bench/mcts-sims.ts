/**
 * How fast does the durable MCTS search simulate, and how much of its time goes into restoring node states
 * (a fresh browser session replaying the node's action path)? Runs `mctsSearch` workflows on a real dev
 * server with worker processes, MiniWoB++ in Chromium, an instant scripted policy that proposes K different
 * actions per state (the scripted solution plus clicks elsewhere in the task area) and the instant fake
 * critic; valueMode rollout and valueMode critic, each with a new session per simulation (mcts.parkedSessions 0)
 * and with parked sessions (`--parked`, default 2), alternating in one run.
 *
 *   node --import tsx bench/mcts-sims.ts [--sims 30] [--task enter-text] [--k 3] [--max-depth 5] [--repeats 1] [--parked 2]
 *
 * Prints simulations per minute, the share of wall time in restores (the search's own restore time: new
 * sessions, in-place resets and parked sessions stepped forward), how restores were served, the mean replay
 * length, the other phases (activity times from the workflow histories: scheduled → completed), and per
 * valueMode the ratio of simulations per minute with parked sessions to without.
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
import { printBenchHeader, runBench } from './bench-run';

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
      if (from.type === 'startSession' || from.type === 'resetSession') {
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
      parked: { type: 'string', default: '2' },
    },
  });
  printBenchHeader('mcts-sims');
  const sims = Number(values.sims);
  const repeats = Number(values.repeats);
  const [policy, critic, stack] = await Promise.all([
    startBranchingPolicyServer(),
    startFakeCriticServer({ kind: 'prefer', substring: 'type', value: 0.6 }),
    startTestStack({ browserWorkers: 1 }),
  ]);
  const parkedModes = [0, Number(values.parked)];
  const rows: {
    mode: string;
    parked: number;
    wall: number;
    sims: number;
    nodes: number;
    depth: number;
    t: Timing;
    restoreS: number;
    reuse: MctsSearchResult['counters']['sessionReuse'];
    replayed: number;
    restores: number;
    steps: number;
    rolloutSteps: number;
  }[] = [];
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
    // Warm-up (browser launch, workflow bundle), then the modes alternately.
    for (let r = 0; r <= repeats; r++) {
      for (const [valueMode, parkedSessions] of (['rollout', 'critic'] as const).flatMap((m) => parkedModes.map((p) => [m, p] as const))) {
        if (r === 0 && (valueMode === 'critic' || parkedSessions === 0)) continue;
        const cfg = parseConfig({ ...base, mcts: { ...base.mcts, valueMode, parkedSessions, numSimulations: r === 0 ? 3 : sims } });
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
        const id = `bench-mcts-${valueMode}-p${parkedSessions}-${Date.now()}-${n++}`;
        const t0 = performance.now();
        const res: MctsSearchResult = await stack.client.workflow.execute('mctsSearch', { taskQueue: stack.controlQueue, workflowId: id, args: [input] });
        const wall = (performance.now() - t0) / 1000;
        if (r === 0) continue;
        const t = await activityTimes(stack.client, id);
        rows.push({
          mode: valueMode,
          parked: parkedSessions,
          wall,
          restoreS: res.counters.seconds.restore,
          reuse: res.counters.sessionReuse,
          sims: res.simulations,
          nodes: res.stats.nodes,
          depth: res.stats.maxDepth,
          t,
          replayed: res.counters.replayedActions,
          restores: res.counters.restores,
          steps: res.counters.browserSteps,
          rolloutSteps: res.counters.rolloutSteps,
        });
        console.error(
          `${valueMode} parked ${parkedSessions}: ${res.simulations} simulations in ${wall.toFixed(1)} s, ${res.stats.nodes} nodes, depth ${res.stats.maxDepth}, restore ${res.counters.seconds.restore.toFixed(1)} s`,
        );
      }
    }
  } finally {
    await stack.stop();
    await policy.close();
    await critic.close();
  }
  const pct = (x: number, of: number) => `${((x / of) * 100).toFixed(1)}%`;
  const perMin = (r: (typeof rows)[number]) => (r.sims / r.wall) * 60;
  console.log(
    `mctsSearch on MiniWoB++ ${values.task} seed 1: ${sims} simulations, K=${values.k}, maxDepth ${values['max-depth']}, instant scripted policy and critic, ${repeats} run(s) per mode`,
  );
  console.log(
    '| valueMode | parkedSessions | wall s | simulations/min | nodes | depth | restores | at node / stepped / reset / new (spares) | mean replay (actions) | restore share | step share | policy share | critic share | close share |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const u = r.reuse;
    console.log(
      `| ${r.mode} | ${r.parked} | ${r.wall.toFixed(1)} | ${perMin(r).toFixed(1)} | ${r.nodes} | ${r.depth} | ${r.restores} | ${u.reused} / ${u.advanced} / ${u.resetInPlace} / ${u.fresh} (${u.prepared}) | ` +
        `${(r.replayed / Math.max(1, r.restores)).toFixed(2)} | ${pct(r.restoreS, r.wall)} | ${pct(r.t.step, r.wall)} | ${pct(r.t.sample, r.wall)} | ${pct(r.t.critic, r.wall)} | ${pct(r.t.close, r.wall)} |`,
    );
  }
  for (const mode of ['rollout', 'critic']) {
    const mean = (p: number) => {
      const rs = rows.filter((r) => r.mode === mode && r.parked === p);
      return rs.reduce((a, r) => a + perMin(r), 0) / Math.max(1, rs.length);
    };
    console.log(`${mode}: simulations/min with parkedSessions ${parkedModes[1]} / with 0 = ${(mean(parkedModes[1]) / mean(0)).toFixed(2)}×`);
  }
  console.log(
    "Restore share: the search's restore time (workflow clock: new sessions, in-place resets, parked sessions stepped forward) over wall time. " +
      'Other shares: activity time (scheduled → completed, from the histories; stepSession includes the forward steps) over wall time; closes overlap the next simulation.',
  );
}

runBench(main);
