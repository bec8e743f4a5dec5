import type { HaloConfig } from '../config/config';
import { fnv1a32 } from '../rewards/shaping';

/** The algorithms the training engine runs (workflows/train-engine.ts), by their config section. */
export type TrainingMode = 'grpo' | 'mcts';

/**
 * What the one training loop reads from a run's config, whichever section holds it (`train` for GRPO, `mcts`
 * for Agent Q): how many iterations, which tasks, the held-out evaluation, pipelining and serving. The
 * algorithm's own hyperparameters stay in its section and are read by its descriptor only.
 */
export interface TrainingPlan {
  runId: string;
  iterations: number;
  tasks: string[];
  parallelism: number;
  /** Greedy evaluation tasks; MCTS runs without heldOutTasks evaluate on their training tasks (as they always did). */
  evalTasks: string[];
  /** Fixed evaluation seeds (every task × every seed); absent: one seed per task, drawn per iteration. */
  evalSeeds?: number[];
  evalEvery: number;
  evalEverySteps: number;
  maxStaleness: number;
  /** How episodes (searches) reach updates: whole iterations, or a stream (train.rollout, mcts.rollout). */
  rollout: 'iterations' | 'stream';
  /** Units (groups' episodes or searches) an update learns from: an iteration's worth. */
  batchUnits: number;
  /** train.rollout stream: fresh-session attempts per episode and updates per workflow run. */
  stream?: { episodeRetries: number; updatesPerRun: number };
  vllmBaseUrl?: string;
  /** Source of tasks and seeds: the run id, or `seed-<seed>`. */
  pickKey: string;
  maxFailedShare: number;
  /** The config key of that share, for the error that stops a run past it. */
  maxFailedShareKey: string;
}

export function trainingPlan(cfg: HaloConfig, mode: TrainingMode): TrainingPlan {
  if (mode === 'grpo') {
    const t = cfg.train;
    return {
      runId: t.runId,
      iterations: t.iterations,
      tasks: t.tasks,
      parallelism: t.parallelism,
      evalTasks: t.heldOutTasks,
      ...(t.evalSeeds ? { evalSeeds: t.evalSeeds } : {}),
      evalEvery: t.evalEvery,
      evalEverySteps: t.evalEverySteps,
      maxStaleness: t.maxStaleness,
      rollout: t.rollout,
      batchUnits: t.episodesPerIteration,
      ...(t.rollout === 'stream' ? { stream: { episodeRetries: t.stream.episodeRetries, updatesPerRun: t.stream.updatesPerRun } } : {}),
      ...(t.vllmBaseUrl ? { vllmBaseUrl: t.vllmBaseUrl } : {}),
      pickKey: t.seed === undefined ? t.runId : `seed-${t.seed}`,
      maxFailedShare: t.maxFailedEpisodeShare,
      maxFailedShareKey: 'train.maxFailedEpisodeShare',
    };
  }
  const m = cfg.mcts;
  return {
    runId: m.runId,
    iterations: m.iterations,
    tasks: m.tasks,
    parallelism: m.parallelism,
    evalTasks: m.heldOutTasks.length > 0 ? m.heldOutTasks : m.tasks,
    evalSeeds: m.evalSeeds,
    evalEvery: m.evalEvery,
    evalEverySteps: m.evalEverySteps,
    maxStaleness: m.maxStaleness,
    rollout: m.rollout,
    batchUnits: m.tasks.length * m.searchesPerTask,
    ...(m.rollout === 'stream' ? { stream: { episodeRetries: m.stream.episodeRetries, updatesPerRun: m.stream.updatesPerRun } } : {}),
    ...(m.vllmBaseUrl ? { vllmBaseUrl: m.vllmBaseUrl } : {}),
    pickKey: m.seed === undefined ? m.runId : `seed-${m.seed}`,
    maxFailedShare: m.maxFailedSearchShare,
    maxFailedShareKey: 'mcts.maxFailedSearchShare',
  };
}

export interface TaskPick {
  task: string;
  seed: number;
}

/**
 * What seeds the draws of episode (or search) j of an iteration: the pick key (the run's seed, else its id), so two
 * runs of one config and seed sample alike whatever their run ids, as they already play the same tasks.
 */
export function drawKey(pickKey: string, iteration: number, j: number | string): string {
  return `${pickKey}-it${iteration}-${j}`;
}

/** Deterministic task and seed for episode j of an iteration: the pick key and the iteration are the seed. */
export function pickTasks(tasks: readonly string[], count: number, pickKey: string, iteration: number): TaskPick[] {
  return Array.from({ length: count }, (_, j) => {
    const h = parseInt(fnv1a32(`${pickKey}:${iteration}:${j}`), 16);
    return { task: tasks[h % tasks.length], seed: h % 100_000 };
  });
}

/**
 * The greedy evaluation's episodes of an iteration: every evaluation task with every fixed seed (the same
 * episodes each time, so iterations compare), or, without fixed seeds, one pick per task drawn from the
 * iteration (how GRPO runs have always evaluated).
 */
export function evaluationPicks(plan: Pick<TrainingPlan, 'evalTasks' | 'evalSeeds' | 'pickKey'>, iteration: number): TaskPick[] {
  if (plan.evalSeeds) return plan.evalTasks.flatMap((task) => plan.evalSeeds!.map((seed) => ({ task, seed })));
  return pickTasks(plan.evalTasks, plan.evalTasks.length, `${plan.pickKey}-eval`, iteration);
}
