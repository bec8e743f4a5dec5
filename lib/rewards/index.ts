// Dense rewards: public entry point for activities, the CLI and tests.
//
// Workflow code must import './shaping' and './weights' directly: this file also holds the YAML file
// loader, which needs node:fs (not allowed in the workflow sandbox).

import { readFileSync } from 'node:fs';
import { ConfigError } from '../config';
import { parseRewardWeightsYaml, type RewardWeights } from './weights';

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

/** Reads and validates a reward weights YAML file; errors name the file and every bad field. */
export function loadRewardWeights(path: string): RewardWeights {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read reward weights file ${path}: ${(err as Error).message}`);
  }
  return parseRewardWeightsYaml(text, `reward weights file ${path}`);
}
