import type { StepRecord } from './episode-types';

/** Share of sampled actions that parsed into a valid action; 0 for an episode with no steps. */
export function actionValidity(steps: Pick<StepRecord, 'completion'>[]): number {
  if (steps.length === 0) return 0;
  return steps.filter((s) => s.completion.valid).length / steps.length;
}
