import { continueAsNew, executeChild, log, patched, proxyActivities, workflowInfo } from '@temporalio/workflow';
import { checkFailureShare, pool, poolSettled } from './pool';
import { trainingRunConfig } from './run-config';
import type { HaloConfig } from '../lib/config';
import { RunControl, type TrainingResult } from './run-control';
import type { DiskActivities } from '../activities/disk';
import type { ControlActivities } from '../activities/control';
import type { BuildGrpoBatchResult, GrpoBatchActivities } from '../activities/grpo-batch';
import type { createMetricsActivities } from '../activities/metrics';
import type { AdapterActivities } from '../activities/adapters';
import { episodeInput, type EpisodeResult } from '../lib/episode-types';
import { iterationMetrics, shouldWarnZeroStd, type EpisodeSummary, type IterationMetrics } from '../lib/grpo';
import { evaluationDue, greedy, samplingPolicy, servingOf, staleness, type SamplingPolicy, type ServedAdapter } from '../lib/iteration-policy';
import { runContextFromConfig, type RunContext } from '../lib/run-context';
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
  /**
   * train.maxStaleness ≥ 1: iteration `iteration − 1`'s rollouts, collected while its predecessor's update ran
   * and not yet learned from (a `Collected` in the blob store). This run updates on it while the next
   * iteration's rollouts sample from adapter v<adapterVersion>.
   */
  pendingRef?: string;
  /** Environment steps of the iterations learned from so far (train.evalEverySteps); absent: 0. */
  envSteps?: number;
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

/** One iteration's rollouts: the batch built from them and what its metrics row needs. */
export interface Collected {
  iteration: number;
  /** The adapter version its episodes sampled from (0: the base model). */
  sampledVersion: number;
  batch: BuildGrpoBatchResult;
  episodes: EpisodeSummary[];
  failed: number;
  /** Workflow-clock seconds of its `rollout` and `batch` phases. */
  seconds: Record<string, number>;
}

/** What every phase of a run needs. */
interface RunScope {
  cfg: HaloConfig;
  runId: string;
  ctx: RunContext;
  run: RunControl<Omit<TrainStatus, 'phase' | 'paused' | 'stopping'>>;
  control: ReturnType<typeof proxyActivities<ControlActivities & GrpoBatchActivities & MetricsActivities & AdapterActivities & DiskActivities>>;
  /** Source of tasks and seeds: the run id, or `seed-<train.seed>`. */
  pickKey: string;
}

/**
 * Online GRPO, one iteration per workflow run: episodes (child workflows, bounded parallelism) sampled from the
 * adapter of the previous iteration → batch of group advantages → learner `update_policy` (adapter v<N>) →
 * adapter into vLLM when serving from one → metrics appended once → continue-as-new with a small state.
 *
 * train.maxStaleness 1 pipelines the iterations: a run updates on the previous iteration's batch while the
 * next iteration's rollouts sample from the newest adapter there is (one version behind); the learner's ratio
 * against the sampler's own log-probs corrects and clips those samples. Each run awaits both halves before it
 * continues as new, so a restart resumes both, and every version is written once.
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
  // On-policy: this iteration samples from the adapter the previous one wrote (pipelined: the newest there is).
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
  const scope: RunScope = { cfg, runId, ctx, run, control, pickKey: t.seed === undefined ? runId : `seed-${t.seed}` };
  if (t.maxStaleness > 0) {
    return pipelined(scope, state, sampling, diskOk, (m) => void (lastMetrics = m));
  }
  if (!diskOk || !(await run.proceed())) return { runId, iterations: it - 1, adapterVersion: state.adapterVersion, stoppedEarly: true };

  const collected = await collect(scope, it, sampling, state.adapterVersion, run.seconds);
  const version = state.adapterVersion + 1;
  const learned = await learn(scope, collected, version, run.seconds, state.envSteps ?? 0);
  lastMetrics = learned.metrics;
  const zeroStdHistory = warnZeroStd(scope, it, state.zeroStdHistory, learned.metrics);

  const ended = run.ended(runId, it, t.iterations, version);
  if (ended) return ended;
  run.phase = 'continue';
  const nextState: TrainState = {
    ...state,
    iteration: it + 1,
    adapterVersion: version,
    adapterPath: learned.adapterPath,
    zeroStdHistory,
    paused: run.paused,
    lastMetrics: learned.metrics,
    ...(learned.envSteps > 0 ? { envSteps: learned.envSteps } : {}),
  };
  return continueAsNew<typeof trainGrpo>({ state: nextState });
}

/**
 * One run of a pipelined GRPO loop (train.maxStaleness ≥ 1): the update on iteration `it − 1`'s batch (carried
 * by reference) and the rollouts of iteration `it`, side by side. The rollouts sample from v<adapterVersion>,
 * the newest adapter at the run's start; the update writes v<adapterVersion + 1>. A stop (or the last
 * iteration) starts no further rollouts, and the batch already collected is still learned from.
 */
async function pipelined(
  scope: RunScope,
  state: TrainState,
  sampling: SamplingPolicy,
  diskOk: boolean,
  onMetrics: (m: IterationMetrics) => void,
): Promise<TrainResult> {
  const { cfg, runId, run, control } = scope;
  const t = cfg.train;
  const it = state.iteration;
  const pending = state.pendingRef ? ((await control.loadJson({ ref: state.pendingRef })) as Collected) : undefined;
  const go = diskOk && (await run.proceed());
  const collectSeconds: Record<string, number> = {};
  let version = state.adapterVersion;
  let adapterPath = state.adapterPath;
  let zeroStdHistory = state.zeroStdHistory;
  let lastMetrics = state.lastMetrics ?? null;
  let envSteps = state.envSteps ?? 0;
  // An iteration's metrics row has its own rollout and batch seconds, then its update's.
  const learnFrom = async (c: Collected) => {
    const learned = await learn(scope, c, version + 1, { ...c.seconds }, envSteps);
    version++;
    envSteps = learned.envSteps;
    adapterPath = learned.adapterPath;
    lastMetrics = learned.metrics;
    onMetrics(learned.metrics);
    zeroStdHistory = warnZeroStd(scope, c.iteration, zeroStdHistory, learned.metrics);
  };
  // A stopped or paused-then-stopped run still learns from what it has collected.
  const rollouts = go && it <= t.iterations ? collect(scope, it, sampling, state.adapterVersion, collectSeconds) : undefined;
  run.phase = rollouts && pending ? 'rollout + update' : rollouts ? 'rollout' : 'update';
  const [collected] = await Promise.all([rollouts, pending ? learnFrom(pending) : undefined]);
  const lastCollected = collected?.iteration ?? pending?.iteration ?? it - 1;
  const done = run.stopping || !go || lastCollected >= t.iterations;
  if (done) {
    if (collected) await learnFrom(collected);
    return { runId, iterations: version, adapterVersion: version, stoppedEarly: version < t.iterations };
  }
  run.phase = 'continue';
  const { ref } = await control.storeJson({ value: collected });
  const nextState: TrainState = {
    ...state,
    iteration: it + 1,
    adapterVersion: version,
    ...(adapterPath ? { adapterPath } : {}),
    zeroStdHistory,
    paused: run.paused,
    lastMetrics,
    pendingRef: ref,
    ...(envSteps > 0 ? { envSteps } : {}),
  };
  return continueAsNew<typeof trainGrpo>({ state: nextState });
}

/** Iteration `it`'s episodes, sampled with `sampling` (adapter v<sampledVersion>), and the batch built from them. */
async function collect(scope: RunScope, it: number, sampling: SamplingPolicy, sampledVersion: number, seconds: Record<string, number>): Promise<Collected> {
  const { cfg, runId, ctx, run, control } = scope;
  const t = cfg.train;
  const picks = pickTasks(t.tasks, t.episodesPerIteration, scope.pickKey, it);
  const runs = t.grouping !== 'step' ? picks.flatMap((p) => Array.from({ length: t.numGenerations }, () => p)) : picks;
  const rollout = await run.timed(
    'rollout',
    () =>
      poolSettled(runs, t.parallelism, (p, j) =>
        executeChild(episode, {
          workflowId: `${runId}-it${it}-ep${j}`,
          taskQueue: cfg.temporal.controlTaskQueue,
          args: [
            episodeInput({
              run: ctx,
              task: taskOf(cfg, p),
              maxSteps: cfg.episode.maxSteps,
              sampling,
              mode: 'grpo',
              ...(t.grouping === 'step' ? { grouping: { n: t.numGenerations, choose: t.choose } } : {}),
            }),
          ],
          staticSummary: `${runId} iteration ${it}: ${cfg.episode.env}/${p.task} seed ${p.seed}`,
        }),
      ),
    'rollout',
    seconds,
  );
  // A failed episode (a site briefly unreachable, a session lost too often) is left out of the batch; past
  // the configured share the iteration's data is not worth an update and the run stops, naming the reasons.
  checkFailureShare(rollout.failed, runs.length, t.maxFailedEpisodeShare, `episodes of iteration ${it}`, 'train.maxFailedEpisodeShare');
  for (const f of rollout.failed) log.warn('episode failed; left out of the batch', { runId, iteration: it, episode: f.index, error: f.error });
  const episodes: EpisodeResult[] = rollout.ok;

  // Group advantages into a batch (references only).
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
    seconds,
  );
  return {
    iteration: it,
    sampledVersion,
    batch,
    episodes: episodes.map((e) => ({
      success: e.success,
      steps: e.steps,
      validActions: e.validActions,
      shapedReturn: e.shapedReturn,
      ...(e.forkSnapshots !== undefined ? { forkSnapshots: e.forkSnapshots, forkReplayFallbacks: e.forkReplayFallbacks } : {}),
    })),
    failed: rollout.failed.length,
    seconds,
  };
}

/**
 * One learner update on an iteration's batch (adapter v<version>), the adapter into vLLM when serving from one,
 * the greedy evaluation when due, and the iteration's metrics row, appended once. `stepsBefore`: environment
 * steps of the iterations learned from before this one; the result's `envSteps` adds this one's.
 */
async function learn(
  scope: RunScope,
  c: Collected,
  version: number,
  seconds: Record<string, number>,
  stepsBefore: number,
): Promise<{ metrics: IterationMetrics; adapterPath: string; envSteps: number }> {
  const { cfg, runId, ctx, run, control } = scope;
  const t = cfg.train;
  const it = c.iteration;
  const { batch } = c;
  const update = await run.timed(
    'update',
    () =>
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
          // Pipelined: samples one update behind are importance-weighted to the sampler, not clipped away.
          ...(t.maxStaleness > 0 ? { stale_weight_cap: t.staleWeightCap } : {}),
        },
      }),
    'update',
    seconds,
  );

  // Serve the new adapter (colocated: the learner already holds it). Pipelined rollouts may still be sampling
  // from the previous version: it stays loaded.
  if (servingOf(cfg.policy, t.vllmBaseUrl)) {
    await run.timed(
      'load adapter',
      () => control.loadAdapterIntoVllm({ base_url: t.vllmBaseUrl!, run_id: runId, version, adapter_path: update.adapter_path, keep: 1 + t.maxStaleness }),
      'load',
      seconds,
    );
  }

  // Metrics, once per iteration (the activity is idempotent per iteration).
  run.phase = 'metrics';
  const metrics = iterationMetrics({
    groups: batch.group_rewards.map((rewards) => ({ rewards })),
    episodes: c.episodes,
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
    phaseSeconds: { ...seconds },
    ...(batch.anchor ? { anchor: batch.anchor } : {}),
    ...(t.maxStaleness > 0 ? { staleness: { sampledVersion: c.sampledVersion, value: staleness(it, c.sampledVersion) } } : {}),
  });
  if (c.failed > 0) metrics.failed_episodes = c.failed;
  // Greedy evaluation on held-out tasks every K iterations or K environment steps, with the adapter just written.
  const envSteps = stepsBefore + c.episodes.reduce((n, e) => n + e.steps, 0);
  const due = evaluationDue({ iteration: it, evalEvery: t.evalEvery, evalEverySteps: t.evalEverySteps, stepsBefore, stepsAfter: envSteps });
  if (due && t.heldOutTasks.length > 0) {
    const evalSampling = samplingPolicy({ policy: greedy(cfg.policy), runId, adapterVersion: version, serving: servingOf(cfg.policy, t.vllmBaseUrl, update.adapter_path) });
    const evals: EpisodeResult[] = await run.timed(
      'evaluation',
      () =>
        pool(pickTasks(t.heldOutTasks, t.heldOutTasks.length, `${scope.pickKey}-eval`, it), t.parallelism, (p, j) =>
          executeChild(episode, {
            workflowId: `${runId}-it${it}-eval${j}`,
            taskQueue: cfg.temporal.controlTaskQueue,
            args: [episodeInput({ run: ctx, task: taskOf(cfg, p), maxSteps: cfg.episode.maxSteps, sampling: evalSampling, mode: 'grpo-eval' })],
            staticSummary: `${runId} iteration ${it} greedy evaluation: ${cfg.episode.env}/${p.task}`,
          }),
        ),
      'eval',
      seconds,
    );
    metrics.eval = {
      success_rate: evals.filter((e) => e.success).length / evals.length,
      mean_return: evals.reduce((s, e) => s + e.shapedReturn, 0) / evals.length,
      episodes: evals.length,
    };
    metrics.seconds = { ...metrics.seconds, eval: seconds.eval };
  }
  await control.appendIterationMetrics({ run_id: runId, iteration: it, metrics, time: new Date().toISOString(), ...wandbOf(cfg) });
  return { metrics, adapterPath: update.adapter_path, envSteps };
}

function taskOf(cfg: HaloConfig, p: { task: string; seed: number }) {
  return { env: cfg.episode.env, task: p.task, seed: p.seed };
}

/** The last ten iterations' zero-std shares, warning when most groups have carried no signal for a while. */
function warnZeroStd(scope: RunScope, it: number, history: number[], metrics: IterationMetrics): number[] {
  const zeroStdHistory = [...history, metrics.frac_reward_zero_std].slice(-10);
  if (shouldWarnZeroStd(zeroStdHistory)) {
    log.warn('frac_reward_zero_std has stayed above 0.5: most groups carry no learning signal (raise temperature or numGenerations, or check the rewards)', {
      runId: scope.runId,
      iteration: it,
      frac_reward_zero_std: metrics.frac_reward_zero_std,
    });
  }
  return zeroStdHistory;
}
