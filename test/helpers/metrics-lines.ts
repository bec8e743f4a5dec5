import { parseMetricsLine, type MetricsLine } from '../../lib/training/run-metrics';

export const TIME = '2025-01-02T03:04:05.000Z';
type Extra = { env_steps?: number; sessions_opened?: number; replayed_actions?: number };

/** A GRPO row as the writer stores it; the newer counts are laid on top (the schema may not keep them yet). */
export function grpo(iteration: number, o: { evalRate?: number; episodeLength?: number; episodes?: number; seconds?: Record<string, number> } & Extra = {}): MetricsLine {
  const { env_steps, sessions_opened, replayed_actions } = o;
  const line = parseMetricsLine(
    JSON.stringify({
      run_id: 'r',
      iteration,
      time: TIME,
      algorithm: 'grpo',
      success_rate: 0.5,
      mean_return: 0.1,
      loss: 0.01,
      grad_norm: 0.1,
      adapter_version: iteration,
      num_episodes: o.episodes ?? 4,
      seconds: o.seconds ?? { rollout: 10, batch: 0.5, update: 2 },
      ...(o.evalRate !== undefined ? { eval: { success_rate: o.evalRate, mean_return: 0, episodes: 16 } } : {}),
      mean_reward: 0,
      reward_std: 0.1,
      frac_reward_zero_std: 0.5,
      episode_length: o.episodeLength ?? 2.5,
      action_validity: 1,
      tokens: 100,
      num_groups: 4,
    }),
    1,
  );
  return Object.assign(line, Object.fromEntries(Object.entries({ env_steps, sessions_opened, replayed_actions }).filter(([, v]) => v !== undefined)));
}
