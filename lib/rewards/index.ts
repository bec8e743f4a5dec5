// Dense rewards: public entry point for activities, the CLI and tests. Reading a weights file from disk
// is host/rewards-file.ts.

export type { RewardBreakdown, RewardInput, RewardState, RewardTerm, RewardView } from './types';
export {
  computeReward,
  fnv1a32,
  initialRewardState,
  MAX_VISITED,
  normaliseAxtree,
  roundReward,
  stateKey,
  summarizeBreakdown,
} from './shaping';
export {
  defaultRewardWeights,
  parseRewardWeights,
  parseRewardWeightsYaml,
  rewardWeightsSchema,
  siteWeights,
  WEIGHTED_SITES,
  type GeneralWeights,
  type RewardWeights,
} from './weights';
export { parseAxLine, parseAxtree, splitUrl, type AxNode, type MilestoneDetector } from './milestones';
export { milestonesFor, SITE_MILESTONES } from './sites';
