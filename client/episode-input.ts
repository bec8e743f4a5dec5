import type { HaloConfig } from '../lib/config';
import { episodeInput, type EpisodeInput } from '../lib/episode-types';
import { runContextFromConfig } from '../lib/run-context';

/** The input of a single `halo episode` from a validated config: its own run, the base model (no adapter). */
export function singleEpisodeInput(cfg: HaloConfig, workflowId: string): EpisodeInput {
  const e = cfg.episode;
  return episodeInput({
    run: runContextFromConfig(cfg, workflowId),
    task: { env: e.env, task: e.task, seed: e.seed },
    maxSteps: e.maxSteps,
    sampling: { policy: cfg.policy, adapterVersion: 0 },
    mode: 'policy',
  });
}
