import { z } from 'zod';
import type { AgentAction } from '../model-io/actions';
import type { RewardBreakdown } from '../rewards/types';

/**
 * The experience contract: what the training loop learns from, declared once. Episodes write it (the trajectory
 * blob of `recordTrajectory`, with its step groups), the batch builders read it (GRPO step, episode and anchor
 * grouping; MCTS's DPO pairs), the viewer and `halo export` show it. The TypeScript types are inferred from
 * these schemas; what crosses to the Python learner (the prompt, the sampler's tokens, the DPO pair) is
 * generated into `workers/learner/halo_learner/payloads.py` from these schemas (through lib/training/learner-types.ts,
 * `npx halo learner-schema --write`).
 *
 * Model output always travels with the sampler's token reference (`tokensRef`, a `SampledTokens` blob), never
 * with the token ids inline: N × maxTokens ids and log-probs would swell every history and batch that carried
 * them, and the learner reads the blob itself. A sampled completion is one record (`Completion`) wherever it goes;
 * the shapes written before it are read by lib/training/completion.ts and lib/training/stored-trajectory.ts.
 */

/** Same pattern as `blob/store.ts` and `halo_learner/blobs.py`. */
export const BLOB_REF = /^sha256:[0-9a-f]{64}\.[a-z0-9]{1,8}$/;

const finite = z.number(); // zod 4 rejects NaN and ±Infinity for z.number()
const int = z.number().int();
export const blobRefSchema = z.string().regex(BLOB_REF, 'not a blob reference (sha256:<64 hex>.<ext>)');

// ---- what the model saw: the prompt (written by lib/model-io/prompt.ts) -------------------------------------

export const TextPartSchema = z.strictObject({ type: z.literal('text'), text: z.string() });
export const ImagePartSchema = z.strictObject({ type: z.literal('image'), ref: z.string().regex(BLOB_REF) });
export const PromptPartSchema = z.discriminatedUnion('type', [TextPartSchema, ImagePartSchema]);
export const PromptMessageSchema = z.strictObject({
  role: z.enum(['system', 'user', 'assistant']),
  content: z.array(PromptPartSchema).min(1),
});
export const PromptSchema = z.array(PromptMessageSchema).min(1);

// ---- what the model said: the sampler's tokens -----------------------------------------------------

/**
 * The blob behind a `tokensRef`: the sampler's token ids (end-of-turn token included) and the log-prob of each
 * (vLLM with `--logprobs-mode processed_logprobs`, or the colocated sampler: after temperature). The learner
 * reads it to train on exactly the sampled tokens; a blob that breaks this schema fails the update.
 */
export const SampledTokensSchema = z
  .strictObject({
    token_ids: z.array(int.min(0)).min(1),
    /**
     * Null when the server gave ids without log-probs: the learner then uses its own (ratio 1). A null entry is one
     * unknown log-prob (vLLM's -9999 placeholder, or none reported): the learner uses its own there, counted.
     */
    logprobs: z.array(finite.nullable()).nullable().default(null),
    /** Written by the colocated sampler: the grammar the tokens were sampled under (constrained decoding). */
    grammar_ref: z.string().nullable().default(null),
    /** The served request's prompt token ids, a `{"prompt_token_ids": [...]}` blob (vLLM's top-level `prompt_token_ids`). */
    prompt_ref: blobRefSchema.nullable().default(null),
  })
  .superRefine((t, ctx) => {
    if (t.logprobs !== null && t.logprobs.length !== t.token_ids.length) {
      ctx.addIssue({ code: 'custom', path: ['logprobs'], message: `logprobs has ${t.logprobs.length} entries but token_ids has ${t.token_ids.length}` });
    }
  });

/** The blob behind a `SampledTokens` `prompt_ref`: the served request's prompt token ids (vLLM's top-level `prompt_token_ids`). */
export const PromptTokenIdsSchema = z.strictObject({ prompt_token_ids: z.array(int.min(0)).min(1) });

// ---- where: the task and the pages --------------------------------------------------------------------

export const TaskRefSchema = z.object({ env: z.enum(['miniwob', 'real']), task: z.string(), seed: int });

/** A page as the episode saw it: references only (screenshot and accessibility tree are blobs). */
export const ObservationRefSchema = z.object({
  goal: z.string(),
  url: z.string(),
  step: int,
  width: finite,
  height: finite,
  screenshotRef: z.string(),
  axtreeRef: z.string(),
  /** Hash of the page state used by reward shaping (new-state and loop terms) and anchor grouping. */
  stateKey: z.string(),
});

/** The part of an observation a step record keeps (the goal is kept once per episode). */
export const StepObservationRefSchema = ObservationRefSchema.pick({ url: true, step: true, screenshotRef: true, axtreeRef: true }).extend({
  /** The state key of the page the step acted from (GRPO anchor grouping matches steps on it). */
  stateKey: z.string().optional(),
});

/** A page in the trajectory blob: the full observation, with what older writers left out optional. */
export const TrajectoryObservationSchema = ObservationRefSchema.partial({ goal: true, width: true, height: true, stateKey: true });

// ---- rewards and actions (declared in lib/rewards/types.ts and lib/model-io/actions.ts; checked here) ------------

export const RewardBreakdownSchema: z.ZodType<RewardBreakdown> = z.object({
  total: finite,
  terms: z.array(z.object({ term: z.string(), value: finite, detail: z.string().optional() })),
});

/** A step's dense reward for payloads and the UI: `+0.1 valid, +1 env reward, +10 task success = 11.1`. */
export const ShapedSummarySchema = z.object({ total: finite, summary: z.string() });

/** Any action, valid or not: the parser's output is kept as it was, whatever today's action schema says. */
const agentActionSchema = z.custom<AgentAction>(
  (v) => typeof v === 'object' && v !== null && typeof (v as { type?: unknown }).type === 'string',
  'expected an action ({type, ...})',
);

// ---- a completion: what the sampler drew and the parser made of it ----------------------------------------

/**
 * One sampled completion, carried whole from the sampler to the learner's batch: by the step record, the group
 * candidate, the trajectory and the search tree's node alike (lib/training/completion.ts reads the flat shapes
 * older histories and blobs hold). The text and the tokens go by reference; the learner's batch is the one place
 * they are inlined.
 */
export const CompletionSchema = z.object({
  /** The whole text (a `.txt` blob); absent when the rollout is never trained on, or for an old inline text. */
  ref: z.string().optional(),
  /** The first characters; the whole text where there is no `ref` (a text an old history held inline). */
  preview: z.string(),
  /** The sampler's tokens (a `SampledTokens` blob); absent when the server gave none (the learner retokenises). */
  tokensRef: blobRefSchema.optional(),
  /**
   * The sampler's `finish_reason` (`stop`, `length`, ...): `length` means the text has no end-of-turn token, which
   * a retokenised completion must then not get. Null where the sampler did not say.
   */
  finishReason: z.string().nullable(),
  /** Sum of the sampler's log-probs (MCTS keeps it as the DPO reference log-prob without reading the tokens). */
  logprobSum: finite.optional(),
  /** The parser's action, kept as it was whatever today's action schema says. */
  action: agentActionSchema,
  /** The action parsed into one the environment takes. */
  valid: z.boolean(),
});

// ---- step groups (GRPO step grouping) -----------------------------------------------------------------

/** One candidate of a step group: its completion, and its shaped reward from the group's shared state. */
export const GroupCandidateSchema = z.object({ completion: CompletionSchema, reward: finite });

/** N candidates sampled at one state, each scored from that state; the episode continued from `chosen`. */
export const StepGroupSchema = z.object({
  promptRef: z.string(),
  /** Constrained decoding: the grammar blob the candidates were sampled under. */
  grammarRef: z.string().optional(),
  step: int,
  candidates: z.array(GroupCandidateSchema).min(1),
  chosen: int.min(0),
  /** Dynamic sampling grew the group: its first `firstDraw` candidates are the step's own draw, the rest extra draws. */
  firstDraw: int.min(1).optional(),
});

// ---- the episode workflow's step record -------------------------------------------------------------

/** One step as the episode workflow keeps it (and shows it in its progress query). */
export const StepRecordSchema = z.object({
  step: int,
  observation: StepObservationRefSchema,
  /** The prompt the action was sampled from (GRPO episode grouping trains on it). */
  promptRef: z.string(),
  /** Constrained decoding: the grammar blob the action was sampled under. */
  grammarRef: z.string().optional(),
  completion: CompletionSchema,
  /** The environment's own reward. */
  reward: finite,
  /** The dense reward the learner sees, with the terms that fired. */
  shaped: ShapedSummarySchema,
  /** Kept only for outputs that never reached the browser (their breakdown exists nowhere else). */
  breakdown: RewardBreakdownSchema.optional(),
  done: z.boolean(),
  url: z.string(),
  actionError: z.string().optional(),
  resultRef: z.string().optional(),
});

// ---- recordTrajectory: its input and the blob it writes ---------------------------------------------

/** One step as the trajectory activity receives it: references, plus the little that exists nowhere else. */
/**
 * A completion as the episode hands it to `recordTrajectory`, the largest input of an episode's history: without its
 * preview where a blob holds the text, and without its action where the step's result blob holds it (the activity
 * takes both from there).
 */
export const CompletionInputSchema = CompletionSchema.partial({ preview: true, action: true });

export const TrajectoryStepInputSchema = z.object({
  step: int,
  promptRef: z.string(),
  grammarRef: z.string().optional(),
  completion: CompletionInputSchema,
  /** The browser step's result blob (valid actions). */
  resultRef: z.string().optional(),
  /** Shaped reward of an output that never reached the browser (invalid actions). */
  shaped: RewardBreakdownSchema.optional(),
});

export const TrajectoryInputSchema = z.object({
  workflowId: z.string(),
  task: TaskRefSchema,
  policyModel: z.string(),
  initial: ObservationRefSchema,
  steps: z.array(TrajectoryStepInputSchema),
  groups: z.array(StepGroupSchema.extend({ candidates: z.array(z.object({ completion: CompletionInputSchema, reward: finite })).min(1) })).optional(),
  success: z.boolean(),
  reward: finite,
  reason: z.string().nullable(),
});

/** One step of the trajectory blob. */
export const TrajectoryStepSchema = z.object({
  step: int,
  promptRef: z.string(),
  grammarRef: z.string().optional(),
  /** The page the action was taken in; its `stateKey` forms anchor groups. */
  observation: TrajectoryObservationSchema,
  /** The model's output; its action is the one the environment ran (the result blob's), where it ran one. */
  completion: CompletionSchema,
  /** The shaped reward with the terms that fired. */
  shaped: RewardBreakdownSchema,
  /** The environment's own reward. */
  reward: finite,
  done: z.boolean(),
  actionError: z.string().optional(),
  /** The page after the step. */
  after: TrajectoryObservationSchema,
});

/** The trajectory blob `recordTrajectory` (activities/control.ts) writes at the end of every episode. */
export const TrajectorySchema = z.object({
  /** 2: steps and group candidates carry a `Completion`. Version 1 blobs are read by lib/training/stored-trajectory.ts. */
  version: z.literal(2),
  workflowId: z.string(),
  task: TaskRefSchema,
  policyModel: z.string(),
  groups: z.array(StepGroupSchema).optional(),
  success: z.boolean(),
  reward: finite,
  reason: z.string().nullable(),
  goal: z.string(),
  initial: TrajectoryObservationSchema,
  steps: z.array(TrajectoryStepSchema),
});

// ---- anchor groups (lib/training/anchor-groups.ts) ------------------------------------------------------------

/** One rollout as anchor grouping needs it, steps in order. */
export const AnchorRolloutSchema = z.object({
  /** Shaped reward of each step. */
  rewards: z.array(finite).readonly(),
  /**
   * Anchor key of the page each step acted from (`anchorStateKey`: filled text fields count by a hash of their
   * text, unlike the shaping `stateKey`). A missing key never matches anything: that step keeps only the
   * episode term.
   */
  stateKeys: z.array(z.string().nullable().optional()).readonly(),
});

// ---- DPO pairs (MCTS) ---------------------------------------------------------------------------------

const dpoPairScores = {
  /** The sampler's tokens of each completion, when the search sampled them (`SampledTokens` blobs). */
  chosen_tokens_ref: blobRefSchema.nullable().default(null),
  rejected_tokens_ref: blobRefSchema.nullable().default(null),
  /** Logged reference log-probs: accepted from older writers and not used (the reference is the base model). */
  ref_chosen_logprob: finite.nullable().default(null),
  ref_rejected_logprob: finite.nullable().default(null),
};

/** A step-level DPO pair as the learner takes it (one item of `update_dpo`'s batch): the prompt and texts inline. */
export const DpoPairSchema = z
  .strictObject({ prompt: PromptSchema, chosen: z.string(), rejected: z.string(), ...dpoPairScores })
  .refine((p) => (p.ref_chosen_logprob === null) === (p.ref_rejected_logprob === null), {
    message: 'give both ref_chosen_logprob and ref_rejected_logprob, or neither',
  });

/**
 * A DPO pair of a finished search as its pair blob holds it: the prompt and texts by reference (`writeDpoBatch`
 * resolves them into a `DpoPair`), plus where it came from in the tree. Blobs written before the token
 * references lack them.
 */
export const MctsPairSchema = z.object({
  prompt_ref: z.string(),
  chosen_ref: z.string(),
  rejected_ref: z.string(),
  chosen_tokens_ref: blobRefSchema.nullable().optional(),
  rejected_tokens_ref: blobRefSchema.nullable().optional(),
  ref_chosen_logprob: finite.nullable(),
  ref_rejected_logprob: finite.nullable(),
  delta_q: finite,
  chosen_q: finite,
  rejected_q: finite,
  /** Node ids: the parent state and the two children compared. */
  parent: int,
  chosen: int,
  rejected: int,
});

// ---- types ------------------------------------------------------------------------------------------------

export type LearnerPrompt = z.output<typeof PromptSchema>;
/** What a writer puts in a token blob (defaulted keys optional); readers parse it into `SampledTokensParsed`. */
export type SampledTokens = z.input<typeof SampledTokensSchema>;
export type SampledTokensParsed = z.output<typeof SampledTokensSchema>;
export type PromptTokenIds = z.infer<typeof PromptTokenIdsSchema>;
export type TaskRef = z.infer<typeof TaskRefSchema>;
export type ObservationRef = z.infer<typeof ObservationRefSchema>;
export type StepObservationRef = z.infer<typeof StepObservationRefSchema>;
export type TrajectoryObservation = z.infer<typeof TrajectoryObservationSchema>;
export type ShapedSummary = z.infer<typeof ShapedSummarySchema>;
export type Completion = z.infer<typeof CompletionSchema>;
export type CompletionInput = z.infer<typeof CompletionInputSchema>;
export type GroupCandidate = z.infer<typeof GroupCandidateSchema>;
export type StepGroup = z.infer<typeof StepGroupSchema>;
export type StepRecord = z.infer<typeof StepRecordSchema>;
export type TrajectoryStepInput = z.infer<typeof TrajectoryStepInputSchema>;
export type TrajectoryInput = z.infer<typeof TrajectoryInputSchema>;
export type TrajectoryStep = z.infer<typeof TrajectoryStepSchema>;
export type Trajectory = z.infer<typeof TrajectorySchema>;
export type AnchorRollout = z.infer<typeof AnchorRolloutSchema>;
export type DpoPairInput = z.input<typeof DpoPairSchema>;
export type DpoPair = z.output<typeof DpoPairSchema>;
export type MctsPair = z.infer<typeof MctsPairSchema>;
