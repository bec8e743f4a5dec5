import { z } from 'zod';
import type { AgentAction } from '../model-io/actions';
import { asCompletion, type FlatCompletion } from './completion';
import { StepGroupSchema, TrajectorySchema, TrajectoryStepSchema, blobRefSchema, type Completion, type SampledTokens, type StepGroup, type Trajectory } from './experience';

/**
 * Trajectory blobs as stored, any version, read into today's `Trajectory`. Version 1 (before the completion record)
 * kept each step's and group candidate's completion flat, the text inline, and in early runs the sampler's tokens
 * inline too: a reader given a blob writer stores those tokens as a `SampledTokens` blob, so the learner trains on
 * them as sampled (see lib/training/completion.ts for the rest of the upgrade).
 */

const finite = z.number();
const flatCompletion = {
  completionRef: z.string().optional(),
  completion: z.string().optional(),
  tokensRef: blobRefSchema.optional(),
  tokenIds: z.array(z.number().int()).optional(),
  logprobs: z.array(finite).optional(),
  finishReason: z.string().nullable().optional(),
};
const anyAction = z.custom<AgentAction>((v) => typeof v === 'object' && v !== null && typeof (v as { type?: unknown }).type === 'string', 'expected an action ({type, ...})');

const V1GroupSchema = StepGroupSchema.extend({
  candidates: z.array(z.object({ ...flatCompletion, valid: z.boolean(), reward: finite })).min(1),
});

/** Version 1: today's envelope, with flat completions in the steps and group candidates. */
const V1TrajectorySchema = TrajectorySchema.extend({
  version: z.literal(1),
  groups: z.array(V1GroupSchema).optional(),
  steps: z.array(TrajectoryStepSchema.omit({ completion: true }).extend({ ...flatCompletion, completion: z.string(), action: anyAction, valid: z.boolean() })),
});

/** Stores a `SampledTokens` value; returns its blob reference. */
export type TokensWriter = (tokens: SampledTokens) => Promise<string>;

/** The sampler's tokens a version-1 entry held inline, as a `SampledTokens` value (null without ids). */
export function inlineTokens(c: { tokenIds?: number[]; logprobs?: number[] }): SampledTokens | null {
  if (!c.tokenIds?.length) return null;
  const paired = c.logprobs && c.logprobs.length === c.tokenIds.length;
  return { token_ids: c.tokenIds, logprobs: paired ? c.logprobs! : null };
}

async function upgraded(c: FlatCompletion, putTokens: TokensWriter | null): Promise<Completion> {
  const out = asCompletion(c);
  const inline = !c.tokensRef && putTokens ? inlineTokens(c) : null;
  return inline ? { ...out, tokensRef: await putTokens!(inline) } : out;
}

export type TrajectoryRead = { success: true; data: Trajectory } | { success: false; error: z.ZodError };

/** A stored trajectory of any version as today's shape; without `putTokens`, inline tokens of version 1 are dropped. */
export async function readTrajectory(value: unknown, putTokens: TokensWriter | null): Promise<TrajectoryRead> {
  if ((value as { version?: unknown } | null)?.version !== 1) {
    const parsed = TrajectorySchema.safeParse(value);
    return parsed.success ? { success: true, data: parsed.data } : { success: false, error: parsed.error };
  }
  const v1 = V1TrajectorySchema.safeParse(value);
  if (!v1.success) return { success: false, error: v1.error };
  const { groups: v1Groups, steps: v1Steps, ...t } = v1.data;
  const groups: StepGroup[] = [];
  for (const { candidates: flat, ...g } of v1Groups ?? []) {
    const candidates = [];
    for (const c of flat) candidates.push({ completion: await upgraded(c, putTokens), reward: c.reward });
    groups.push({ ...g, candidates });
  }
  const steps = [];
  for (const st of v1Steps) {
    const { completionRef, completion, tokensRef, tokenIds, logprobs, finishReason, action, valid, ...rest } = st;
    const flat: FlatCompletion = { completionRef, completion, tokensRef, tokenIds, logprobs, finishReason, action, valid };
    steps.push({ ...rest, completion: await upgraded(flat, putTokens) });
  }
  return { success: true, data: { ...t, version: 2, ...(v1Groups ? { groups } : {}), steps } };
}
