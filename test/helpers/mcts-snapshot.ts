import { emptyCounters, type MctsSnapshot } from '../../lib/search/mcts-search';
import type { Tree } from '../../lib/search/mcts';

/** The manifest of a stored search of `tree` (run `r`, iteration 1, `click-button` seed 1, α 0.5, 3 simulations), its chunks stored as `chunks`. */
export function snapshotManifest(tree: Tree, chunks: string[]): MctsSnapshot {
  return {
    version: 1,
    runId: 'r',
    iteration: 1,
    task: { env: 'miniwob', task: 'click-button', seed: 1 },
    alpha: 0.5,
    pairThreshold: 0.1,
    goal: 'click OK',
    simulations: 3,
    counters: emptyCounters(),
    nodeCount: tree.nodes.length,
    nextId: tree.nextId,
    chunks,
  };
}
