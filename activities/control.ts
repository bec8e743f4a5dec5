import { Context } from '@temporalio/activity';
import type OpenAI from 'openai';
import { BlobStore } from '../blob/store';
import { clip } from '../lib/actions';
import { parseAction } from '../lib/parse';
import { buildPrompt, type PromptMessage } from '../lib/prompt';
import type { SampleInput, SampleResult, StepRecord, TaskRef } from '../lib/episode-types';
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
  async function toOpenAiMessages(messages: PromptMessage[]): Promise<OpenAI.Chat.Completions.ChatCompletionMessageParam[]> {
    const out: OpenAI.Chat.Completions.ChatCompletionMessageParam[] = [];
    for (const m of messages) {
      if (m.role === 'system') {
        out.push({ role: 'system', content: m.content.map((p) => (p.type === 'text' ? p.text : '')).join('\n') });
        continue;
      }
      const parts: OpenAI.Chat.Completions.ChatCompletionContentPart[] = [];
      for (const p of m.content) {
        if (p.type === 'text') parts.push({ type: 'text', text: p.text });
        else parts.push({ type: 'image_url', image_url: { url: `data:image/png;base64,${(await blobs.get(p.ref)).toString('base64')}` } });
      }
      out.push({ role: 'user', content: parts });
    }
    return out;
  }

  return {
    async samplePolicy(input: SampleInput): Promise<SampleResult> {
      const t0 = Date.now();
      const axtree = (await blobs.get(input.observation.axtreeRef)).toString('utf8');
      const prompt = buildPrompt({ ...input.observation, axtree }, input.history, input.policy.historyLength);
      const promptRef = await blobs.putJson(prompt);
      const { completions, model } = await chatCompletions(
        input.policy,
        await toOpenAiMessages(prompt),
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

    async recordTrajectory(input: {
      workflowId: string;
      task: TaskRef;
      policyModel: string;
      steps: Omit<StepRecord, 'completion'>[];
      success: boolean;
      reward: number;
      reason: string | null;
    }): Promise<string> {
      const steps = [];
      for (const step of input.steps) {
        steps.push({ ...step, completion: (await blobs.get(step.completionRef)).toString('utf8') });
      }
      return blobs.putJson({ version: 1, ...input, steps });
    },
  };
}

export type ControlActivities = ReturnType<typeof createControlActivities>;
