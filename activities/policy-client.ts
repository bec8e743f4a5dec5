import OpenAI from 'openai';
import { ApplicationFailure } from '@temporalio/activity';
import type { PolicyConfig } from '../lib/config';

export interface Completion {
  text: string;
  finishReason: string | null;
}

// Rate limits and timeouts are transient; every other 4xx means the request itself is wrong.
const RETRYABLE_4XX = new Set([408, 409, 425, 429]);

/**
 * One chat-completion call with `n` samples. The client never retries on its own: Temporal owns retries,
 * and a request the server rejects as malformed is a non-retryable failure with the server's reason.
 */
export async function chatCompletions(
  policy: PolicyConfig,
  messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[],
  signal?: AbortSignal,
): Promise<{ completions: Completion[]; model: string }> {
  const client = new OpenAI({
    baseURL: policy.baseUrl,
    apiKey: process.env[policy.apiKeyEnv] || 'EMPTY',
    maxRetries: 0,
    timeout: policy.timeoutMs,
  });
  try {
    const res = await client.chat.completions.create(
      {
        model: policy.model,
        messages,
        n: policy.n,
        ...samplingParams(policy),
      },
      { signal },
    );
    if (!Array.isArray(res.choices) || res.choices.length === 0) {
      throw new Error(`policy server ${policy.baseUrl} answered with no choices`);
    }
    const completions = res.choices
      .slice()
      .sort((a, b) => (a.index ?? 0) - (b.index ?? 0))
      .map((c) => ({ text: typeof c.message?.content === 'string' ? c.message.content : '', finishReason: c.finish_reason ?? null }));
    return { completions, model: res.model ?? policy.model };
  } catch (err) {
    throw classifyPolicyError(err, policy);
  }
}

/**
 * OpenAI's reasoning models (o-series, gpt-5 class) reject `max_tokens` and any temperature but the default;
 * vLLM and older models take `max_tokens` and `temperature`.
 */
export function samplingParams(policy: Pick<PolicyConfig, 'model' | 'maxTokens' | 'temperature'>): { max_tokens?: number; max_completion_tokens?: number; temperature?: number } {
  const name = policy.model.split('/').pop() ?? policy.model;
  if (/^(o\d|gpt-5)/i.test(name)) return { max_completion_tokens: policy.maxTokens };
  return { max_tokens: policy.maxTokens, temperature: policy.temperature };
}

export function classifyPolicyError(err: unknown, policy: PolicyConfig): Error {
  if (err instanceof OpenAI.APIError && typeof err.status === 'number') {
    const detail = `${policy.baseUrl} (model ${policy.model}) answered HTTP ${err.status}: ${err.message}`;
    if (err.status >= 400 && err.status < 500 && !RETRYABLE_4XX.has(err.status)) {
      return ApplicationFailure.nonRetryable(`policy request rejected: ${detail}`, 'PolicyRequestRejected');
    }
    return ApplicationFailure.retryable(`policy server error: ${detail}`, 'PolicyServerError');
  }
  if (err instanceof OpenAI.APIConnectionError || err instanceof OpenAI.APIConnectionTimeoutError) {
    return ApplicationFailure.retryable(
      `policy server ${policy.baseUrl} unreachable: ${err.message}. Is vLLM (or the fake server) running?`,
      'PolicyServerUnreachable',
    );
  }
  return err instanceof Error ? err : new Error(String(err));
}
