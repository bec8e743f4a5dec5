/**
 * How fast does a GRPO run make progress again after its workers die? During real runs on a private stack
 * (Temporal dev server, control worker, one browser worker, the Python tiny-random learner), SIGKILL the
 * browser worker and/or the learner at a chosen moment, restart them at once (as a supervisor would), and
 * read from the Temporal histories (server timestamps) of the run and its child episodes:
 *
 * - progress: the first activity that completes after the restart, anywhere in the run or its children
 *   (the headline number; target < 10 s from the restart);
 * - moved on: the first completion after the restart of a policy call, trajectory record, batch or update,
 *   i.e. the interrupted step / group / update is behind the run;
 * - detected: when Temporal timed out the first activity that died with the worker.
 *
 * Scenarios (each repeated; one kill per iteration and scenario):
 * - `browser-fork`: browser worker killed while forked sessions of a step group run (scripted policy, so
 *   candidates are valid and forks exist);
 * - `learner-update`: learner killed while update_policy runs (same scripted run, later in the iteration);
 * - `both-reset`: browser worker and learner killed together while the episode's reset (startSession) runs
 *   (colocated tiny-random policy: the learner is needed for the next step);
 * - `both-sample`: browser worker and learner killed together while sample_actions runs (colocated).
 *
 * The timeouts that drive recovery come from the config; `--profile default` uses the values a user gets
 * from configs/default.yaml (which sets none of them: the schema defaults), `--profile tight` the values of
 * test/integration/chaos.test.ts.
 *
 *   node --import tsx bench/grpo-recovery.ts [--repeats 3] [--profiles default,tight]
 *        [--scenarios browser-fork,learner-update,both-reset,both-sample] [--n 8]
 */
import type { ChildProcess } from 'node:child_process';
import { parseArgs } from 'node:util';
import type { WorkflowHandle } from '@temporalio/client';
import type { HaloConfig } from '../lib/config/config';
import { startOrAttachTrain } from '../client/train';
import { startFakePolicyServer, type FakePolicyServer } from '../testing/fake-policy-server';
import { startTestStack, type TestStack } from '../testing/stack';
import { stackGrpoConfig, scriptedPolicy } from '../testing/grpo-config';
import { fmt, load, median, printBenchHeader, printLoadAtEnd, runBench } from './bench-run';
import { readChain, readIteration, type ActivityRun } from './temporal-history';
import { stackPromptIds } from '../testing/model-prompt-ids';

const { values } = parseArgs({
  options: {
    repeats: { type: 'string', default: '3' },
    profiles: { type: 'string', default: 'default,tight' },
    scenarios: { type: 'string', default: 'browser-fork,learner-update,both-reset,both-sample' },
    n: { type: 'string', default: '8' },
    task: { type: 'string', default: 'click-checkboxes' },
  },
});
const repeats = Number(values.repeats);
const scenarios = values.scenarios!.split(',');

const PROFILES = {
  // configs/default.yaml sets none of these: lib/config/config.ts defaults.
  default: { heartbeatTimeoutMs: 10_000, sessionStartTimeoutMs: 20_000, learnerHeartbeatTimeoutS: 60 },
  // test/integration/chaos.test.ts
  tight: { heartbeatTimeoutMs: 3_000, sessionStartTimeoutMs: 5_000, learnerHeartbeatTimeoutS: 5 },
} as const;
type Profile = keyof typeof PROFILES;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const alive = (p: ChildProcess) => p.exitCode === null && p.signalCode === null;
const isLearner = (p: ChildProcess) => p.spawnargs.includes('halo_learner.worker');
const isBrowser = (p: ChildProcess) => p.spawnargs.some((a) => a.endsWith('browser.ts'));
const MOVED_ON = new Set(['samplePolicy', 'sample_actions', 'recordTrajectory', 'buildGrpoBatch', 'update_policy']);

interface Sample {
  profile: Profile;
  scenario: string;
  iteration: number;
  killedWhile: string;
  /** Client clock, ms: SIGKILL sent, new processes spawned, new processes polling. */
  kill: number;
  spawn: number;
  /** All restarted workers polling; and each one's own time. */
  ready: number;
  readyBy: Record<string, number>;
  detected?: { at: number; what: string };
  progress?: { at: number; what: string };
  movedOn?: { at: number; what: string };
  load: string;
  timeline: string[];
}

function config(stack: TestStack, profile: Profile, policy: 'colocated' | 'scripted', runId: string, fake?: FakePolicyServer): HaloConfig {
  const p = PROFILES[profile];
  return stackGrpoConfig(stack, {
    runId,
    iterations: repeats,
    maxSteps: 3,
    policy: policy === 'scripted' ? scriptedPolicy(fake!.url) : undefined,
    episode: { heartbeatTimeoutMs: p.heartbeatTimeoutMs, sessionStartTimeoutMs: p.sessionStartTimeoutMs },
    train: { tasks: [values.task!], numGenerations: Number(values.n), learnerHeartbeatTimeoutS: p.learnerHeartbeatTimeoutS },
  });
}

type Pending = { type: string; state: number };

async function pendingOf(stack: TestStack, workflowId: string): Promise<Pending[] | undefined> {
  const d = await stack.client.workflow
    .getHandle(workflowId)
    .describe()
    .catch(() => undefined);
  if (d?.status.name !== 'RUNNING') return undefined;
  return (d.raw.pendingActivities ?? []).map((a) => ({ type: a.activityType?.name ?? '?', state: Number(a.state) }));
}

/**
 * Waits until `pred` holds on the pending activities of the current iteration's episode (`child`) or of the
 * run itself (`parent`). Returns the iteration, or undefined when the run finished first.
 */
async function waitFor(
  stack: TestStack,
  handle: WorkflowHandle,
  runId: string,
  startIteration: number,
  where: 'child' | 'parent',
  pred: (p: Pending[]) => boolean,
): Promise<number | undefined> {
  let it = startIteration;
  for (;;) {
    const d = await handle.describe().catch(() => undefined);
    if (d && d.status.name !== 'RUNNING' && d.status.name !== 'CONTINUED_AS_NEW') return undefined;
    if (where === 'parent') {
      const p = d?.status.name === 'RUNNING' ? (d.raw.pendingActivities ?? []).map((a) => ({ type: a.activityType?.name ?? '?', state: Number(a.state) })) : [];
      if (pred(p)) {
        const st = await handle.query<{ iteration: number }>('status').catch(() => undefined);
        return st?.iteration ?? it;
      }
    } else {
      const p = await pendingOf(stack, `${runId}-it${it}-ep0`);
      if (p && pred(p)) return it;
      if (!p) {
        // Not started yet, or finished: move on when the next iteration's episode exists.
        const next = await stack.client.workflow
          .getHandle(`${runId}-it${it + 1}-ep0`)
          .describe()
          .catch(() => undefined);
        if (next) it++;
      }
    }
    await sleep(40);
  }
}

async function killAndRestart(stack: TestStack, which: ('browser' | 'learner')[]): Promise<{ kill: number; spawn: number; ready: number; readyBy: Record<string, number> }> {
  const victims = which.map((w) => stack.workers.find((p) => alive(p) && (w === 'browser' ? isBrowser(p) : isLearner(p)))!);
  const kill = Date.now();
  for (const v of victims) v.kill('SIGKILL');
  await Promise.all(victims.map((v) => (alive(v) ? new Promise((r) => v.once('exit', r)) : null)));
  const spawn = Date.now();
  const before = new Set(stack.workers);
  const started = which.map((w) => (w === 'browser' ? stack.startWorker('browser') : stack.startLearner()));
  // The stack helper's own wait can be satisfied by the dead process's poller, which Temporal keeps listing
  // for a while; readiness here is a poller whose identity (`<pid>@<host>`, the SDKs' default) is the new one.
  const fresh = stack.workers.filter((p) => !before.has(p));
  const readyBy: Record<string, number> = {};
  await Promise.all(
    fresh.map(async (p) => {
      const queue = isLearner(p) ? stack.gpuQueue : stack.browserQueue;
      for (;;) {
        const res = await stack.connection.workflowService.describeTaskQueue({ namespace: stack.namespace, taskQueue: { name: queue }, taskQueueType: 2 });
        if ((res.pollers ?? []).some((x) => x.identity?.startsWith(`${p.pid}@`))) {
          readyBy[isLearner(p) ? 'learner' : 'browser'] = Date.now();
          return;
        }
        if (!alive(p)) throw new Error(`restarted worker ${p.pid} exited`);
        await sleep(100);
      }
    }),
  );
  const ready = Date.now();
  await Promise.all(started);
  return { kill, spawn, ready, readyBy };
}

/** Reads the run (from the run current at the kill) and its episodes until the progress events exist. */
async function measure(stack: TestStack, runId: string, fromRunId: string, s: Sample, timeoutMs = 300_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const chain = await readChain(stack.client, runId, fromRunId);
    const acts: ActivityRun[] = [];
    for (const r of chain) acts.push(...(await readIteration(stack.client, r)).activities);
    const after = (t: number, f: (a: ActivityRun) => boolean) => acts.filter((a) => a.outcome === 'completed' && a.ended! > t && f(a)).sort((a, b) => a.ended! - b.ended!)[0];
    // Attempts that fail by timeout do not reach the history until the activity's last attempt: a retried
    // activity shows as one event with attempt > 1, whose start is the retry (detection + retry interval).
    const det: { at: number; what: string }[] = [];
    for (const a of acts) {
      const where = a.workflowId.endsWith('-ep0') ? 'episode' : 'run';
      if (a.outcome === 'timed out' && a.ended! > s.kill) det.push({ at: a.ended!, what: `${a.type} timed out (${where})` });
      if (a.attempt > 1 && a.started !== undefined && a.started > s.kill) det.push({ at: a.started, what: `${a.type} attempt ${a.attempt} started (${where})` });
    }
    s.detected = det.sort((x, y) => x.at - y.at)[0];
    const p = after(s.spawn, () => true);
    const m = after(s.spawn, (a) => MOVED_ON.has(a.type));
    if (p) s.progress = { at: p.ended!, what: `${p.type}${p.attempt > 1 ? ` (attempt ${p.attempt})` : ''}` };
    if (m) s.movedOn = { at: m.ended!, what: m.type };
    if ((s.progress && s.movedOn) || Date.now() > deadline) {
      const end = s.movedOn?.at ?? Date.now();
      const rel = (t?: number) => (t === undefined ? '   –  ' : `${((t - s.kill) / 1000).toFixed(2).padStart(6)}`);
      s.timeline = acts
        .filter((a) => (a.ended === undefined || a.ended >= s.kill) && a.scheduled <= end)
        .sort((a, b) => (a.ended ?? Infinity) - (b.ended ?? Infinity))
        .map((a) => `${rel(a.scheduled)} ${rel(a.started)} ${rel(a.ended)}  ${a.type} #${a.attempt} ${a.outcome}${a.workflowId.endsWith('-ep0') ? '' : ' (run)'}`);
      return;
    }
    await sleep(500);
  }
}

const FORKS_BUSY = (p: Pending[]) => p.filter((a) => (a.type === 'startSession' || a.type === 'stepSession') && a.state === 2).length >= 2;
const RESET_BUSY = (p: Pending[]) => p.length === 1 && p[0].type === 'startSession' && p[0].state === 2;
const SAMPLE_BUSY = (p: Pending[]) => p.some((a) => a.type === 'sample_actions' && a.state === 2);
const UPDATE_BUSY = (p: Pending[]) => p.some((a) => a.type === 'update_policy' && a.state === 2);

async function runScenarios(stack: TestStack, profile: Profile, policy: 'colocated' | 'scripted', fake: FakePolicyServer | undefined, out: Sample[]) {
  const plan: { scenario: string; where: 'child' | 'parent'; pred: (p: Pending[]) => boolean; which: ('browser' | 'learner')[]; killedWhile: string }[] =
    policy === 'scripted'
      ? [
          { scenario: 'browser-fork', where: 'child', pred: FORKS_BUSY, which: ['browser'], killedWhile: '≥2 fork activities (startSession/stepSession) running' },
          { scenario: 'learner-update', where: 'parent', pred: UPDATE_BUSY, which: ['learner'], killedWhile: 'update_policy running' },
        ]
      : [
          { scenario: 'both-reset', where: 'child', pred: RESET_BUSY, which: ['browser', 'learner'], killedWhile: "the episode's reset (startSession) running" },
          { scenario: 'both-sample', where: 'child', pred: SAMPLE_BUSY, which: ['browser', 'learner'], killedWhile: 'sample_actions running' },
        ];
  const steps = plan.filter((p) => scenarios.includes(p.scenario));
  if (!steps.length) return;
  const runId = `bench-rec-${profile}-${policy}-${Date.now().toString(36)}`;
  const { handle } = await startOrAttachTrain(stack.client, config(stack, profile, policy, runId, fake));
  let iteration = 1;
  try {
    while (iteration <= repeats) {
      for (const step of steps) {
        const it = await waitFor(stack, handle, runId, iteration, step.where, step.pred);
        if (it === undefined) break;
        iteration = it;
        const currentRun = (await handle.describe()).runId;
        const t = await killAndRestart(stack, step.which);
        const s: Sample = { profile, scenario: step.scenario, iteration: it, killedWhile: step.killedWhile, ...t, load: load(), timeline: [] };
        await measure(stack, runId, currentRun, s);
        out.push(s);
        console.error(
          `${profile} ${step.scenario} it${it}: progress ${s.progress ? fmt(s.progress.at - s.spawn) : '?'} s after restart (${s.progress?.what}), ` +
            `moved on ${s.movedOn ? fmt(s.movedOn.at - s.spawn) : '?'} s (${s.movedOn?.what}), workers ready after ${readyText(s)} s, load ${s.load}`,
        );
      }
      iteration++;
      // Next kills in the next iteration's episode.
      while ((await handle.query<{ iteration: number }>('status').catch(() => ({ iteration }))).iteration < iteration) {
        const d = await handle.describe().catch(() => undefined);
        if (d && d.status.name !== 'RUNNING' && d.status.name !== 'CONTINUED_AS_NEW') break;
        await sleep(200);
      }
    }
    await handle.result();
  } catch (err) {
    console.error(`${profile}/${policy}: ${(err as Error).message}`);
    await handle.terminate('bench done').catch(() => {});
  }
}

const readyText = (s: Sample) =>
  Object.entries(s.readyBy)
    .map(([k, v]) => `${k} ${fmt(v - s.spawn)}`)
    .join(', ');

async function main() {
  printBenchHeader('grpo-recovery');
  const stack = await startTestStack({ browserWorkers: 1, learner: true });
  const fake = await startFakePolicyServer({ kind: 'scripted' }, { promptIds: stackPromptIds(stack.home) });
  const samples: Sample[] = [];
  try {
    for (const profile of values.profiles!.split(',') as Profile[]) {
      for (const policy of ['scripted', 'colocated'] as const) await runScenarios(stack, profile, policy, fake, samples);
    }
  } finally {
    await fake.close();
    await stack.stop();
  }

  console.log('');
  for (const profile of values.profiles!.split(',') as Profile[]) {
    const p = PROFILES[profile];
    console.log(
      `profile ${profile}: episode.heartbeatTimeoutMs ${p.heartbeatTimeoutMs}, episode.sessionStartTimeoutMs ${p.sessionStartTimeoutMs}, ` +
        `train.learnerHeartbeatTimeoutS ${p.learnerHeartbeatTimeoutS}; fixed in code: startSession retry 1 s, learner retry 1 s (initial intervals); a restarted learner fails its predecessor's attempt at startup`,
    );
  }
  console.log('');
  console.log('Each kill: SIGKILL, new processes spawned at once ("restart"); times in s after the restart unless said otherwise.');
  console.log('');
  console.log(
    '| profile | scenario | killed while | iteration | workers polling again | detected (first timeout) after kill | progress: next activity done | which | moved on | which | load avg 1/5/15 |',
  );
  console.log('|---|---|---|---|---|---|---|---|---|---|---|');
  for (const s of samples) {
    console.log(
      `| ${s.profile} | ${s.scenario} | ${s.killedWhile} | ${s.iteration} | ${readyText(s)} | ${s.detected ? `${fmt(s.detected.at - s.kill)} (${s.detected.what})` : '–'} | ` +
        `${s.progress ? fmt(s.progress.at - s.spawn) : 'none'} | ${s.progress?.what ?? ''} | ${s.movedOn ? fmt(s.movedOn.at - s.spawn) : 'none'} | ${s.movedOn?.what ?? ''} | ${s.load} |`,
    );
  }
  console.log('');
  console.log('| profile | scenario | kills | median all restarted workers polling s | median progress s after restart | median moved on s | target progress < 10 s |');
  console.log('|---|---|---|---|---|---|---|');
  for (const profile of values.profiles!.split(',')) {
    for (const scenario of scenarios) {
      const xs = samples.filter((s) => s.profile === profile && s.scenario === scenario);
      if (!xs.length) continue;
      const prog = median(xs.filter((s) => s.progress).map((s) => s.progress!.at - s.spawn));
      console.log(
        `| ${profile} | ${scenario} | ${xs.length} | ${fmt(median(xs.map((s) => s.ready - s.spawn)))} | **${fmt(prog)}** | ` +
          `${fmt(median(xs.filter((s) => s.movedOn).map((s) => s.movedOn!.at - s.spawn)))} | ${prog < 10_000 ? 'met' : 'NOT met'} |`,
      );
    }
  }
  console.log('');
  console.log('Timelines (first kill of each profile and scenario): scheduled / started / ended in s after the SIGKILL, activity #attempt outcome');
  for (const profile of values.profiles!.split(',')) {
    for (const scenario of scenarios) {
      const s = samples.find((x) => x.profile === profile && x.scenario === scenario);
      if (!s) continue;
      console.log('');
      console.log(
        `${profile} / ${scenario} (iteration ${s.iteration}; restart at +${fmt(s.spawn - s.kill)} s, workers polling: ${Object.entries(s.readyBy)
          .map(([k, v]) => `${k} +${fmt(v - s.kill)}`)
          .join(', ')})`,
      );
      console.log('```');
      console.log('  sched  start    end');
      for (const line of s.timeline) console.log(line);
      console.log('```');
    }
  }
  printLoadAtEnd();
}

runBench(main);
