import type { HaloConfig } from './config';
import { episodeHistoryProblems, samplingPayloadProblem } from './history-budget';
import { iterationBudgetProblems } from './iteration-budget';
import { replicaKey } from '../serving/policy-pool';
import { searchHistoryProblems } from './search-budget';

// What a config's fields cannot be together, beyond each field's own limits: parseConfig reports these after the
// schema, each naming the keys to change.

/** A pool of policy servers loads each adapter into every replica: the adapter endpoint must be one of them. */
export function poolProblems(cfg: HaloConfig): string[] {
  const urls = cfg.policy.baseUrls;
  if (!urls || urls.length <= 1) return [];
  const keys = urls.map(replicaKey);
  return (['train', 'mcts'] as const)
    .filter((sec) => cfg[sec].vllmBaseUrl !== undefined && !keys.includes(replicaKey(cfg[sec].vllmBaseUrl!)))
    .map(
      (sec) => `${sec}.vllmBaseUrl ${cfg[sec].vllmBaseUrl} is not one of policy.baseUrls: with a pool, every replica loads each adapter; set it to one of them (e.g. the first)`,
    );
}

/** Staleness beyond one update needs the rollout stream: iterations overlap one update at most. */
export function rolloutProblems(cfg: HaloConfig): string[] {
  return (['train', 'mcts'] as const)
    .filter((sec) => cfg[sec].rollout === 'iterations' && cfg[sec].maxStaleness > 1)
    .map((sec) => `${sec}.maxStaleness ${cfg[sec].maxStaleness}: iterations overlap one update at most (0 or 1); set ${sec}.rollout: stream for a larger bound`);
}

/** train.dynamicSampling that cannot work: extra draws exist only for step groups, and one draw is N candidates. */
export function dynamicSamplingProblems(cfg: HaloConfig): string[] {
  const t = cfg.train;
  const max = t.dynamicSampling.maxCandidates;
  if (max === 0) return [];
  if (t.grouping !== 'step') return [`train.dynamicSampling.maxCandidates: extra draws need train.grouping step (it is ${t.grouping}); set it to 0`];
  if (max < 2 * t.numGenerations)
    return [`train.dynamicSampling.maxCandidates ${max}: one extra draw is numGenerations (${t.numGenerations}) candidates, so it is 0 or at least ${2 * t.numGenerations}`];
  return [];
}

/**
 * A GRPO run that would learn nothing: greedy decoding (policy.temperature 0) gives every one of the N
 * candidates of a step group, and every one of the N rollouts of an episode or anchor group, the same
 * completion, so every advantage is 0. `halo train` refuses it before it starts; undefined when it samples.
 */
export function identicalCandidatesProblem(cfg: HaloConfig): string | undefined {
  const t = cfg.train;
  if (cfg.policy.temperature > 0 || t.numGenerations <= 1) return undefined;
  const what = t.grouping === 'step' ? `candidates of every step group` : `rollouts of every ${t.grouping} group`;
  return (
    `policy.temperature 0 (greedy) with train.numGenerations ${t.numGenerations}: the ${t.numGenerations} ${what} would be identical, ` +
    `so every advantage is 0 and the run learns nothing. Set policy.temperature above 0 (0.7, the default, or --temperature 0.7); ` +
    `greedy evaluations (train.evalEvery, halo eval) decode at temperature 0 whatever policy.temperature says`
  );
}

/**
 * Episodes this config would run that pass a Temporal payload or history limit (lib/config/history-budget.ts): a
 * GRPO episode with its grouping's candidates, an MCTS expansion's sampling call, an MCTS search's run with its
 * tree (lib/config/search-budget.ts), and an iteration's child fan-out.
 */
export function historyBudgetProblems(cfg: HaloConfig): string[] {
  const stepGroups = cfg.train.grouping === 'step';
  // Dynamic sampling can grow a step group to maxCandidates forks; the budget counts the largest group.
  const grown = stepGroups && cfg.train.dynamicSampling.maxCandidates > cfg.train.numGenerations;
  const episode = episodeHistoryProblems(
    {
      n: stepGroups ? Math.max(cfg.train.numGenerations, cfg.train.dynamicSampling.maxCandidates) : 1,
      forks: stepGroups,
      maxSteps: cfg.episode.maxSteps,
      maxTokens: cfg.policy.maxTokens,
    },
    { n: grown ? 'train.dynamicSampling.maxCandidates' : 'train.numGenerations', maxSteps: 'episode.maxSteps', maxTokens: 'policy.maxTokens' },
  );
  const expansion = samplingPayloadProblem(cfg.mcts.maxChildren, cfg.policy.maxTokens, { n: 'mcts.maxChildren', maxTokens: 'policy.maxTokens' });
  const m = cfg.mcts;
  const search = searchHistoryProblems({
    numSimulations: m.numSimulations,
    maxChildren: m.maxChildren,
    maxDepth: m.maxDepth,
    continueAsNewEvery: m.continueAsNewEvery,
    parkedSessions: m.parkedSessions,
    maxTokens: cfg.policy.maxTokens,
  });
  return [...episode, ...(expansion ? [expansion] : []), ...search, ...iterationBudgetProblems(cfg)];
}
