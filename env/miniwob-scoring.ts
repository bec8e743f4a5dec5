import { MINIWOB_RAISED_TIME_LIMIT_MS, type MiniwobConfig } from '../lib/config/config';

export type MiniwobTimeLimit = MiniwobConfig['timeLimit'];
export type MiniwobRewardMode = MiniwobConfig['reward'];

export const RAISED_EPISODE_MAX_TIME_MS = MINIWOB_RAISED_TIME_LIMIT_MS;

/**
 * MiniWoB++'s own success rule (the package's binary and thresholded rewards): raw reward 1. About 20 tasks
 * give partial credit (click-checkboxes with 2 of 3 boxes ticked gives 0.5); that is a failure, as it is for
 * the official environment, and stays visible as the reward. (BrowserGym's `raw > 0` is more generous and
 * would not be comparable with MiniWoB++'s own numbers.)
 */
export function miniwobSuccess(raw: number): boolean {
  return raw >= 1;
}

/** core.EPISODE_MAX_TIME to set before an episode, or null to keep the task's own (10 s unless the page sets it). */
export function episodeMaxTimeMs(limit: MiniwobTimeLimit | undefined): number | null {
  if (limit === undefined || limit === 'raised') return RAISED_EPISODE_MAX_TIME_MS;
  if (limit === 'official') return null;
  if (!Number.isSafeInteger(limit) || limit <= 0) throw new Error(`invalid MiniWoB time limit ${limit}`);
  return limit;
}

/** What the page reports at the end of an episode. */
export interface MiniwobOutcome {
  /** WOB_RAW_REWARD_GLOBAL: the task's reward without time penalty. */
  raw: number;
  /** WOB_REWARD_GLOBAL: the same, positive values scaled by the share of the time limit left. */
  scaled: number;
}

/** The environment reward an ended episode reports under `reward`. */
export function reportedReward(outcome: MiniwobOutcome, mode: MiniwobRewardMode | undefined): number {
  return mode === 'official' ? outcome.scaled : outcome.raw;
}
