import {
  ApplicationFailure,
  condition,
  continueAsNew,
  defineQuery,
  defineSignal,
  executeChild,
  log,
  proxyActivities,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import { pool } from './pool';
import { runConfig } from './run-config';
import type { ControlActivities } from '../activities/control';
import type { GrpoBatchActivities } from '../activities/grpo-batch';
import type { createMetricsActivities } from '../activities/metrics';
import type { AdapterActivities } from '../activities/adapters';
import type { EpisodeInput, EpisodeResult } from '../lib/episode-types';
import { iterationMetrics, shouldWarnZeroStd, type IterationMetrics } from '../lib/grpo';
import { fnv1a32 } from '../lib/rewards/shaping';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { learnerActivities } from './learner';
import { episode } from './episode';

/** What continue-as-new carries: small, no config body, no tree, no images. */
export interface TrainState {
  iteration: number;
  adapterVersion: number;
  configRef: string;
  configHash: string;
  zeroStdHistory: number[];
  paused: boolean;
  /** The previous iteration's metrics, for the status query and progress bar. */
  lastMetrics?: IterationMetrics | null;
}

export interface TrainGrpoInput {
  /** The run's config (validated here too); absent on continuation, where `state.configRef` holds it. */
  config?: unknown;
  state?: TrainState;
}

export interface TrainStatus {
  runId: string;
  iteration: number;
  iterations: number;
  adapterVersion: number;
  phase: string;
  paused: boolean;
  stopping: boolean;
  lastMetrics: IterationMetrics | null;
}

export interface TrainResult {
  runId: string;
  iterations: number;
  adapterVersion: number;
  stoppedEarly: boolean;
}

export const trainStatusQuery = defineQuery<TrainStatus>('status');
export const pauseSignal = defineSignal('pause');
export const resumeSignal = defineSignal('resume');
/** Graceful: the current iteration finishes (its adapter is kept), then the run ends. */
export const stopSignal = defineSignal('stop');

type MetricsActivities = ReturnType<typeof createMetricsActivities>;

/** Deterministic task and seed for episode j of an iteration: the run id and iteration are the seed. */
export function pickTasks(tasks: string[], count: number, runId: string, iteration: number): { task: string; seed: number }[] {
  return Array.from({ length: count }, (_, j) => {
    const h = parseInt(fnv1a32(`${runId}:${iteration}:${j}`), 16);
    return { task: tasks[h % tasks.length], seed: h % 100_000 };
  });
}

const seconds = (t0: number) => (new Date().getTime() - t0) / 1000;

/**
 * Online GRPO, one iteration per workflow run: episodes (child workflows, bounded parallelism) → batch of
 * group advantages → learner `update_policy` (adapter v<N>) → adapter into vLLM when serving from one →
 * metrics appended once → continue-as-new with a small state.
 */
export async function trainGrpo(input: TrainGrpoInput): Promise<TrainResult> {
  const info = workflowInfo();
  const control = proxyActivities<ControlActivities & GrpoBatchActivities & MetricsActivities & AdapterActivities>({
    startToCloseTimeout: '10m',
    retry: { initialInterval: '1s', maximumInterval: '30s', maximumAttempts: 20 },
  });

  // Handlers first, so `status`, pause and stop work from the first moment (before the config is stored).
  let paused = false;
  let stopping = false;
  let phase = 'starting';
  let lastMetrics: IterationMetrics | null = null;
  let statusView = (): TrainStatus => ({
    runId: info.workflowId,
    iteration: input.state?.iteration ?? 1,
    iterations: 0,
    adapterVersion: input.state?.adapterVersion ?? 0,
    phase,
    paused,
    stopping,
    lastMetrics,
  });
  setHandler(pauseSignal, () => void (paused = true));
  setHandler(resumeSignal, () => void (paused = false));
  setHandler(stopSignal, () => void (stopping = true));
  setHandler(trainStatusQuery, () => statusView());

  const { cfg, stored } = await runConfig(input, control, 'trainGrpo input');
  const state: TrainState = input.state ?? {
    iteration: 1,
    adapterVersion: 0,
    configRef: stored!.ref,
    configHash: stored!.hash,
    zeroStdHistory: [],
    paused: false,
  };
  const t = cfg.train;
  const runId = t.runId;
  if (info.workflowId !== runId) {
    throw ApplicationFailure.nonRetryable(`workflow id ${info.workflowId} must equal train.runId ${runId}`, 'InvalidConfig');
  }
  upsertSearchAttributes([
    { key: RUN_ID, value: runId },
    { key: KIND, value: 'train' },
    { key: MODE, value: 'grpo' },
    { key: TASK, value: `${cfg.episode.env}/${t.tasks.join(',')}`.slice(0, 200) },
  ]);

  paused = paused || state.paused;
  lastMetrics = state.lastMetrics ?? null;
  const iterationsTotal = cfg.train.iterations;
  statusView = () => ({
    runId,
    iteration: state.iteration,
    iterations: iterationsTotal,
    adapterVersion: state.adapterVersion,
    phase,
    paused,
    stopping,
    lastMetrics,
  });
  if (paused) {
    phase = 'paused';
    await condition(() => !paused || stopping);
  }
  if (stopping) return { runId, iterations: state.iteration - 1, adapterVersion: state.adapterVersion, stoppedEarly: true };

  const it = state.iteration;
  const phaseSeconds: Record<string, number> = {};

  // 1. Episodes.
  phase = 'rollout';
  let t0 = new Date().getTime();
  const picks = pickTasks(t.tasks, t.episodesPerIteration, runId, it);
  const runs = t.grouping === 'episode' ? picks.flatMap((p) => Array.from({ length: t.numGenerations }, () => p)) : picks;
  const episodeBase = (p: { task: string; seed: number }): EpisodeInput => ({
    task: { env: cfg.episode.env, task: p.task, seed: p.seed },
    maxSteps: cfg.episode.maxSteps,
    policy: cfg.policy,
    browserTaskQueue: cfg.temporal.browserTaskQueue,
    maxSessionRebuilds: cfg.episode.maxSessionRebuilds,
    sessionStartTimeoutMs: cfg.episode.sessionStartTimeoutMs,
    heartbeatTimeoutMs: cfg.episode.heartbeatTimeoutMs,
    runId,
    mode: 'grpo',
    rewardWeights: cfg.rewards,
    envOptions: { realRunId: cfg.real.runId, evaluateAtCap: cfg.real.evaluateAtCap },
    adapterVersion: state.adapterVersion,
    gpuTaskQueue: t.gpuTaskQueue,
    learnerHeartbeatTimeoutMs: t.learnerHeartbeatTimeoutS * 1000,
    ...(t.grouping === 'step' ? { grouping: { n: t.numGenerations, choose: t.choose } } : {}),
  });
  const episodes: EpisodeResult[] = await pool(runs, t.parallelism, (p, j) =>
    executeChild(episode, {
      workflowId: `${runId}-it${it}-ep${j}`,
      taskQueue: cfg.temporal.controlTaskQueue,
      args: [episodeBase(p)],
      staticSummary: `${runId} iteration ${it}: ${cfg.episode.env}/${p.task} seed ${p.seed}`,
    }),
  );
  phaseSeconds.rollout = seconds(t0);

  // 2. Group advantages into a batch (references only), 3. one learner update: adapter v<N>.
  phase = 'update';
  t0 = new Date().getTime();
  const batch = await control.buildGrpoBatch({
    run_id: runId,
    iteration: it,
    grouping: t.grouping,
    trajectory_refs: episodes.map((e) => e.trajectoryRef),
  });
  phaseSeconds.batch = seconds(t0);
  t0 = new Date().getTime();
  const version = state.adapterVersion + 1;
  const update = await learnerActivities({
    taskQueue: t.gpuTaskQueue,
    heartbeatTimeout: t.learnerHeartbeatTimeoutS * 1000,
    summary: `update_policy ${runId} v${version} (${batch.items} items)`,
  }).updatePolicy({
    run_id: runId,
    version,
    batch_ref: batch.batch_ref,
    hyperparameters: {
      learning_rate: t.learningRate,
      kl_coef: t.klCoef,
      clip_epsilon: t.clipEpsilon,
      temperature: Math.max(cfg.policy.temperature, 1e-3),
      max_grad_norm: t.maxGradNorm,
      loss_type: t.lossType,
    },
  });
  phaseSeconds.update = seconds(t0);

  // 4. Serve the new adapter (colocated: the learner already holds it).
  if (cfg.policy.backend === 'openai' && t.vllmBaseUrl) {
    phase = 'load adapter';
    t0 = new Date().getTime();
    await control.loadAdapterIntoVllm({ base_url: t.vllmBaseUrl, run_id: runId, version, adapter_path: update.adapter_path, keep: 1 });
    phaseSeconds.load = seconds(t0);
  }

  // 5. Metrics, once per iteration (the activity is idempotent per iteration).
  phase = 'metrics';
  const metrics = iterationMetrics({
    groups: batch.group_rewards.map((rewards) => ({ rewards })),
    episodes: episodes.map((e) => ({ success: e.success, steps: e.steps, validActions: e.validActions, shapedReturn: e.shapedReturn })),
    update: { loss: update.loss, grad_norm: update.grad_norm, version: update.version, tokens: update.tokens },
    phaseSeconds,
  });
  // 6. Greedy evaluation on held-out tasks every K iterations, with the adapter just written.
  if (t.evalEvery > 0 && it % t.evalEvery === 0 && t.heldOutTasks.length > 0) {
    phase = 'evaluation';
    t0 = new Date().getTime();
    const evals: EpisodeResult[] = await pool(pickTasks(t.heldOutTasks, t.heldOutTasks.length, `${runId}-eval`, it), t.parallelism, (p, j) =>
      executeChild(episode, {
        workflowId: `${runId}-it${it}-eval${j}`,
        taskQueue: cfg.temporal.controlTaskQueue,
        args: [{ ...episodeBase(p), policy: { ...cfg.policy, temperature: 0, n: 1 }, adapterVersion: version, grouping: undefined, mode: 'grpo-eval' }],
        staticSummary: `${runId} iteration ${it} greedy evaluation: ${cfg.episode.env}/${p.task}`,
      }),
    );
    metrics.eval = {
      success_rate: evals.filter((e) => e.success).length / evals.length,
      mean_return: evals.reduce((s, e) => s + e.shapedReturn, 0) / evals.length,
      episodes: evals.length,
    };
    metrics.seconds = { ...metrics.seconds, eval: seconds(t0) };
  }
  lastMetrics = metrics;
  await control.appendIterationMetrics({ run_id: runId, iteration: it, metrics, time: new Date().toISOString() });
  const zeroStdHistory = [...state.zeroStdHistory, metrics.frac_reward_zero_std].slice(-10);
  if (shouldWarnZeroStd(zeroStdHistory)) {
    log.warn('frac_reward_zero_std has stayed above 0.5: most groups carry no learning signal (raise temperature or numGenerations, or check the rewards)', {
      runId,
      iteration: it,
      frac_reward_zero_std: metrics.frac_reward_zero_std,
    });
  }

  const nextState: TrainState = { ...state, iteration: it + 1, adapterVersion: version, zeroStdHistory, paused, lastMetrics: metrics };
  if (stopping || it >= t.iterations) {
    return { runId, iterations: it, adapterVersion: version, stoppedEarly: it < t.iterations };
  }
  phase = 'continue';
  return continueAsNew<typeof trainGrpo>({ state: nextState });
}
