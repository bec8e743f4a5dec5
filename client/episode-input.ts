import type { HaloConfig } from '../lib/config';
import { episodeInput, type EpisodeInput } from '../lib/episode-types';
import { runContextFromConfig } from '../lib/run-context';
import { withOptionalTokenIds } from './token-ids';

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
