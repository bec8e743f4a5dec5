import { z } from 'zod';

/** One `trainMcts` iteration's metrics (a line of `runs/<run>/mcts-metrics.jsonl`, activities/mcts-metrics.ts). */
const finite = z.number();
const int = z.number().int();
const fraction = finite.min(0).max(1);

export const MctsIterationMetricsSchema = z.object({
  /** Searches (one per task) in the iteration. */
  searches: int.min(0),
  /** Simulations over all searches (each counted once). */
  simulations: int.min(0),
  nodes: int.min(0),
  /** Fraction of searches whose best path ends in a successful terminal state. */
  best_path_success_rate: fraction,
  /** Step-level DPO pairs collected. */
  pairs: int.min(0),
  /** Mean composite-Q gap of the pairs; null without pairs. */
  mean_abs_delta_q: finite.min(0).nullable(),
  /** Pairs that carry the sampler's reference log-probs (the others use the adapter-disabled reference). */
  pairs_with_ref_logprobs: int.min(0),
  dpo_loss: finite.nullable(),
  reward_margin: finite.nullable(),
  accuracy: fraction.nullable(),
  grad_norm: finite.min(0).nullable(),
  /** The adapter after this iteration (unchanged when the update was skipped). */
  adapter_version: int.min(0),
  /** True when no pair was collected, so no update ran. */
  update_skipped: z.boolean(),
  candidates: int.min(0),
  /** Unparseable candidates (terminal children with reward 0). */
  invalid_candidates: int.min(0),
  critic_calls: int.min(0),
  /** Critic answers that were unusable (neutral verdict, `ok: false`). */
  critic_failures: int.min(0),
  session_rebuilds: int.min(0),
  /** Greedy evaluation with the new adapter (mcts.evalEvery), else null. */
  eval_success_rate: fraction.nullable(),
  /** Searches that failed (their pairs left out); absent when none did. */
  failed_searches: int.min(1).optional(),
  seconds: z.record(z.string(), finite.min(0)),
});
export type MctsIterationMetrics = z.output<typeof MctsIterationMetricsSchema>;
