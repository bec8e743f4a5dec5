import { wantsTokenIds } from '../activities/policy-client';
import type { PolicyConfig } from '../lib/config/config';
import type { SamplingPolicyConfig } from '../lib/episode/episode-types';

/**
 * The policy of samples nobody trains on (a single episode, an evaluation): when it asks a served policy for token
 * ids, it goes on without them where the server gives none. Training runs never pass through here, so their rule
 * stays: no ids, no run (`policy.tokenIds`).
 */
export function withOptionalTokenIds(policy: PolicyConfig): SamplingPolicyConfig {
  return policy.backend === 'openai' && wantsTokenIds(policy) ? { ...policy, tokenIdsOptional: true } : policy;
}

/** The line said once when episodes went on without token ids; undefined when none did. */
export function tokenIdsNote(missing: number, steps: number): string | undefined {
  if (missing <= 0) return undefined;
  return `the policy server gave no token ids for ${missing} of ${steps} steps; sampling went on without them (a training run needs them: serve with vLLM, or set policy.tokenIds: off to train on retokenised text)`;
}
