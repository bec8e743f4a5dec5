/**
 * The MCTS search's data and pure helpers (no workflow APIs; unit-tested in test/unit/mcts-search.test.ts):
 * what a search stores (snapshots), returns (result, pairs, best path, root decision) and shows (progress,
 * tree view), and the pure steps `mctsSearch` (workflows/mcts-search.ts) builds on.
 */
import type { Completion, MctsPair } from '../training/experience';
import { asCompletion } from '../training/completion';
import { actionKey, clip, describeAction, type Action, type AgentAction } from '../model-io/actions';
import { bestPath, compositeQ, dpoPairs, getNode, type MctsNode, type NodeData, type Tree, type TreeStats } from './mcts';
import { fnv1a32 } from '../rewards/shaping';

/** Rounds for display (three decimals by default). */
export const round = (x: number, d = 3) => Math.round(x * 10 ** d) / 10 ** d;

/** The task a search runs on. */
export interface SearchTask {
  env: 'miniwob' | 'real';
  task: string;
  seed: number;
}

/** What continue-as-new carries: a reference to the tree, never the tree. */
export interface MctsSearchState {
  snapshotRef: string;
  /** Simulations completed (backpropagated) so far. */
  simulations: number;
  /** Of the snapshot's tree, so the queries have numbers while the tree is being loaded. */
  stats: TreeStats;
  /** Workflow runs so far in this search's continue-as-new chain. */
  runs: number;
}

export interface SessionReuseCounters {
  reused: number;
  advanced: number;
  resetInPlace: number;
  fresh: number;
  /** Spares: sessions brought to a restored node in the background (reset in place, or new) for a later simulation. */
  prepared: number;
  /**
   * Of the spares, those that opened a new session and got it (the other sessions a search opens are `fresh`),
   * and the actions all spares that got there replayed (restores' replays are `MctsCounters.replayedActions`).
   * Counted by workflows/parked-sessions.ts from the first such spare on; absent: none (or a search from before them).
   */
  spareSessions?: number;
  spareReplayedActions?: number;
}

export interface MctsCounters {
  candidates: number;
  invalidCandidates: number;
  criticCalls: number;
  criticFailures: number;
  sessionRebuilds: number;
  restores: number;
  replayedActions: number;
  browserSteps: number;
  rolloutSteps: number;
  /**
   * How restores were served (workflows/parked-sessions.ts): a parked session already at the node, one
   * stepped forward from an ancestor, one reset in place, a new session (rebuilds of lost sessions included).
   * Snapshots written before it existed lack it (read as zeros).
   */
  sessionReuse: SessionReuseCounters;
  /** Workflow-clock seconds per phase (restore = startSession with replay, or a parked session's reset or advance). */
  seconds: { restore: number; sample: number; critic: number; step: number; total: number };
}

/**
 * The blob behind `snapshotRef`: everything but the nodes, which are in chunks of SNAPSHOT_CHUNK_NODES
 * (`MctsSnapshotChunk` blobs), so no single payload between the workflow and the blob store grows with
 * the tree (Temporal warns above 256 KB per payload and refuses 2 MB; a node is ~0.5–1 KB).
 */
export interface MctsSnapshot {
  version: 1;
  runId: string;
  iteration: number | null;
  task: SearchTask;
  alpha: number;
  pairThreshold: number;
  goal: string;
  simulations: number;
  counters: MctsCounters;
  nodeCount: number;
  nextId: number;
  chunks: string[];
}

/** Nodes `from .. from + nodes.length - 1`. */
export interface MctsSnapshotChunk {
  from: number;
  nodes: Tree['nodes'];
  /**
   * Snapshots written before node data moved into the nodes kept it here, `meta[i]` for node `from + i`;
   * recorded histories still load such chunks.
   */
  meta?: NodeData[];
}

export const SNAPSHOT_CHUNK_NODES = 200;

/** The DPO pairs of a finished search: stored as a blob (`MctsPair[]`), summarised here. */
export interface MctsPairsSummary {
  /** Blob holding the `MctsPair[]`; null when there are none. */
  ref: string | null;
  count: number;
  meanAbsDeltaQ: number | null;
  /** Pairs that carry the sampler's reference log-probs. */
  withRefLogprobs: number;
}

/** A step-level DPO pair in the learner's batch-request format (references only), plus where it came from. */
export type { MctsPair };

export interface BestPathView {
  nodeIds: number[];
  actions: string[];
  /** The path ends in a terminal node with reward 1. */
  success: boolean;
  terminal: boolean;
  reward: number | null;
}

/** The search's decision at its root: the first action of the best path (what a test-time search plays). */
export interface RootDecision {
  nodeId: number;
  action: AgentAction;
  /** The completion that proposed it (results recorded before the record: `completionRef` and `preview` flat), and the prompt at the root it was sampled from. */
  completion?: Completion;
  promptRef: string;
  visits: number;
  q: number;
}

export interface MctsSearchResult {
  workflowId: string;
  task: SearchTask;
  goal: string;
  simulations: number;
  stats: TreeStats;
  bestPath: BestPathView;
  pairs: MctsPairsSummary;
  counters: MctsCounters;
  /** The final tree (`MctsSnapshot`), for `halo mcts tree` after the workers are gone. */
  snapshotRef: string;
  runs: number;
  /** The first step of the best path; null when the root was never expanded. */
  decision?: RootDecision | null;
}

export interface MctsProgress {
  workflowId: string;
  phase: string;
  simulations: number;
  numSimulations: number;
  stats: TreeStats;
  runs: number;
}

export interface MctsTreeView extends MctsProgress {
  runId: string;
  iteration: number | null;
  task: SearchTask;
  goal: string;
  alpha: number;
  pairThreshold: number;
  /** Null only while a continued run loads its snapshot. */
  tree: Tree | null;
  /** Set when `tree` holds only the first nodes of a tree too large for a query result (lib/search/tree-query.ts). */
  treeNote?: string;
  bestPath: BestPathView | null;
  pairs: number;
  counters: MctsCounters | null;
}

export function emptyCounters(): MctsCounters {
  return {
    candidates: 0,
    invalidCandidates: 0,
    criticCalls: 0,
    criticFailures: 0,
    sessionRebuilds: 0,
    restores: 0,
    replayedActions: 0,
    browserSteps: 0,
    rolloutSteps: 0,
    sessionReuse: { reused: 0, advanced: 0, resetInPlace: 0, fresh: 0, prepared: 0 },
    seconds: { restore: 0, sample: 0, critic: 0, step: 0, total: 0 },
  };
}

/**
 * Unparseable candidates. Decision: an unparseable completion becomes a child like any other, whose
 * "action" is the parser's InvalidAction (`{type: 'invalid', reason, excerpt}`), marked terminal with
 * reward 0 as soon as it is added, and keeping its completion (data.completion) and log-prob sum.
 * - The search makes progress: a terminal child costs no browser work (selection backs its 0 up again),
 *   valid siblings are evaluated normally, and a state whose K samples are all unparseable still gets
 *   K children and a visit per simulation.
 * - Pairs can form: the critic sees the unparseable text among the candidates and ranks it (rank prior),
 *   and its Q_mcts stays 0, so a valid sibling that leads anywhere beats it by the threshold, and even
 *   between unparseable siblings the critic's ranking separates them. "Outputting garbage is a failed
 *   step" is exactly what the policy should learn from such a pair.
 * - Equal unparseable outputs are merged like equal actions (the key is the parser's reason + the first
 *   200 characters).
 * - An InvalidAction is never replayed: terminal nodes have no children, so it is never on the action path
 *   of a node whose state is restored. (lib/search/mcts.ts types actions as `Action`; the cast is confined to
 *   `asTreeAction`.)
 */
export function asTreeAction(a: AgentAction): Action {
  return a as Action;
}

/** Candidates with equal actions merged, the first of each kept (the key is `actionKey`, as in the tree). */
export function distinctActions<C extends { completion: { action: AgentAction } }>(candidates: readonly C[]): C[] {
  const seen = new Set<string>();
  return candidates.filter((c) => {
    const key = actionKey(asTreeAction(c.completion.action));
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/**
 * `distinctActions`, each with how many of the candidates proposed its action (the tree's `proposals`), the most
 * proposed first (ties in sampling order): children of equal prior get their ids, and are tried, in that order.
 */
export function proposedActions<C extends { completion: { action: AgentAction } }>(candidates: readonly C[]): (C & { proposals: number })[] {
  const counts = new Map<string, number>();
  for (const c of candidates) {
    const key = actionKey(asTreeAction(c.completion.action));
    counts.set(key, (counts.get(key) ?? 0) + 1);
  }
  return distinctActions(candidates)
    .map((c) => ({ ...c, proposals: counts.get(actionKey(asTreeAction(c.completion.action)))! }))
    .sort((a, b) => b.proposals - a.proposals);
}

export function isInvalidNode(tree: Tree, id: number): boolean {
  return (getNode(tree, id).action as AgentAction | null)?.type === 'invalid';
}

/**
 * The sampler's log-prob sum of a completion as the DPO reference log-prob (Agent Q logs reference
 * log-probs at collection time: π_ref is the policy that sampled), or null when it would not be the
 * quantity the learner compares with: the learner scores sequences at temperature 1 and appends the
 * end-of-turn token, so only completions sampled at temperature 1 that stopped on their own count.
 * Null makes the learner use the adapter-disabled model as reference for that pair.
 */
export function refLogprob(logprobs: readonly number[] | number | undefined, temperature: number, finishReason: string | null | undefined): number | null {
  // The sampler's sum (tokens stored as blobs), or the per-token list (histories from before).
  if (logprobs === undefined || (typeof logprobs !== 'number' && logprobs.length === 0)) return null;
  if (Math.abs(temperature - 1) > 1e-9 || finishReason !== 'stop') return null;
  let s = 0;
  if (typeof logprobs === 'number') s = logprobs;
  else for (const x of logprobs) s += x;
  return Number.isFinite(s) ? s : null;
}

/** Step-level DPO pairs with their texts' references; pairs whose prompt or texts are missing are left out. */
export function collectPairs(tree: Tree, alpha: number, threshold: number): MctsPair[] {
  const out: MctsPair[] = [];
  for (const p of dpoPairs(tree, alpha, threshold)) {
    const prompt = getNode(tree, p.parentId).data.promptRef;
    const c = getNode(tree, p.chosenId).data;
    const r = getNode(tree, p.rejectedId).data;
    if (!prompt || !c.completion?.ref || !r.completion?.ref) continue;
    const both = c.refLogprob != null && r.refLogprob != null;
    out.push({
      prompt_ref: prompt,
      chosen_ref: c.completion.ref,
      rejected_ref: r.completion.ref,
      ...(c.completion.tokensRef ? { chosen_tokens_ref: c.completion.tokensRef } : {}),
      ...(r.completion.tokensRef ? { rejected_tokens_ref: r.completion.tokensRef } : {}),
      ref_chosen_logprob: both ? c.refLogprob! : null,
      ref_rejected_logprob: both ? r.refLogprob! : null,
      delta_q: p.deltaQ,
      chosen_q: p.chosenQ,
      rejected_q: p.rejectedQ,
      parent: p.parentId,
      chosen: p.chosenId,
      rejected: p.rejectedId,
    });
  }
  return out;
}

export function meanAbsDeltaQ(pairs: readonly { delta_q: number }[]): number | null {
  if (pairs.length === 0) return null;
  return pairs.reduce((s, p) => s + Math.abs(p.delta_q), 0) / pairs.length;
}

/** The tree's nodes in chunks of `size`, in id order. */
export function snapshotChunks(tree: Tree, size = SNAPSHOT_CHUNK_NODES): MctsSnapshotChunk[] {
  const out: MctsSnapshotChunk[] = [];
  for (let from = 0; from < tree.nodes.length; from += size) out.push({ from, nodes: tree.nodes.slice(from, from + size) });
  return out;
}

/** A node as stored before the completion record (its completion's parts flat in `data`) read into today's shape. */
function withCompletionRecord(n: MctsNode): MctsNode {
  const { completionRef, preview, tokensRef, ...data } = n.data as MctsNode['data'] & { completionRef?: string; preview?: string; tokensRef?: string };
  if (completionRef === undefined && preview === undefined && tokensRef === undefined) return n;
  const completion = asCompletion({ action: n.action as AgentAction, ...(completionRef ? { completionRef } : {}), preview: preview ?? '', ...(tokensRef ? { tokensRef } : {}) });
  return { ...n, data: { ...data, completion } };
}

/** The tree back from a snapshot's chunks (in the manifest's order); throws when they do not fit together. */
export function joinSnapshot(snap: Pick<MctsSnapshot, 'nodeCount' | 'nextId'>, chunks: readonly MctsSnapshotChunk[]): Tree {
  const nodes: MctsNode[] = [];
  for (const c of chunks) {
    if (c.from !== nodes.length || (c.meta && c.nodes.length !== c.meta.length)) {
      throw new Error(`MCTS snapshot chunk starting at node ${c.from} does not follow node ${nodes.length - 1}`);
    }
    nodes.push(...(c.meta ? c.nodes.map((n, i) => ({ ...n, data: c.meta![i] ?? {} })) : c.nodes).map(withCompletionRecord));
  }
  if (nodes.length !== snap.nodeCount || snap.nextId !== nodes.length || nodes.some((n, i) => n.id !== i)) {
    throw new Error(`MCTS snapshot is inconsistent: ${nodes.length} nodes in its chunks, manifest says ${snap.nodeCount} (nextId ${snap.nextId})`);
  }
  return { nodes, nextId: snap.nextId };
}

export function pairsSummary(pairs: readonly MctsPair[], ref: string | null): MctsPairsSummary {
  return { ref, count: pairs.length, meanAbsDeltaQ: meanAbsDeltaQ(pairs), withRefLogprobs: pairs.filter((p) => p.ref_chosen_logprob !== null).length };
}

export function bestPathView(tree: Tree, alpha: number): BestPathView {
  const ids = bestPath(tree, alpha);
  const last = getNode(tree, ids.length ? ids[ids.length - 1] : 0);
  return {
    nodeIds: ids,
    actions: ids.map((id) => describeAction((getNode(tree, id).action as AgentAction | null) ?? { type: 'wait', seconds: 0 })),
    success: last.terminal && (last.reward ?? 0) >= 1,
    terminal: last.terminal,
    reward: last.reward,
  };
}

/** The best path's first node as the search's decision at the root (null when the root has no children). */
export function rootDecision(tree: Tree, alpha: number): RootDecision | null {
  const [first] = bestPath(tree, alpha);
  if (first === undefined) return null;
  const node = getNode(tree, first);
  const m = node.data;
  const promptRef = getNode(tree, 0).data.promptRef;
  if (!promptRef) return null;
  return {
    nodeId: first,
    action: node.action as AgentAction,
    ...(m.completion ? { completion: m.completion } : {}),
    promptRef,
    visits: node.visits,
    q: round(compositeQ(node, alpha)),
  };
}

/** The prompt's "previous actions" for a state reached by `path` (the last `historyLength`). */
export function historyOf(path: readonly Action[], historyLength: number) {
  const from = Math.max(0, path.length - historyLength);
  return path.slice(from).map((a, i) => ({ step: from + i + 1, action: describeAction(a) }));
}

/** The text the critic sees for a candidate: the action, or the unparseable output itself. */
export function criticText(a: AgentAction, preview: string): string {
  if (a.type !== 'invalid') return describeAction(a);
  return `(unparseable output, ${clip(a.reason, 60)}) ${JSON.stringify(clip(preview.replace(/\s+/g, ' ').trim(), 120))}`;
}

/** Child workflow id of the search of `task` in `iteration` of `runId`. */
export function searchWorkflowId(runId: string, iteration: number, task: string, repeat = 0): string {
  return repeat === 0 ? `${runId}-it${iteration}-${task}` : `${runId}-it${iteration}-${task}-${repeat + 1}`;
}

/**
 * The seed of a task's search in an iteration: derived from run id, iteration, task and which of the task's
 * searches it is (`mcts.searchesPerTask`; the first keeps the key it always had, so older runs replay).
 */
export function searchSeed(runId: string, iteration: number, task: string, repeat = 0): number {
  const key = repeat === 0 ? `${runId}:${iteration}:${task}` : `${runId}:${iteration}:${task}#${repeat + 1}`;
  return parseInt(fnv1a32(key), 16) % 100_000;
}

/** One line per node for logs and the UI: `[4] click (500, 300) N=3 Q=0.62`. */
export function describeTreeNode(tree: Tree, id: number, alpha: number): string {
  const n = getNode(tree, id);
  const what = n.action ? describeAction(n.action as AgentAction) : 'root';
  return `[${id}] ${clip(what, 60)} (depth ${n.depth}, N=${n.visits}, Q=${round(compositeQ(n, alpha))})`;
}
