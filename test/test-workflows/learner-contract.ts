import type { Duration } from '@temporalio/common';
import { proxyActivities } from '@temporalio/workflow';
import type { LearnerBatchActivities } from '../../activities/learner-batches';
import type { SampleActionsOutput, UpdateDpoOutput, UpdatePolicyOutput } from '../../lib/training/learner-types';
import { learnerActivities } from '../../workflows/learner-calls';

export interface LearnerContractInput {
  /** Adapters go to `<HALO_CHECKPOINTS>/<runId>/v1..v3`; use a fresh id (a used one answers `reused` throughout). */
  runId: string;
  /** Blob with prompt messages as lib/model-io/prompt.ts writes them (an image part must reference a stored PNG). */
  promptRef: string;
  /** The learner's task queue; default `gpu`. */
  gpuTaskQueue?: string;
  /** Completions to sample with v1; default 4. */
  n?: number;
  /** Per completion; default 16. */
  maxTokens?: number;
  seed?: number;
  /** How long each learner call may wait for a learner and run (fails the smoke test instead of waiting forever); default 10 min. */
  learnerTimeout?: Duration;
}

export interface LearnerContractResult {
  runId: string;
  grpoBatchRef: string;
  dpoBatchRef: string;
  tokenBatchRef: string;
  /** update_policy v1 from text completions (retokenised by the learner). */
  grpo: UpdatePolicyOutput;
  /** sample_actions with v1. */
  sample: SampleActionsOutput;
  stored: SampleActionsOutput;
  /** update_dpo v2 from v1: the sampled text is the rejected answer. */
  dpo: UpdateDpoOutput;
  /** update_policy v1 again: must be `reused`, no gradients applied twice. */
  repeat: UpdatePolicyOutput;
  /** update_policy v3 from v2 with the sampler's tokens by reference (no retokenisation). */
  tokens: UpdatePolicyOutput;
}

const GOOD = '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 300]}}\n</tool_call>';
const BAD = 'I am not sure what to do here.';

/**
 * Cross-language smoke test of the learner: every payload the training workflows send to the Python
 * learner, through the real task queue, with the answers checked against lib/training/learner-types.ts. Only
 * test/integration/learner-contract.test.ts runs it, on a worker of its own: it is not in the production
 * bundle (workflows/index.ts).
 */
export async function learnerContract(input: LearnerContractInput): Promise<LearnerContractResult> {
  const { runId, promptRef } = input;
  const n = input.n ?? 4;
  const batches = proxyActivities<LearnerBatchActivities>({
    startToCloseTimeout: '1m',
    retry: { initialInterval: '1s', maximumAttempts: 5 },
  });
  const learner = learnerActivities({
    taskQueue: input.gpuTaskQueue ?? 'gpu',
    scheduleToCloseTimeout: input.learnerTimeout ?? '10m',
    summary: `learner contract ${runId}`,
  });

  // 1-2. GRPO from text completions: one good tool call, one useless answer, group advantages ±1.
  const grpoBatchRef = await batches.writeGrpoBatch({
    items: [
      { prompt_ref: promptRef, completion: GOOD, advantage: 1 },
      { prompt_ref: promptRef, completion: BAD, advantage: -1 },
    ],
  });
  const grpo = await learner.updatePolicy({
    run_id: runId,
    version: 1,
    batch_ref: grpoBatchRef,
    hyperparameters: { learning_rate: 1e-4 },
  });

  // 3. Colocated sampling with the adapter just written.
  const sample = await learner.sampleActions({
    run_id: runId,
    version: 1,
    prompt_ref: promptRef,
    n,
    temperature: 1,
    max_tokens: input.maxTokens ?? 16,
    seed: input.seed ?? 0,
  });

  // 3b. The same draw with its tokens stored as blobs, as workflows ask for them (nothing inline).
  const stored = await learner.sampleActions({
    run_id: runId,
    version: 1,
    prompt_ref: promptRef,
    n,
    temperature: 1,
    max_tokens: input.maxTokens ?? 16,
    seed: input.seed ?? 0,
    store_tokens: true,
  });

  // 4-5. Step-level DPO on v1: the good answer over what the (random) policy said.
  const dpoBatchRef = await batches.writeDpoBatch({
    pairs: [
      { prompt_ref: promptRef, chosen: GOOD, rejected: sample.completions[0]?.text ?? BAD },
      { prompt_ref: promptRef, chosen: GOOD, rejected: BAD },
    ],
  });
  const dpo = await learner.updateDpo({ run_id: runId, version: 2, batch_ref: dpoBatchRef, hyperparameters: { beta: 0.1 } });

  // 6. A retried (or repeated) update of an existing version returns the adapter already written.
  const repeat = await learner.updatePolicy({ run_id: runId, version: 1, batch_ref: grpoBatchRef });

  // 7. GRPO from the sampler's own tokens and log-probs, by reference as a colocated run sends them: the learner
  // reads each completion's token blob itself.
  const sums = stored.completions.map((c) => c.logprob_sum ?? 0);
  const mean = sums.reduce((a, b) => a + b, 0) / Math.max(1, sums.length);
  const tokenBatchRef = await batches.writeGrpoBatch({
    items: stored.completions.map((c, i) => ({
      prompt_ref: promptRef,
      completion: c.text,
      tokens_ref: c.tokens_ref,
      finish_reason: c.finish_reason,
      // Any zero-mean signal will do for the contract: sequence log-prob relative to the group mean.
      advantage: Math.round((sums[i] - mean) * 1e6) / 1e6,
    })),
    max_completion_len: input.maxTokens ?? 16,
  });
  const tokens = await learner.updatePolicy({ run_id: runId, version: 3, batch_ref: tokenBatchRef });

  return { runId, grpoBatchRef, dpoBatchRef, tokenBatchRef, grpo, sample, stored, dpo, repeat, tokens };
}
