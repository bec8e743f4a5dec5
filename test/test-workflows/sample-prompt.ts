import type { Duration } from '@temporalio/common';
import type { SampleActionsOutput } from '../../lib/training/learner-types';
import { learnerActivities } from '../../workflows/learner-calls';

export interface SamplePromptInput {
  runId: string;
  /** A prompt blob as lib/model-io/prompt.ts writes it. */
  promptRef: string;
  gpuTaskQueue: string;
  /** Bound on the call, queue time included: a learner that never answers fails the workflow instead of hanging. */
  timeout: Duration;
}

/**
 * One colocated `sample_actions` call with the base model on a given prompt, attempted once. Test code: only
 * test/integration/prompt-integrity.test.ts runs it, on a worker of its own; not in the production bundle.
 */
export async function samplePrompt(input: SamplePromptInput): Promise<SampleActionsOutput> {
  const learner = learnerActivities({
    taskQueue: input.gpuTaskQueue,
    scheduleToCloseTimeout: input.timeout,
    retry: { maximumAttempts: 1 },
    summary: `sample on ${input.promptRef}`,
  });
  return learner.sampleActions({ run_id: input.runId, version: 0, prompt_ref: input.promptRef, n: 2, temperature: 1, max_tokens: 8, seed: 0 });
}
