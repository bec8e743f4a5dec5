import { readFileSync } from 'node:fs';
import { ConfigError } from '../lib/config/config-error';
import { parseRewardWeightsYaml, type RewardWeights } from '../lib/rewards/weights';

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
