import { ApplicationFailure } from '@temporalio/activity';
import { BlobNotFoundError, type BlobStore } from '../blob/store';
import type { Completion, Trajectory } from '../lib/training/experience';
import { readTrajectory } from '../lib/training/stored-trajectory';
import { describeZodError } from '../lib/training/learner-types';
import {
  dynamicSamplingStats,
  episodeGroup,
  groupsToBatchItems,
  grpoRefItem,
  stepGroupRewards,
  type BatchStepGroup,
  type DynamicSamplingStats,
  type GrpoRefItem,
} from '../lib/training/grpo';
import { anchorGroupAdvantages, anchorRollout, mergeAnchorStats, type AnchorParams, type AnchorStats } from '../lib/training/anchor-groups';
import type { LearnerBatchActivities } from './learner-batches';

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
  /** train.dynamicSampling is on: report what it did (`dynamic`) even in an iteration where no group drew more. */
  dynamic_sampling?: boolean;
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
  /** Step grouping with train.dynamicSampling: the groups that drew more, and the zero-std share before they did. */
  dynamic?: DynamicSamplingStats;
}

/** train.anchor's defaults (lib/config/config.ts), for a workflow that passes none. */
const ANCHOR_DEFAULTS: AnchorParams = { episodeWeight: 1, stepWeight: 1, discount: 0.95 };

/**
 * Builds one iteration's GRPO batch from its episodes' trajectories. Step grouping: each recorded step group
 * (N candidates from one state); episode grouping: the N rollouts of one task and seed, compared on their
 * shaped returns, every step of a rollout carrying its rollout's advantage; anchor grouping: the same rollouts,
 * plus a step term from equal states met across them. Only references cross Temporal.
 */
export function createGrpoBatchActivities(blobs: BlobStore, batches: LearnerBatchActivities) {
  /** A trajectory blob of any version (lib/training/stored-trajectory.ts), checked: a bad one fails the batch, naming the field. */
  async function trajectory(ref: string): Promise<Trajectory> {
    let value: unknown;
    try {
      value = await blobs.getJson(ref);
    } catch (err) {
      if (err instanceof BlobNotFoundError) throw ApplicationFailure.create({ message: err.message, type: 'BlobNotFound', nonRetryable: true });
      if (err instanceof SyntaxError) throw invalidTrajectory(`trajectory ${ref} is not JSON (${err.message})`);
      throw err; // I/O trouble: let Temporal retry
    }
    const parsed = await readTrajectory(value, (tokens) => blobs.putJson(tokens));
    if (!parsed.success) throw invalidTrajectory(describeZodError(parsed.error, `trajectory ${ref}`));
    return parsed.data;
  }

  /** The record with its text by reference: a text an old history held inline is stored here. */
  async function withRef(c: Completion): Promise<Completion & { ref: string }> {
    return c.ref ? (c as Completion & { ref: string }) : { ...c, ref: await blobs.put(c.preview, 'txt') };
  }

  /**
   * The accessibility trees the rollouts' steps acted from (anchor keys are computed from them), by reference.
   * A trajectory names its trees, so they outlive it in the store; a missing one fails the batch.
   */
  async function axtrees(rollouts: Trajectory[]): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (const r of rollouts) {
      for (const st of r.steps) {
        const ref = st.observation.axtreeRef;
        if (out.has(ref)) continue;
        try {
          out.set(ref, (await blobs.get(ref)).toString('utf8'));
        } catch (err) {
          if (!(err instanceof BlobNotFoundError)) throw err;
          const message = `anchor grouping needs the accessibility tree of step ${st.step} of ${r.workflowId}: ${err.message}`;
          throw ApplicationFailure.create({ message, type: 'BlobNotFound', nonRetryable: true });
        }
      }
    }
    return out;
  }

  async function stepGroups(trajs: Trajectory[]): Promise<BatchStepGroup[]> {
    const out: BatchStepGroup[] = [];
    for (const t of trajs) {
      for (const g of t.groups ?? []) {
        const candidates = [];
        for (const c of g.candidates) candidates.push({ completion: await withRef(c.completion), reward: c.reward });
        out.push({
          promptRef: g.promptRef,
          ...(g.grammarRef ? { grammarRef: g.grammarRef } : {}),
          step: g.step,
          chosen: g.chosen,
          ...(g.firstDraw ? { firstDraw: g.firstDraw } : {}),
          candidates,
        });
      }
    }
    return out;
  }

  /**
   * Episode and anchor grouping: the rollouts of one task + seed form a group. Episode: every step of a rollout
   * carries the rollout's advantage. Anchor: each step's advantage adds a step term from the steps of the
   * group's rollouts that acted from the same state (lib/training/anchor-groups.ts).
   */
  async function episodeItems(trajs: Trajectory[], anchor: AnchorParams | null): Promise<{ items: GrpoRefItem[]; groups: number[][]; anchor?: AnchorStats }> {
    const byTask = new Map<string, Trajectory[]>();
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
        const trees = await axtrees(rollouts);
        const a = anchorGroupAdvantages(
          rollouts.map((r) => anchorRollout(r, (ref) => trees.get(ref)!)),
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
          items.push(grpoRefItem(st, await withRef(st.completion), advantages[i][k]));
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
      const trajs: Trajectory[] = [];
      for (const ref of input.trajectory_refs) trajs.push(await trajectory(ref));
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
        items = groups.flatMap((g) => g.candidates.map((c) => grpoRefItem(g, c.completion, 0)));
      } else if (input.grouping !== 'step') {
        noSignal = items.every((it) => it.advantage === 0);
      }
      if (items.length === 0) {
        throw ApplicationFailure.nonRetryable(`iteration ${input.iteration} of ${input.run_id} produced no samples`, 'EmptyIteration');
      }
      const batch_ref = await batches.writeGrpoBatch({ items, max_completion_len: input.max_completion_len ?? null });
      const dynamic = input.dynamic_sampling || groups.some((g) => g.firstDraw) ? { dynamic: dynamicSamplingStats(groups) } : {};
      return { batch_ref, items: items.length, group_rewards: groupRewards, no_signal: noSignal, ...(anchorStats ? { anchor: anchorStats } : {}), ...dynamic };
    },
  };
}

export type GrpoBatchActivities = ReturnType<typeof createGrpoBatchActivities>;

function invalidTrajectory(message: string): ApplicationFailure {
  return ApplicationFailure.create({ message, type: 'InvalidTrajectory', nonRetryable: true });
}
