import type { HaloConfig } from '../config/config';

/** Where a run's scalars also go to Weights & Biases (the config's `wandb` section, with a project). */
export interface WandbTarget {
  project: string;
  entity?: string;
  /** online | offline | disabled; unset: wandb's own default (WANDB_MODE, else online). */
  mode?: 'online' | 'offline' | 'disabled';
}

/**
 * The `wandb` field of a metrics append: `{ wandb }` when the config names a project, else nothing at all
 * (so runs without W&B send exactly the input they always sent).
 */
export function wandbOf(cfg: Pick<HaloConfig, 'wandb'>): { wandb?: WandbTarget } {
  const w = cfg.wandb;
  if (!w?.project) return {};
  return { wandb: { project: w.project, ...(w.entity ? { entity: w.entity } : {}), ...(w.mode ? { mode: w.mode } : {}) } };
}
