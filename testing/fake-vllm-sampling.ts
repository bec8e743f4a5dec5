import { createHash } from 'node:crypto';
import type { ChatRequest } from './chat-server';
import { byteIds, type FakeVocab } from './fake-vocab';

/**
 * How the vLLM stand-in turns a request into its sampling distribution, as vLLM 0.33 does:
 *
 * - Defaults (`ChatCompletionRequest.to_sampling_params`): a field the request leaves out (or sends null) comes from
 *   the model's generation config, else vLLM's neutral value. Of `generation_config.json` vLLM takes only
 *   repetition_penalty, temperature, top_k, top_p and min_p (`ModelConfig.get_diff_sampling_param`; with
 *   `--generation-config vllm` none of them). Qwen3-VL-8B-Instruct ships temperature 0.7, top_p 0.8, top_k 20.
 * - Checks (`SamplingParams._verify_args`), with its messages: 400 on a value out of range.
 * - Greedy (temperature below 1e-5): top_p, top_k and min_p are reset to neutral (`SamplingParams.__post_init__`).
 */

export interface EffectiveSampling {
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  presence_penalty: number;
  frequency_penalty: number;
  repetition_penalty: number;
}

/** vLLM's own defaults of a chat request (`ChatCompletionRequest._DEFAULT_SAMPLING_PARAMS`). */
export const VLLM_NEUTRAL: EffectiveSampling = { repetition_penalty: 1, presence_penalty: 0, frequency_penalty: 0, temperature: 1, top_p: 1, top_k: 0, min_p: 0 };

/** Qwen/Qwen3-VL-8B-Instruct's generation_config.json, the sampling fields of it. */
export const QWEN3_VL_GENERATION_CONFIG: Record<string, number> = { temperature: 0.7, top_p: 0.8, top_k: 20 };

/** The generation-config fields vLLM applies as request defaults. */
const FROM_GENERATION_CONFIG = ['repetition_penalty', 'temperature', 'top_k', 'top_p', 'min_p'] as const;

/** The defaults a server applies: the model's generation config (its sampling fields), or none under `--generation-config vllm`. */
export function serverDefaults(generationConfig: Record<string, number>, vllmGenerationConfig: boolean): Partial<EffectiveSampling> {
  if (vllmGenerationConfig) return {};
  const out: Partial<EffectiveSampling> = {};
  for (const k of FROM_GENERATION_CONFIG) if (typeof generationConfig[k] === 'number') out[k] = generationConfig[k];
  return out;
}

/** Request value, else server default, else vLLM's neutral value; greedy rows untruncated. */
export function effectiveSampling(body: ChatRequest, defaults: Partial<EffectiveSampling> = {}): EffectiveSampling {
  const out = { ...VLLM_NEUTRAL };
  for (const k of Object.keys(VLLM_NEUTRAL) as (keyof EffectiveSampling)[]) {
    const sent = (body as unknown as Record<string, unknown>)[k];
    out[k] = typeof sent === 'number' ? sent : (defaults[k] ?? VLLM_NEUTRAL[k]);
  }
  if (out.temperature < 1e-5) Object.assign(out, { top_p: 1, top_k: 0, min_p: 0 });
  return out;
}

/** Whether the distribution is cut (top-k, top-p or min-p): the log-probs are then of the renormalised rest. */
export function truncates(s: EffectiveSampling): boolean {
  return s.top_p < 1 || s.top_k >= 1 || s.min_p > 0;
}

/** Python's `str` of a float (`1.0`, `0.5`), as vLLM's messages print it. */
const pyFloat = (x: number) => (Number.isInteger(x) ? x.toFixed(1) : String(x));

/** vLLM's refusal of the sampling fields (`_verify_args`, 0.33), or undefined. `param` as VLLMValidationError names it. */
export function samplingError(s: EffectiveSampling): { message: string; param: string | null } | undefined {
  const bad = (message: string, param: string | null = null, value?: number) => ({
    message: param && value !== undefined ? `${message} (parameter=${param}, value=${pyFloat(value)})` : message,
    param,
  });
  if (!Number.isInteger(s.top_k)) return bad('top_k: Input should be a valid integer, got a number with a fractional part', 'top_k');
  if (!(s.presence_penalty >= -2 && s.presence_penalty <= 2)) return bad(`presence_penalty must be in [-2, 2], got ${pyFloat(s.presence_penalty)}.`);
  if (!(s.frequency_penalty >= -2 && s.frequency_penalty <= 2)) return bad(`frequency_penalty must be in [-2, 2], got ${pyFloat(s.frequency_penalty)}.`);
  if (!(s.repetition_penalty > 0)) return bad(`repetition_penalty must be greater than zero, got ${pyFloat(s.repetition_penalty)}.`);
  if (s.temperature < 0) return bad(`temperature must be non-negative, got ${pyFloat(s.temperature)}.`, 'temperature', s.temperature);
  if (!(s.top_p > 0 && s.top_p <= 1)) return bad(`top_p must be in (0, 1], got ${pyFloat(s.top_p)}.`, 'top_p', s.top_p);
  // -1 is accepted quietly as "off"; 0 is vLLM's preferred "off".
  if (s.top_k < -1) return bad(`top_k must be 0 (disable), or at least 1, got ${s.top_k}.`);
  if (!(s.min_p >= 0 && s.min_p <= 1)) return bad(`min_p must be in [0, 1], got ${pyFloat(s.min_p)}.`);
  return undefined;
}

const TAIL = 60;

/**
 * The sampled token's log-prob after temperature, top-k, min-p and top-p (vLLM's processed_logprobs, in the order of
 * v1/sample/sampler.py: logits / T, then the cuts; greedy, T below 1e-5, counts as T = 1). The fake model's raw
 * distribution at a position: the sampled token has p = exp(lp), the most likely (p > 1/3 for every `fakeLogprob`),
 * and the other tokens share 1 - p geometrically, the j-th (1 - p) / 2^j. Temperature raises each to 1/T, which
 * keeps that order; cutting keeps a prefix of it and renormalises.
 */
export function truncatedLogprob(lp: number, s: EffectiveSampling): number {
  const t = s.temperature < 1e-5 ? 1 : s.temperature;
  if (!truncates(s) && t === 1) return lp;
  const p = Math.exp(lp);
  // Weights relative to the sampled token's, (p_j / p)^(1/T): no underflow at small T.
  const tail = (j: number) => ((1 - p) / 2 ** j / p) ** (1 / t);
  let kept = TAIL;
  while (s.min_p > 0 && kept > 0 && tail(kept) < s.min_p) kept--;
  if (s.top_k >= 1) kept = Math.min(kept, s.top_k - 1);
  let mass = 1;
  for (let j = 1; j <= kept; j++) mass += tail(j);
  if (s.top_p < 1) {
    // top-p on what top-k and min-p left: the shortest prefix holding top_p of it.
    let cum = 1;
    let m = 0;
    while (m < kept && cum / mass < s.top_p) cum += tail(++m);
    mass = cum;
  }
  return -Math.log(mass);
}

/**
 * Positions reported as vLLM's -9999 placeholder: `spec` below 1 is a fraction of the positions (spread evenly),
 * 1 or more a count (the first ones).
 */
export function placeholderPositions(length: number, spec: number | undefined): Set<number> {
  const out = new Set<number>();
  if (!spec || spec <= 0) return out;
  for (let t = 0; t < length; t++) {
    if (spec >= 1 ? t < spec : Math.floor((t + 1) * spec) > Math.floor(t * spec)) out.add(t);
  }
  return out;
}

/**
 * The fake's encoding of a chat prompt (vLLM's top-level `prompt_token_ids`): a Qwen-like chat template in the
 * fake's byte tokenizer (`vocab`), each image as its marker and ids of its hash. Stable: the same prompt, the same ids.
 */
export function fakePromptTokenIds(body: ChatRequest, vocab: FakeVocab): number[] {
  const bytes = (s: string | Uint8Array) => byteIds(vocab, s);
  const ids: number[] = [];
  for (const m of body.messages ?? []) {
    ids.push(vocab.imStart, ...bytes(`${m.role}\n`));
    for (const part of typeof m.content === 'string' ? [{ type: 'text', text: m.content }] : m.content) {
      if (part.type === 'text') ids.push(...bytes(part.text ?? ''));
      else if (part.type === 'image_url')
        ids.push(
          vocab.image,
          ...bytes(
            createHash('sha256')
              .update(part.image_url?.url ?? '')
              .digest()
              .subarray(0, 8),
          ),
        );
    }
    ids.push(vocab.eos, ...bytes('\n'));
  }
  ids.push(vocab.imStart, ...bytes('assistant\n'));
  return ids;
}
