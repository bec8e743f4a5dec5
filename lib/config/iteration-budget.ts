import type { HaloConfig } from './config';
import { iterationHistoryProblems } from './history-budget';

/**
 * A training iteration's fan-out against the run's own history (lib/config/history-budget.ts): every iteration is one
 * workflow run (it continues as new), and each child workflow it starts (episode, search, evaluation episode)
 * adds about nine events there. Checked for GRPO and MCTS alike, so a config the schema allows cannot have a
 * run terminated by the server half-way through an iteration it already paid for.
 */
export function iterationBudgetProblems(cfg: HaloConfig): string[] {
  const t = cfg.train;
  const rollouts = t.grouping === 'step' ? 1 : t.numGenerations;
  const grpoEval = t.evalEvery > 0 || t.evalEverySteps > 0 ? t.heldOutTasks.length * (t.evalSeeds?.length ?? 1) : 0;
  const grpo = iterationHistoryProblems(
    { collect: t.episodesPerIteration * rollouts, evaluate: grpoEval, evaluations: t.maxStaleness > 0 ? 2 : 1, actionsPerChild: cfg.episode.maxSteps },
    {
      collect:
        rollouts > 1
          ? `train.episodesPerIteration ${t.episodesPerIteration} × train.numGenerations ${t.numGenerations} (${t.grouping} grouping)`
          : `train.episodesPerIteration ${t.episodesPerIteration}`,
      lowerCollect: rollouts > 1 ? 'train.episodesPerIteration or train.numGenerations' : 'train.episodesPerIteration',
      evaluate: t.evalSeeds ? `train.heldOutTasks ${t.heldOutTasks.length} × train.evalSeeds ${t.evalSeeds.length}` : `train.heldOutTasks ${t.heldOutTasks.length}`,
      lowerEvaluate: t.evalSeeds ? 'train.heldOutTasks or train.evalSeeds' : 'train.heldOutTasks',
    },
  );
  const m = cfg.mcts;
  const evalTasks = m.heldOutTasks.length > 0 ? m.heldOutTasks : m.tasks;
  const mctsEval = m.evalEvery > 0 || m.evalEverySteps > 0 ? evalTasks.length * m.evalSeeds.length : 0;
  const mcts = iterationHistoryProblems(
    {
      collect: m.tasks.length * m.searchesPerTask,
      evaluate: mctsEval,
      evaluations: m.maxStaleness > 0 ? 2 : 1,
      actionsPerChild: Math.max(cfg.episode.maxSteps, m.maxDepth),
    },
    {
      collect: `mcts.tasks ${m.tasks.length} × mcts.searchesPerTask ${m.searchesPerTask}`,
      lowerCollect: 'mcts.tasks or mcts.searchesPerTask',
      evaluate: `${m.heldOutTasks.length > 0 ? 'mcts.heldOutTasks' : 'mcts.tasks (no heldOutTasks)'} ${evalTasks.length} × mcts.evalSeeds ${m.evalSeeds.length}`,
      lowerEvaluate: m.heldOutTasks.length > 0 ? 'mcts.heldOutTasks or mcts.evalSeeds' : 'mcts.evalSeeds',
    },
  );
  return [...grpo, ...mcts];
}
