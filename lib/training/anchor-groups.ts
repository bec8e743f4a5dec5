// Grouping `anchor`: step-level credit without forks (GiGPO, arXiv 2505.10978 §4). Pure: no I/O, no clock.
//
// The N rollouts of one task + seed run as ordinary episodes (as with grouping `episode`). Afterwards, every
// step is put in an "anchor group" with every other step of those N rollouts that acted from the same state
// (equal anchor key of the page before acting). Since the rollouts start from one reset state, step 1 always
// forms such a group; later steps do when rollouts meet the same page again.
//
// The anchor key is not the shaping `stateKey` the observation carries: that one reduces every filled text
// field to "filled" (so typing another letter pays no new state), which would put the pages after typing the
// right and the wrong recipient in one group and credit the wrong action by the right one's return. The anchor
// key (`anchorStateKey`, lib/rewards/shaping.ts) counts a field by a hash of its text; it is computed from the
// page's URL and accessibility tree when the batch is built, so trajectories recorded before it get it too.
//
//     R_i      = Σ_t r_t^(i)                              the rollout's shaped return
//     G_t^(i)  = Σ_k γ^k r_{t+k}^(i)                      discounted return from step t on, within rollout i
//     A_t^(i)  = episodeWeight · (R_i − mean_j R_j)
//              + stepWeight    · (G_t^(i) − mean of G over the anchor group of s_t^(i)) · b
//
// with b = 1 (GiGPO), or with `balanceGroups` b = N / the group's member count. Unbalanced, the step-1 group
// (all N rollouts) outweighs a later state's group of the few that reached it; where a small policy tells the
// two pages apart only weakly, the first step's credit then sets the action on both.
//
// As everywhere in lib/training/grpo.ts there is no std division (Dr. GRPO; GiGPO's "w/o std" variant, F_norm = 1).
// A step whose anchor group has one member keeps only the episode term: its step term would be G − G = 0,
// and no comparison was made. Discounting makes an early step on a successful path rank below a later one,
// so the step term rewards getting there sooner.

import type { AnchorRollout, TrajectoryStep } from './experience';
import { groupAdvantages } from './grpo';
import { anchorStateKey, roundReward } from '../rewards/shaping';

export interface AnchorParams {
  /** Weight of the rollout-level term (1 in GiGPO). */
  episodeWeight: number;
  /** Weight ω of the step-level term (1 in GiGPO). */
  stepWeight: number;
  /** γ of the step returns G_t (0.95 in GiGPO's scripts). */
  discount: number;
  /**
   * Scale a group's step term by N / its member count, so that a state few rollouts reached weighs in the update
   * as much as the start state all N share (false, as in GiGPO: every step weighs the same).
   */
  balanceGroups?: boolean;
}

export type { AnchorRollout };

/**
 * A recorded rollout as anchor grouping reads it: each step's shaped reward and the anchor key of the page it
 * acted from. `axtreeOf` gives the text behind an observation's `axtreeRef`.
 */
export function anchorRollout(t: { steps: readonly Pick<TrajectoryStep, 'shaped' | 'observation'>[] }, axtreeOf: (ref: string) => string): AnchorRollout {
  return {
    rewards: t.steps.map((s) => s.shaped.total),
    stateKeys: t.steps.map((s) => anchorStateKey({ url: s.observation.url, axtree: axtreeOf(s.observation.axtreeRef) })),
  };
}

/** Per-iteration counts of the step-level groups, as in the metrics file. */
export interface AnchorStats {
  /** Anchor groups with at least two members. */
  anchor_groups: number;
  /** Mean / max member count of those groups; 0 when there are none. */
  anchor_group_size_mean: number;
  anchor_group_size_max: number;
  /** Share of all steps that sit in a group of at least two (their step term carries a comparison). */
  step_signal_share: number;
}

export interface AnchorGroupResult {
  /** `advantages[i][t]`: the advantage of step t of rollout i. */
  advantages: number[][];
  /** R_i, the rollouts' undiscounted shaped returns (the episode groups' rewards). */
  returns: number[];
  /** G_t^(i). */
  stepReturns: number[][];
  /** Member count of each step's anchor group (1: the step was alone). */
  groupSizes: number[][];
  stats: AnchorStats;
}

/** G_t = Σ_k γ^k r_{t+k} for every t, computed backwards: G_t = r_t + γ·G_{t+1}. */
export function discountedReturns(rewards: readonly number[], discount: number): number[] {
  const out = new Array<number>(rewards.length);
  let g = 0;
  for (let t = rewards.length - 1; t >= 0; t--) {
    g = rewards[t] + discount * g;
    out[t] = g;
  }
  return out;
}

function checkParams(p: AnchorParams): void {
  for (const k of ['episodeWeight', 'stepWeight'] as const) {
    if (!(Number.isFinite(p[k]) && p[k] >= 0)) throw new RangeError(`anchor.${k} must be a finite number ≥ 0, got ${String(p[k])}`);
  }
  if (!(Number.isFinite(p.discount) && p.discount >= 0 && p.discount <= 1)) {
    throw new RangeError(`anchor.discount must be in [0, 1], got ${String(p.discount)}`);
  }
}

/**
 * Advantages of the N rollouts of one task + seed under grouping `anchor`. Throws a RangeError on bad
 * parameters, a non-finite reward, or a rollout whose keys and rewards differ in length.
 */
export function anchorGroupAdvantages(rollouts: readonly AnchorRollout[], params: AnchorParams): AnchorGroupResult {
  checkParams(params);
  rollouts.forEach((r, i) => {
    if (r.stateKeys.length !== r.rewards.length) {
      throw new RangeError(`rollouts[${i}]: ${r.stateKeys.length} state keys for ${r.rewards.length} rewards`);
    }
  });
  const returns = rollouts.map((r) => r.rewards.reduce((s, x) => s + x, 0));
  const episodeAdv = groupAdvantages(returns); // also rejects non-finite rewards (through their sums)
  const stepReturns = rollouts.map((r) => discountedReturns(r.rewards, params.discount));

  // Key → members. Following GiGPO (Eq. 6), a state visited twice within one rollout contributes both visits
  // to its group, so a loop back to a state is compared with the step that first left it.
  const members = new Map<string, { i: number; t: number }[]>();
  rollouts.forEach((r, i) =>
    r.stateKeys.forEach((k, t) => {
      if (typeof k !== 'string' || k === '') return;
      const list = members.get(k);
      if (list) list.push({ i, t });
      else members.set(k, [{ i, t }]);
    }),
  );

  const stepAdv = rollouts.map((r) => r.rewards.map(() => 0));
  const groupSizes = rollouts.map((r) => r.rewards.map(() => 1));
  const sizes: number[] = [];
  let signalSteps = 0;
  for (const list of members.values()) {
    if (list.length < 2) continue;
    sizes.push(list.length);
    signalSteps += list.length;
    const adv = groupAdvantages(list.map(({ i, t }) => stepReturns[i][t]));
    const scale = params.balanceGroups ? rollouts.length / list.length : 1;
    list.forEach(({ i, t }, j) => {
      stepAdv[i][t] = scale * adv[j];
      groupSizes[i][t] = list.length;
    });
  }

  const advantages = rollouts.map((r, i) => r.rewards.map((_, t) => roundReward(params.episodeWeight * episodeAdv[i] + params.stepWeight * stepAdv[i][t])));
  const totalSteps = rollouts.reduce((s, r) => s + r.rewards.length, 0);
  return {
    advantages,
    returns: returns.map(roundReward),
    stepReturns: stepReturns.map((g) => g.map(roundReward)),
    groupSizes,
    stats: {
      anchor_groups: sizes.length,
      anchor_group_size_mean: sizes.length ? roundReward(sizes.reduce((s, x) => s + x, 0) / sizes.length) : 0,
      anchor_group_size_max: sizes.length ? Math.max(...sizes) : 0,
      step_signal_share: totalSteps ? roundReward(signalSteps / totalSteps) : 0,
    },
  };
}

/** The stats of several task groups of one iteration, merged as if they were one. */
export function mergeAnchorStats(parts: readonly { stats: AnchorStats; steps: number }[]): AnchorStats {
  let groups = 0;
  let members = 0;
  let max = 0;
  let steps = 0;
  let signal = 0;
  for (const { stats, steps: n } of parts) {
    groups += stats.anchor_groups;
    members += stats.anchor_group_size_mean * stats.anchor_groups;
    max = Math.max(max, stats.anchor_group_size_max);
    steps += n;
    signal += stats.step_signal_share * n;
  }
  return {
    anchor_groups: groups,
    anchor_group_size_mean: groups ? roundReward(members / groups) : 0,
    anchor_group_size_max: max,
    step_signal_share: steps ? roundReward(signal / steps) : 0,
  };
}
