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
//     across them (GiGPO; lib/training/anchor-groups.ts, `anchorGroupAdvantages`). No forks.
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

import { roundReward } from '../rewards/shaping';
import type { Completion } from './experience';

/** Rewards closer than this are "equal": a group whose spread is below it carries no learning signal. */
export const REWARD_EPSILON = 1e-9;

// ---- advantages -------------------------------------------------------------------------------------

/** Throws a RangeError naming the first value that is not a finite number (`what[i]`). */
export function checkFinite(values: readonly number[], what: string): void {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (typeof v !== 'number' || !Number.isFinite(v)) throw new RangeError(`${what}[${i}] is not a finite number: ${String(v)}`);
  }
}

/** Arithmetic mean; 0 for no values. */
export function mean(xs: readonly number[]): number {
  if (xs.length === 0) return 0;
  let s = 0;
  for (const x of xs) s += x;
  return s / xs.length;
}

/** Population standard deviation (divides by n); 0 for fewer than two values. */
export function populationStd(xs: readonly number[]): number {
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

/** N candidates sampled at one state (one prompt) and each executed from that state. */
export interface BatchStepGroup {
  /** Blob reference of the prompt JSON (`SampleResult.promptRef`). */
  promptRef: string;
  /** Constrained decoding: the grammar blob every candidate was sampled under. */
  grammarRef?: string;
  step: number;
  /** Each candidate's completion (its text by reference: the batch builder stored any inline one) and shaped reward. */
  candidates: { completion: Completion & { ref: string }; reward: number }[];
  /** Index of the candidate the episode continued from. */
  chosen: number;
  /** Dynamic sampling grew the group: the first `firstDraw` candidates are the step's own draw. */
  firstDraw?: number;
}

/** What dynamic sampling did in one batch of step groups (metrics keys). */
export interface DynamicSamplingStats {
  /** Groups that drew extra candidates because their first draw scored alike. */
  groups_resampled: number;
  /** Candidates those extra draws added. */
  extra_candidates: number;
  /** The zero-std share of the groups' first draws, before any extra draw (frac_reward_zero_std is after). */
  frac_reward_zero_std_first_draw: number;
}

export function dynamicSamplingStats(groups: readonly BatchStepGroup[]): DynamicSamplingStats {
  let resampled = 0;
  let extra = 0;
  let zeroFirst = 0;
  for (const g of groups) {
    const first = g.firstDraw ?? g.candidates.length;
    if (first < g.candidates.length) {
      resampled++;
      extra += g.candidates.length - first;
    }
    if (isZeroStdGroup(g.candidates.slice(0, first).map((c) => c.reward))) zeroFirst++;
  }
  return {
    groups_resampled: resampled,
    extra_candidates: extra,
    frac_reward_zero_std_first_draw: groups.length ? roundReward(zeroFirst / groups.length) : 0,
  };
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
 * `GrpoBatchSchema` (lib/training/learner-types.ts). Assignable to `GrpoBatchItemRequest`.
 */
export interface GrpoRefItem {
  prompt_ref: string;
  completion_ref: string;
  /** The sampler's tokens by reference (the learner reads and checks the blob); null: the learner retokenises. */
  tokens_ref: string | null;
  advantage: number;
  finish_reason: string | null;
  /** Constrained decoding: the grammar blob the completion was sampled under (the learner masks the same way). */
  grammar_ref?: string | null;
}

/** The learner's item for one completion sampled from `at`'s prompt (and grammar): where the wire's snake_case starts. */
export function grpoRefItem(at: { promptRef: string; grammarRef?: string }, c: Completion & { ref: string }, advantage: number): GrpoRefItem {
  return {
    prompt_ref: at.promptRef,
    completion_ref: c.ref,
    tokens_ref: c.tokensRef ?? null,
    advantage,
    finish_reason: c.finishReason,
    ...(at.grammarRef ? { grammar_ref: at.grammarRef } : {}),
  };
}

/**
 * The GRPO items of some step groups, with advantages from `groupAdvantages`:
 *  - groups whose rewards are all equal (zero std, including groups of one) are skipped: every advantage
 *    would be 0, no learning signal, only compute;
 *  - invalid candidates are kept: their negative reward is a signal (a completion that does not parse
 *    should become less likely). They usually have no tokens; `tokens_ref: null` lets the learner retokenise
 *    the text;
 *  - the sampler's tokens travel by reference: the learner reads the blob and checks it (ids and log-probs
 *    paired one to one), nothing here copies them;
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
    g.candidates.forEach((c, i) => items.push(grpoRefItem(g, c.completion, adv[i])));
  }
  return items;
}

// ---- the zero-std warning ----------------------------------------------------------------------------

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
