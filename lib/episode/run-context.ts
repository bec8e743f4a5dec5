import type { HaloConfig } from '../config/config';
import type { EnvOptions, RealScoring } from './episode-types';
import type { RewardWeights } from '../rewards/weights';

/**
 * What every episode and search of a run needs besides its task and policy: where its activities go, how
 * long a lost session or learner is waited for, and how the environment rewards. One object, built once from
 * the config, instead of the same fields threaded through each workflow input.
 */
export interface RunContext {
  runId: string;
  browserTaskQueue: string;
  gpuTaskQueue: string;
  learnerHeartbeatTimeoutMs: number;
  maxSessionRebuilds: number;
  sessionStartTimeoutMs: number;
  heartbeatTimeoutMs: number;
  rewardWeights?: RewardWeights;
  envOptions?: EnvOptions;
  /** The learner's base model: a learner holding another model refuses the run's requests. */
  baseModel?: string;
}

/** `train.baseModel`, or the colocated policy's model (the learner samples with it, so it is the learner's). */
export function learnerBaseModel(cfg: HaloConfig): string | undefined {
  return cfg.train.baseModel ?? (cfg.policy.backend === 'colocated' ? cfg.policy.model : undefined);
}

/**
 * `real.scoring`, or the default of the use: an evaluation reports numbers comparable with the benchmark's, so
 * it scores as agisdk does unless told otherwise; training and single episodes keep the faster settings.
 */
export function realScoringOf(cfg: HaloConfig, use: 'evaluation' | 'training'): RealScoring {
  return cfg.real.scoring ?? (use === 'evaluation' ? 'official' : 'training');
}

export function runContextFromConfig(cfg: HaloConfig, runId: string, use: 'evaluation' | 'training' = 'training'): RunContext {
  return {
    runId,
    browserTaskQueue: cfg.temporal.browserTaskQueue,
    gpuTaskQueue: cfg.train.gpuTaskQueue,
    learnerHeartbeatTimeoutMs: cfg.train.learnerHeartbeatTimeoutS * 1000,
    maxSessionRebuilds: cfg.episode.maxSessionRebuilds,
    sessionStartTimeoutMs: cfg.episode.sessionStartTimeoutMs,
    heartbeatTimeoutMs: cfg.episode.heartbeatTimeoutMs,
    rewardWeights: cfg.rewards,
    ...(learnerBaseModel(cfg) ? { baseModel: learnerBaseModel(cfg) } : {}),
    envOptions: {
      realRunId: cfg.real.runId,
      evaluateAtCap: cfg.real.evaluateAtCap,
      realForkMode: cfg.real.forkMode,
      realScoring: realScoringOf(cfg, use),
      miniwobTimeLimit: cfg.miniwob.timeLimit,
      miniwobReward: cfg.miniwob.reward,
    },
  };
}
