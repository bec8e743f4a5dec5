import { mcts } from './algorithms/mcts';
import { runTraining, type TrainingInput } from './train-engine';
import type { TrainingResult } from './run-control';

/**
 * `trainMcts` (one per run, workflow id = mcts.runId): Agent Q's MCTS + step-level DPO on the training
 * engine, one iteration per workflow run (workflows/train-engine.ts, algorithm workflows/algorithms/mcts.ts):
 * the same pause/stop/status, pipelining, serving, held-out evaluation and metrics row as GRPO runs.
 */
export async function trainMcts(input: TrainingInput): Promise<TrainingResult> {
  return runTraining(mcts, input);
}
