import { ApplicationFailure, Context } from '@temporalio/activity';
import type { BlobStore } from '../blob/store';
import { buildCriticPrompt, buildOutcomePrompt, parseCriticAnswer, parseOutcomeAnswer, rankToPriors, type CriticConfig, type CriticObservation } from '../lib/search/critic';
import type { PromptMessage } from '../lib/model-io/prompt';
import { policySchema, type PolicyConfig } from '../lib/config/config';
import { toOpenAiMessages } from './openai-messages';
import { chatCompletions } from './policy-client';
import { clipErrorText } from '../lib/serving/credentials';

export type { CriticConfig };

export interface CritiqueInput {
  critic: CriticConfig;
  observation: { goal: string; url: string; step: number; screenshotRef: string; axtreeRef: string };
  /** describeAction texts of the K candidates, in candidate order. */
  candidates: string[];
}

export interface CritiqueResult {
  /** Candidate indexes, best first (a permutation of 0..K-1). */
  ranking: number[];
  /** The critic's probability of success from this state, in [0, 1]. */
  value: number;
  /** priors[i]: candidate i's prior from its rank (rankToPriors). */
  priors: number[];
  /** False when the critic's answer was unusable: neutral ranking and value (count these). */
  ok: boolean;
  reason?: string;
  promptRef: string;
  completionRef: string;
  model: string;
  latencyMs: number;
}

export interface JudgeOutcomeInput {
  critic: CriticConfig;
  /** The final state. */
  observation: CritiqueInput['observation'];
  /** describeAction texts of the actions taken since the reset, in order. */
  actions: string[];
}

export interface JudgeOutcomeResult {
  /** The critic's probability that the goal was achieved, in [0, 1]; 0.5 when its answer was unusable. */
  value: number;
  ok: boolean;
  reason?: string;
  promptRef: string;
  completionRef: string;
  model: string;
  latencyMs: number;
}

/** Enough for `{"ranking": [...], "value": ...}` with room for a short preamble. */
export const CRITIC_MAX_TOKENS = 256;

function activitySignal(): AbortSignal | undefined {
  try {
    return Context.current().cancellationSignal;
  } catch {
    return undefined;
  }
}

/** The critic as a policy-client config (n = 1), validated by the policy schema; a bad config is permanent. */
function asPolicyConfig(critic: CriticConfig): PolicyConfig {
  const parsed = policySchema.safeParse({
    backend: 'openai',
    baseUrl: critic.baseUrl,
    model: critic.model,
    credential: critic.credential ?? 'critic',
    ...(critic.apiKeyEnv !== undefined ? { apiKeyEnv: critic.apiKeyEnv } : {}),
    timeoutMs: critic.timeoutMs,
    temperature: critic.temperature,
    maxTokens: critic.maxTokens ?? CRITIC_MAX_TOKENS,
    historyLength: 0,
    maxAttempts: 1,
  });
  if (!parsed.success) {
    const issues = parsed.error.issues.map((i) => `critic.${i.path.map(String).join('.')}: ${i.message}`).join('; ');
    throw ApplicationFailure.nonRetryable(`invalid critic config: ${issues}`, 'CriticConfigInvalid');
  }
  return parsed.data;
}

/**
 * The policy client's classified failure, reworded for the critic; type and retryability are kept, so
 * retry policies written for the policy client (e.g. nonRetryableErrorTypes) apply unchanged.
 */
function asCriticFailure(err: unknown): unknown {
  if (!(err instanceof ApplicationFailure)) return err;
  return ApplicationFailure.create({
    message: `critic call failed: ${err.message}`,
    type: err.type ?? undefined,
    nonRetryable: err.nonRetryable ?? undefined,
    details: err.details ? [...err.details] : undefined,
    cause: err,
  });
}

/** Activities of the AI critic (Agent Q's self-critique): rank a state's candidate actions and value the state. */
export function createCriticActivities(blobs: BlobStore) {
  /** One critic call: the prompt built from the observation (its tree read from the blob store), both texts stored. */
  async function ask(critic: CriticConfig, observation: CritiqueInput['observation'], build: (obs: CriticObservation) => PromptMessage[]) {
    const config = asPolicyConfig(critic);
    const axtree = (await blobs.get(observation.axtreeRef)).toString('utf8');
    const { goal, url, step, screenshotRef } = observation;
    const prompt = build({ goal, url, step, screenshotRef, axtree });
    const promptRef = await blobs.putJson(prompt);
    const { completions, model } = await chatCompletions(config, 1, await toOpenAiMessages(blobs, prompt), activitySignal(), { field: 'critic' }).catch((err: unknown) => {
      throw asCriticFailure(err);
    });
    const { text, finishReason } = completions[0];
    const completionRef = await blobs.put(text, 'txt');
    /** An unusable answer's reason, saying so when the answer was cut by max_tokens. */
    // The reason goes into the history and may quote the answer: clipped like a server's error text.
    const explain = (ok: boolean, reason: string | undefined) => {
      const r = reason === undefined ? undefined : clipErrorText(reason);
      return !ok && finishReason === 'length' ? `${r} (the answer hit max_tokens)` : r;
    };
    return { text, promptRef, completionRef, model, explain };
  }

  return {
    /**
     * Asks the critic to rank the candidates and value the state. An unusable answer is data (ok false,
     * neutral ranking and value 0.5, with the reason), never a failure; transport errors follow the policy
     * client: 4xx (other than 408/409/425/429) are non-retryable, the rest retryable.
     */
    async critiqueCandidates(input: CritiqueInput): Promise<CritiqueResult> {
      const t0 = Date.now();
      if (!Array.isArray(input.candidates) || input.candidates.length === 0) {
        throw ApplicationFailure.nonRetryable('critiqueCandidates needs at least one candidate action', 'CriticBadInput');
      }
      const k = input.candidates.length;
      const { text, promptRef, completionRef, model, explain } = await ask(input.critic, input.observation, (obs) => buildCriticPrompt(obs, input.candidates));
      const verdict = parseCriticAnswer(text, k);
      const reason = explain(verdict.ok, verdict.reason);
      return {
        ranking: verdict.ranking,
        value: verdict.value,
        priors: rankToPriors(verdict.ranking),
        ok: verdict.ok,
        ...(reason !== undefined ? { reason } : {}),
        promptRef,
        completionRef,
        model,
        latencyMs: Date.now() - t0,
      };
    },

    /**
     * Asks the critic whether an ended episode achieved its goal (test-time search values ended states this
     * way instead of reading the environment's success). Errors and unusable answers as critiqueCandidates.
     */
    async judgeOutcome(input: JudgeOutcomeInput): Promise<JudgeOutcomeResult> {
      const t0 = Date.now();
      if (!Array.isArray(input.actions)) throw ApplicationFailure.nonRetryable('judgeOutcome needs the list of actions taken', 'CriticBadInput');
      const { text, promptRef, completionRef, model, explain } = await ask(input.critic, input.observation, (obs) => buildOutcomePrompt(obs, input.actions));
      const verdict = parseOutcomeAnswer(text);
      const reason = explain(verdict.ok, verdict.reason);
      return {
        value: verdict.value,
        ok: verdict.ok,
        ...(reason !== undefined ? { reason } : {}),
        promptRef,
        completionRef,
        model,
        latencyMs: Date.now() - t0,
      };
    },
  };
}

export type CriticActivities = ReturnType<typeof createCriticActivities>;
