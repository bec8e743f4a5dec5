// The metrics row of one training iteration (lib/training/run-metrics.ts), built from what the iteration did: GRPO's
// from its groups, episodes and update, MCTS's from its searches and DPO update. Pure and workflow-safe (no
// I/O, no clock). The caller adds what it measures afterwards: `eval`, `seconds.eval`, `failed_episodes`.

import { roundReward } from '../rewards/shaping';
import type { AnchorStats } from './anchor-groups';
import type { BrowserWork } from '../episode/episode-types';
import { checkFinite, isZeroStdGroup, mean, populationStd, type DynamicSamplingStats } from './grpo';
import type { MctsCounters, MctsSearchResult } from '../search/mcts-search';
import type { GrpoTrainingMetrics, MctsTrainingMetrics } from './run-metrics';

// ---- GRPO -------------------------------------------------------------------------------------------

export interface EpisodeSummary {
  success: boolean;
  steps: number;
  validActions: number;
  shapedReturn: number;
  forkSnapshots?: number;
  forkReplayFallbacks?: number;
  /** The episode's browser work; absent from episodes recorded before it was counted. */
  browser?: BrowserWork;
}

export interface UpdateSummary {
  loss: number;
  grad_norm: number;
  version: number;
  tokens: number;
  /** Items the learner had to retokenise (the sampler gave no token ids); absent from older learners. */
  retokenized?: number;
  /** Share of the retokenised items whose ids are not a faithful stand-in for what was sampled. */
  token_mismatch_rate?: number;
  /** Sampler tokens with an unknown log-prob (dropped from the loss), and the share of completions sampled on
   * prompt ids that differ from the learner's encoding; null or absent from older learners. */
  unknown_logprobs?: number | null;
  prompt_mismatch_rate?: number | null;
  /** The update's own statistics (null when the learner could not measure them): KL to the reference, share of
   * clipped tokens, mean importance ratio, entropy estimate of the sampled tokens. */
  kl?: number | null;
  clip_fraction?: number | null;
  mean_ratio?: number | null;
  entropy?: number | null;
}

export interface IterationMetricsInput {
  /** Every group of the iteration (step groups: candidate rewards; episode groups: returns). */
  groups: readonly { rewards: readonly number[] }[];
  episodes: readonly EpisodeSummary[];
  /** The learner's answer; absent when the iteration applied no update (e.g. every group was zero-std). */
  update?: UpdateSummary;
  /** Wall-clock seconds per phase (`rollout`, `batch`, `update`, `load`, …), measured by the caller. */
  phaseSeconds: Record<string, number>;
  /** Grouping `anchor`: the step-level groups of the batch (lib/training/anchor-groups.ts). */
  anchor?: AnchorStats;
  /** Step grouping with dynamic sampling: what the extra draws did (lib/training/grpo.ts). */
  dynamic?: DynamicSamplingStats;
  /** Every group of the batch scored alike: the update carried no policy gradient (KL only). */
  noSignal?: boolean;
  /** Pipelined runs (train.maxStaleness ≥ 1): the adapter the batch was sampled from and its staleness. */
  staleness?: { sampledVersion: number; value: number };
}

/**
 * The metrics of one GRPO iteration. Every ratio and mean of an empty set is 0, never NaN, so the metrics
 * file and the query stay plain JSON: mean_reward / reward_std of no candidates, frac_reward_zero_std of no
 * groups (groups of one count as zero-std), episode_length / success_rate / mean_return of no episodes,
 * action_validity of no steps. loss, grad_norm and adapter_version are null and tokens 0 without an update.
 * Throws a RangeError on a non-finite reward or phase time.
 */
export function iterationMetrics(input: IterationMetricsInput): GrpoTrainingMetrics {
  const all: number[] = [];
  let zeroStd = 0;
  input.groups.forEach((g, i) => {
    checkFinite(g.rewards, `groups[${i}].rewards`);
    for (const r of g.rewards) all.push(r);
    if (isZeroStdGroup(g.rewards)) zeroStd++;
  });
  const eps = input.episodes;
  let steps = 0;
  let valid = 0;
  let successes = 0;
  let returns = 0;
  let forkSnapshots = 0;
  let forkFallbacks = 0;
  eps.forEach((e, i) => {
    forkSnapshots += e.forkSnapshots ?? 0;
    forkFallbacks += e.forkReplayFallbacks ?? 0;
    checkFinite([e.steps, e.validActions, e.shapedReturn], `episodes[${i}] (steps, validActions, shapedReturn)`);
    returns += e.shapedReturn;
    steps += e.steps;
    valid += e.validActions;
    if (e.success) successes++;
  });
  const ratio = (a: number, b: number): number => (b > 0 ? roundReward(a / b) : 0);
  const u = input.update;
  return {
    algorithm: 'grpo',
    mean_reward: roundReward(mean(all)),
    reward_std: roundReward(populationStd(all)),
    frac_reward_zero_std: ratio(zeroStd, input.groups.length),
    episode_length: ratio(steps, eps.length),
    success_rate: ratio(successes, eps.length),
    mean_return: ratio(returns, eps.length),
    action_validity: ratio(valid, steps),
    loss: u ? u.loss : null,
    grad_norm: u ? u.grad_norm : null,
    adapter_version: u ? u.version : null,
    tokens: u ? u.tokens : 0,
    ...(u && u.retokenized !== undefined ? { retokenized: u.retokenized } : {}),
    ...(u && u.token_mismatch_rate !== undefined ? { token_mismatch_rate: roundReward(u.token_mismatch_rate) } : {}),
    ...(typeof u?.unknown_logprobs === 'number' ? { unknown_logprobs: u.unknown_logprobs } : {}),
    ...(typeof u?.prompt_mismatch_rate === 'number' ? { prompt_mismatch_rate: roundReward(u.prompt_mismatch_rate) } : {}),
    ...updateStats(u),
    seconds: phaseSeconds(input.phaseSeconds, 'phaseSeconds'),
    num_groups: input.groups.length,
    num_episodes: eps.length,
    ...(input.anchor ? { ...input.anchor } : {}),
    ...(input.dynamic ? { ...input.dynamic } : {}),
    ...(input.noSignal !== undefined ? { update_without_signal: input.noSignal ? 1 : 0 } : {}),
    ...(forkSnapshots + forkFallbacks > 0 ? { fork_snapshots: forkSnapshots, fork_replay_fallbacks: forkFallbacks } : {}),
    ...(input.staleness ? { sampled_adapter_version: input.staleness.sampledVersion, staleness: input.staleness.value } : {}),
    ...grpoBrowserWork(eps),
  };
}

/**
 * The episodes' browser work as metrics keys. An episode recorded before it was counted stands for its own
 * steps in env_steps (its step groups' other candidates unknown); sessions and replays are reported only
 * when every episode counted them, rather than as a sum that silently leaves some out.
 */
function grpoBrowserWork(eps: readonly EpisodeSummary[]): Pick<GrpoTrainingMetrics, 'env_steps' | 'sessions_opened' | 'replayed_actions'> {
  let envSteps = 0;
  let sessions = 0;
  let replayed = 0;
  eps.forEach((e, i) => {
    const b = e.browser;
    if (b) checkFinite([b.steps, b.sessions, b.replayedActions], `episodes[${i}].browser (steps, sessions, replayedActions)`);
    envSteps += b ? b.steps : e.steps;
    sessions += b ? b.sessions : 0;
    replayed += b ? b.replayedActions : 0;
  });
  const allCounted = eps.every((e) => e.browser !== undefined);
  return { env_steps: envSteps, ...(allCounted ? { sessions_opened: sessions, replayed_actions: replayed } : {}) };
}

/** The learner's per-update statistics that it measured (finite), as metrics fields. */
function updateStats(u: UpdateSummary | undefined): Pick<GrpoTrainingMetrics, 'kl' | 'clip_fraction' | 'mean_ratio' | 'entropy'> {
  const out: Pick<GrpoTrainingMetrics, 'kl' | 'clip_fraction' | 'mean_ratio' | 'entropy'> = {};
  for (const k of ['kl', 'clip_fraction', 'mean_ratio', 'entropy'] as const) {
    const v = u?.[k];
    if (typeof v === 'number' && Number.isFinite(v)) out[k] = v;
  }
  return out;
}

/** The phase times in key order; throws a RangeError naming a non-finite one (`what.phase`). */
function phaseSeconds(given: Record<string, number>, what: string): Record<string, number> {
  const seconds: Record<string, number> = {};
  for (const k of Object.keys(given).sort()) {
    const v = given[k];
    if (!Number.isFinite(v)) throw new RangeError(`${what}.${k} is not a finite number: ${String(v)}`);
    seconds[k] = v;
  }
  return seconds;
}

// ---- MCTS -------------------------------------------------------------------------------------------

export interface MctsIterationMetricsInput {
  /** The iteration's finished searches (failed ones left out: the caller counts them as failed_episodes). */
  searches: readonly Pick<MctsSearchResult, 'simulations' | 'stats' | 'bestPath' | 'pairs' | 'counters'>[];
  /** The DPO update's answer; null when no pair was collected and no update ran. */
  update: { loss: number; reward_margin: number; accuracy: number; grad_norm: number } | null;
  /** The adapter after the iteration: the one the update wrote (unused when there was none). */
  adapterVersion: number;
  /** Wall-clock seconds per phase, measured by the caller. */
  seconds: Record<string, number>;
}

/**
 * The metrics of one MCTS iteration: a search stands for an episode (num_episodes, success_rate and
 * mean_return are over the searches' best paths, see lib/training/run-metrics.ts), the DPO update's loss, gradient
 * norm and adapter are the common keys, everything else is the `mcts` section. 0 (never NaN) over no
 * searches. Throws a RangeError on a non-finite phase time.
 */
export function mctsIterationMetrics(input: MctsIterationMetricsInput): MctsTrainingMetrics {
  const s = input.searches;
  const sum = (f: (r: (typeof s)[number]) => number) => s.reduce((a, r) => a + f(r), 0);
  const pairs = sum((r) => r.pairs.count);
  const sumAbsDeltaQ = sum((r) => (r.pairs.meanAbsDeltaQ ?? 0) * r.pairs.count);
  const ratio = (a: number, b: number): number => (b > 0 ? roundReward(a / b) : 0);
  const u = input.update;
  return {
    algorithm: 'mcts',
    success_rate: ratio(s.filter((r) => r.bestPath.success).length, s.length),
    mean_return: ratio(
      sum((r) => (r.bestPath.terminal ? (r.bestPath.reward ?? 0) : 0)),
      s.length,
    ),
    loss: u ? u.loss : null,
    grad_norm: u ? u.grad_norm : null,
    adapter_version: u ? input.adapterVersion : null,
    num_episodes: s.length,
    ...mctsBrowserWork(s),
    seconds: phaseSeconds(input.seconds, 'seconds'),
    mcts: {
      simulations: sum((r) => r.simulations),
      nodes: sum((r) => r.stats.nodes),
      pairs,
      mean_abs_delta_q: pairs > 0 ? sumAbsDeltaQ / pairs : null,
      pairs_with_ref_logprobs: sum((r) => r.pairs.withRefLogprobs),
      reward_margin: u ? u.reward_margin : null,
      accuracy: u ? Math.min(1, Math.max(0, u.accuracy)) : null,
      update_skipped: u === null,
      candidates: sum((r) => r.counters.candidates),
      invalid_candidates: sum((r) => r.counters.invalidCandidates),
      critic_calls: sum((r) => r.counters.criticCalls),
      critic_failures: sum((r) => r.counters.criticFailures),
      session_rebuilds: sum((r) => r.counters.sessionRebuilds),
    },
  };
}

/**
 * The searches' browser work as metrics keys: steps of their simulations, new sessions (restores and rebuilds
 * that opened one, and spares that did), and actions replayed (restores, parked sessions stepped forward,
 * spares). sessions_opened is left out when a search predates its counters, rather than undercounted.
 */
function mctsBrowserWork(searches: MctsIterationMetricsInput['searches']): Pick<MctsTrainingMetrics, 'env_steps' | 'sessions_opened' | 'replayed_actions'> {
  let envSteps = 0;
  let sessions = 0;
  let replayed = 0;
  let allCounted = true;
  for (const { counters: c } of searches) {
    // Typed as always there; results recorded before the reuse counters existed lack them.
    const reuse = c.sessionReuse as MctsCounters['sessionReuse'] | undefined;
    envSteps += c.browserSteps;
    replayed += c.replayedActions + (reuse?.spareReplayedActions ?? 0);
    if (reuse) sessions += reuse.fresh + (reuse.spareSessions ?? 0);
    else allCounted = false;
  }
  return { env_steps: envSteps, replayed_actions: replayed, ...(allCounted ? { sessions_opened: sessions } : {}) };
}
