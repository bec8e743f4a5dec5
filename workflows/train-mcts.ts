/**
 * `trainMcts` (one per run, id = mcts.runId), the same skeleton as `trainGrpo`: per iteration one search per
 * task as child workflows (workflows/mcts-search.ts), the DPO pairs of all searches → `writeDpoBatch` →
 * learner `update_dpo` (adapter v<N> of the run, the `qwen3vl_mcts` adapter) → into vLLM when serving from
 * one → optional greedy evaluation → one metrics line (`runs/<run>/mcts-metrics.jsonl`) → continue-as-new
 * with a small state.
 */
import { continueAsNew, executeChild, log, patched, proxyActivities, workflowInfo } from '@temporalio/workflow';
import { checkFailureShare, pool, poolSettled } from './pool';
import { trainingRunConfig } from './run-config';
import { RunControl, type TrainingResult } from './run-control';
import type { ControlActivities } from '../activities/control';
import type { DiskActivities } from '../activities/disk';
import type { LearnerBatchActivities } from '../activities/learner-batches';
import type { AdapterActivities } from '../activities/adapters';
import type { MctsStoreActivities } from '../activities/mcts-store';
import type { MctsMetricsActivities } from '../activities/mcts-metrics';
import type { MctsIterationMetrics } from '../lib/mcts-metrics';
import { episodeInput, type EpisodeResult } from '../lib/episode-types';
import { greedy, samplingPolicy, servingOf, type ServedAdapter } from '../lib/iteration-policy';
import { mctsParams } from '../lib/mcts-params';
import { mctsIterationMetrics, searchSeed, searchWorkflowId } from '../lib/mcts-search';
import { runContextFromConfig } from '../lib/run-context';
import { wandbOf } from '../lib/curves';
import { episode } from './episode';
import { learnerActivities } from './learner-calls';
import { mctsSearch, type MctsSearchInput } from './mcts-search';
import * as profiles from './activity-profiles';

// The run messages are the same as trainGrpo's (workflows/messages.ts): `halo status`, pause, resume, stop.
export { statusQuery as trainMctsStatusQuery } from './messages';

/** What continue-as-new carries: small, no config body, no trees. */
export interface TrainMctsState {
  iteration: number;
  adapterVersion: number;
  configRef: string;
  configHash: string;
  paused: boolean;
  lastMetrics?: MctsIterationMetrics | null;
  /** Folder of adapter v<adapterVersion> (as the serving process sees it): reloaded into a restarted vLLM. */
  adapterPath?: string;
}

export interface TrainMctsInput {
  /** The run's config; absent on continuation, where `state.configRef` holds it. */
  config?: unknown;
  state?: TrainMctsState;
}

export interface TrainMctsStatus {
  runId: string;
  mode: 'mcts';
  iteration: number;
  iterations: number;
  adapterVersion: number;
  phase: string;
  paused: boolean;
  stopping: boolean;
  /** Workflow ids of this iteration's searches. */
  searches: string[];
  lastMetrics: MctsIterationMetrics | null;
  /** The served adapter this iteration samples from: `halo up` loads it into a restarted vLLM. */
  servedAdapter?: ServedAdapter;
}

export type TrainMctsResult = TrainingResult;

/**
 * Agent Q's "MCTS-guided DPO", one iteration per workflow run: searches (child workflows, bounded
 * parallelism) with the previous iteration's adapter → step-level pairs → `writeDpoBatch` → learner
 * `update_dpo` (v<N>; the reference policy is the one that sampled, through the logged log-probs) → adapter
 * into vLLM → optional greedy evaluation → metrics appended once → continue-as-new.
 */
export async function trainMcts(input: TrainMctsInput): Promise<TrainMctsResult> {
  const info = workflowInfo();
  const control = proxyActivities<ControlActivities & LearnerBatchActivities & MctsStoreActivities & MctsMetricsActivities & AdapterActivities & DiskActivities>(
    profiles.runActivities(),
  );
  const run = new RunControl<Omit<TrainMctsStatus, 'phase' | 'paused' | 'stopping'>>(info.workflowId, { paused: input.state?.paused });
  let searches: string[] = [];
  let lastMetrics: MctsIterationMetrics | null = input.state?.lastMetrics ?? null;
  const status = (runId: string, iterations: number, state?: TrainMctsState) => ({
    runId,
    mode: 'mcts' as const,
    iteration: state?.iteration ?? 1,
    iterations,
    adapterVersion: state?.adapterVersion ?? 0,
    searches,
    lastMetrics,
  });
  run.describe(() => status(info.workflowId, 0, input.state));

  const { cfg, stored, runId } = await trainingRunConfig(input, control, 'mcts');
  const state: TrainMctsState = input.state ?? { iteration: 1, adapterVersion: 0, configRef: stored!.ref, configHash: stored!.hash, paused: false };
  const m = cfg.mcts;
  const it = state.iteration;
  const ctx = runContextFromConfig(cfg, runId);
  let adapterPath = state.adapterPath;
  // The searches sample from the adapter the previous iteration wrote.
  const sampling = samplingPolicy({ policy: cfg.policy, runId, adapterVersion: state.adapterVersion, serving: servingOf(cfg.policy, m.vllmBaseUrl, adapterPath) });
  run.describe(() => ({ ...status(runId, m.iterations, state), ...(sampling.adapter ? { servedAdapter: sampling.adapter } : {}) }));
  // Runs started before the disk check replay without it.
  const diskOk = !patched('free-disk-check') || (await run.waitForDisk(() => control.checkFreeDisk({ minFreeBytes: cfg.stack.minFreeDiskGiB * 2 ** 30 })));
  if (!diskOk || !(await run.proceed())) return { runId, iterations: it - 1, adapterVersion: state.adapterVersion, stoppedEarly: true };

  // 1. One search per task, with the current policy (adapter v<N-1>).
  const params = mctsParams(cfg);
  const picks = m.tasks.map((task) => ({ task, seed: searchSeed(m.seed === undefined ? runId : `seed-${m.seed}`, it, task), id: searchWorkflowId(runId, it, task) }));
  searches = picks.map((p) => p.id);
  const searched = await run.timed('search', () =>
    poolSettled(picks, m.parallelism, (p) =>
      executeChild(mctsSearch, {
        workflowId: p.id,
        taskQueue: cfg.temporal.controlTaskQueue,
        staticSummary: `${runId} iteration ${it}: MCTS on ${cfg.episode.env}/${p.task} seed ${p.seed} (${params.numSimulations} simulations)`,
        args: [
          {
            run: ctx,
            iteration: it,
            task: { env: cfg.episode.env, task: p.task, seed: p.seed },
            params,
            policy: sampling.policy,
            adapterVersion: state.adapterVersion,
            ...(sampling.adapter ? { adapter: sampling.adapter } : {}),
          } satisfies MctsSearchInput,
        ],
      }),
    ),
  );
  checkFailureShare(searched.failed, picks.length, m.maxFailedSearchShare, `searches of iteration ${it}`, 'mcts.maxFailedSearchShare');
  for (const f of searched.failed) log.warn('search failed; its pairs are left out', { runId, iteration: it, task: f.item.task, error: f.error });
  const results = searched.ok;

  // 2. Step-level DPO on all pairs of the iteration: adapter v<N>.
  const pairRefs = results.flatMap((r) => (r.pairs.ref && r.pairs.count > 0 ? [r.pairs.ref] : []));
  const pairCount = results.reduce((n, r) => n + r.pairs.count, 0);
  let version = state.adapterVersion;
  let update: { loss: number; reward_margin: number; accuracy: number; grad_norm: number } | null = null;
  if (pairCount > 0) {
    // writeDpoBatch (validated against the learner's schema) over the searches' pair blobs.
    const { batch_ref: batchRef } = await run.timed('update', () => control.writeMctsDpoBatch({ pairs_refs: pairRefs }), 'batch');
    const next = version + 1;
    const out = await run.timed('update', () =>
      learnerActivities({
        taskQueue: ctx.gpuTaskQueue,
        heartbeatTimeout: ctx.learnerHeartbeatTimeoutMs,
        summary: `update_dpo ${runId} v${next} (${pairCount} pairs)`,
      }).updateDpo({
        run_id: runId,
        version: next,
        batch_ref: batchRef,
        ...(ctx.baseModel ? { base_model: ctx.baseModel } : {}),
        hyperparameters: { learning_rate: m.learningRate, beta: m.beta, max_grad_norm: m.maxGradNorm },
      }),
    );
    update = { loss: out.loss, reward_margin: out.reward_margin, accuracy: out.accuracy, grad_norm: out.grad_norm };
    version = next;
    adapterPath = out.adapter_path;
    // 3. Serve it (colocated: the learner already holds it).
    if (servingOf(cfg.policy, m.vllmBaseUrl)) {
      await run.timed(
        'load adapter',
        () => control.loadAdapterIntoVllm({ base_url: m.vllmBaseUrl!, run_id: runId, version, adapter_path: out.adapter_path, keep: 1 }),
        'load',
      );
    }
  } else {
    log.warn('no DPO pairs in this iteration: update skipped, adapter unchanged', { runId, iteration: it });
  }

  // 4. Greedy evaluation with the new policy, every evalEvery iterations.
  let evalSuccessRate: number | null = null;
  if (m.evalEvery > 0 && it % m.evalEvery === 0) {
    const evalSampling = samplingPolicy({ policy: greedy(cfg.policy), runId, adapterVersion: version, serving: servingOf(cfg.policy, m.vllmBaseUrl, adapterPath) });
    const runsEval = m.tasks.flatMap((task) => m.evalSeeds.map((seed) => ({ task, seed })));
    const evals: EpisodeResult[] = await run.timed(
      'evaluate',
      () =>
        pool(runsEval, m.parallelism, (e) =>
          executeChild(episode, {
            workflowId: `${runId}-it${it}-eval-${e.task}-s${e.seed}`,
            taskQueue: cfg.temporal.controlTaskQueue,
            staticSummary: `${runId} iteration ${it}: greedy evaluation of v${version} on ${cfg.episode.env}/${e.task} seed ${e.seed}`,
            args: [
              episodeInput({
                run: ctx,
                task: { env: cfg.episode.env, task: e.task, seed: e.seed },
                maxSteps: cfg.episode.maxSteps,
                sampling: evalSampling,
                mode: 'mcts-eval',
              }),
            ],
          }),
        ),
      'eval',
    );
    evalSuccessRate = evals.length ? evals.filter((e) => e.success).length / evals.length : null;
  }

  // 5. Metrics, once per iteration.
  run.phase = 'metrics';
  const metrics = mctsIterationMetrics({ searches: results, update, adapterVersion: version, evalSuccessRate, seconds: { ...run.seconds } });
  if (searched.failed.length > 0) metrics.failed_searches = searched.failed.length;
  lastMetrics = metrics;
  await control.appendMctsMetrics({ run_id: runId, iteration: it, metrics, time: new Date().toISOString(), ...wandbOf(cfg) });

  const ended = run.ended(runId, it, m.iterations, version);
  if (ended) return ended;
  run.phase = 'continue';
  const nextState: TrainMctsState = {
    ...state,
    iteration: it + 1,
    adapterVersion: version,
    ...(adapterPath ? { adapterPath } : {}),
    paused: run.paused,
    lastMetrics: metrics,
  };
  return continueAsNew<typeof trainMcts>({ state: nextState });
}
