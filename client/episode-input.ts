import type { HaloConfig } from '../lib/config';
import type { EpisodeInput } from '../lib/episode-types';

/** The episode workflow's input from a validated config. */
export function episodeInput(cfg: HaloConfig): EpisodeInput {
  const e = cfg.episode;
  return {
    task: { env: e.env, task: e.task, seed: e.seed },
    maxSteps: e.maxSteps,
    policy: cfg.policy,
    browserTaskQueue: cfg.temporal.browserTaskQueue,
    maxSessionRebuilds: e.maxSessionRebuilds,
    sessionStartTimeoutMs: e.sessionStartTimeoutMs,
    heartbeatTimeoutMs: e.heartbeatTimeoutMs,
    mode: 'policy',
    rewardWeights: cfg.rewards,
    envOptions: { realRunId: cfg.real.runId, evaluateAtCap: cfg.real.evaluateAtCap },
  };
}
