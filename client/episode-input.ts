import type { HaloConfig } from '../lib/config/config';
import { episodeInput, type EpisodeInput } from '../lib/episode/episode-types';
import { runContextFromConfig } from '../lib/episode/run-context';
import { withOptionalTokenIds } from './token-ids';

/** agisdk's `max_steps`: the step cap REAL results are published under. */
export const REAL_MAX_STEPS = 25;

/**
 * The step cap of `halo episode`: --max-steps, else the config's when the config is for the episode's environment.
 * A REAL episode started from a MiniWoB++ config (default.yaml caps its one-action tasks at 1) gets REAL's 25:
 * under a cap of 1 the agent could never answer, and a REAL episode that does not answer scores 0.
 */
export function episodeMaxSteps(base: HaloConfig, env: 'miniwob' | 'real' | undefined, flag: number | undefined): number | undefined {
  if (flag !== undefined) return flag;
  if ((env ?? base.episode.env) === 'real' && base.episode.env !== 'real') return REAL_MAX_STEPS;
  return undefined;
}

/**
 * The input of a single `halo episode` from a validated config: its own run, the base model (no adapter). Nothing
 * trains on its samples, so a server without token ids is sampled without them.
 */
export function singleEpisodeInput(cfg: HaloConfig, workflowId: string): EpisodeInput {
  const e = cfg.episode;
  return episodeInput({
    run: runContextFromConfig(cfg, workflowId),
    task: { env: e.env, task: e.task, seed: e.seed },
    maxSteps: e.maxSteps,
    sampling: { policy: withOptionalTokenIds(cfg.policy), adapterVersion: 0 },
    mode: 'policy',
  });
}
