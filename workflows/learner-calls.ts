import type { Duration } from '@temporalio/common';
import { ApplicationFailure, proxyActivities, type ActivityOptions, type RetryPolicy } from '@temporalio/workflow';
import type { z } from 'zod';
import {
  SampleActionsInputSchema,
  SampleActionsOutputSchema,
  UpdateDpoInputSchema,
  UpdateDpoOutputSchema,
  UpdatePolicyInputSchema,
  UpdatePolicyOutputSchema,
  describeZodError,
  type SampleActionsInput,
  type SampleActionsInputArgs,
  type SampleActionsOutput,
  type UpdateDpoInput,
  type UpdateDpoInputArgs,
  type UpdateDpoOutput,
  type UpdatePolicyInput,
  type UpdatePolicyInputArgs,
  type UpdatePolicyOutput,
} from '../lib/training/learner-types';
import { LEARNER_RETRY, LEARNER_UPDATE_TIMEOUT } from './activity-profiles';
import { clipSummary } from '../lib/model-io/text';

// Workflow-safe: only @temporalio/workflow and zod (pure). The learner is the Python worker on the `gpu`
// task queue (workers/learner); its activities are called by name with one snake_case object each.

/** The activities of `halo_learner.activities.LearnerActivities`, by their registered names. */
export interface LearnerActivityFns {
  update_policy(input: UpdatePolicyInput): Promise<unknown>;
  update_dpo(input: UpdateDpoInput): Promise<unknown>;
  sample_actions(input: SampleActionsInput): Promise<unknown>;
}

export interface LearnerProxyOptions {
  /** Task queue of the learner worker (env HALO_GPU_QUEUE on its side); default `gpu`. */
  taskQueue?: string;
  /** One update on the 8B takes minutes; default 2 h. */
  startToCloseTimeout?: Duration;
  /** The learner heartbeats per completion chunk and per group; default 60 s (see workers/learner/README.md). */
  heartbeatTimeout?: Duration;
  /** Unset by default: a call waits in the queue until a learner polls it (start it later, nothing is lost). */
  scheduleToCloseTimeout?: Duration;
  /** Out of GPU memory and a lost worker are retried; bad payloads and missing parents are non-retryable. */
  retry?: RetryPolicy;
  summary?: string;
}

/**
 * Typed learner calls from workflow code. Inputs are validated (and their defaults filled in, so the
 * history shows the exact hyperparameters) before they are scheduled; answers are validated before they
 * are returned. A payload that breaks the contract fails the workflow with a non-retryable
 * `LearnerContractViolation` naming the field, rather than a workflow task that fails forever.
 */
export function learnerActivities(opts: LearnerProxyOptions = {}) {
  const options: ActivityOptions = {
    taskQueue: opts.taskQueue ?? 'gpu',
    startToCloseTimeout: opts.startToCloseTimeout ?? LEARNER_UPDATE_TIMEOUT,
    heartbeatTimeout: opts.heartbeatTimeout ?? '60s',
    retry: opts.retry ?? LEARNER_RETRY,
    ...(opts.scheduleToCloseTimeout !== undefined ? { scheduleToCloseTimeout: opts.scheduleToCloseTimeout } : {}),
    ...(opts.summary !== undefined ? { summary: clipSummary(opts.summary) } : {}),
  };
  const acts = proxyActivities<LearnerActivityFns>(options);
  return {
    /** GRPO (`dr_grpo`) update: adapter v<version> from v<version-1>; idempotent per (run_id, version). */
    async updatePolicy(input: UpdatePolicyInputArgs): Promise<UpdatePolicyOutput> {
      const inp = checked(UpdatePolicyInputSchema, input, 'update_policy input');
      return checked(UpdatePolicyOutputSchema, await acts.update_policy(inp), 'update_policy result');
    },
    /** Step-level DPO update: adapter v<version> from v<version-1>; idempotent per (run_id, version). */
    async updateDpo(input: UpdateDpoInputArgs): Promise<UpdateDpoOutput> {
      const inp = checked(UpdateDpoInputSchema, input, 'update_dpo input');
      return checked(UpdateDpoOutputSchema, await acts.update_dpo(inp), 'update_dpo result');
    },
    /** Colocated sampling: n completions of one prompt with adapter v<version> (0 = base model). */
    async sampleActions(input: SampleActionsInputArgs): Promise<SampleActionsOutput> {
      const inp = checked(SampleActionsInputSchema, input, 'sample_actions input');
      return checked(SampleActionsOutputSchema, await acts.sample_actions(inp), 'sample_actions result');
    },
  };
}

export type LearnerClient = ReturnType<typeof learnerActivities>;

/** Parse with a contract schema; a mismatch is a permanent, clearly named workflow failure. */
export function checked<S extends z.ZodType>(schema: S, value: unknown, what: string): z.output<S> {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  throw ApplicationFailure.create({
    message: describeZodError(r.error, what),
    type: 'LearnerContractViolation',
    nonRetryable: true,
  });
}
