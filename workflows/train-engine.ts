import { ApplicationFailure, continueAsNew, executeChild, log, patched, proxyActivities, workflowInfo } from '@temporalio/workflow';
import type { AdapterActivities } from '../activities/adapters';
import type { ControlActivities } from '../activities/control';
import type { DiskActivities } from '../activities/disk';
import type { GrpoBatchActivities } from '../activities/grpo-batch';
import type { LearnerBatchActivities } from '../activities/learner-batches';
import type { MctsStoreActivities } from '../activities/mcts-store';
import type { MetricsActivities } from '../activities/metrics';
import type { HaloConfig } from '../lib/config/config';
import { wandbOf } from '../lib/training/curves';
import { episodeInput, type EpisodeResult } from '../lib/episode/episode-types';
import { betterEval, evaluationDue, greedy, samplingPolicy, servingOf, staleness, type BestEval, type SamplingPolicy, type ServedAdapter } from '../lib/serving/iteration-policy';
import { runContextFromConfig, type RunContext } from '../lib/episode/run-context';
import type { StartedEpisode, StreamStats } from '../lib/training/rollout-stream';
import type { ReplicaStats } from '../lib/serving/policy-pool';
import type { TrainingMetrics } from '../lib/training/run-metrics';
import { evaluationPicks, trainingPlan, type TrainingMode, type TrainingPlan } from '../lib/training/training-plan';
import * as profiles from './activity-profiles';
import { episode } from './episode';
import { learnerActivities, type LearnerClient } from './learner-calls';
import { pool } from './pool';
import { trainingRunConfig } from './run-config';
import { RunControl, type TrainingResult } from './run-control';
import { streamRollouts } from './stream-loop';

/**
 * The one training loop. `trainGrpo` and `trainMcts` are this loop with an algorithm descriptor each
 * (workflows/algorithms/): the descriptor collects an iteration's experience and builds its batch, makes the
 * learner update and builds its metrics section; the engine owns everything else, the same for every
 * algorithm: config, pause/stop/status, the disk check, pipelining (`maxStaleness`), serving the new adapter,
 * the greedy held-out evaluation, the metrics row (appended once) and continue-as-new with a small state.
 * A third algorithm is a third descriptor, not a third loop (test/unit/layering.test.ts keeps it so).
 */

/** The activities every training run calls, on the control task queue. */
export type RunActivities = ControlActivities & GrpoBatchActivities & LearnerBatchActivities & MctsStoreActivities & MetricsActivities & AdapterActivities & DiskActivities;

/** What continue-as-new carries: small, no config body, no episodes, trees or images. */
export interface TrainingState {
  iteration: number;
  adapterVersion: number;
  configRef: string;
  configHash: string;
  paused: boolean;
  /**
   * A stop that came after the run last looked (pipelined: while the collected batch was being stored). The
   * next run learns from the pending batch and ends; without it, the stop would be dropped at continue-as-new.
   */
  stopping?: boolean;
  /** GRPO: the last ten iterations' zero-std shares (absent in MCTS runs). */
  zeroStdHistory?: number[];
  /** Folder of adapter v<adapterVersion> (as the serving process sees it): reloaded into a restarted vLLM. */
  adapterPath?: string;
  /** The previous iteration's metrics, for the status query and progress bar. */
  lastMetrics?: TrainingMetrics | null;
  /**
   * maxStaleness ≥ 1: iteration `iteration − 1`'s experience, collected while its predecessor's update ran and
   * not yet learned from (a `Collected` in the blob store). This run updates on it while the next iteration
   * collects with adapter v<adapterVersion>.
   */
  pendingRef?: string;
  /** Environment steps of the iterations learned from so far (evalEverySteps); absent: 0. */
  envSteps?: number;
  /** The adapter its held-out evaluations scored best so far (lib/serving/iteration-policy.ts `betterEval`). */
  bestEval?: BestEval;
  /** train.rollout stream: the stream's buffer, queue and counters (a `StreamSnapshot` in the blob store). */
  streamRef?: string;
}

export interface TrainingInput {
  /** The run's config (validated here); absent on continuation, where `state.configRef` holds it. */
  config?: unknown;
  state?: TrainingState;
}

export interface TrainingStatus {
  runId: string;
  mode: TrainingMode;
  iteration: number;
  iterations: number;
  adapterVersion: number;
  phase: string;
  paused: boolean;
  stopping: boolean;
  lastMetrics: TrainingMetrics | null;
  /** The served adapter this iteration samples from: `halo up` loads it into a restarted vLLM. */
  servedAdapter?: ServedAdapter;
  /** MCTS: workflow ids of this iteration's searches. */
  searches?: string[];
  /** train.rollout stream: episodes in flight and queued, complete groups buffered, the adapter new episodes sample. */
  stream?: { inFlight: number; queued: number; buffered: number; samplingVersion: number };
}

/** One iteration's experience, its batch (by reference) and what its metrics row needs; `D` is the algorithm's part. */
export type Collected<D = object> = D & {
  iteration: number;
  /** The adapter version it was collected with (0: the base model). */
  sampledVersion: number;
  /** Episodes or searches that failed (left out of the batch). */
  failed: number;
  /** Workflow-clock seconds of its collection and batch phases. */
  seconds: Record<string, number>;
  /** train.rollout stream: updates its oldest sample is behind the adapter the update starts from, and the stream's numbers. */
  streamed?: Streamed;
};

/** What a streamed batch adds to its metrics row. */
export interface Streamed {
  staleness: number;
  stats: StreamStats;
}

/** What every phase of a run needs. */
export interface RunScope {
  cfg: HaloConfig;
  runId: string;
  ctx: RunContext;
  plan: TrainingPlan;
  run: RunControl<Omit<TrainingStatus, 'phase' | 'paused' | 'stopping'>>;
  control: ReturnType<typeof proxyActivities<RunActivities>>;
}

/** The learner's answer to an update, as far as the engine needs it. */
export interface UpdateDone<U> {
  adapterPath: string;
  result: U;
}

/** An algorithm's part in streaming rollouts (workflows/stream-loop.ts): one unit's episodes, and a batch from them. */
export interface StreamParts<D, R> {
  /** Episodes per unit (a unit is what one group needs complete). */
  unitSize(scope: RunScope): number;
  /** One episode of a unit, sampled with `sampling` (the newest adapter served when it started). */
  runEpisode(scope: RunScope, ep: StartedEpisode, sampling: SamplingPolicy): Promise<R>;
  /** Update `it`'s experience from the batch's episodes (unit by unit, members in order). */
  build(scope: RunScope, it: number, episodes: R[], sampledVersion: number, seconds: Record<string, number>): Promise<Collected<D>>;
}

/** One algorithm of the engine. */
export interface Algorithm<D, U, R = never> {
  mode: TrainingMode;
  /** The `mode` of its greedy evaluation episodes (their search attribute and records). */
  evalMode: 'grpo-eval' | 'mcts-eval';
  /** Iteration `it`'s experience with `sampling` (adapter v<sampledVersion>), and the learner batch built from it. */
  collect(scope: RunScope, it: number, sampling: SamplingPolicy, sampledVersion: number, seconds: Record<string, number>): Promise<Collected<D>>;
  /** Environment steps an iteration's experience took (evalEverySteps). */
  envSteps(c: Collected<D>): number;
  /** The learner update writing adapter v<version>; null when the batch holds nothing to learn (the version stays). */
  update(scope: RunScope, c: Collected<D>, version: number, seconds: Record<string, number>): Promise<UpdateDone<U> | null>;
  /** The iteration's metrics row, before the evaluation the engine adds. */
  metrics(scope: RunScope, c: Collected<D>, update: U | null, adapterVersion: number, seconds: Record<string, number>): TrainingMetrics;
  /** Status fields of its own for iteration `it` (MCTS: the searches' workflow ids). */
  status?(scope: RunScope, it: number): Partial<TrainingStatus>;
  /** Looks at each metrics row as it is written (GRPO: warns when groups carry no signal for a while). */
  watch?(scope: RunScope, it: number, history: number[], metrics: TrainingMetrics): number[];
  /** Streaming rollouts (train.rollout stream); an algorithm without it runs iterations only. */
  stream?: StreamParts<D, R>;
}

/** An algorithm's learner update: timed as the iteration's `update` phase, on the run's learner queue and heartbeat. */
export function learnerUpdate<T>(scope: RunScope, seconds: Record<string, number>, summary: string, call: (learner: LearnerClient) => Promise<T>): Promise<T> {
  const learner = learnerActivities({ taskQueue: scope.ctx.gpuTaskQueue, heartbeatTimeout: scope.ctx.learnerHeartbeatTimeoutMs, summary });
  return scope.run.timed('update', () => call(learner), 'update', seconds);
}

/** Runs one iteration (two, overlapped, when pipelined) of `algorithm`, then continues as new. */
export async function runTraining<D, U, R>(algorithm: Algorithm<D, U, R>, input: TrainingInput): Promise<TrainingResult> {
  const info = workflowInfo();
  const control = proxyActivities<RunActivities>(profiles.runActivities());
  // Handlers first, so `status`, pause and stop work from the first moment (before the config is stored).
  const run = new RunControl<Omit<TrainingStatus, 'phase' | 'paused' | 'stopping'>>(info.workflowId, { paused: input.state?.paused, stopping: input.state?.stopping });
  let lastMetrics: TrainingMetrics | null = input.state?.lastMetrics ?? null;
  const describe = (runId: string, iterations: number, state: TrainingState | undefined, extra: Partial<TrainingStatus>, live: () => Partial<TrainingStatus> = () => ({})) =>
    run.describe(() => ({
      runId,
      mode: algorithm.mode,
      iteration: state?.iteration ?? 1,
      iterations,
      adapterVersion: state?.adapterVersion ?? 0,
      lastMetrics,
      ...extra,
      ...live(),
    }));
  describe(info.workflowId, 0, input.state, {});

  const { cfg, stored, runId } = await trainingRunConfig(input, control, algorithm.mode);
  const state: TrainingState = input.state ?? { iteration: 1, adapterVersion: 0, configRef: stored!.ref, configHash: stored!.hash, zeroStdHistory: [], paused: false };
  const plan = trainingPlan(cfg, algorithm.mode);
  const it = state.iteration;
  const scope: RunScope = { cfg, runId, ctx: runContextFromConfig(cfg, runId), plan, run, control };
  // On-policy: this iteration samples from the adapter the previous one wrote (pipelined: the newest there is).
  const sampling = samplingPolicy({ policy: cfg.policy, runId, adapterVersion: state.adapterVersion, serving: servingOf(cfg.policy, plan.vllmBaseUrl, state.adapterPath) });
  describe(runId, plan.iterations, state, { ...algorithm.status?.(scope, it), ...(sampling.adapter ? { servedAdapter: sampling.adapter } : {}) });
  // Runs started before the disk check replay without it.
  const diskOk = !patched('free-disk-check') || (await run.waitForDisk(() => control.checkFreeDisk({ minFreeBytes: cfg.stack.minFreeDiskGiB * 2 ** 30 })));
  const loop = new Loop(algorithm, scope, state, (m) => {
    lastMetrics = m;
  });
  if (plan.rollout === 'stream') {
    if (!algorithm.stream) throw ApplicationFailure.nonRetryable(`${algorithm.mode} runs iterations only (train.rollout stream is GRPO's)`, 'InvalidConfig');
    return streamRollouts(loop, algorithm.stream, scope, state, diskOk, (live) => describe(runId, plan.iterations, state, {}, live));
  }
  if (plan.maxStaleness > 0) return loop.pipelined(sampling, diskOk);
  return loop.sequential(sampling, diskOk);
}

/** One workflow run's part of the loop: what it learned so far, and how it continues. */
/** Browser slots another part of the run owns (the stream's): an episode waits for one and gives it back. */
export interface SlotGate {
  acquire(): Promise<void>;
  release(): void;
}

async function inSlot<T>(gate: SlotGate | undefined, fn: () => Promise<T>): Promise<T> {
  if (!gate) return fn();
  await gate.acquire();
  try {
    return await fn();
  } finally {
    gate.release();
  }
}

export class Loop<D, U, R> {
  /** The newest adapter written (0: the base model). */
  version: number;
  /** The newest adapter ready to sample from: loaded into vLLM where the run serves its adapters. */
  servedVersion: number;
  private adapterPath: string | undefined;
  private zeroStdHistory: number[];
  private lastMetrics: TrainingMetrics | null;
  private envSteps: number;
  private bestEval: BestEval | undefined;
  /** Streaming: where evaluation episodes take their browser slots, so they share `parallelism` with the stream. */
  evalSlots: SlotGate | undefined;

  constructor(
    private readonly algorithm: Algorithm<D, U, R>,
    private readonly scope: RunScope,
    private readonly state: TrainingState,
    private readonly onMetrics: (m: TrainingMetrics) => void,
  ) {
    this.version = state.adapterVersion;
    this.servedVersion = state.adapterVersion;
    this.adapterPath = state.adapterPath;
    this.zeroStdHistory = state.zeroStdHistory ?? [];
    this.lastMetrics = state.lastMetrics ?? null;
    this.envSteps = state.envSteps ?? 0;
    this.bestEval = state.bestEval;
  }

  /** Collect → update → serve → evaluate → metrics, then continue as new (or end). */
  async sequential(sampling: SamplingPolicy, diskOk: boolean): Promise<TrainingResult> {
    const { runId, run, plan } = this.scope;
    const it = this.state.iteration;
    if (!diskOk || !(await run.proceed())) return { runId, iterations: it - 1, adapterVersion: this.version, stoppedEarly: true };
    const collected = await this.algorithm.collect(this.scope, it, sampling, this.version, run.seconds);
    await this.learnFrom(collected, run.seconds);
    const ended = run.ended(runId, it, plan.iterations, this.version);
    if (ended) return this.withBest(ended);
    return this.continue(it + 1);
  }

  /**
   * maxStaleness ≥ 1: the update on iteration `it − 1`'s batch (carried by reference) and the collection of
   * iteration `it`, side by side. The collection samples from v<adapterVersion>, the newest adapter at the
   * run's start; the update writes the next. A stop (or the last iteration) starts no further collection, and
   * the batch already collected is still learned from. Each run awaits both halves before it continues as
   * new, so a restart resumes both and every version is written once.
   */
  async pipelined(sampling: SamplingPolicy, diskOk: boolean): Promise<TrainingResult> {
    const { runId, run, plan, control } = this.scope;
    const it = this.state.iteration;
    const pending = this.state.pendingRef ? ((await control.loadJson({ ref: this.state.pendingRef })) as Collected<D>) : undefined;
    const go = diskOk && (await run.proceed());
    const collectSeconds: Record<string, number> = {};
    // A stopped or paused-then-stopped run still learns from what it has collected.
    const collecting = go && it <= plan.iterations ? this.algorithm.collect(this.scope, it, sampling, this.state.adapterVersion, collectSeconds) : undefined;
    run.phase = collecting && pending ? 'collect + update' : collecting ? 'collect' : 'update';
    // An iteration's metrics row has its own collection and batch seconds, then its update's.
    const [collected] = await Promise.all([collecting, pending ? this.learnFrom(pending, { ...pending.seconds }) : undefined]);
    const lastCollected = collected?.iteration ?? pending?.iteration ?? it - 1;
    if (run.stopping || !go || lastCollected >= plan.iterations) {
      if (collected) await this.learnFrom(collected, { ...collected.seconds });
      return this.withBest({ runId, iterations: lastCollected, adapterVersion: this.version, stoppedEarly: lastCollected < plan.iterations });
    }
    const { ref } = await control.storeJson({ value: collected });
    return this.continue(it + 1, ref);
  }

  /** Sampling with the newest adapter served (streaming: what a starting episode samples from). */
  servedSampling(): SamplingPolicy {
    const { cfg, runId, plan } = this.scope;
    return samplingPolicy({ policy: cfg.policy, runId, adapterVersion: this.servedVersion, serving: servingOf(cfg.policy, plan.vllmBaseUrl, this.adapterPath) });
  }

  /** One update on an iteration's batch, the adapter served, the evaluation when due, the metrics row appended once. */
  async learnFrom(c: Collected<D>, seconds: Record<string, number>): Promise<void> {
    const { cfg, runId, run, control, plan } = this.scope;
    const update = await this.algorithm.update(this.scope, c, this.version + 1, seconds);
    let replicas: ReplicaStats[] | undefined;
    if (update) {
      this.version++;
      this.adapterPath = update.adapterPath;
      // Serve the new adapter (colocated: the learner already holds it), on every replica of a pool. Pipelined
      // collection may still be sampling from the previous version: it stays loaded.
      if (servingOf(cfg.policy, plan.vllmBaseUrl)) {
        const pool = cfg.policy.baseUrls && cfg.policy.baseUrls.length > 1 ? { replicas: cfg.policy.baseUrls } : {};
        // Streaming: an episode keeps sampling from the version it started with for as long as it runs.
        const keep = 1 + plan.maxStaleness + (plan.rollout === 'stream' ? 1 : 0);
        const load = { base_url: plan.vllmBaseUrl!, run_id: runId, version: this.version, adapter_path: update.adapterPath, keep, ...pool };
        replicas = (await run.timed('load adapter', () => control.loadAdapterIntoVllm(load), 'load', seconds)).pool;
      }
      this.servedVersion = this.version;
    }
    run.phase = 'metrics';
    const metrics = this.algorithm.metrics(this.scope, c, update?.result ?? null, this.version, { ...seconds });
    if (replicas) metrics.policy_replicas = replicas;
    if (cfg.episode.env === 'real') metrics.scoring = this.scope.ctx.envOptions?.realScoring ?? 'training';
    if (c.failed > 0) metrics.failed_episodes = c.failed;
    if (c.streamed) Object.assign(metrics, { sampled_adapter_version: c.sampledVersion, staleness: c.streamed.staleness, stream: c.streamed.stats });
    else if (plan.maxStaleness > 0) Object.assign(metrics, { sampled_adapter_version: c.sampledVersion, staleness: staleness(c.iteration, c.sampledVersion) });
    const stepsBefore = this.envSteps;
    this.envSteps += this.algorithm.envSteps(c);
    const due = evaluationDue({ iteration: c.iteration, evalEvery: plan.evalEvery, evalEverySteps: plan.evalEverySteps, stepsBefore, stepsAfter: this.envSteps });
    if (due && plan.evalTasks.length > 0) {
      metrics.eval = await this.evaluate(c.iteration, seconds);
      metrics.seconds = { ...metrics.seconds, eval: seconds.eval };
      this.bestEval = betterEval(this.bestEval, { version: this.version, iteration: c.iteration, success: metrics.eval.success_rate });
      Object.assign(metrics, { best_adapter_version: this.bestEval.version, best_eval_success: this.bestEval.success });
    }
    await control.appendIterationMetrics({ run_id: runId, iteration: c.iteration, metrics, time: new Date().toISOString(), ...wandbOf(cfg) });
    this.lastMetrics = metrics;
    this.onMetrics(metrics);
    if (this.algorithm.watch) this.zeroStdHistory = this.algorithm.watch(this.scope, c.iteration, this.zeroStdHistory, metrics);
  }

  /** Greedy episodes with the adapter just written, on the held-out tasks and seeds: success rate and mean return. */
  private async evaluate(it: number, seconds: Record<string, number>): Promise<NonNullable<TrainingMetrics['eval']>> {
    const { cfg, runId, ctx, run, plan } = this.scope;
    const sampling = samplingPolicy({ policy: greedy(cfg.policy), runId, adapterVersion: this.version, serving: servingOf(cfg.policy, plan.vllmBaseUrl, this.adapterPath) });
    const evals: EpisodeResult[] = await run.timed(
      'evaluation',
      () =>
        pool(evaluationPicks(plan, it), plan.parallelism, (p, j) =>
          inSlot(this.evalSlots, () =>
            executeChild(episode, {
              workflowId: `${runId}-it${it}-eval${j}`,
              taskQueue: cfg.temporal.controlTaskQueue,
              args: [
                episodeInput({ run: ctx, task: { env: cfg.episode.env, task: p.task, seed: p.seed }, maxSteps: cfg.episode.maxSteps, sampling, mode: this.algorithm.evalMode }),
              ],
              staticSummary: `${runId} iteration ${it} greedy evaluation of v${this.version}: ${cfg.episode.env}/${p.task} seed ${p.seed}`,
            }),
          ),
        ),
      'eval',
      seconds,
    );
    return {
      success_rate: evals.filter((e) => e.success).length / evals.length,
      mean_return: evals.reduce((s, e) => s + e.shapedReturn, 0) / evals.length,
      episodes: evals.length,
    };
  }

  /**
   * The run's result names the best-evaluated adapter beside the latest, and says so in the log when the latest
   * scored below it: the run ends serving the latest, and nobody should take it for the best one unawares.
   */
  withBest(r: TrainingResult): TrainingResult {
    const best = this.bestEval;
    if (!best) return r;
    if (best.version !== r.adapterVersion) {
      log.warn(`held-out evaluation scored adapter v${best.version} (iteration ${best.iteration}, success ${best.success}) above the latest v${r.adapterVersion}; both are kept`, {
        runId: r.runId,
        best,
      });
    }
    return { ...r, best };
  }

  continue(iteration: number, pendingRef?: string, streamRef?: string): Promise<never> {
    this.scope.run.phase = 'continue';
    const next: TrainingState = {
      ...this.state,
      iteration,
      adapterVersion: this.version,
      ...(this.adapterPath ? { adapterPath: this.adapterPath } : {}),
      ...(this.algorithm.watch ? { zeroStdHistory: this.zeroStdHistory } : {}),
      paused: this.scope.run.paused,
      lastMetrics: this.lastMetrics,
      ...(this.envSteps > 0 ? { envSteps: this.envSteps } : {}),
      ...(this.bestEval ? { bestEval: this.bestEval } : {}),
    };
    // Absent unless set: the continue-as-new input of runs nobody stopped stays as it was.
    if (this.scope.run.stopping) next.stopping = true;
    else delete next.stopping;
    if (pendingRef) next.pendingRef = pendingRef;
    else delete next.pendingRef;
    if (streamRef) next.streamRef = streamRef;
    else delete next.streamRef;
    return continueAsNew<(input: TrainingInput) => Promise<TrainingResult>>({ state: next });
  }
}
export type { TrainingResult } from './run-control';
