import { grpo } from './algorithms/grpo';
import { runTraining, type TrainingInput } from './train-engine';
import type { TrainingResult } from './run-control';

/**
 * `trainGrpo` (one per run, workflow id = train.runId): online GRPO on the training engine, one iteration
 * per workflow run (workflows/train-engine.ts, algorithm workflows/algorithms/grpo.ts). The workflow type
 * name and its input stay as they were, so `temporal workflow start --type trainGrpo`, the CLI and recorded
 * histories keep working.
 */
export async function trainGrpo(input: TrainingInput): Promise<TrainingResult> {
  return runTraining(grpo, input);
}
