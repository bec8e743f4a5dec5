import { clip, isValidAction, type AgentAction } from '../model-io/actions';
import type { Completion, CompletionInput } from './experience';

/**
 * The one reader of a sampled completion's older shapes. Before the completion record (`Completion`,
 * lib/training/experience.ts), a candidate's parts lay flat beside the step, group candidate or tree node that
 * carried it, under names that changed with the sampler (`completionRef` or the text inline as `completion`, the
 * tokens by `tokensRef` or inline as `tokenIds`/`logprobs`). Workflow histories and stored blobs of those days still
 * hold them: whatever reads an activity's result, a trajectory or a tree from before passes it through here, so the
 * live types carry no legacy field.
 *
 * Two old forms cannot be kept as they were, and what happens to them is said here once:
 *  - a text held inline, without a blob (histories from before parsing moved into an activity): the record keeps
 *    it whole as its `preview`, and a writer that needs a blob (the GRPO batch) stores the preview;
 *  - tokens held inline (colocated histories from before the learner stored them as blobs): their log-prob sum is
 *    kept (MCTS's DPO reference); the ids are dropped, and the learner retokenises that text (ratio 1) — only
 *    samples drawn before such an upgrade, replayed from history, are affected.
 */
export interface FlatCompletion {
  action?: AgentAction;
  preview?: string;
  /** The whole text as a blob. */
  completionRef?: string;
  /** The text inline (older histories), or a step record's first characters. */
  completion?: string;
  tokensRef?: string;
  tokenIds?: number[];
  logprobs?: number[];
  logprobSum?: number;
  finishReason?: string | null;
  valid?: boolean;
}

/** How many characters of a completion its record keeps as `preview`. */
export const PREVIEW_CHARS = 200;

/** An action an old group candidate did not record (groups kept only validity and reward then). */
export const UNRECORDED_ACTION: AgentAction = { type: 'unrecorded' } as unknown as AgentAction;

/**
 * The record as `recordTrajectory` takes it (`CompletionInput`): no preview where a blob holds the text, no action
 * where the step's result blob holds it (`ranAction`).
 */
export function leanCompletion(c: Completion, ranAction = false): CompletionInput {
  const { preview, action, ...rest } = c;
  return { ...rest, ...(c.ref ? {} : { preview }), ...(ranAction ? {} : { action }) };
}

/** Whether `c` is already a completion record (no flat field of the older shapes, a validity and a preview). */
export function isCompletion(c: unknown): c is Completion {
  if (typeof c !== 'object' || c === null) return false;
  const o = c as Record<string, unknown>;
  return typeof o.preview === 'string' && typeof o.valid === 'boolean' && !('completionRef' in o) && !('completion' in o) && !('tokenIds' in o);
}

/** A completion record from any shape a candidate was ever carried in. */
export function asCompletion(c: Completion | FlatCompletion): Completion {
  if (isCompletion(c)) return c;
  const f = c as FlatCompletion;
  const action = f.action ?? UNRECORDED_ACTION;
  const logprobSum = f.logprobSum ?? (f.logprobs?.length ? f.logprobs.reduce((s, x) => s + x, 0) : undefined);
  return {
    ...(f.completionRef ? { ref: f.completionRef } : {}),
    preview: f.completionRef ? clip(f.preview ?? f.completion ?? '', PREVIEW_CHARS) : (f.completion ?? f.preview ?? ''),
    ...(f.tokensRef ? { tokensRef: f.tokensRef } : {}),
    finishReason: f.finishReason ?? null,
    ...(logprobSum !== undefined ? { logprobSum } : {}),
    action,
    valid: f.valid ?? (f.action ? isValidAction(f.action) : false),
  };
}
