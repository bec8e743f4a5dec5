import { continueAsNew, executeChild, log, patched, proxyActivities, workflowInfo } from '@temporalio/workflow';
import { checkFailureShare, pool, poolSettled } from './pool';
import { trainingRunConfig } from './run-config';
import { RunControl, type TrainingResult } from './run-control';
import type { DiskActivities } from '../activities/disk';
import type { ControlActivities } from '../activities/control';
import type { GrpoBatchActivities } from '../activities/grpo-batch';
import type { createMetricsActivities } from '../activities/metrics';
import type { AdapterActivities } from '../activities/adapters';
import { episodeInput, type EpisodeResult } from '../lib/episode-types';
import { iterationMetrics, shouldWarnZeroStd, type IterationMetrics } from '../lib/grpo';
import { greedy, samplingPolicy, servingOf, type ServedAdapter } from '../lib/iteration-policy';
import { runContextFromConfig } from '../lib/run-context';
import { wandbOf } from '../lib/curves';
import { fnv1a32 } from '../lib/rewards/shaping';
import { learnerActivities } from './learner-calls';
import { episode } from './episode';
import * as profiles from './activity-profiles';

// Kept for the CLI and older imports: the one set of run messages (workflows/messages.ts).
export { pauseSignal, resumeSignal, stopSignal, statusQuery as trainStatusQuery } from './messages';

/** What continue-as-new carries: small, no config body, no tree, no images. */
export interface TrainState {
  iteration: number;
  adapterVersion: number;
  configRef: string;
  configHash: string;
  zeroStdHistory: number[];
  paused: boolean;
  /** Folder of adapter v<adapterVersion> (as the serving process sees it): reloaded into a restarted vLLM. */
  adapterPath?: string;
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
  /** The served adapter this iteration samples from: `halo up` loads it into a restarted vLLM. */
  servedAdapter?: ServedAdapter;
}

export type TrainResult = TrainingResult;

type MetricsActivities = ReturnType<typeof createMetricsActivities>;

/** Deterministic task and seed for episode j of an iteration: the run id and iteration are the seed. */
export function pickTasks(tasks: string[], count: number, runId: string, iteration: number): { task: string; seed: number }[] {
  return Array.from({ length: count }, (_, j) => {
    const h = parseInt(fnv1a32(`${runId}:${iteration}:${j}`), 16);
    return { task: tasks[h % tasks.length], seed: h % 100_000 };
  });
}

/**
 * Online GRPO, one iteration per workflow run: episodes (child workflows, bounded parallelism) sampled from the
 * adapter of the previous iteration → batch of group advantages → learner `update_policy` (adapter v<N>) →
 * adapter into vLLM when serving from one → metrics appended once → continue-as-new with a small state.
 */
export async function trainGrpo(input: TrainGrpoInput): Promise<TrainResult> {
  const info = workflowInfo();
  const control = proxyActivities<ControlActivities & GrpoBatchActivities & MetricsActivities & AdapterActivities & DiskActivities>(profiles.runActivities());
  // Handlers first, so `status`, pause and stop work from the first moment (before the config is stored).
  const run = new RunControl<Omit<TrainStatus, 'phase' | 'paused' | 'stopping'>>(info.workflowId, { paused: input.state?.paused });
  let lastMetrics: IterationMetrics | null = input.state?.lastMetrics ?? null;
  run.describe(() => ({
    runId: info.workflowId,
    iteration: input.state?.iteration ?? 1,
    iterations: 0,
    adapterVersion: input.state?.adapterVersion ?? 0,
    lastMetrics,
  }));

  const { cfg, stored, runId } = await trainingRunConfig(input, control, 'grpo');
  const state: TrainState = input.state ?? { iteration: 1, adapterVersion: 0, configRef: stored!.ref, configHash: stored!.hash, zeroStdHistory: [], paused: false };
  const t = cfg.train;
  const it = state.iteration;
  const ctx = runContextFromConfig(cfg, runId);
  // On-policy: this iteration samples from the adapter the previous one wrote.
  const sampling = samplingPolicy({ policy: cfg.policy, runId, adapterVersion: state.adapterVersion, serving: servingOf(cfg.policy, t.vllmBaseUrl, state.adapterPath) });
  run.describe(() => ({
    runId,
    iteration: it,
    iterations: t.iterations,
    adapterVersion: state.adapterVersion,
    lastMetrics,
    ...(sampling.adapter ? { servedAdapter: sampling.adapter } : {}),
  }));
  // Runs started before the disk check replay without it.
  const diskOk = !patched('free-disk-check') || (await run.waitForDisk(() => control.checkFreeDisk({ minFreeBytes: cfg.stack.minFreeDiskGiB * 2 ** 30 })));
  if (!diskOk || !(await run.proceed())) return { runId, iterations: it - 1, adapterVersion: state.adapterVersion, stoppedEarly: true };
  const task = (p: { task: string; seed: number }) => ({ env: cfg.episode.env, task: p.task, seed: p.seed });

  // 1. Episodes.
  // train.seed, when set, replaces the run id as the source of tasks and seeds.
  const pickKey = t.seed === undefined ? runId : `seed-${t.seed}`;
  const picks = pickTasks(t.tasks, t.episodesPerIteration, pickKey, it);
  const runs = t.grouping !== 'step' ? picks.flatMap((p) => Array.from({ length: t.numGenerations }, () => p)) : picks;
  const rollout = await run.timed('rollout', () =>
    poolSettled(runs, t.parallelism, (p, j) =>
      executeChild(episode, {
        workflowId: `${runId}-it${it}-ep${j}`,
        taskQueue: cfg.temporal.controlTaskQueue,
        args: [
          episodeInput({
            run: ctx,
            task: task(p),
            maxSteps: cfg.episode.maxSteps,
            sampling,
            mode: 'grpo',
            ...(t.grouping === 'step' ? { grouping: { n: t.numGenerations, choose: t.choose } } : {}),
          }),
        ],
        staticSummary: `${runId} iteration ${it}: ${cfg.episode.env}/${p.task} seed ${p.seed}`,
      }),
    ),
  );
  // A failed episode (a site briefly unreachable, a session lost too often) is left out of the batch; past
  // the configured share the iteration's data is not worth an update and the run stops, naming the reasons.
  checkFailureShare(rollout.failed, runs.length, t.maxFailedEpisodeShare, `episodes of iteration ${it}`, 'train.maxFailedEpisodeShare');
  for (const f of rollout.failed) log.warn('episode failed; left out of the batch', { runId, iteration: it, episode: f.index, error: f.error });
  const episodes: EpisodeResult[] = rollout.ok;

  // 2. Group advantages into a batch (references only), 3. one learner update: adapter v<N>.
  const batch = await run.timed(
    'update',
    () =>
      control.buildGrpoBatch({
        run_id: runId,
        iteration: it,
        grouping: t.grouping,
        ...(t.grouping === 'anchor' ? { anchor: t.anchor } : {}),
        trajectory_refs: episodes.map((e) => e.trajectoryRef),
        // dr_grpo's constant denominator: B × the longest completion the policy may write.
        max_completion_len: cfg.policy.maxTokens,
      }),
    'batch',
  );
  const version = state.adapterVersion + 1;
  const update = await run.timed('update', () =>
    learnerActivities({
      taskQueue: t.gpuTaskQueue,
      heartbeatTimeout: t.learnerHeartbeatTimeoutS * 1000,
      summary: `update_policy ${runId} v${version} (${batch.items} items)`,
    }).updatePolicy({
      run_id: runId,
      version,
      batch_ref: batch.batch_ref,
      ...(ctx.baseModel ? { base_model: ctx.baseModel } : {}),
      hyperparameters: {
        learning_rate: t.learningRate,
        kl_coef: t.klCoef,
        clip_epsilon: t.clipEpsilon,
        temperature: Math.max(cfg.policy.temperature, 1e-3),
        max_grad_norm: t.maxGradNorm,
        loss_type: t.lossType,
      },
    }),
  );

  // 4. Serve the new adapter (colocated: the learner already holds it).
  if (servingOf(cfg.policy, t.vllmBaseUrl)) {
    await run.timed(
      'load adapter',
      () => control.loadAdapterIntoVllm({ base_url: t.vllmBaseUrl!, run_id: runId, version, adapter_path: update.adapter_path, keep: 1 }),
      'load',
    );
  }

  // 5. Metrics, once per iteration (the activity is idempotent per iteration).
  run.phase = 'metrics';
  const metrics = iterationMetrics({
    groups: batch.group_rewards.map((rewards) => ({ rewards })),
    episodes: episodes.map((e) => ({
      success: e.success,
      steps: e.steps,
      validActions: e.validActions,
      shapedReturn: e.shapedReturn,
      ...(e.forkSnapshots !== undefined ? { forkSnapshots: e.forkSnapshots, forkReplayFallbacks: e.forkReplayFallbacks } : {}),
    })),
    update: {
      loss: update.loss,
      grad_norm: update.grad_norm,
      version: update.version,
      tokens: update.tokens,
      retokenized: update.retokenized,
      token_mismatch_rate: update.token_mismatch_rate,
      kl: update.kl,
      clip_fraction: update.clip_fraction,
      mean_ratio: update.mean_ratio,
      entropy: update.entropy,
    },
    phaseSeconds: { ...run.seconds },
    ...(batch.anchor ? { anchor: batch.anchor } : {}),
  });
  if (rollout.failed.length > 0) metrics.failed_episodes = rollout.failed.length;
  // 6. Greedy evaluation on held-out tasks every K iterations, with the adapter just written.
  if (t.evalEvery > 0 && it % t.evalEvery === 0 && t.heldOutTasks.length > 0) {
    const evalSampling = samplingPolicy({ policy: greedy(cfg.policy), runId, adapterVersion: version, serving: servingOf(cfg.policy, t.vllmBaseUrl, update.adapter_path) });
    const evals: EpisodeResult[] = await run.timed(
      'evaluation',
      () =>
        pool(pickTasks(t.heldOutTasks, t.heldOutTasks.length, `${pickKey}-eval`, it), t.parallelism, (p, j) =>
          executeChild(episode, {
            workflowId: `${runId}-it${it}-eval${j}`,
            taskQueue: cfg.temporal.controlTaskQueue,
            args: [episodeInput({ run: ctx, task: task(p), maxSteps: cfg.episode.maxSteps, sampling: evalSampling, mode: 'grpo-eval' })],
            staticSummary: `${runId} iteration ${it} greedy evaluation: ${cfg.episode.env}/${p.task}`,
          }),
        ),
      'eval',
    );
    metrics.eval = {
      success_rate: evals.filter((e) => e.success).length / evals.length,
      mean_return: evals.reduce((s, e) => s + e.shapedReturn, 0) / evals.length,
      episodes: evals.length,
    };
    metrics.seconds = { ...metrics.seconds, eval: run.seconds.eval };
  }
  lastMetrics = metrics;
  await control.appendIterationMetrics({ run_id: runId, iteration: it, metrics, time: new Date().toISOString(), ...wandbOf(cfg) });
  const zeroStdHistory = [...state.zeroStdHistory, metrics.frac_reward_zero_std].slice(-10);
  if (shouldWarnZeroStd(zeroStdHistory)) {
    log.warn('frac_reward_zero_std has stayed above 0.5: most groups carry no learning signal (raise temperature or numGenerations, or check the rewards)', {
      runId,
      iteration: it,
      frac_reward_zero_std: metrics.frac_reward_zero_std,
    });
  }

  const ended = run.ended(runId, it, t.iterations, version);
  if (ended) return ended;
  run.phase = 'continue';
  const nextState: TrainState = {
    ...state,
    iteration: it + 1,
    adapterVersion: version,
    adapterPath: update.adapter_path,
    zeroStdHistory,
    paused: run.paused,
    lastMetrics: metrics,
  };
  return continueAsNew<typeof trainGrpo>({ state: nextState });
}
