// GRPO math for the trainGrpo workflow, top to bottom (CleanRL style). Pure and workflow-safe: no I/O,
// no Node APIs, no clock, no randomness (the workflow supplies its own uniform draws).
//
// One group = N candidates compared with each other:
//   - grouping `step`: N candidate actions sampled at one state, each executed from that same state (forked
//     sessions); a candidate's reward is its shaped step reward. The episode continues from one of them
//     (`chooseCandidate`).
//   - grouping `episode`: N rollouts of the same task + seed, compared on their shaped returns
//     (`episodeGroup`).
//   - grouping `anchor`: the rollouts of `episode`, plus step groups formed afterwards from equal states met
//     across them (GiGPO; lib/anchor-groups.ts, `anchorGroupAdvantages`). No forks.
//
// Advantages are Dr. GRPO's (the learner's `loss_type: dr_grpo`, workers/learner/halo_learner/grpo.py):
//
//     A_i = r_i - mean(r)            no division by std(r): groups with a small spread are not blown up
//
// Numbers are rounded to 1e-9 with `roundReward` (same as the shaped rewards), so histories and the metrics
// file print `0.3`, not `0.30000000000000004`; the error (≤ 5e-10) is far below anything the learner sees.
//
// Non-finite rewards (NaN, ±Infinity) are bugs upstream (shaped rewards are always finite): the functions
// here throw a RangeError naming the bad value rather than send NaN advantages to the learner (whose schema
// would reject them anyway).

import { roundReward } from './rewards/shaping';
import type { AnchorStats } from './anchor-groups';

/** Rewards closer than this are "equal": a group whose spread is below it carries no learning signal. */
export const REWARD_EPSILON = 1e-9;

// ---- advantages -------------------------------------------------------------------------------------

function checkFinite(values: readonly number[], what: string): void {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new RangeError(`${what}[${i}] is not a finite number: ${String(v)}`);
  }
}

function mean(xs: readonly number[]): number {
  if (xs.length === 0) return 0;
  let s = 0;
  for (const x of xs) s += x;
  return s / xs.length;
}

/** Population standard deviation (divides by n); 0 for fewer than two values. */
function populationStd(xs: readonly number[]): number {
  if (xs.length < 2) return 0;
  const m = mean(xs);
  let s = 0;
  for (const x of xs) s += (x - m) * (x - m);
  return Math.sqrt(s / xs.length);
}

/**
 * True when every reward of the group is equal (within REWARD_EPSILON): all advantages are 0, the group
 * teaches nothing. A group of one and an empty group count as zero-std.
 */
export function isZeroStdGroup(rewards: readonly number[]): boolean {
  checkFinite(rewards, 'rewards');
  if (rewards.length < 2) return true;
  let lo = rewards[0];
  let hi = rewards[0];
  for (const r of rewards) {
    if (r < lo) lo = r;
    if (r > hi) hi = r;
  }
  return hi - lo <= REWARD_EPSILON;
}

/**
 * Dr. GRPO advantages of one group: `A_i = r_i - mean(r)`, no std division, rounded to 1e-9.
 * They sum to 0 (within rounding). A group of one, or a group whose rewards are all equal, gets all zeros.
 * Throws a RangeError on a non-finite reward.
 */
export function groupAdvantages(rewards: readonly number[]): number[] {
  if (isZeroStdGroup(rewards)) return rewards.map(() => 0);
  const m = mean(rewards);
  return rewards.map((r) => roundReward(r - m));
}

/** Grouping `episode`: N rollouts of one task + seed compared on their (shaped) returns. */
export interface EpisodeGroupResult {
  returns: number[];
  mean: number;
  /** `A_i = R_i - mean(R)`, same rule as `groupAdvantages`. */
  advantages: number[];
  /** All returns equal: no learning signal (the group is left out of the batch). */
  zeroStd: boolean;
}

export function episodeGroup(returns: readonly number[]): EpisodeGroupResult {
  const advantages = groupAdvantages(returns);
  return { returns: [...returns], mean: roundReward(mean(returns)), advantages, zeroStd: isZeroStdGroup(returns) };
}

// ---- step groups and the candidate the episode continues from -------------------------------------

/** One candidate of a step group, after it was executed from the group's state. */
export interface CandidateOutcome {
  /** Blob reference of the completion text (`Candidate.completionRef`). */
  completionRef: string;
  /** The sampler's token ids of the completion (stop token included); absent → the learner retokenises. */
  tokenIds?: number[] | null;
  /** The sampler's per-token log-probs, one per token id. */
  logprobs?: number[] | null;
  /** The sampler's finish reason (`stop` / `length`); `length` tells the learner there is no end-of-turn token. */
  finishReason?: string | null;
  /** Whether the completion parsed into an action the browser accepted. */
  valid: boolean;
  /** The candidate's shaped step reward. */
  reward: number;
}

/** N candidates sampled at one state (one prompt) and each executed from that state. */
export interface BatchStepGroup {
  /** Blob reference of the prompt JSON (`SampleResult.promptRef`). */
  promptRef: string;
  /** Constrained decoding: the grammar blob every candidate was sampled under. */
  grammarRef?: string;
  step: number;
  candidates: CandidateOutcome[];
  /** Index of the candidate the episode continued from. */
  chosen: number;
}

export type ChooseMode = 'best' | 'sampled';

/**
 * The candidate the episode continues from.
 *  - `best`: argmax of the rewards; ties go to the lowest index.
 *  - `sampled`: softmax sampling, `p_i ∝ exp(r_i / temperature)`, with the uniform draw `u ∈ [0, 1)` the
 *    workflow supplies (e.g. from its deterministic `Math.random()`): the first i whose cumulative
 *    probability exceeds u. Same rewards + same u → same index.
 * Throws a RangeError for no candidates, a non-finite reward, u outside [0, 1) or temperature ≤ 0.
 */
export function chooseCandidate(rewards: readonly number[], mode: ChooseMode, u: number, temperature = 1): number {
  if (rewards.length === 0) throw new RangeError('chooseCandidate: no candidates');
  checkFinite(rewards, 'rewards');
  let best = 0;
  for (let i = 1; i < rewards.length; i++) if (rewards[i] > rewards[best]) best = i;
  if (mode === 'best') return best;
  if (mode !== 'sampled') throw new RangeError(`chooseCandidate: unknown mode ${JSON.stringify(mode)} (best | sampled)`);
  if (!(Number.isFinite(u) && u >= 0 && u < 1)) throw new RangeError(`chooseCandidate: u must be in [0, 1), got ${String(u)}`);
  if (!(Number.isFinite(temperature) && temperature > 0)) {
    throw new RangeError(`chooseCandidate: temperature must be > 0, got ${String(temperature)}`);
  }
  const max = rewards[best];
  const weights = rewards.map((r) => Math.exp((r - max) / temperature)); // max weight is 1: no overflow
  let total = 0;
  for (const w of weights) total += w;
  let cum = 0;
  for (let i = 0; i < weights.length; i++) {
    cum += weights[i] / total;
    if (u < cum) return i;
  }
  // Rounding left the cumulative sum a hair under 1 and u above it: the last candidate with weight.
  for (let i = weights.length - 1; i >= 0; i--) if (weights[i] > 0) return i;
  return best;
}

/** The rewards of a step group's candidates, in order. */
export function stepGroupRewards(group: BatchStepGroup): number[] {
  return group.candidates.map((c) => c.reward);
}

// ---- batch items for writeGrpoBatch ---------------------------------------------------------------

/**
 * One GRPO item by reference, as `writeGrpoBatch` (activities/learner-batches.ts) takes it: the activity
 * resolves `prompt_ref` / `completion_ref` from the blob store and validates the result against
 * `GrpoBatchSchema` (lib/learner-types.ts). Assignable to `GrpoBatchItemRequest`.
 */
export interface GrpoRefItem {
  prompt_ref: string;
  completion_ref: string;
  completion_token_ids: number[] | null;
  old_logprobs: number[] | null;
  advantage: number;
  finish_reason: string | null;
  /** Constrained decoding: the grammar blob the completion was sampled under (the learner masks the same way). */
  grammar_ref?: string | null;
}

/**
 * The GRPO items of some step groups, with advantages from `groupAdvantages`:
 *  - groups whose rewards are all equal (zero std, including groups of one) are skipped: every advantage
 *    would be 0, no learning signal, only compute;
 *  - invalid candidates are kept: their negative reward is a signal (a completion that does not parse
 *    should become less likely). They usually have no token ids; `completion_token_ids: null` lets the
 *    learner retokenise the text;
 *  - empty `tokenIds` become null (the schema rejects an empty list); `old_logprobs` are dropped (null: the
 *    learner uses the current policy's log-probs, ratio 1) when they do not pair one-to-one with the token
 *    ids; with no token ids they are passed on, and the learner pairs them only if its retokenisation has
 *    the same length;
 *  - identical completions within a group are kept, each with its own advantage: they are separate samples
 *    and dropping them would bias the group mean.
 * Returns [] when every group is zero-std: the workflow should skip the update (the schema wants ≥ 1 item).
 */
export function groupsToBatchItems(groups: readonly BatchStepGroup[]): GrpoRefItem[] {
  const items: GrpoRefItem[] = [];
  for (const g of groups) {
    const rewards = stepGroupRewards(g);
    if (isZeroStdGroup(rewards)) continue;
    const adv = groupAdvantages(rewards);
    g.candidates.forEach((c, i) => {
      const ids = Array.isArray(c.tokenIds) && c.tokenIds.length > 0 ? [...c.tokenIds] : null;
      let old = Array.isArray(c.logprobs) && c.logprobs.length > 0 ? [...c.logprobs] : null;
      if (ids !== null && old !== null && old.length !== ids.length) old = null;
      items.push({
        prompt_ref: g.promptRef,
        completion_ref: c.completionRef,
        completion_token_ids: ids,
        old_logprobs: old,
        advantage: adv[i],
        finish_reason: c.finishReason ?? null,
        ...(g.grammarRef ? { grammar_ref: g.grammarRef } : {}),
      });
    });
  }
  return items;
}

// ---- metrics of one iteration -----------------------------------------------------------------------

export interface EpisodeSummary {
  success: boolean;
  steps: number;
  validActions: number;
  shapedReturn: number;
  forkSnapshots?: number;
  forkReplayFallbacks?: number;
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
  /** Grouping `anchor`: the step-level groups of the batch (lib/anchor-groups.ts). */
  anchor?: AnchorStats;
  /** Pipelined runs (train.maxStaleness ≥ 1): the adapter the batch was sampled from and its staleness. */
  staleness?: { sampledVersion: number; value: number };
}

/** One iteration's metrics, snake_case as in the metrics file (lib/run-metrics.ts). */
export interface IterationMetrics {
  /** Mean of every candidate's reward over all groups; 0 with no candidates. */
  mean_reward: number;
  /** Population std of every candidate's reward over all groups; 0 with fewer than two candidates. */
  reward_std: number;
  /** Fraction of groups whose rewards are all equal (groups of one count); 0 with no groups. */
  frac_reward_zero_std: number;
  /** Mean steps per episode; 0 with no episodes. */
  episode_length: number;
  /** Fraction of successful episodes; 0 with no episodes. */
  success_rate: number;
  /** Mean shaped return (sum of shaped step rewards) per episode; 0 with no episodes. */
  mean_return: number;
  /** Valid actions / steps over all episodes; 0 with no steps. */
  action_validity: number;
  /** The update's loss; null when no update was applied this iteration. */
  loss: number | null;
  /** The update's gradient norm (before clipping); null when no update was applied. */
  grad_norm: number | null;
  /** The adapter version the update wrote; null when no update was applied. */
  adapter_version: number | null;
  /** Completion tokens the update trained on; 0 when no update was applied. */
  tokens: number;
  /**
   * Items the update trained on retokenised text instead of the sampler's own token ids (a server that
   * returned none); 0 when every item came with ids. Present when the learner reported it.
   */
  retokenized?: number;
  /** Of those, the share whose retokenisation may differ from the sampled tokens (their old log-probs unused). */
  token_mismatch_rate?: number;
  /** The update's KL to the reference, clipped-token share, mean ratio and entropy estimate, when measured. */
  kl?: number;
  clip_fraction?: number;
  mean_ratio?: number;
  entropy?: number;
  /** Wall-clock seconds per phase, as given. */
  seconds: Record<string, number>;
  num_groups: number;
  num_episodes: number;
  /** Greedy evaluation on held-out tasks, on the iterations that ran one. */
  eval?: { success_rate: number; mean_return: number; episodes: number };
  /** Episodes of the iteration that failed (left out of the batch and of the other metrics). */
  failed_episodes?: number;
  /** Grouping `anchor` only: groups of ≥ 2 steps acting from one state, their mean / max size, share of steps in one. */
  anchor_groups?: number;
  anchor_group_size_mean?: number;
  anchor_group_size_max?: number;
  step_signal_share?: number;
  /** REAL step groups: forks made from a copy of the parent's client state, and copies that differed (replayed). */
  fork_snapshots?: number;
  fork_replay_fallbacks?: number;
  /** Pipelined runs (train.maxStaleness ≥ 1): the adapter version the batch's episodes sampled from, and how many updates behind the on-policy one it was. */
  sampled_adapter_version?: number;
  staleness?: number;
}

/**
 * The metrics of one iteration. Every ratio and mean of an empty set is 0, never NaN, so the metrics file
 * and the query stay plain JSON (see the field docs for each case). Throws a RangeError on a non-finite
 * reward or phase time.
 */
export function iterationMetrics(input: IterationMetricsInput): IterationMetrics {
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
  const seconds: Record<string, number> = {};
  for (const k of Object.keys(input.phaseSeconds).sort()) {
    const v = input.phaseSeconds[k];
    if (!Number.isFinite(v)) throw new RangeError(`phaseSeconds.${k} is not a finite number: ${String(v)}`);
    seconds[k] = v;
  }
  const ratio = (a: number, b: number): number => (b > 0 ? roundReward(a / b) : 0);
  const u = input.update;
  return {
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
    ...updateStats(u),
    seconds,
    num_groups: input.groups.length,
    num_episodes: eps.length,
    ...(input.anchor ? { ...input.anchor } : {}),
    ...(forkSnapshots + forkFallbacks > 0 ? { fork_snapshots: forkSnapshots, fork_replay_fallbacks: forkFallbacks } : {}),
    ...(input.staleness ? { sampled_adapter_version: input.staleness.sampledVersion, staleness: input.staleness.value } : {}),
  };
}

/** The learner's per-update statistics that it measured (finite), as metrics fields. */
function updateStats(u: UpdateSummary | undefined): Pick<IterationMetrics, 'kl' | 'clip_fraction' | 'mean_ratio' | 'entropy'> {
  const out: Pick<IterationMetrics, 'kl' | 'clip_fraction' | 'mean_ratio' | 'entropy'> = {};
  for (const k of ['kl', 'clip_fraction', 'mean_ratio', 'entropy'] as const) {
    const v = u?.[k];
    if (typeof v === 'number' && Number.isFinite(v)) out[k] = v;
  }
  return out;
}

/**
 * True when `frac_reward_zero_std` stayed above `threshold` for each of the last `window` iterations
 * (oldest first in `history`): most groups carry no signal, the policy is probably stuck (all candidates
 * fail alike, or all succeed alike). False while the history is shorter than the window.
 */
export function shouldWarnZeroStd(history: readonly number[], window = 3, threshold = 0.5): boolean {
  if (!Number.isInteger(window) || window < 1) throw new RangeError(`shouldWarnZeroStd: window must be an integer ≥ 1, got ${String(window)}`);
  if (history.length < window) return false;
  return history.slice(-window).every((f) => f > threshold);
}
