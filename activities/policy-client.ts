import OpenAI from 'openai';
import { ApplicationFailure } from '@temporalio/activity';
import type { PolicyConfig } from '../lib/config';
import { clipErrorText } from '../lib/credentials';
import { apiKeyFor } from './credentials';

export interface Completion {
  text: string;
  finishReason: string | null;
  /** The sampler's token ids of the completion, end-of-turn token included; absent when the server gave none. */
  tokenIds?: number[];
  /** The sampler's log-prob of each completion token (one per token id when both are present). */
  logprobs?: number[];
}

export interface ChatResult {
  completions: Completion[];
  model: string;
  /** Whether the request asked for token ids and log-probs (the vLLM extension fields were sent). */
  askedForTokens: boolean;
}

/**
 * vLLM's extensions of the chat request that return the sampled tokens (vLLM's `ChatCompletionRequest`):
 * `return_token_ids` (0.10.2+) adds `choices[i].token_ids`; `return_tokens_as_token_ids` writes each
 * `logprobs.content[].token` as `"token_id:N"`, which is where older servers, without `token_ids`, keep the
 * ids. Both are sent: a server ignores fields it does not know, and the ids are read from whichever came back.
 */
export const TOKEN_FIELDS = { logprobs: true, return_token_ids: true, return_tokens_as_token_ids: true } as const;

// Rate limits and timeouts are transient; every other 4xx means the request itself is wrong.
const RETRYABLE_4XX = new Set([408, 409, 425, 429]);

/** Servers that refused the token fields in `auto` mode (this process): later requests leave them out. */
const refusesTokenFields = new Set<string>();

/**
 * Whether a sampling request to this policy asks for token ids and log-probs. `auto`: yes, except for
 * OpenAI's own API (which rejects unknown fields and whose reasoning models reject `logprobs`) and servers
 * that already refused the fields once.
 */
export function wantsTokenIds(policy: Pick<PolicyConfig, 'baseUrl'> & { tokenIds?: PolicyConfig['tokenIds'] }): boolean {
  const mode = policy.tokenIds ?? 'auto';
  if (mode !== 'auto') return mode === 'on';
  if (refusesTokenFields.has(policy.baseUrl)) return false;
  let host = '';
  try {
    host = new URL(policy.baseUrl).hostname.toLowerCase();
  } catch {
    return false;
  }
  return !(host === 'openai.com' || host.endsWith('.openai.com') || host.endsWith('.openai.azure.com'));
}

/**
 * One chat-completion call with `n` samples. The client never retries on its own: Temporal owns retries,
 * and a request the server rejects as malformed is a non-retryable failure with the server's reason.
 * With `tokens`, the request asks for the completion's token ids and log-probs (TOKEN_FIELDS); in `auto`
 * mode a server that rejects those fields (400 naming one of them) is asked again without them, once.
 */
export async function chatCompletions(
  policy: PolicyConfig,
  n: number,
  messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[],
  signal?: AbortSignal,
  opts: { tokens?: boolean; field?: string; grammar?: Record<string, unknown> } = {},
): Promise<ChatResult> {
  const client = new OpenAI({
    baseURL: policy.baseUrl,
    apiKey: apiKeyFor({ credential: policy.credential, apiKeyEnv: policy.apiKeyEnv, url: policy.baseUrl, field: opts.field ?? 'policy', fallback: 'policy' }) || 'EMPTY',
    maxRetries: 0,
    timeout: policy.timeoutMs,
  });
  const ask = async (tokens: boolean): Promise<ChatResult> => {
    const body: OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming & Partial<typeof TOKEN_FIELDS> = {
      model: policy.model,
      messages,
      n,
      ...samplingParams(policy),
      ...(tokens ? TOKEN_FIELDS : {}),
      ...(opts.grammar ? structuredOutputs(opts.grammar) : {}),
    };
    const res = await client.chat.completions.create(body, { signal });
    if (!Array.isArray(res.choices) || res.choices.length === 0) {
      throw new Error(`policy server ${policy.baseUrl} answered with no choices`);
    }
    const completions = res.choices
      .slice()
      .sort((a, b) => (a.index ?? 0) - (b.index ?? 0))
      .map((c) => ({
        text: typeof c.message?.content === 'string' ? c.message.content : '',
        finishReason: c.finish_reason ?? null,
        ...(tokens ? sampledTokens(c as VllmChoice) : {}),
      }));
    return { completions, model: res.model ?? policy.model, askedForTokens: tokens };
  };
  const tokens = opts.tokens ?? false;
  try {
    return await ask(tokens);
  } catch (err) {
    if (tokens && (policy.tokenIds ?? 'auto') === 'auto' && refusedTokenFields(err)) {
      refusesTokenFields.add(policy.baseUrl);
      try {
        return await ask(false);
      } catch (again) {
        throw classifyPolicyError(again, policy);
      }
    }
    throw classifyPolicyError(err, policy);
  }
}

/** A choice as vLLM writes it: the OpenAI fields plus `token_ids`. */
type VllmChoice = OpenAI.Chat.Completions.ChatCompletion.Choice & { token_ids?: unknown };

/**
 * The sampled ids and log-probs of one choice: ids from `token_ids`, else parsed from `"token_id:N"` token
 * strings; log-probs from `logprobs.content`. Anything malformed is left out (the learner then retokenises
 * the text), and log-probs that do not pair one-to-one with the ids are dropped: what comes back is a valid
 * `SampledTokens` (lib/experience.ts) or nothing.
 */
export function sampledTokens(choice: VllmChoice): { tokenIds?: number[]; logprobs?: number[] } {
  const content = Array.isArray(choice.logprobs?.content) ? choice.logprobs.content : undefined;
  let ids: number[] | undefined;
  if (Array.isArray(choice.token_ids) && choice.token_ids.every(isTokenId)) ids = choice.token_ids as number[];
  else if (content && content.length > 0) {
    const parsed = content.map((c) => /^token_id:(\d+)$/.exec(typeof c?.token === 'string' ? c.token : '')?.[1]);
    if (parsed.every((s) => s !== undefined)) ids = parsed.map(Number);
  }
  let logprobs: number[] | undefined;
  if (content?.every((c) => typeof c?.logprob === 'number' && Number.isFinite(c.logprob))) {
    // vLLM's log-probs are float32 values, which 9 significant digits reproduce exactly (and the learner reads
    // them as float32): half the JSON of a double's 17 digits in every history that carries them.
    logprobs = content.map((c) => Number(c.logprob.toPrecision(9)));
  }
  // No ids is no tokens: a token blob must name at least one (the learner refuses an empty one).
  if (ids && ids.length === 0) ids = undefined;
  if (ids && logprobs && logprobs.length !== ids.length) logprobs = undefined;
  return { ...(ids ? { tokenIds: [...ids] } : {}), ...(logprobs ? { logprobs } : {}) };
}

function isTokenId(x: unknown): boolean {
  return Number.isInteger(x) && (x as number) >= 0;
}

function refusedTokenFields(err: unknown): boolean {
  return err instanceof OpenAI.APIError && (err.status === 400 || err.status === 422) && /return_token|logprobs/i.test(err.message);
}

/**
 * OpenAI's reasoning models (o-series, gpt-5 class) reject `max_tokens` and any temperature but the default;
 * vLLM and older models take `max_tokens` and `temperature`.
 */
/**
 * vLLM's structured-output request field (0.11+; the `guided_*` fields it replaced are ignored from 0.12 on,
 * with unconstrained output): the action grammar's JSON schema, compact JSON without free whitespace, which is
 * what the colocated sampler compiles with xgrammar too (lib/action-grammar.ts).
 */
export function structuredOutputs(schema: Record<string, unknown>): { structured_outputs: { json: Record<string, unknown>; disable_any_whitespace: true } } {
  return { structured_outputs: { json: schema, disable_any_whitespace: true } };
}

export function samplingParams(policy: Pick<PolicyConfig, 'model' | 'maxTokens' | 'temperature'>): { max_tokens?: number; max_completion_tokens?: number; temperature?: number } {
  const name = policy.model.split('/').pop() ?? policy.model;
  if (/^(o\d|gpt-5)/i.test(name)) return { max_completion_tokens: policy.maxTokens };
  return { max_tokens: policy.maxTokens, temperature: policy.temperature };
}

/** What a classified failure carries in `details[0]`, for callers that react to a particular refusal. */
export interface PolicyFailureDetail {
  status: number;
  message: string;
  /** Set when the server answered 404 "The model `X` does not exist." (vLLM): the name it does not serve. */
  missingModel?: string;
}

/** vLLM's answer to a request naming a model (or adapter) it does not serve; later versions append the valid names. */
const MODEL_MISSING = /The model `([^`]+)` does not exist/;

export function classifyPolicyError(err: unknown, policy: PolicyConfig): Error {
  if (err instanceof OpenAI.APIError && typeof err.status === 'number') {
    // The server's text goes into the workflow history: clipped, whatever the server (or a proxy) answered.
    const said = clipErrorText(err.message);
    const detail = `${policy.baseUrl} (model ${policy.model}) answered HTTP ${err.status}: ${said}`;
    const missing = err.status === 404 ? MODEL_MISSING.exec(err.message)?.[1] : undefined;
    const details: PolicyFailureDetail[] = [{ status: err.status, message: said, ...(missing ? { missingModel: clipErrorText(missing) } : {}) }];
    if (err.status >= 400 && err.status < 500 && !RETRYABLE_4XX.has(err.status)) {
      return ApplicationFailure.create({ message: `policy request rejected: ${detail}`, type: 'PolicyRequestRejected', nonRetryable: true, details });
    }
    return ApplicationFailure.create({ message: `policy server error: ${detail}`, type: 'PolicyServerError', nonRetryable: false, details });
  }
  if (err instanceof OpenAI.APIConnectionError || err instanceof OpenAI.APIConnectionTimeoutError) {
    return ApplicationFailure.retryable(
      `policy server ${policy.baseUrl} unreachable: ${clipErrorText(err.message)}. Is vLLM (or the fake server) running?`,
      'PolicyServerUnreachable',
    );
  }
  return err instanceof Error ? err : new Error(String(err));
}

/** The model a classified failure says the server does not serve (404 "does not exist"), if that is what it says. */
export function missingModelOf(err: unknown): string | undefined {
  if (!(err instanceof ApplicationFailure) || !Array.isArray(err.details)) return undefined;
  const d = err.details[0] as Partial<PolicyFailureDetail> | undefined;
  return d?.status === 404 && typeof d.missingModel === 'string' ? d.missingModel : undefined;
}
