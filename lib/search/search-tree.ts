import { clip, isValidAction, type AgentAction } from '../model-io/actions';
import { expand, getNode, markTerminal, pathTo, qMcts, setCriticValue, treeStats, type Tree } from './mcts';
import { asTreeAction, bestPathView, describeTreeNode, round } from './mcts-search';
import type { RewardState } from '../rewards/types';
import type { Completion } from '../training/experience';

/**
 * What a simulation of `mctsSearch` writes into its tree and how the Temporal UI is told (pure; the tree
 * lives in workflows/search-state.ts).
 */

/** A sampled completion, as an expansion adds it. */
export interface SearchCandidate {
  completion: Completion;
  refLogprob: number | null;
  /** How many of the expansion's samples proposed this action (lib/search/mcts.ts `proposals`); absent: not counted. */
  proposals?: number;
}

/** The record a node keeps: a shorter preview (trees live in workflow state), unless no blob holds the text. */
function nodeRecord(c: Completion): Completion {
  return c.ref ? { ...c, preview: clip(c.preview, 120) } : c;
}

/** A simulation's result: the node whose value is backed up, the value, and how it was obtained. */
export interface Valuation {
  node: number;
  value: number;
  how: string;
}

/** The critic's answer at a node's state: priors for the candidates, a value for the state. */
export interface Verdict {
  priors: number[];
  value: number;
  ok: boolean;
}

/** Every candidate's prior when there is no critic. */
export const NEUTRAL_PRIOR = 0.5;

/**
 * Expansion of `id`: the node keeps the critic's value and the prompt it was sampled from, and the distinct
 * candidates become children with the critic's priors, at most `maxChildren` by prior. Unparseable
 * candidates are terminal children with reward 0 (see `asTreeAction`). Returns the new child ids, highest
 * prior first.
 */
export function addChildren(tree: Tree, id: number, promptRef: string, candidates: readonly SearchCandidate[], verdict: Verdict | null, maxChildren: number): number[] {
  const node = getNode(tree, id);
  if (verdict) {
    setCriticValue(tree, id, verdict.value);
    node.data.criticOk = verdict.ok;
  }
  node.data.promptRef = promptRef;
  const children = candidates.map((c, i) => ({
    action: asTreeAction(c.completion.action),
    prior: verdict ? (verdict.priors[i] ?? 0) : NEUTRAL_PRIOR,
    ...(c.proposals !== undefined ? { proposals: c.proposals } : {}),
    data: { completion: nodeRecord(c.completion), refLogprob: c.refLogprob },
  }));
  const added = expand(tree, id, children, maxChildren);
  for (const child of added) {
    if (!isValidAction(getNode(tree, child).action as AgentAction)) markEnded(tree, child, 0, 'unparseable');
  }
  return added;
}

/** A node where the episode ended (or can go no further): terminal with its reward, and why. */
export function markEnded(tree: Tree, id: number, reward: number, outcome: string): void {
  markTerminal(tree, id, reward);
  getNode(tree, id).data.outcome = outcome;
}

/** Records the shaped reward of node `id`'s action and the shaping state after it. */
export function recordShaped(tree: Tree, id: number, reward: number, state?: RewardState): void {
  const data = getNode(tree, id).data;
  data.shaped = reward;
  if (state) data.rewardState = state;
}

/**
 * valueMode shaped: the value of the episode whose actions from the search's root lead to node `id` and then
 * `more` (a rollout's shaped rewards). A success is worth 1, as under rollout values; any other episode half its
 * shaped return over `scale`, clamped to [0, 0.5], so progress orders the failures and never outranks a success.
 * Siblings share their ancestors' rewards, so they are told apart by what their own action and what follows it
 * earned.
 */
export function shapedValue(tree: Tree, id: number, more: number, scale: number, success: boolean): number {
  if (success) return 1;
  let total = more;
  for (let n = getNode(tree, id); n.parent !== null; n = getNode(tree, n.parent)) total += n.data.shaped ?? 0;
  return 0.5 * Math.min(1, Math.max(0, total / scale));
}

/** The error of a node's action that ran but failed on the page (clipped: every node is stored, and shown in the tree view). */
export function recordActionError(tree: Tree, id: number, error: string): void {
  getNode(tree, id).data.actionError = clip(error, 200);
}

/** The Temporal UI's current details after a simulation: what it selected, evaluated and backed up, and the tree now. */
export function describeSimulation(tree: Tree, alpha: number, sim: { tag: string; label: string; leaf: number; valuation: Valuation }): string {
  const { tag, label, leaf, valuation: v } = sim;
  const stats = treeStats(tree);
  const root = getNode(tree, 0);
  const best = bestPathView(tree, alpha);
  return [
    `${tag} · ${label}`,
    `selected ${describeTreeNode(tree, leaf, alpha)}`,
    ...(v.node !== leaf ? [`expanded: ${getNode(tree, leaf).children.length} children; evaluated ${describeTreeNode(tree, v.node, alpha)}`] : []),
    `value ${round(v.value)} (${v.how}), backed up over ${pathTo(tree, v.node).length} nodes`,
    `root N=${root.visits} Q̃=${round(qMcts(root))} · ${stats.nodes} nodes, depth ${stats.maxDepth}, ${stats.terminalNodes} terminal`,
    `best path: ${best.actions.join(' → ') || '(none)'}${best.success ? ' ✓' : ''}`,
  ].join('\n');
}
