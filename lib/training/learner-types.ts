import { z } from 'zod';
import { mctsSchema, policySchema, trainSchema } from '../config/config';
import {
  BLOB_REF,
  DpoPairSchema,
  ImagePartSchema,
  PromptMessageSchema,
  PromptPartSchema,
  PromptSchema,
  PromptTokenIdsSchema,
  SampledTokensSchema,
  TextPartSchema,
  blobRefSchema,
} from './experience';

/**
 * The learner contract, declared once: what goes to the `gpu` task queue and what comes back from it, snake_case
 * keys, unknown keys rejected. The Python learner's pydantic models (`workers/learner/halo_learner/payloads.py`)
 * are generated from these schemas (`npx halo learner-schema --write`; test/unit/learner-schema.test.ts fails
 * when the file is stale), with the checks JSON Schema cannot state (the `refine`s) mirrored in
 * `payload_rules.py`. `test/integration/learner-contract.test.ts` round-trips real payloads through the worker.
 *
 * Types: `XInput` (z.input) is what a caller may write (defaulted keys optional); `X` (z.output) is the
 * parsed value with every default filled in, which is what is sent.
 */

// One path component (the learner's checkpoints/<run_id>/): "", ".", "..", ".hidden" and separators are refused.
const RUN_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/;

const finite = z.number(); // zod 4 rejects NaN and ±Infinity for z.number()
const int = z.number().int();
const runId = z.string().min(1).regex(RUN_ID, 'run_id: a letter or digit, then up to 199 letters, digits, ".", "_" or "-"');
/**
 * The base model a request was written for (the run's `policy.model`, e.g. "Qwen/Qwen3-VL-8B-Instruct"); the
 * learner refuses it with a non-retryable `ModelMismatch` when it holds another model. Null skips the check.
 */
const baseModel = z.string().min(1).nullable().default(null);

// The prompt, the sampler's tokens and the DPO pair are experience (lib/training/experience.ts), declared there once.
export { BLOB_REF, DpoPairSchema, ImagePartSchema, PromptMessageSchema, PromptPartSchema, PromptSchema, PromptTokenIdsSchema, SampledTokensSchema, TextPartSchema };
export type { DpoPair, DpoPairInput, LearnerPrompt, PromptTokenIds, SampledTokens, SampledTokensParsed } from './experience';

// ---- update_policy ---------------------------------------------------------------------------------

// A request without a hyperparameter trains with the run config's default for it (lib/config/config.ts), the one place
// each default is written; the ranges here are the learner's own, wider than a config's.
const TRAIN = trainSchema.parse(undefined);
const MCTS = mctsSchema.parse(undefined);
const POLICY = policySchema.parse(undefined);

export const GrpoHyperparametersSchema = z.strictObject({
  learning_rate: finite.gt(0).default(TRAIN.learningRate),
  kl_coef: finite.min(0).default(TRAIN.klCoef),
  clip_epsilon: finite.gt(0).lt(1).default(TRAIN.clipEpsilon),
  temperature: finite.gt(0).default(POLICY.temperature),
  max_grad_norm: finite.gt(0).default(TRAIN.maxGradNorm),
  /** dr_grpo only: advantages r − mean(r), no std division, a constant length normaliser. */
  loss_type: z.literal('dr_grpo').default(TRAIN.lossType),
  /** Pipelined iterations: the decoupled objective, importance weights to the sampler's policy capped at this. */
  stale_weight_cap: finite.gt(0).nullable().default(null),
});

export const GrpoItemSchema = z.strictObject({
  prompt: PromptSchema,
  completion: z.string(),
  /**
   * The sampler's tokens of the completion (a `SampledTokens` blob, which the learner reads and checks). Null:
   * the learner retokenises the text (a server that gave no ids, an invalid output) and has no sampler log-probs.
   */
  tokens_ref: blobRefSchema.nullable().default(null),
  advantage: finite,
  /** Optional: when the sampler stopped on max_tokens the text has no end-of-turn token to learn. */
  finish_reason: z.string().nullable().default(null),
  /** Constrained decoding: the JSON-schema blob (lib/model-io/action-grammar.ts) the completion was sampled under. */
  grammar_ref: z.string().nullable().default(null),
});

/** The blob behind `update_policy`'s `batch_ref`. */
export const GrpoBatchSchema = z.strictObject({
  items: z.array(GrpoItemSchema).min(1),
  /**
   * The run's `policy.maxTokens`: dr_grpo divides by B × this constant. Null falls back to the batch's longest
   * completion, which changes the weight of a token from batch to batch (the learner logs a warning).
   */
  max_completion_len: int.min(1).nullable().default(null),
});

export const UpdatePolicyInputSchema = z.strictObject({
  run_id: runId,
  version: int.min(1),
  batch_ref: z.string(),
  hyperparameters: GrpoHyperparametersSchema.prefault({}),
  base_model: baseModel,
});

const updateOutputShape = {
  run_id: z.string(),
  version: int,
  adapter_path: z.string(),
  loss: finite,
  grad_norm: finite,
  tokens: int,
  seconds: finite,
  reused: z.boolean(),
};

export const UpdatePolicyOutputSchema = z.strictObject({
  ...updateOutputShape,
  retokenized: int,
  token_mismatch_rate: finite,
  /** sampler tokens whose log-prob was unknown (vLLM's -9999 or none): dropped from the loss */
  unknown_logprobs: int.nullable().default(null),
  /** share of the completions with the server's prompt ids whose ids differ from the learner's own encoding */
  prompt_mismatch_rate: finite.nullable().default(null),
  // Per-update statistics, measured before the optimiser step (null when unknown or written before them):
  /** mean k3 estimate of KL(π_θ ‖ π_ref) per completion token (null when kl_coef is 0: no reference pass) */
  kl: finite.nullable().default(null),
  /** share of tokens with sampler log-probs whose clipped ratio (to the sampler; decoupled: to the learner's own, 0) left [1 - ε, 1 + ε] */
  clip_fraction: finite.nullable().default(null),
  /** mean π_θ / π_old over tokens with sampler log-probs */
  mean_ratio: finite.nullable().default(null),
  ratio_tokens: int.nullable().default(null),
  /** mean -log π_θ of the sampled tokens: a one-sample estimate of the policy's entropy */
  entropy: finite.nullable().default(null),
  /** dr_grpo's B × max_completion_len */
  denominator: finite.nullable().default(null),
  /** completions per packed forward, planned for the memory budget (halved after an out-of-memory retry) */
  micro_batch: int.nullable().default(null),
});

// ---- update_dpo ------------------------------------------------------------------------------------

export const DpoHyperparametersSchema = z.strictObject({
  learning_rate: finite.gt(0).default(MCTS.learningRate),
  beta: finite.gt(0).default(MCTS.beta),
  max_grad_norm: finite.gt(0).default(MCTS.maxGradNorm),
});

/** The blob behind `update_dpo`'s `batch_ref`. */
export const DpoBatchSchema = z.strictObject({ pairs: z.array(DpoPairSchema).min(1) });

export const UpdateDpoInputSchema = z.strictObject({
  run_id: runId,
  version: int.min(1),
  batch_ref: z.string(),
  hyperparameters: DpoHyperparametersSchema.prefault({}),
  base_model: baseModel,
});

export const UpdateDpoOutputSchema = z.strictObject({
  ...updateOutputShape,
  reward_margin: finite,
  accuracy: finite,
});

// ---- sample_actions --------------------------------------------------------------------------------

export const SampleActionsInputSchema = z.strictObject({
  run_id: runId,
  /** 0 = the base model (adapter disabled); N = adapter v<N> of run_id. */
  version: int.min(0).default(0),
  /** A blob holding the prompt messages (`PromptSchema`), as `samplePolicy` writes them. */
  prompt_ref: z.string(),
  n: int.min(1).max(64).default(1),
  temperature: finite.min(0).default(0.7),
  max_tokens: int.min(1).default(256),
  seed: int.nullable().default(null),
  /** ε of an exploring draw: tokens from (1 − ε)·π + ε·uniform(allowed), with that mixture's log-probs. */
  explore: finite.min(0).max(1).default(0),
  base_model: baseModel,
  /** Constrained decoding: every completion follows this JSON-schema blob (lib/model-io/action-grammar.ts). */
  grammar_ref: z.string().nullable().default(null),
  /** Tokens as blobs (`tokens_ref`), not inline: n × max_tokens ids and log-probs would swell every history carrying them. */
  store_tokens: z.boolean().default(false),
});

export const CompletionSchema = z
  .strictObject({
    text: z.string(),
    /** Include the stop token when there is one; `text` leaves it out. */
    token_ids: z.array(int).nullable().default(null),
    logprobs: z.array(finite).nullable().default(null),
    /** With `store_tokens`: a `SampledTokens` blob ({token_ids, logprobs, grammar_ref}) instead of the two lists. */
    tokens_ref: z.string().nullable().default(null),
    /** Sum of the log-probs (either way): MCTS keeps it as the DPO reference log-prob of the completion. */
    logprob_sum: finite.nullable().default(null),
    finish_reason: z.enum(['stop', 'length']),
  })
  .superRefine((c, ctx) => {
    const inline = c.token_ids !== null && c.logprobs !== null;
    if (inline === (c.tokens_ref !== null) || (c.token_ids === null) !== (c.logprobs === null)) {
      ctx.addIssue({ code: 'custom', message: 'a completion carries its tokens either inline (token_ids and logprobs) or as tokens_ref' });
    }
  });

export const SampleActionsOutputSchema = z.strictObject({
  completions: z.array(CompletionSchema),
  model: z.string(),
  version: int,
  seconds: finite,
  /** How many sample_actions calls the learner sampled together in this call's batch (halo_learner/sample_batcher.py). */
  batch_calls: int.min(1).default(1),
});

// ---- types -----------------------------------------------------------------------------------------

export type GrpoHyperparameters = z.output<typeof GrpoHyperparametersSchema>;
export type GrpoItemInput = z.input<typeof GrpoItemSchema>;
export type GrpoItem = z.output<typeof GrpoItemSchema>;
export type GrpoBatchInput = z.input<typeof GrpoBatchSchema>;
export type GrpoBatch = z.output<typeof GrpoBatchSchema>;
export type UpdatePolicyInputArgs = z.input<typeof UpdatePolicyInputSchema>;
export type UpdatePolicyInput = z.output<typeof UpdatePolicyInputSchema>;
export type UpdatePolicyOutput = z.output<typeof UpdatePolicyOutputSchema>;
/** What a learner (or a fake one) may answer: the statistics are optional on the wire. */
export type UpdatePolicyOutputWire = z.input<typeof UpdatePolicyOutputSchema>;
export type DpoHyperparameters = z.output<typeof DpoHyperparametersSchema>;
export type DpoBatchInput = z.input<typeof DpoBatchSchema>;
export type DpoBatch = z.output<typeof DpoBatchSchema>;
export type UpdateDpoInputArgs = z.input<typeof UpdateDpoInputSchema>;
export type UpdateDpoInput = z.output<typeof UpdateDpoInputSchema>;
export type UpdateDpoOutput = z.output<typeof UpdateDpoOutputSchema>;
export type SampleActionsInputArgs = z.input<typeof SampleActionsInputSchema>;
export type SampleActionsInput = z.output<typeof SampleActionsInputSchema>;
export type LearnerCompletion = z.output<typeof CompletionSchema>;
export type SampleActionsOutput = z.output<typeof SampleActionsOutputSchema>;

/** Every schema of the contract under its pydantic name, in the order payloads.py declares them. */
export const LEARNER_SCHEMAS = {
  TextPart: TextPartSchema,
  ImagePart: ImagePartSchema,
  PromptPart: PromptPartSchema,
  PromptMessage: PromptMessageSchema,
  Prompt: PromptSchema,
  SampledTokens: SampledTokensSchema,
  PromptTokenIds: PromptTokenIdsSchema,
  GrpoHyperparameters: GrpoHyperparametersSchema,
  GrpoItem: GrpoItemSchema,
  GrpoBatch: GrpoBatchSchema,
  UpdatePolicyInput: UpdatePolicyInputSchema,
  UpdatePolicyOutput: UpdatePolicyOutputSchema,
  DpoHyperparameters: DpoHyperparametersSchema,
  DpoPair: DpoPairSchema,
  DpoBatch: DpoBatchSchema,
  UpdateDpoInput: UpdateDpoInputSchema,
  UpdateDpoOutput: UpdateDpoOutputSchema,
  SampleActionsInput: SampleActionsInputSchema,
  Completion: CompletionSchema,
  SampleActionsOutput: SampleActionsOutputSchema,
} as const;

/** "items.0.tokens_ref: not a blob reference; …": a zod error in one line, first few issues. */
export function describeZodError(err: z.ZodError, what: string, max = 5): string {
  const parts = err.issues.slice(0, max).map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`);
  const more = err.issues.length > max ? ` (and ${err.issues.length - max} more)` : '';
  return `invalid ${what}: ${parts.join('; ')}${more}`;
}
