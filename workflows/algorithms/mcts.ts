import { executeChild, log } from '@temporalio/workflow';
import type { UpdateDpoOutput } from '../../lib/training/learner-types';
import { mctsParams } from '../../lib/search/mcts-params';
import { searchSeed, searchWorkflowId, type MctsSearchResult } from '../../lib/search/mcts-search';
import { mctsIterationMetrics } from '../../lib/training/training-metrics';
import { drawKey } from '../../lib/training/training-plan';
import { mctsSearch, type MctsSearchInput } from '../mcts-search';
import { checkFailureShare, poolSettled } from '../pool';
import type { SamplingPolicy } from '../../lib/serving/iteration-policy';
import { learnerUpdate, type Algorithm, type Collected, type RunScope } from '../train-engine';

/** What an MCTS iteration collects: each search's summary, and the DPO batch of all their pairs (null: no pairs). */
export interface MctsExperience {
  searches: Pick<MctsSearchResult, 'simulations' | 'stats' | 'bestPath' | 'pairs' | 'counters'>[];
  batchRef: string | null;
  pairs: number;
}

/** One search of an iteration: its task, seed, workflow id and draw key. */
interface SearchPick {
  task: string;
  seed: number;
  id: string;
  drawKey: string;
}

/** The iteration's searches: `searchesPerTask` per task, each seed from the pick key, iteration, task and repeat. */
function searchPicks(scope: RunScope, it: number): SearchPick[] {
  const repeats = Array.from({ length: scope.cfg.mcts.searchesPerTask }, (_, r) => r);
  return scope.cfg.mcts.tasks.flatMap((task) =>
    repeats.map((r) => ({
      task,
      seed: searchSeed(scope.plan.pickKey, it, task, r),
      id: searchWorkflowId(scope.runId, it, task, r),
      drawKey: drawKey(scope.plan.pickKey, it, `${task}-${r}`),
    })),
  );
}

/** One search of iteration `it` as a child workflow, sampling from adapter v<version> (`sampling` names it). */
function runSearch(scope: RunScope, it: number, p: SearchPick, sampling: SamplingPolicy, version: number): Promise<MctsSearchResult> {
  const { cfg, runId, ctx } = scope;
  const params = mctsParams(cfg);
  return executeChild(mctsSearch, {
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
        adapterVersion: version,
        ...(sampling.adapter ? { adapter: sampling.adapter } : {}),
        drawKey: p.drawKey,
      } satisfies MctsSearchInput,
    ],
  });
}

/** An update's experience from its searches: their summaries and one DPO batch of all their pairs (null: none). */
async function experience(
  scope: RunScope,
  it: number,
  results: MctsSearchResult[],
  failed: number,
  sampledVersion: number,
  seconds: Record<string, number>,
): Promise<Collected<MctsExperience>> {
  const { run, control } = scope;
  const pairRefs = results.flatMap((r) => (r.pairs.ref && r.pairs.count > 0 ? [r.pairs.ref] : []));
  const pairs = results.reduce((n, r) => n + r.pairs.count, 0);
  // writeDpoBatch (validated against the learner's schema) over the searches' pair blobs.
  const batchRef = pairs > 0 ? (await run.timed('update', () => control.writeMctsDpoBatch({ pairs_refs: pairRefs }), 'batch', seconds)).batch_ref : null;
  return {
    iteration: it,
    sampledVersion,
    searches: results.map((r) => ({ simulations: r.simulations, stats: r.stats, bestPath: r.bestPath, pairs: r.pairs, counters: r.counters })),
    batchRef,
    pairs,
    failed,
    seconds,
  };
}

/**
 * Agent Q's MCTS-guided DPO: per iteration `searchesPerTask` searches per task (child workflows, workflows/mcts-search.ts)
 * with the previous iteration's adapter, the step-level pairs of all searches in one DPO batch, then the
 * learner's `update_dpo` (the reference policy is the base model, the learner's resident model with the adapter
 * off; log-probs logged by the sampler are not used as the reference). An
 * iteration without pairs skips the update and keeps the adapter.
 */
export const mcts: Algorithm<MctsExperience, UpdateDpoOutput, MctsSearchResult> = {
  mode: 'mcts',
  evalMode: 'mcts-eval',

  status: (scope, it) => ({ searches: searchPicks(scope, it).map((p) => p.id) }),

  async collect(scope, it, sampling, sampledVersion, seconds) {
    const { runId, run, plan } = scope;
    const picks = searchPicks(scope, it);
    const searched = await run.timed('search', () => poolSettled(picks, plan.parallelism, (p) => runSearch(scope, it, p, sampling, sampledVersion)), 'search', seconds);
    checkFailureShare(searched.failed, picks.length, plan.maxFailedShare, `searches of iteration ${it}`, plan.maxFailedShareKey);
    for (const f of searched.failed) log.warn('search failed; its pairs are left out', { runId, iteration: it, task: f.item.task, error: f.error });
    return experience(scope, it, searched.ok, searched.failed.length, sampledVersion, seconds);
  },

  // Streaming: a unit is one search. Unit u is search u mod B of iteration ⌊u / B⌋ + 1 (B: the iteration's
  // searches), with that search's workflow id, seed and draws; a search run again gets `-r<attempt>`.
  stream: {
    unitSize: () => 1,
    runEpisode(scope, ep, sampling) {
      const it = Math.floor(ep.unit / scope.plan.batchUnits) + 1;
      const p = searchPicks(scope, it)[ep.unit % scope.plan.batchUnits];
      return runSearch(scope, it, ep.attempt > 0 ? { ...p, id: `${p.id}-r${ep.attempt}` } : p, sampling, ep.version);
    },
    build: (scope, it, results, sampledVersion, seconds) => experience(scope, it, results, 0, sampledVersion, seconds),
  },

  envSteps: (c) => c.searches.reduce((n, s) => n + s.counters.browserSteps, 0),

  async update(scope, c, version, seconds) {
    const { cfg, runId, ctx } = scope;
    if (!c.batchRef) {
      log.warn('no DPO pairs in this iteration: update skipped, adapter unchanged', { runId, iteration: c.iteration });
      return null;
    }
    const m = cfg.mcts;
    const out = await learnerUpdate(scope, seconds, `update_dpo ${runId} v${version} (${c.pairs} pairs)`, (learner) =>
      learner.updateDpo({
        run_id: runId,
        version,
        batch_ref: c.batchRef!,
        ...(ctx.baseModel ? { base_model: ctx.baseModel } : {}),
        hyperparameters: { learning_rate: m.learningRate, beta: m.beta, max_grad_norm: m.maxGradNorm },
      }),
    );
    return { adapterPath: out.adapter_path, result: out };
  },

  metrics: (_scope, c, update, adapterVersion, seconds) =>
    mctsIterationMetrics({
      searches: c.searches,
      update: update ? { loss: update.loss, reward_margin: update.reward_margin, accuracy: update.accuracy, grad_norm: update.grad_norm } : null,
      adapterVersion,
      seconds,
    }),
};
