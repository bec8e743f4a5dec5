import { ApplicationFailure } from '@temporalio/activity';
import type { BlobStore } from '../blob/store';
import type { SampledTokens, StepGroup } from '../lib/episode-types';
import { episodeGroup, groupsToBatchItems, stepGroupRewards, type GrpoRefItem, type BatchStepGroup } from '../lib/grpo';
import { anchorGroupAdvantages, mergeAnchorStats, type AnchorParams, type AnchorStats } from '../lib/anchor-groups';
import type { LearnerBatchActivities } from './learner-batches';

/** What the trajectory blob holds that the batch needs (written by `recordTrajectory`). */
interface TrajectoryForBatch {
  task: { env: string; task: string; seed: number };
  groups?: StepGroup[];
  steps: {
    promptRef: string;
    grammarRef?: string;
    completion: string;
    completionRef?: string;
    tokensRef?: string;
    tokenIds?: number[];
    logprobs?: number[];
    shaped: { total: number };
    /** The page the step acted from; its `stateKey` forms anchor groups (absent in older trajectories: never grouped). */
    observation?: { stateKey?: string };
  }[];
}

export interface BuildGrpoBatchInput {
  run_id: string;
  iteration: number;
  grouping: 'step' | 'episode' | 'anchor';
  /** Grouping `anchor`: the weights and discount (train.anchor); the schema defaults when absent. */
  anchor?: AnchorParams;
  trajectory_refs: string[];
  /**
   * The run's `policy.maxTokens`, recorded in the batch: dr_grpo divides by B × this constant, so a token weighs
   * the same in every batch of the run. Absent (older workflows): the learner falls back to the batch's longest
   * completion and logs it.
   */
  max_completion_len?: number | null;
}

export interface BuildGrpoBatchResult {
  batch_ref: string;
  items: number;
  /** Rewards of every group (step: candidates' shaped rewards; episode: rollouts' returns), for metrics. */
  group_rewards: number[][];
  /** Every group had equal rewards: the batch carries them with advantage 0 (KL only) to keep versions contiguous. */
  no_signal: boolean;
  /** Grouping `anchor`: the step-level groups found across the rollouts, for the metrics row. */
  anchor?: AnchorStats;
}

/** train.anchor's defaults (lib/config.ts), for a workflow that passes none. */
const ANCHOR_DEFAULTS: AnchorParams = { episodeWeight: 1, stepWeight: 1, discount: 0.95 };

/**
 * Builds one iteration's GRPO batch from its episodes' trajectories. Step grouping: each recorded step group
 * (N candidates from one state); episode grouping: the N rollouts of one task and seed, compared on their
 * shaped returns, every step of a rollout carrying its rollout's advantage; anchor grouping: the same rollouts,
 * plus a step term from equal states met across them. Only references cross Temporal.
 */
export function createGrpoBatchActivities(blobs: BlobStore, batches: LearnerBatchActivities) {
  async function completionRef(c: { completionRef?: string; completion?: string }): Promise<string> {
    return c.completionRef ?? blobs.put(c.completion ?? '', 'txt');
  }

  /** The sampler's tokens of a completion: from its blob (vLLM path) or inline (colocated path). */
  async function tokens(c: { tokensRef?: string; tokenIds?: number[]; logprobs?: number[] }): Promise<{ tokenIds: number[] | null; logprobs: number[] | null }> {
    if (c.tokensRef) {
      const t = await blobs.getJson<SampledTokens>(c.tokensRef);
      return { tokenIds: t.token_ids, logprobs: t.logprobs };
    }
    return { tokenIds: c.tokenIds ?? null, logprobs: c.logprobs ?? null };
  }

  async function stepGroups(trajs: TrajectoryForBatch[]): Promise<BatchStepGroup[]> {
    const out: BatchStepGroup[] = [];
    for (const t of trajs) {
      for (const g of t.groups ?? []) {
        const candidates = [];
        for (const c of g.candidates) {
          candidates.push({
            completionRef: await completionRef(c),
            ...(await tokens(c)),
            valid: c.valid,
            reward: c.reward,
          });
        }
        out.push({ promptRef: g.promptRef, ...(g.grammarRef ? { grammarRef: g.grammarRef } : {}), step: g.step, chosen: g.chosen, candidates });
      }
    }
    return out;
  }

  /**
   * Episode and anchor grouping: the rollouts of one task + seed form a group. Episode: every step of a rollout
   * carries the rollout's advantage. Anchor: each step's advantage adds a step term from the steps of the
   * group's rollouts that acted from the same state (lib/anchor-groups.ts).
   */
  async function episodeItems(
    trajs: TrajectoryForBatch[],
    anchor: AnchorParams | null,
  ): Promise<{ items: GrpoRefItem[]; groups: number[][]; anchor?: AnchorStats }> {
    const byTask = new Map<string, TrajectoryForBatch[]>();
    for (const t of trajs) {
      const key = `${t.task.env}/${t.task.task}/${t.task.seed}`;
      byTask.set(key, [...(byTask.get(key) ?? []), t]);
    }
    const items: GrpoRefItem[] = [];
    const groups: number[][] = [];
    const anchorParts: { stats: AnchorStats; steps: number }[] = [];
    for (const rollouts of byTask.values()) {
      const returns = rollouts.map((r) => r.steps.reduce((s, st) => s + st.shaped.total, 0));
      groups.push(returns);
      let advantages: number[][];
      if (anchor) {
        const a = anchorGroupAdvantages(
          rollouts.map((r) => ({ rewards: r.steps.map((st) => st.shaped.total), stateKeys: r.steps.map((st) => st.observation?.stateKey) })),
          anchor,
        );
        advantages = a.advantages;
        anchorParts.push({ stats: a.stats, steps: rollouts.reduce((s, r) => s + r.steps.length, 0) });
      } else {
        const e = episodeGroup(returns).advantages;
        advantages = rollouts.map((r, i) => r.steps.map(() => e[i]));
      }
      for (const [i, r] of rollouts.entries()) {
        for (const [k, st] of r.steps.entries()) {
          const t = await tokens(st);
          items.push({
            prompt_ref: st.promptRef,
            completion_ref: await completionRef(st),
            completion_token_ids: t.tokenIds && t.tokenIds.length ? t.tokenIds : null,
            old_logprobs: t.tokenIds && t.logprobs && t.logprobs.length === t.tokenIds.length ? t.logprobs : null,
            advantage: advantages[i][k],
            finish_reason: null,
            ...(st.grammarRef ? { grammar_ref: st.grammarRef } : {}),
          });
        }
      }
    }
    return { items, groups, ...(anchor ? { anchor: mergeAnchorStats(anchorParts) } : {}) };
  }

  return {
    async buildGrpoBatch(input: BuildGrpoBatchInput): Promise<BuildGrpoBatchResult> {
      if (input.trajectory_refs.length === 0) {
        throw ApplicationFailure.nonRetryable(`iteration ${input.iteration} of ${input.run_id} has no episodes to learn from`, 'EmptyIteration');
      }
      const trajs: TrajectoryForBatch[] = [];
      for (const ref of input.trajectory_refs) trajs.push(await blobs.getJson<TrajectoryForBatch>(ref));
      let items: GrpoRefItem[];
      let groupRewards: number[][];
      let groups: BatchStepGroup[] = [];
      let anchorStats: AnchorStats | undefined;
      if (input.grouping === 'step') {
        groups = await stepGroups(trajs);
        items = groupsToBatchItems(groups);
        groupRewards = groups.map(stepGroupRewards);
      } else {
        const e = await episodeItems(trajs, input.grouping === 'anchor' ? (input.anchor ?? ANCHOR_DEFAULTS) : null);
        items = e.items.filter((it) => it.advantage !== 0);
        groupRewards = e.groups;
        anchorStats = e.anchor;
        if (items.length === 0) items = e.items;
      }
      let noSignal = false;
      if (items.length === 0) {
        // Every group had equal rewards. The update still runs (KL only, advantage 0) so that adapter versions
        // advance once per iteration and a run's version is its iteration count.
        noSignal = true;
        items = groups.flatMap((g) =>
          g.candidates.map((c) => ({
            prompt_ref: g.promptRef,
            completion_ref: c.completionRef,
            completion_token_ids: c.tokenIds && c.tokenIds.length ? c.tokenIds : null,
            old_logprobs: null,
            advantage: 0,
            finish_reason: null,
            ...(g.grammarRef ? { grammar_ref: g.grammarRef } : {}),
          })),
        );
      } else if (input.grouping !== 'step') {
        noSignal = items.every((it) => it.advantage === 0);
      }
      if (items.length === 0) {
        throw ApplicationFailure.nonRetryable(`iteration ${input.iteration} of ${input.run_id} produced no samples`, 'EmptyIteration');
      }
      const batch_ref = await batches.writeGrpoBatch({ items, max_completion_len: input.max_completion_len ?? null });
      return { batch_ref, items: items.length, group_rewards: groupRewards, no_signal: noSignal, ...(anchorStats ? { anchor: anchorStats } : {}) };
    },
  };
}

export type GrpoBatchActivities = ReturnType<typeof createGrpoBatchActivities>;
