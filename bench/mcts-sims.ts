/**
 * How fast does the durable MCTS search simulate, and how much of its time goes into restoring node states
 * (a browser session brought to the node by replaying its action path)? Runs `mctsSearch` workflows on a real
 * dev server with worker processes, MiniWoB++ in Chromium, an instant scripted policy that proposes K
 * different actions per state (the scripted solution plus clicks elsewhere in the task area) and the instant
 * fake critic; valueMode rollout and valueMode critic, on three stacks one after the other:
 *   - before: HALO_WARM_PAGES=0 and HALO_FAST_REPLAY=0, a new session per simulation (mcts.parkedSessions 0):
 *     every restore loads its page and settles after every replayed action (what the targets were set against);
 *   - settled replays: HALO_FAST_REPLAY=0, parked sessions (`--parked`, default 2);
 *   - default: parkedSessions 0 and `--parked`, alternately.
 *
 *   node --import tsx bench/mcts-sims.ts [--sims 30] [--task enter-text] [--k 3] [--max-depth 5] [--repeats 1] [--parked 2]
 *
 * Prints simulations per minute, the share of wall time in restores (the search's own restore time: new
 * sessions, in-place resets and parked sessions stepped forward), how restores were served, how many replays
 * kept their fast replay, the mean replay length, the other phases (activity times from the workflow
 * histories: scheduled → completed), and per valueMode the ratios of simulations per minute.
 */
import { parseArgs } from 'node:util';
import type { Client } from '@temporalio/client';
import { parseConfig } from '../lib/config/config';
import { mctsParams } from '../lib/search/mcts-params';
import type { MctsSearchResult } from '../lib/search/mcts-search';
import type { MctsSearchInput } from '../workflows/mcts-search';
import { startBranchingPolicyServer } from '../testing/branching-policy-server';
import { startFakeCriticServer } from '../testing/fake-critic-server';
import { startTestStack, type TestStack } from '../testing/stack';
import { printBenchHeader, runBench } from './bench-run';

interface Timing {
  restore: number;
  restores: number;
  /** Restores whose replay skipped its settle waits and kept that, and those that replayed again with them. */
  fast: number;
  settledAgain: number;
  step: number;
  sample: number;
  critic: number;
  close: number;
}

/** Activity time (scheduled → completed/failed/timed out) per activity type over every run of a search's chain. */
async function activityTimes(client: Client, workflowId: string): Promise<Timing> {
  const t: Timing = { restore: 0, restores: 0, fast: 0, settledAgain: 0, step: 0, sample: 0, critic: 0, close: 0 };
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
        const data = e.activityTaskCompletedEventAttributes?.result?.payloads?.[0]?.data;
        const how = data ? (JSON.parse(Buffer.from(data).toString('utf8')) as { fastReplay?: string }).fastReplay : undefined;
        if (how === 'fast') t.fast++;
        else if (how === 'settled') t.settledAgain++;
      } else if (from.type === 'stepSession') t.step += d;
      else if (from.type === 'samplePolicy') t.sample += d;
      else if (from.type === 'critiqueCandidates') t.critic += d;
      else if (from.type === 'closeSession') t.close += d;
    }
  }
  return t;
}

interface Row {
  setup: string;
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
}

/** Worker settings of each stack: `before` is the path without warm pages and without fast replays. */
const SETUPS = [
  { name: 'before', env: { HALO_WARM_PAGES: '0', HALO_FAST_REPLAY: '0' } },
  { name: 'settled replays', env: { HALO_WARM_PAGES: '', HALO_FAST_REPLAY: '0' } },
  { name: 'default', env: { HALO_WARM_PAGES: '', HALO_FAST_REPLAY: '' } },
] as const;

/** One warm-up search, then per valueMode a search for each of `parkedModes`, alternately. */
async function runSearches(
  stack: TestStack,
  setup: string,
  parkedModes: number[],
  policyUrl: string,
  criticUrl: string,
  values: Record<string, string | undefined>,
  sims: number,
  repeats: number,
): Promise<Row[]> {
  const rows: Row[] = [];
  const base = {
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'openai', baseUrl: policyUrl, model: 'scripted', maxTokens: 64 },
    mcts: {
      numSimulations: sims,
      maxChildren: Number(values.k),
      maxDepth: Number(values['max-depth']),
      continueAsNewEvery: 10,
      critic: { backend: 'openai', baseUrl: criticUrl, model: 'fake-critic' },
    },
  };
  let n = 0;
  for (let r = 0; r <= repeats; r++) {
    for (const [valueMode, parkedSessions] of (['rollout', 'critic'] as const).flatMap((m) => parkedModes.map((p) => [m, p] as const))) {
      if (r === 0 && (valueMode === 'critic' || parkedSessions !== parkedModes[0])) continue;
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
      rows.push({
        setup,
        mode: valueMode,
        parked: parkedSessions,
        wall,
        restoreS: res.counters.seconds.restore,
        reuse: res.counters.sessionReuse,
        sims: res.simulations,
        nodes: res.stats.nodes,
        depth: res.stats.maxDepth,
        t: await activityTimes(stack.client, id),
        replayed: res.counters.replayedActions,
        restores: res.counters.restores,
      });
      console.error(
        `${setup}, ${valueMode} parked ${parkedSessions}: ${res.simulations} simulations in ${wall.toFixed(1)} s, ${res.stats.nodes} nodes, depth ${res.stats.maxDepth}, restore ${res.counters.seconds.restore.toFixed(1)} s`,
      );
    }
  }
  return rows;
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
  const [policy, critic] = await Promise.all([startBranchingPolicyServer(), startFakeCriticServer({ kind: 'prefer', substring: 'type', value: 0.6 })]);
  const parked = Number(values.parked);
  const rows: Row[] = [];
  try {
    // The path the targets were set against first (a page loaded and every replayed action settled for every
    // simulation), then today's defaults with and without parked sessions: one stack each, as a worker reads
    // HALO_WARM_PAGES and HALO_FAST_REPLAY when it starts.
    for (const setup of SETUPS) {
      process.env.HALO_WARM_PAGES = setup.env.HALO_WARM_PAGES;
      process.env.HALO_FAST_REPLAY = setup.env.HALO_FAST_REPLAY;
      const stack = await startTestStack({ browserWorkers: 1 });
      try {
        const modes = setup.name === 'before' ? [0] : setup.name === 'settled replays' ? [parked] : [0, parked];
        rows.push(...(await runSearches(stack, setup.name, modes, policy.url, critic.url, values, sims, repeats)));
      } finally {
        await stack.stop();
      }
    }
  } finally {
    await policy.close();
    await critic.close();
  }
  const pct = (x: number, of: number) => `${((x / of) * 100).toFixed(1)}%`;
  const perMin = (r: (typeof rows)[number]) => (r.sims / r.wall) * 60;
  console.log(
    `mctsSearch on MiniWoB++ ${values.task} seed 1: ${sims} simulations, K=${values.k}, maxDepth ${values['max-depth']}, instant scripted policy and critic, ${repeats} run(s) per mode`,
  );
  console.log(
    '| workers | valueMode | parkedSessions | wall s | simulations/min | nodes | depth | restores | at node / stepped / reset / new (spares) | fast replays kept / replayed again | mean replay (actions) | restore share | step share | policy share | critic share | close share |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|');
  for (const r of rows) {
    const u = r.reuse;
    console.log(
      `| ${r.setup} | ${r.mode} | ${r.parked} | ${r.wall.toFixed(1)} | ${perMin(r).toFixed(1)} | ${r.nodes} | ${r.depth} | ${r.restores} | ${u.reused} / ${u.advanced} / ${u.resetInPlace} / ${u.fresh} (${u.prepared}) | ${r.t.fast} / ${r.t.settledAgain} | ` +
        `${(r.replayed / Math.max(1, r.restores)).toFixed(2)} | ${pct(r.restoreS, r.wall)} | ${pct(r.t.step, r.wall)} | ${pct(r.t.sample, r.wall)} | ${pct(r.t.critic, r.wall)} | ${pct(r.t.close, r.wall)} |`,
    );
  }
  for (const mode of ['rollout', 'critic']) {
    const mean = (setup: string, p: number) => {
      const rs = rows.filter((r) => r.setup === setup && r.mode === mode && r.parked === p);
      return rs.reduce((a, r) => a + perMin(r), 0) / Math.max(1, rs.length);
    };
    const best = mean('default', parked);
    console.log(
      `${mode}: simulations/min of default parkedSessions ${parked} / before parkedSessions 0 = ${(best / mean('before', 0)).toFixed(2)}×; ` +
        `/ default parkedSessions 0 = ${(best / mean('default', 0)).toFixed(2)}×; / settled replays parkedSessions ${parked} = ${(best / mean('settled replays', parked)).toFixed(2)}×`,
    );
  }
  console.log(
    "Restore share: the search's restore time (workflow clock: new sessions, in-place resets, parked sessions stepped forward) over wall time. " +
      'Other shares: activity time (scheduled → completed, from the histories; stepSession includes the forward steps) over wall time; closes overlap the next simulation.',
  );
}

runBench(main);
