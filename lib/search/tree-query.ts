import { TEMPORAL_LIMITS } from '../config/history-budget';
import type { Tree } from './mcts';

/**
 * What the `tree` query may return. A query result travels as one payload, so it is bounded by the payload
 * limit (2 MB); half of it leaves room for the rest of the view and its encoding. At 0.7–1.1 KB a node that is
 * about 1,000 nodes, while the schema allows searches of 10,000 simulations × 32 children (320,001 nodes).
 */
export const TREE_QUERY_BYTES = TEMPORAL_LIMITS.payloadBytes / 2;

/**
 * The tree as the `tree` query shows it: whole when it fits `maxBytes` of JSON, else its first nodes (ids are
 * given in creation order and a parent is always created before its children, so a prefix is a tree rooted
 * at 0), their children lists cut to the nodes shown, and a note saying so. Pure and read-only: a query handler
 * must not change workflow state.
 */
export function boundTree(tree: Tree, maxBytes = TREE_QUERY_BYTES): { tree: Tree; note?: string } {
  let bytes = 0;
  let shown = 0;
  for (; shown < tree.nodes.length; shown++) {
    const b = JSON.stringify(tree.nodes[shown]).length + 1;
    if (bytes + b > maxBytes) break;
    bytes += b;
  }
  if (shown === tree.nodes.length) return { tree };
  shown = Math.max(1, shown);
  const nodes = tree.nodes.slice(0, shown).map((n) => (n.children.some((c) => c >= shown) ? { ...n, children: n.children.filter((c) => c < shown) } : n));
  return {
    tree: { nodes, nextId: shown },
    note:
      `the tree query shows the first ${shown} of ${tree.nodes.length} nodes (the earliest expanded, nearest the root) to stay under ` +
      `Temporal's query result limit; stats, best path and pairs are the whole tree's. Once the search has ended, ` +
      `\`halo mcts tree\` reads the whole tree from its final snapshot`,
  };
}
