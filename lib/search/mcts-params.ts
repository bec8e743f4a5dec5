import type { CriticConfig } from './critic';
import type { HaloConfig } from '../config/config';

type CriticSection = HaloConfig['mcts']['critic'];

/** The search's parameters (from `mcts:` of the config). */
export interface MctsParams {
  numSimulations: number;
  ucbConstant: number;
  maxChildren: number;
  alpha: number;
  pairThreshold: number;
  maxDepth: number;
  valueMode: 'rollout' | 'critic' | 'shaped';
  /** valueMode shaped: the shaped return worth value 1. Inputs recorded before it existed use another valueMode. */
  shapedScale?: number;
  /** Sampling temperature of expansions and rollouts. */
  temperature: number;
  continueAsNewEvery: number;
  /** null: no critic (neutral priors 0.5, no state values): search outcomes alone separate siblings. */
  critic: CriticConfig | null;
  /**
   * How a state where the episode ended is valued. `environment` (training, the default): the task's own
   * success signal, 1 or 0. `self-evaluation` (test-time search): the critic judges the final state
   * (NEUTRAL 0.5 without a critic); the environment's success is never read, so an evaluation that
   * searches stays as blind to the answer as a greedy one.
   */
  outcome?: 'environment' | 'self-evaluation';
  /**
   * Sessions kept open between simulations (workflows/parked-sessions.ts). Inputs recorded before it existed
   * lack it: missing is 0, a new session per simulation.
   */
  parkedSessions?: number;
}

/** The search parameters from a validated config. */
export function mctsParams(cfg: HaloConfig): MctsParams {
  const m = cfg.mcts;
  return {
    numSimulations: m.numSimulations,
    ucbConstant: m.ucbConstant,
    maxChildren: m.maxChildren,
    alpha: m.alpha,
    pairThreshold: m.pairThreshold,
    maxDepth: m.maxDepth,
    valueMode: m.valueMode,
    shapedScale: m.shapedScale,
    temperature: m.temperature,
    continueAsNewEvery: m.continueAsNewEvery,
    parkedSessions: m.parkedSessions,
    critic: criticParams(m.critic),
  };
}

/** A validated `critic` section as the search uses it: null for `backend: none`. */
export function criticParams(c: CriticSection): CriticConfig | null {
  if (c.backend === 'none') return null;
  return {
    baseUrl: c.baseUrl,
    model: c.model,
    credential: c.credential,
    ...(c.apiKeyEnv !== undefined ? { apiKeyEnv: c.apiKeyEnv } : {}),
    timeoutMs: c.timeoutMs,
    temperature: c.temperature,
    maxTokens: c.maxTokens,
  };
}
