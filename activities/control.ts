import { Context } from '@temporalio/activity';
import { BlobStore } from '../blob/store';
import { clip } from '../lib/actions';
import { parseAction } from '../lib/parse';
import { buildPrompt } from '../lib/prompt';
import type { SampleInput, SampleResult, StepResultBlob, TrajectoryInput } from '../lib/episode-types';
import { toOpenAiMessages } from './openai-messages';
import { chatCompletions } from './policy-client';

const PREVIEW_CHARS = 200;

/** The activity's cancellation signal; none when the function runs outside a worker (benchmarks, scripts). */
function activitySignal(): AbortSignal | undefined {
  try {
    return Context.current().cancellationSignal;
  } catch {
    return undefined;
  }
}

/** Activities of the control worker: policy sampling and trajectory records (I/O that is not a browser). */
export function createControlActivities(blobs: BlobStore) {

  return {
    /** A JSON value into the blob store (e.g. a run's config, so continue-as-new carries a reference). */
    async storeJson(input: { value: unknown }): Promise<{ ref: string; hash: string }> {
      const ref = await blobs.putJson(input.value);
      return { ref, hash: ref.slice('sha256:'.length, 'sha256:'.length + 16) };
    },

    async loadJson(input: { ref: string }): Promise<unknown> {
      return blobs.getJson(input.ref);
    },

    /** The prompt for the colocated sampler: the same builder and format as the vLLM path, as a blob. */
    async writePrompt(input: Omit<SampleInput, 'policy'> & { historyLength: number }): Promise<string> {
      const axtree = (await blobs.get(input.observation.axtreeRef)).toString('utf8');
      return blobs.putJson(buildPrompt({ ...input.observation, axtree }, input.history, input.historyLength));
    },

    async samplePolicy(input: SampleInput): Promise<SampleResult> {
      const t0 = Date.now();
      const axtree = (await blobs.get(input.observation.axtreeRef)).toString('utf8');
      const prompt = buildPrompt({ ...input.observation, axtree }, input.history, input.policy.historyLength);
      const promptRef = await blobs.putJson(prompt);
      const { completions, model } = await chatCompletions(
        input.policy,
        await toOpenAiMessages(blobs, prompt),
        activitySignal(),
      );
      const candidates = [];
      for (const c of completions) {
        candidates.push({
          action: parseAction(c.text),
          preview: clip(c.text, PREVIEW_CHARS),
          completionRef: await blobs.put(c.text, 'txt'),
          finishReason: c.finishReason,
        });
      }
      return { candidates, model, promptRef, latencyMs: Date.now() - t0 };
    },

    /** Assembles the episode's trajectory from the blobs its steps wrote; returns the trajectory's reference. */
    async recordTrajectory(input: TrajectoryInput): Promise<string> {
      const steps = [];
      let before = input.initial;
      for (const step of input.steps) {
        const completion = step.completionRef ? (await blobs.get(step.completionRef)).toString('utf8') : (step.completion ?? '');
        const result = step.resultRef ? await blobs.getJson<StepResultBlob>(step.resultRef) : undefined;
        steps.push({
          step: step.step,
          promptRef: step.promptRef,
          observation: before,
          completion,
          completionRef: step.completionRef,
          action: result?.action ?? step.action,
          valid: (result?.action ?? step.action)?.type !== 'invalid',
          shaped: result?.breakdown ?? step.shaped ?? { total: 0, terms: [] },
          reward: result?.reward ?? 0,
          done: result?.done ?? false,
          actionError: result?.actionError,
          after: result ? { ...result.observation, goal: input.initial.goal } : before,
        });
        before = result ? { ...result.observation, goal: input.initial.goal } : before;
      }
      const { initial, ...rest } = input;
      return blobs.putJson({ version: 1, ...rest, goal: initial.goal, initial, steps });
    },
  };
}

export type ControlActivities = ReturnType<typeof createControlActivities>;
