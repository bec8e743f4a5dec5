/**
 * What does Temporal add to an episode? The same 10-step MiniWoB++ episode with an instant scripted policy
 * runs as a plain in-process loop (same session manager, same policy activity code, no Temporal) and as the
 * `episode` workflow on a real dev server with worker processes. Prints the median wall times and the ratio.
 *
 *   node --import tsx bench/episode-overhead.ts [--repeats 5] [--task click-checkboxes] [--steps 10]
 *                                               [--policy-latency-ms 0]   (0 = instant scripted policy)
 */
import { parseArgs } from 'node:util';
import { createControlActivities } from '../activities/control';
import type { SessionManager } from '../activities/session';
import { describeAction, isTerminal, isValidAction } from '../lib/model-io/actions';
import { parseConfig, type HaloConfig } from '../lib/config/config';
import { singleEpisodeInput } from '../client/episode-input';
import type { EpisodeInput, EpisodeResult } from '../lib/episode/episode-types';
import { startFakePolicyServer } from '../testing/fake-policy-server';
import { startTestStack } from '../testing/stack';
import { load, median, runBench } from './bench-run';
import { startInProcessSessions } from './in-process-sessions';
import { warmPagesFromEnv } from '../activities/warm-pages';
import { activityInterval, readRun, unionLength } from './temporal-history';

const { values } = parseArgs({
  options: {
    repeats: { type: 'string', default: '5' },
    task: { type: 'string', default: 'click-checkboxes' },
    steps: { type: 'string', default: '10' },
    'policy-latency-ms': { type: 'string', default: '0' },
  },
});
const repeats = Number(values.repeats);
const maxSteps = Number(values.steps);

/** The plain loop's own calls, timed the same way as the workflow's activities (run = the call). */
const plainCalls: Record<string, number[]> = {};
async function timed<T>(name: string, call: () => Promise<T>): Promise<T> {
  const t = performance.now();
  try {
    return await call();
  } finally {
    plainCalls[name] ??= [];
    plainCalls[name].push(performance.now() - t);
  }
}

async function plainLoop(cfg: HaloConfig, input: EpisodeInput, manager: SessionManager, control: ReturnType<typeof createControlActivities>) {
  const t0 = performance.now();
  const s = await manager.start({ spec: input.task, replay: [], episodeId: 'bench', rewardWeights: cfg.rewards });
  let rewardState = s.rewardState;
  if (process.env.BENCH_VERBOSE) console.error(`  plain start ${(performance.now() - t0).toFixed(0)} ms`);
  let observation = s.observation;
  const history: { step: number; action: string }[] = [];
  let steps = 0;
  for (let step = 1; step <= input.maxSteps; step++) {
    const sample = await timed('samplePolicy', () => control.samplePolicy({ policy: input.policy, observation, history }));
    const action = sample.candidates[0].action;
    steps++;
    history.push({ step, action: describeAction(action) });
    if (!isValidAction(action)) continue;
    const out = await timed('stepSession', () => manager.step({ sessionId: s.sessionId, index: step - 1, action, rewardState }));
    observation = { ...out.observation, goal: observation.goal };
    rewardState = out.rewardState;
    if (out.done || isTerminal(action)) break;
  }
  await manager.close(s.sessionId);
  await control.recordTrajectory({
    workflowId: 'bench',
    task: input.task,
    policyModel: input.policy.model,
    initial: s.observation,
    steps: [],
    success: false,
    reward: 0,
    reason: null,
  });
  return steps;
}

async function main() {
  const policy = await startFakePolicyServer({ kind: 'scripted' });
  policy.delayMs = Number(values['policy-latency-ms']);
  const stack = await startTestStack({ browserWorkers: 1 });
  // The browser worker's pool of kept pages here too, so both sides start their episodes the same way.
  const sessions = await startInProcessSessions({ warmPages: warmPagesFromEnv() });
  const { manager } = sessions;
  const control = createControlActivities(sessions.blobs);
  const cfg = parseConfig({
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { baseUrl: policy.url, model: 'scripted' },
    episode: { task: values.task, seed: 1, maxSteps },
  });
  const input = singleEpisodeInput(cfg, 'bench-episode');
  const plain: number[] = [];
  const durable: number[] = [];
  const shares: number[] = [];
  const parts: Record<string, number[]> = {};
  const note = (k: string, v: number | undefined) => {
    if (v === undefined || !Number.isFinite(v)) return;
    parts[k] ??= [];
    parts[k].push(v);
  };
  let n = 0;
  try {
    // One warm-up of each (browser launch, workflow bundle caches), then alternate so drift hits both.
    for (let r = 0; r <= repeats; r++) {
      let t = performance.now();
      const steps = await plainLoop(cfg, input, manager, control);
      const tp = performance.now() - t;
      t = performance.now();
      const res: EpisodeResult = await stack.client.workflow.execute('episode', {
        taskQueue: stack.controlQueue,
        workflowId: `bench-${n++}-${r}`,
        args: [input],
      });
      const tw = performance.now() - t;
      // Temporal's share read from the episode's own history: the time no activity ran (workflow tasks,
      // dispatch) over the history's span. Unlike the ratio, it does not depend on the plain loop's run.
      const run = await readRun(stack.client, `bench-${n - 1}-${r}`);
      const busy = unionLength(
        run.activities.map((a) => activityInterval(a)).filter((x): x is [number, number] => x !== undefined),
        run.start,
        run.end,
      );
      const share = 1 - busy / (run.end - run.start);
      if (steps !== maxSteps || res.steps !== maxSteps) throw new Error(`expected ${maxSteps} steps, got ${steps} and ${res.steps}`);
      if (r === 0) {
        // The warm-up's calls are not counted.
        for (const k of Object.keys(plainCalls)) delete plainCalls[k];
        continue;
      }
      // Where the time outside the activities goes: a workflow task's queue wait (scheduled → started) and its
      // turn on the worker (started → completed), and each activity's dispatch (scheduled → started).
      for (const t of run.workflowTasks.slice(1)) {
        note('workflow task: queue', t.started !== undefined ? t.started - t.scheduled : undefined);
        note('workflow task: worker turn', t.started !== undefined && t.completed !== undefined ? t.completed - t.started : undefined);
      }
      for (const a of run.activities) {
        note(`${a.type}: dispatch`, a.started !== undefined ? a.started - a.scheduled : undefined);
        note(`${a.type}: run`, a.started !== undefined && a.ended !== undefined ? a.ended - a.started : undefined);
      }
      plain.push(tp);
      durable.push(tw);
      shares.push(share);
      console.error(`run ${r}: plain ${tp.toFixed(0)} ms, temporal ${tw.toFixed(0)} ms, outside activities ${(share * 100).toFixed(1)}%`);
    }
  } finally {
    await sessions.close();
    await stack.stop();
    await policy.close();
  }
  const mp = median(plain);
  const md = median(durable);
  console.log(`episode: ${values.task}, ${maxSteps} steps, policy latency ${policy.delayMs} ms, ${repeats} runs each (medians)`);
  console.log(`plain in-process loop : ${mp.toFixed(0)} ms`);
  console.log(`Temporal workflow      : ${md.toFixed(0)} ms`);
  console.log(`ratio temporal/plain   : ${(md / mp).toFixed(3)}  (overhead ${((md / mp - 1) * 100).toFixed(1)}%, target <= 1.10x)`);
  console.log(`outside activities    : ${(median(shares) * 100).toFixed(1)}% of the episode's history span (workflow tasks and dispatch; median)`);
  for (const [k, v] of Object.entries(parts)) console.log(`  ${k.padEnd(32)}: median ${median(v).toFixed(1)} ms over ${v.length}`);
  for (const [k, v] of Object.entries(plainCalls)) console.log(`  plain loop ${k.padEnd(21)}: median ${median(v).toFixed(1)} ms over ${v.length}`);
  console.log(`load average at the end: ${load()}`);
}

runBench(main);
