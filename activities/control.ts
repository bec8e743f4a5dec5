import { ApplicationFailure, Context } from '@temporalio/activity';
import type { BlobStore } from '../blob/store';
import { clip, isValidAction, type AgentAction, type ToolAction } from '../lib/model-io/actions';
import { parseAction } from '../lib/model-io/parse';
import { buildPrompt } from '../lib/model-io/prompt';
import { actionGrammar, type ActionGrammar, type GrammarWhitespace } from '../lib/model-io/action-grammar';
import { grammarBlob, type GrammarSampler } from '../lib/model-io/grammar-blob';
import type { SampleInput, SampleResult, StepResultBlob, SampledTokens } from '../lib/episode/episode-types';
import type { Completion, CompletionInput, StepGroup, Trajectory, TrajectoryInput, TrajectoryStep } from '../lib/training/experience';
import { asCompletion, PREVIEW_CHARS, type FlatCompletion } from '../lib/training/completion';
import { inlineTokens } from '../lib/training/stored-trajectory';
import { toOpenAiMessages } from './openai-messages';
import { chatCompletions, wantsTokenIds } from './policy-client';
import { onPolicyPool } from './policy-pool';

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
  /**
   * Constrained decoding: the action grammar of this page as a blob, with the whitespace and separators its sampler
   * allows (the colocated sampler: compact), so the learner applies the mask it was sampled under; a budget it cannot fit, or
   * `policy.actions` that leave nothing on the page, is the config's fault.
   */
  async function storeGrammar(axtree: string, maxTokens: number, sampler: GrammarSampler, whitespace: GrammarWhitespace, actions?: readonly ToolAction[]): Promise<string> {
    let grammar: ActionGrammar;
    try {
      grammar = actionGrammar(axtree, maxTokens, whitespace, actions);
    } catch (err) {
      throw ApplicationFailure.nonRetryable(err instanceof Error ? err.message : String(err), 'ConfigError');
    }
    return blobs.putJson(grammarBlob(grammar, sampler));
  }

  /**
   * A step's or candidate's completion record; an activity task scheduled by a worker from before the record
   * (flat fields, tokens perhaps inline) is read into one here, its inline tokens stored as a blob.
   */
  async function recordOf(input: { completion?: unknown }, ran?: AgentAction): Promise<Completion> {
    const lean = input.completion as CompletionInput | undefined;
    if (lean && typeof lean === 'object' && typeof lean.valid === 'boolean') {
      // A record, whole or lean (lib/training/completion.ts `leanCompletion`): a missing preview comes from the
      // text's blob; the action the step's result names wins.
      const action = ran ?? lean.action;
      if (!action) throw ApplicationFailure.nonRetryable('recordTrajectory: a step has neither an action nor a result naming one', 'InvalidInput');
      const preview = lean.preview ?? (lean.ref ? clip((await blobs.get(lean.ref)).toString('utf8'), PREVIEW_CHARS) : '');
      return { ...lean, preview, action };
    }
    const x = input as FlatCompletion;
    const inline = !x.tokensRef ? inlineTokens(x) : null;
    const c = asCompletion(ran ? { ...x, action: ran } : x);
    return inline ? { ...c, tokensRef: await blobs.putJson(inline) } : c;
  }

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

    /** The colocated sampler's prompt and, for constrained decoding, the page's action grammar (both blobs). */
    async writePromptAndGrammar(
      input: Omit<SampleInput, 'policy'> & { historyLength: number; maxTokens: number; actions?: ToolAction[] },
    ): Promise<{ promptRef: string; grammarRef: string }> {
      const axtree = (await blobs.get(input.observation.axtreeRef)).toString('utf8');
      const promptRef = await blobs.putJson(buildPrompt({ ...input.observation, axtree }, input.history, input.historyLength));
      return { promptRef, grammarRef: await storeGrammar(axtree, input.maxTokens, 'colocated', 'compact', input.actions) };
    },

    /**
     * N completions of the policy for one observation, parsed into actions, each with the sampler's token ids
     * and log-probs when the server returns them (`policy.tokenIds`). With `adapter`, the run's adapter that
     * `policy.model` names is kept served: a vLLM that restarted and forgot it gets it loaded again and the
     * request is repeated once; a missing model that is not this adapter stays a non-retryable rejection.
     */
    async samplePolicy(input: SampleInput): Promise<SampleResult> {
      const t0 = Date.now();
      const { policy, adapter } = input;
      if (adapter && adapter.lora_name !== policy.model) {
        throw ApplicationFailure.nonRetryable(
          `samplePolicy: adapter.lora_name ${JSON.stringify(adapter.lora_name)} is not the sampled model ${JSON.stringify(policy.model)}`,
          'InvalidInput',
        );
      }
      const axtree = (await blobs.get(input.observation.axtreeRef)).toString('utf8');
      const prompt = buildPrompt({ ...input.observation, axtree }, input.history, policy.historyLength);
      const promptRef = await blobs.putJson(prompt);
      const messages = await toOpenAiMessages(blobs, prompt);
      const grammarRef = policy.constrained ? await storeGrammar(axtree, policy.maxTokens, policy.server, policy.grammarWhitespace, policy.actions) : undefined;
      const grammar = grammarRef ? await blobs.getJson<Record<string, unknown>>(grammarRef) : undefined;
      // One request on one replica of the policy's servers (activities/policy-pool.ts): its tokens, log-probs and
      // grammar are that request's, whichever replica answered.
      const pooled = await onPolicyPool(policy, adapter, (onReplica) =>
        chatCompletions(onReplica, input.n ?? 1, messages, activitySignal(), {
          tokens: wantsTokenIds(onReplica),
          tokensOptional: policy.tokenIdsOptional === true,
          ...(grammar ? { grammar } : {}),
          ...(input.seed !== undefined ? { seed: input.seed } : {}),
        }),
      );
      const res = pooled.value;
      const loads = pooled.adapter;
      const adapterLoad: SampleResult['adapterLoad'] = loads && loads.loadRequests > 0 ? { requests: loads.loadRequests, ms: loads.loadMs, reloaded: loads.reloaded } : undefined;
      // The prompt as the server encoded it, once per request: every completion's token blob references it.
      const promptIdsRef = res.promptTokenIds ? await blobs.putJson({ prompt_token_ids: res.promptTokenIds }) : undefined;
      const candidates: Completion[] = [];
      for (const c of res.completions) {
        const tokens: SampledTokens | undefined = c.tokenIds && { token_ids: c.tokenIds, logprobs: c.logprobs ?? null, ...(promptIdsRef ? { prompt_ref: promptIdsRef } : {}) };
        // A sum over unknown log-probs is no log-prob of the completion: no sum then.
        const known = c.logprobs?.length && !c.unknownLogprobs ? (c.logprobs as number[]) : undefined;
        const action = parseAction(c.text);
        candidates.push({
          ref: await blobs.put(c.text, 'txt'),
          preview: clip(c.text, PREVIEW_CHARS),
          ...(tokens ? { tokensRef: await blobs.putJson(tokens) } : {}),
          finishReason: c.finishReason,
          ...(known ? { logprobSum: known.reduce((a, b) => a + b, 0) } : {}),
          action,
          valid: isValidAction(action),
        });
      }
      return {
        candidates,
        model: res.model,
        promptRef,
        ...(grammarRef ? { grammarRef } : {}),
        latencyMs: Date.now() - t0,
        askedForTokens: res.askedForTokens,
        ...(adapterLoad ? { adapterLoad } : {}),
        ...(policy.baseUrls && policy.baseUrls.length > 1 ? { replica: pooled.replica } : {}),
      };
    },

    /**
     * Model output from the colocated sampler into typed actions (invalid ones carry the parser's reason), and,
     * with `store`, the texts into the blob store: the parser runs here, never in workflow code, so a history
     * replays the same whatever the parser's version.
     */
    async parseCompletions(input: { texts: string[]; store: boolean }): Promise<{ candidates: { action: AgentAction; preview: string; completionRef?: string }[] }> {
      if (!Array.isArray(input?.texts) || input.texts.some((t) => typeof t !== 'string')) {
        throw ApplicationFailure.nonRetryable('parseCompletions needs { texts: string[], store: boolean }', 'InvalidInput');
      }
      const candidates = [];
      for (const text of input.texts) {
        candidates.push({
          action: parseAction(text),
          preview: clip(text, PREVIEW_CHARS),
          ...(input.store ? { completionRef: await blobs.put(text, 'txt') } : {}),
        });
      }
      return { candidates };
    },

    /**
     * Assembles the episode's trajectory (`Trajectory`, lib/training/experience.ts) from the blobs its steps wrote; returns
     * its reference. Completions go by reference, as the steps carry them (the record's `ref`, `tokensRef`).
     */
    async recordTrajectory(input: TrajectoryInput): Promise<string> {
      const steps: TrajectoryStep[] = [];
      let before = input.initial;
      for (const step of input.steps) {
        const result = step.resultRef ? await blobs.getJson<StepResultBlob>(step.resultRef) : undefined;
        // The action the environment ran, where it ran one.
        const completion = await recordOf(step, result?.action);
        steps.push({
          step: step.step,
          promptRef: step.promptRef,
          ...(step.grammarRef ? { grammarRef: step.grammarRef } : {}),
          observation: before,
          completion,
          shaped: result?.breakdown ?? step.shaped ?? { total: 0, terms: [] },
          reward: result?.reward ?? 0,
          done: result?.done ?? false,
          actionError: result?.actionError,
          after: result ? { ...result.observation, goal: input.initial.goal } : before,
        });
        before = result ? { ...result.observation, goal: input.initial.goal } : before;
      }
      const { initial, groups: inputGroups, ...rest } = input;
      const groups: StepGroup[] = [];
      for (const { candidates, ...g } of inputGroups ?? []) {
        const records = [];
        for (const c of candidates) records.push({ completion: await recordOf(c), reward: c.reward });
        groups.push({ ...g, candidates: records });
      }
      return blobs.putJson({ version: 2, ...rest, ...(inputGroups ? { groups } : {}), goal: initial.goal, initial, steps } satisfies Trajectory);
    },
  };
}

export type ControlActivities = ReturnType<typeof createControlActivities>;
