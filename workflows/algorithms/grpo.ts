import { executeChild, log } from '@temporalio/workflow';
import type { BuildGrpoBatchResult } from '../../activities/grpo-batch';
import type { TrainConfig } from '../../lib/config/config';
import { episodeInput, type EpisodeInput, type EpisodeResult } from '../../lib/episode/episode-types';
import { shouldWarnZeroStd } from '../../lib/training/grpo';
import type { UpdatePolicyOutput } from '../../lib/training/learner-types';
import { iterationMetrics, type EpisodeSummary } from '../../lib/training/training-metrics';
import type { SamplingPolicy } from '../../lib/serving/iteration-policy';
import { drawKey, pickTasks, type TaskPick } from '../../lib/training/training-plan';
import { episode } from '../episode';
import { checkFailureShare, poolSettled } from '../pool';
import { learnerUpdate, type Algorithm, type Collected, type RunScope } from '../train-engine';

/** What a GRPO iteration collects: its episodes' summaries and the batch of group advantages (references only). */
export interface GrpoExperience {
  batch: BuildGrpoBatchResult;
  episodes: EpisodeSummary[];
}

/** Step grouping as its episodes run it: N candidates, and dynamic sampling's extra draws when configured. */
function stepGrouping(t: TrainConfig): NonNullable<EpisodeInput['grouping']> {
  const ds = t.dynamicSampling;
  return { n: t.numGenerations, choose: t.choose, ...(ds.maxCandidates > 0 ? { maxCandidates: ds.maxCandidates, explore: ds.explore } : {}) };
}

/** Whether some samples come from dynamic sampling's ε-mixture rather than from the policy itself. */
function exploring(t: TrainConfig): boolean {
  return t.grouping === 'step' && t.dynamicSampling.maxCandidates > 0 && t.dynamicSampling.explore > 0;
}

/** Episode `j` of iteration `it` (a fresh session's attempt: `-r<attempt>`), as a child workflow. */
function runEpisode(scope: RunScope, it: number, j: number, p: TaskPick, sampling: SamplingPolicy, attempt = 0): Promise<EpisodeResult> {
  const { cfg, runId, ctx, plan } = scope;
  const t = cfg.train;
  return executeChild(episode, {
    workflowId: `${runId}-it${it}-ep${j}${attempt > 0 ? `-r${attempt}` : ''}`,
    taskQueue: cfg.temporal.controlTaskQueue,
    args: [
      episodeInput({
        run: ctx,
        task: { env: cfg.episode.env, task: p.task, seed: p.seed },
        maxSteps: cfg.episode.maxSteps,
        sampling,
        mode: 'grpo',
        ...(t.grouping === 'step' ? { grouping: stepGrouping(t) } : {}),
        drawKey: drawKey(plan.pickKey, it, j),
      }),
    ],
    staticSummary: `${runId} iteration ${it}: ${cfg.episode.env}/${p.task} seed ${p.seed}${attempt > 0 ? ` (fresh session ${attempt})` : ''}`,
  });
}

/** An update's experience from its episodes: the batch of group advantages (by reference) and the summaries. */
async function experience(
  scope: RunScope,
  it: number,
  episodes: EpisodeResult[],
  failed: number,
  sampledVersion: number,
  seconds: Record<string, number>,
): Promise<Collected<GrpoExperience>> {
  const { cfg, runId, run, control } = scope;
  const t = cfg.train;
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
        ...(t.grouping === 'step' && t.dynamicSampling.maxCandidates > 0 ? { dynamic_sampling: true } : {}),
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
      ...(e.browser ? { browser: e.browser } : {}),
    })),
    failed,
    seconds,
  };
}

/**
 * Online GRPO (`dr_grpo`): per iteration, episodes (child workflows, bounded parallelism) sampled from the
 * previous iteration's adapter, grouped by step (N candidates per state), episode (N rollouts of one task and
 * seed) or anchor (episode groups plus equal states across them), advantages = reward − group mean, then the
 * learner's `update_policy`.
 */
export const grpo: Algorithm<GrpoExperience, UpdatePolicyOutput, EpisodeResult> = {
  mode: 'grpo',
  evalMode: 'grpo-eval',

  async collect(scope, it, sampling, sampledVersion, seconds) {
    const { cfg, runId, run, plan } = scope;
    const t = cfg.train;
    const picks = pickTasks(t.tasks, t.episodesPerIteration, plan.pickKey, it);
    const runs = t.grouping !== 'step' ? picks.flatMap((p) => Array.from({ length: t.numGenerations }, () => p)) : picks;
    const rollout = await run.timed('rollout', () => poolSettled(runs, t.parallelism, (p, j) => runEpisode(scope, it, j, p, sampling)), 'rollout', seconds);
    // A failed episode (a site briefly unreachable, a session lost too often) is left out of the batch; past
    // the configured share the iteration's data is not worth an update and the run stops, naming the reasons.
    checkFailureShare(rollout.failed, runs.length, plan.maxFailedShare, `episodes of iteration ${it}`, plan.maxFailedShareKey);
    for (const f of rollout.failed) log.warn('episode failed; left out of the batch', { runId, iteration: it, episode: f.index, error: f.error });
    return experience(scope, it, rollout.ok, rollout.failed.length, sampledVersion, seconds);
  },

  // Streaming: a unit is one episode (step groups live inside it) or the numGenerations rollouts of one pick.
  // Unit u plays the pick the synchronous run would give episode u mod B of iteration ⌊u / B⌋ + 1, with the same
  // workflow id and draw key, so k = 0 replays the iterations; an episode run again gets `-r<attempt>`.
  stream: {
    unitSize: (scope) => (scope.cfg.train.grouping === 'step' ? 1 : scope.cfg.train.numGenerations),
    runEpisode(scope, ep, sampling) {
      const t = scope.cfg.train;
      const it = Math.floor(ep.unit / t.episodesPerIteration) + 1;
      const j = ep.unit % t.episodesPerIteration;
      const pick = pickTasks(t.tasks, t.episodesPerIteration, scope.plan.pickKey, it)[j];
      const size = t.grouping === 'step' ? 1 : t.numGenerations;
      return runEpisode(scope, it, j * size + ep.member, pick, sampling, ep.attempt);
    },
    build: (scope, it, episodes, sampledVersion, seconds) => experience(scope, it, episodes, 0, sampledVersion, seconds),
  },

  envSteps: (c) => c.episodes.reduce((n, e) => n + e.steps, 0),

  // Every iteration updates, even one whose groups all carry no signal (advantage 0, KL only): versions stay contiguous.
  async update(scope, c, version, seconds) {
    const { cfg, runId, ctx } = scope;
    const t = cfg.train;
    const out = await learnerUpdate(scope, seconds, `update_policy ${runId} v${version} (${c.batch.items} items)`, (learner) =>
      learner.updatePolicy({
        run_id: runId,
        version,
        batch_ref: c.batch.batch_ref,
        ...(ctx.baseModel ? { base_model: ctx.baseModel } : {}),
        hyperparameters: {
          learning_rate: t.learningRate,
          kl_coef: t.klCoef,
          clip_epsilon: t.clipEpsilon,
          temperature: Math.max(cfg.policy.temperature, 1e-3),
          max_grad_norm: t.maxGradNorm,
          loss_type: t.lossType,
          // Pipelined: samples one update behind are importance-weighted to the sampler, not clipped away.
          // Exploring draws likewise: their behaviour policy is the ε-mixture, not the policy being trained.
          // Served: another engine's log-probs, whose mismatch with the learner's would otherwise be clipped away.
          ...(t.maxStaleness > 0 || exploring(t) || cfg.policy.backend !== 'colocated' ? { stale_weight_cap: t.staleWeightCap } : {}),
        },
      }),
    );
    return { adapterPath: out.adapter_path, result: out };
  },

  metrics(_scope, c: Collected<GrpoExperience>, update, _version, seconds) {
    return iterationMetrics({
      groups: c.batch.group_rewards.map((rewards) => ({ rewards })),
      episodes: c.episodes,
      ...(update
        ? {
            update: {
              loss: update.loss,
              grad_norm: update.grad_norm,
              version: update.version,
              tokens: update.tokens,
              retokenized: update.retokenized,
              token_mismatch_rate: update.token_mismatch_rate,
              unknown_logprobs: update.unknown_logprobs,
              prompt_mismatch_rate: update.prompt_mismatch_rate,
              kl: update.kl,
              clip_fraction: update.clip_fraction,
              mean_ratio: update.mean_ratio,
              entropy: update.entropy,
            },
          }
        : {}),
      phaseSeconds: seconds,
      ...(c.batch.anchor ? { anchor: c.batch.anchor } : {}),
      ...(c.batch.dynamic ? { dynamic: c.batch.dynamic } : {}),
      noSignal: c.batch.no_signal,
    });
  },

  // The last ten iterations' zero-std shares, warning when most groups have carried no signal for a while.
  watch(scope, it, history, metrics) {
    const zeroStdHistory = [...history, metrics.frac_reward_zero_std ?? 0].slice(-10);
    if (shouldWarnZeroStd(zeroStdHistory)) {
      log.warn('frac_reward_zero_std has stayed above 0.5: most groups carry no learning signal (raise temperature or numGenerations, or check the rewards)', {
        runId: scope.runId,
        iteration: it,
        frac_reward_zero_std: metrics.frac_reward_zero_std,
      });
    }
    return zeroStdHistory;
  },
};
