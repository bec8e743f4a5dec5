import OpenAI from 'openai';
import { ApplicationFailure, log } from '@temporalio/activity';
import { readGrammarBlob } from '../lib/model-io/grammar-blob';
import type { PolicyConfig } from '../lib/config/config';
import { clipErrorText } from '../lib/serving/credentials';
import { apiKeyFor } from './credentials';

export interface Completion {
  text: string;
  finishReason: string | null;
  /** The sampler's token ids of the completion, end-of-turn token included; absent when the server gave none. */
  tokenIds?: number[];
  /**
   * The sampler's log-prob of each completion token (one per token id when both are present); null where the
   * server did not know it (vLLM writes -9999 for a -inf or missing log-prob).
   */
  logprobs?: (number | null)[];
  /** How many of `logprobs` are null; absent when none is. */
  unknownLogprobs?: number;
}

export interface ChatResult {
  completions: Completion[];
  model: string;
  /** Whether the request asked for token ids and log-probs (the vLLM extension fields were sent). */
  askedForTokens: boolean;
  /** The prompt as the server encoded it (vLLM's top-level `prompt_token_ids`, with `return_token_ids`). */
  promptTokenIds?: number[];
  /** `tokensOptional`: token ids were asked for and the server gave none (or refused the fields). */
  tokenIdsMissing?: boolean;
}

/**
 * vLLM's extensions of the chat request that return the sampled tokens (vLLM's `ChatCompletionRequest`):
 * `return_token_ids` (0.10.2+) adds `choices[i].token_ids`; `return_tokens_as_token_ids` writes each
 * `logprobs.content[].token` as `"token_id:N"`, which is where older servers, without `token_ids`, keep the
 * ids. Both are sent: a server ignores fields it does not know, and the ids are read from whichever came back.
 * With `return_token_ids` vLLM also returns the prompt's ids (top-level `prompt_token_ids`).
 */
export const TOKEN_FIELDS = { logprobs: true, return_token_ids: true, return_tokens_as_token_ids: true } as const;

/**
 * The sampling distribution stated in full, each field at its neutral value. vLLM fills a field the request leaves
 * out from the model's `generation_config.json` (Qwen3-VL: top_k 20, top_p 0.8) unless it was started with
 * `--generation-config vllm` (`ModelConfig.get_diff_sampling_param`, `ChatCompletionRequest.to_sampling_params`):
 * the tokens would come from a truncated distribution the learner does not compute. top_k 0 is vLLM's "off"
 * (`SamplingParams._verify_args`: -1 is accepted too, 0 preferred).
 */
export const NEUTRAL_SAMPLING = { top_p: 1, top_k: 0, min_p: 0, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 } as const;

/** vLLM's placeholder for a log-prob it does not have (`max(lp, -9999.0)` in chat_completion/serving.py). */
export const UNKNOWN_LOGPROB = -9999;

// Rate limits and timeouts are transient; every other 4xx means the request itself is wrong.
const RETRYABLE_4XX = new Set([408, 409, 425, 429]);

/**
 * Whether a server takes vLLM's request extensions (token fields, the full sampling distribution): every server
 * but OpenAI's own API, which rejects unknown fields and whose reasoning models reject `logprobs`.
 */
export function vllmLike(baseUrl: string): boolean {
  let host = '';
  try {
    host = new URL(baseUrl).hostname.toLowerCase();
  } catch {
    return false;
  }
  return !(host === 'openai.com' || host.endsWith('.openai.com') || host.endsWith('.openai.azure.com'));
}

/** Whether a sampling request to this policy asks for token ids and log-probs. `auto`: when the server is vLLM-like. */
export function wantsTokenIds(policy: Pick<PolicyConfig, 'baseUrl'> & { tokenIds?: PolicyConfig['tokenIds'] }): boolean {
  const mode = policy.tokenIds ?? 'auto';
  if (mode !== 'auto') return mode === 'on';
  return vllmLike(policy.baseUrl);
}

/**
 * One chat-completion call with `n` samples. The client never retries on its own: Temporal owns retries,
 * and a request the server rejects as malformed is a non-retryable failure with the server's reason.
 * With `tokens`, the request asks for the completion's token ids and log-probs (TOKEN_FIELDS); a server that
 * refuses those fields (400/422 naming one) or answers without ids fails the request non-retryably, saying to
 * set `policy.tokenIds: off`: training on retokenised text is the user's choice, never a silent fallback.
 * With `tokensOptional` (samples nobody trains on) such a server is answered without ids (`tokenIdsMissing`).
 */
export async function chatCompletions(
  policy: PolicyConfig,
  n: number,
  messages: OpenAI.Chat.Completions.ChatCompletionMessageParam[],
  signal?: AbortSignal,
  opts: { tokens?: boolean; tokensOptional?: boolean; field?: string; grammar?: Record<string, unknown>; seed?: number } = {},
): Promise<ChatResult> {
  const client = new OpenAI({
    baseURL: policy.baseUrl,
    apiKey: apiKeyFor({ credential: policy.credential, apiKeyEnv: policy.apiKeyEnv, url: policy.baseUrl, field: opts.field ?? 'policy', fallback: 'policy' }) || 'EMPTY',
    maxRetries: 0,
    timeout: policy.timeoutMs,
  });
  const tokens = opts.tokens ?? false;
  const body: OpenAI.Chat.Completions.ChatCompletionCreateParamsNonStreaming & Partial<typeof TOKEN_FIELDS> = {
    model: policy.model,
    messages,
    n,
    ...samplingParams(policy),
    ...(vllmLike(policy.baseUrl) ? NEUTRAL_SAMPLING : {}),
    ...(tokens ? TOKEN_FIELDS : {}),
    ...(opts.grammar ? structuredOutputs(opts.grammar) : {}),
    // vLLM seeds one generator per request with it: a retried call draws the same n completions.
    ...(opts.seed !== undefined ? { seed: opts.seed } : {}),
  };
  let res: OpenAI.Chat.Completions.ChatCompletion & { prompt_token_ids?: unknown };
  try {
    res = await client.chat.completions.create(body, { signal });
  } catch (err) {
    if (tokens && refusedTokenFields(err)) {
      // Samples nobody trains on need no ids: the same request without the fields.
      if (opts.tokensOptional) {
        sayNoTokenIds(policy);
        return { ...(await chatCompletions(policy, n, messages, signal, { ...opts, tokens: false })), askedForTokens: true, tokenIdsMissing: true };
      }
      throw tokenFieldsFailure(policy, `refused the token fields: HTTP ${(err as InstanceType<typeof OpenAI.APIError>).status}: ${clipErrorText((err as Error).message)}`);
    }
    throw classifyPolicyError(err, policy);
  }
  if (!Array.isArray(res.choices) || res.choices.length === 0) {
    throw new Error(`policy server ${policy.baseUrl} answered with no choices`);
  }
  const completions: Completion[] = res.choices
    .slice()
    .sort((a, b) => (a.index ?? 0) - (b.index ?? 0))
    .map((c) => ({
      text: typeof c.message?.content === 'string' ? c.message.content : '',
      finishReason: c.finish_reason ?? null,
      ...(tokens ? sampledTokens(c as VllmChoice) : {}),
    }));
  const without = tokens ? completions.findIndex((c) => !c.tokenIds) : -1;
  if (without >= 0 && !opts.tokensOptional)
    throw tokenFieldsFailure(policy, `answered without the sampled token ids (choice ${without}; token_ids or "token_id:N" log-prob tokens)`);
  const prompt =
    tokens && Array.isArray(res.prompt_token_ids) && res.prompt_token_ids.length > 0 && res.prompt_token_ids.every(isTokenId) ? (res.prompt_token_ids as number[]) : undefined;
  if (without >= 0) sayNoTokenIds(policy);
  return {
    completions,
    model: res.model ?? policy.model,
    askedForTokens: tokens,
    ...(prompt ? { promptTokenIds: [...prompt] } : {}),
    ...(without >= 0 ? { tokenIdsMissing: true } : {}),
  };
}

/** Servers this process has said give no token ids: once each, not once per sample. */
const saidNoTokenIds = new Set<string>();

function sayNoTokenIds(policy: PolicyConfig): void {
  const key = `${policy.baseUrl} ${policy.model}`;
  if (saidNoTokenIds.has(key)) return;
  saidNoTokenIds.add(key);
  try {
    log.warn('policy server gives no token ids; sampling goes on without them (no training run can use this server unless policy.tokenIds: off)', {
      baseUrl: policy.baseUrl,
      model: policy.model,
    });
  } catch {
    /* outside an activity: nobody to tell */
  }
}

/** Token ids were asked for and not given: non-retryable (asking again gets the same), with the way on. */
function tokenFieldsFailure(policy: PolicyConfig, what: string): ApplicationFailure {
  return ApplicationFailure.create({
    message:
      `policy server ${policy.baseUrl} (model ${policy.model}) ${what}. The learner trains on the sampled token ids; ` +
      'to sample without them, set policy.tokenIds: off (the learner then retokenises the text, ratio 1)',
    type: 'PolicyTokenIdsMissing',
    nonRetryable: true,
  });
}

/** A choice as vLLM writes it: the OpenAI fields plus `token_ids`. */
type VllmChoice = OpenAI.Chat.Completions.ChatCompletion.Choice & { token_ids?: unknown };

/**
 * The sampled ids and log-probs of one choice: ids from `token_ids`, else parsed from `"token_id:N"` token
 * strings; log-probs from `logprobs.content`, null where unknown (vLLM's -9999 placeholder, none, or not a finite
 * number), never a number the learner would take for a probability. Malformed ids are left out, and log-probs that
 * do not pair one-to-one with the ids are dropped: what comes back is a valid `SampledTokens` (lib/training/experience.ts)
 * or nothing.
 */
export function sampledTokens(choice: VllmChoice): Pick<Completion, 'tokenIds' | 'logprobs' | 'unknownLogprobs'> {
  const content = Array.isArray(choice.logprobs?.content) ? choice.logprobs.content : undefined;
  let ids: number[] | undefined;
  if (Array.isArray(choice.token_ids) && choice.token_ids.every(isTokenId)) ids = choice.token_ids as number[];
  else if (content && content.length > 0) {
    const parsed = content.map((c) => /^token_id:(\d+)$/.exec(typeof c?.token === 'string' ? c.token : '')?.[1]);
    if (parsed.every((s) => s !== undefined)) ids = parsed.map(Number);
  }
  let logprobs: (number | null)[] | undefined;
  if (content && content.length > 0) {
    // vLLM's log-probs are float32 values, which 9 significant digits reproduce exactly (and the learner reads
    // them as float32): half the JSON of a double's 17 digits in every history that carries them.
    logprobs = content.map((c) => {
      const lp: unknown = c?.logprob;
      return typeof lp === 'number' && Number.isFinite(lp) && lp > UNKNOWN_LOGPROB ? Number(lp.toPrecision(9)) : null;
    });
  }
  // No ids is no tokens: a token blob must name at least one (the learner refuses an empty one).
  if (ids && ids.length === 0) ids = undefined;
  if (ids && logprobs && logprobs.length !== ids.length) logprobs = undefined;
  const unknown = logprobs?.filter((lp) => lp === null).length ?? 0;
  return { ...(ids ? { tokenIds: [...ids] } : {}), ...(logprobs ? { logprobs } : {}), ...(unknown > 0 ? { unknownLogprobs: unknown } : {}) };
}

function isTokenId(x: unknown): boolean {
  return Number.isInteger(x) && (x as number) >= 0;
}

function refusedTokenFields(err: unknown): boolean {
  return err instanceof OpenAI.APIError && (err.status === 400 || err.status === 422) && /return_token|logprobs/i.test(err.message);
}

/**
 * vLLM's structured-output request field (0.11+; the `guided_*` fields it replaced are ignored from 0.12 on,
 * with unconstrained output) for a stored grammar blob (lib/model-io/action-grammar.ts): its JSON schema. The whitespace
 * the output may hold is the server's setting (`--structured-outputs-config`, policy.grammarWhitespace): vLLM's
 * xgrammar and guidance backends ignore the request's `disable_any_whitespace`, which is sent only to say in
 * the request what the blob was sampled under.
 */
export function structuredOutputs(grammar: Record<string, unknown>): { structured_outputs: { json: Record<string, unknown>; disable_any_whitespace: boolean } } {
  const { schema, any_whitespace } = readGrammarBlob(grammar);
  return { structured_outputs: { json: schema, disable_any_whitespace: !any_whitespace } };
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
