/**
 * Agent-Q-style Monte Carlo tree search over browser states: pure tree operations for workflow code.
 *
 * Workflow-safe: no I/O, no Node APIs, no clocks, no randomness; every tie is broken by a fixed rule, so
 * the same calls on the same tree always give the same result (Temporal replays it). The tree is a plain
 * JSON value (node ids are indexes into `nodes`), so it can live in workflow state, be snapshotted to the
 * blob store and be read back with JSON.parse without changing any result below.
 *
 * The functions that change the tree (`expand`, `backpropagate`, `setObservation`, `setCriticValue`,
 * `markTerminal`) mutate it in place; everything else only reads. What the search records about a node
 * besides its statistics (the completion that proposed it, the prompt at its state, why it ended) travels
 * with the node as `data`, which no function here reads.
 *
 * One simulation, as the MCTS workflow drives it:
 *   1. `select` a node (UCB1 on the composite Q, unvisited children first);
 *   2. if it is not terminal: replay `actionPath` in a browser, observe, `setObservation`, sample K actions
 *      with the policy, let the critic rank them, `expand` with `rankToPriors` (lib/search/critic.ts) as priors
 *      and `setCriticValue` with the critic's state value;
 *   3. roll out (or use the terminal reward) to get a value in [0, 1] and `backpropagate` it.
 * Afterwards `bestPath` is the search's answer and `dpoPairs` are the step-level DPO pairs.
 */
import { actionKey, type Action } from '../model-io/actions';
import type { RewardState } from '../rewards/types';
import type { Completion } from '../training/experience';

/** Where a node's browser state is stored (blob references; no image bytes in workflow state). */
export interface NodeObservation {
  screenshotRef: string;
  axtreeRef: string;
  url: string;
  /** Identifies the page state (e.g. a hash of url + axtree), to spot actions that changed nothing. */
  stateKey: string;
}

/**
 * A node's record for training and inspection. Completions and prompts are blob references (no large text
 * in workflow state).
 */
export interface NodeData {
  /**
   * The completion that proposed this node's action (lib/training/experience.ts's record, its preview clipped): its text
   * and tokens are a DPO pair's chosen/rejected text and `chosen_tokens_ref` / `rejected_tokens_ref`. Trees stored
   * before the record held its parts flat; `joinSnapshot` (lib/search/mcts-search.ts) reads them into it.
   */
  completion?: Completion;
  /** The sampler's log-prob sum of that completion when usable as the DPO reference, else null (lib/search/mcts-search.ts `refLogprob`). */
  refLogprob?: number | null;
  /** The prompt at this node's state, from which its children were sampled (a DPO pair's prompt). */
  promptRef?: string;
  /** False when the critic's answer at this node's state was unusable (neutral verdict). */
  criticOk?: boolean;
  /** Why the node is terminal: `success`, `failure` (environment outcomes), `ended, …` (self-evaluated), `unparseable`, `depth cap`. */
  outcome?: string;
  /** The environment's complaint when the action could not be applied (the state did not change). */
  actionError?: string;
  /** The shaped reward of this node's action (the rewards file's terms), once it has run. */
  shaped?: number;
  /**
   * The shaping state at this node (pages visited, milestones fired since the task's reset), once known. A session
   * restored here by replaying the path starts a fresh one, which forgets the pages before it: the search gives it
   * this one, so an action is paid the same however its session got here.
   */
  rewardState?: RewardState;
}

export interface MctsNode {
  id: number;
  parent: number | null;
  /** The action that leads from the parent's state to this node's state; null at the root. */
  action: Action | null;
  /** `actionKey(action)`: equal actions have equal keys. Null at the root. */
  actionKey: string | null;
  depth: number;
  /** The state after `action`, once it has been executed. */
  observationRef?: NodeObservation;
  visits: number;
  valueSum: number;
  /** The critic's prior for `action` among its siblings, in [0, 1] (from its ranking). 1 at the root. */
  prior: number;
  /**
   * How many of the samples of its parent's expansion proposed `action` (equal actions are merged into one
   * child): the policy's own preference among its siblings. Siblings the search cannot tell apart otherwise go
   * to the more proposed one (`selectChild`, `bestPath`). Absent in trees from before it was counted: every
   * such child counts the same, so their ties fall to the lower id as they always did.
   */
  proposals?: number;
  /** The critic's estimate of the probability of success from this node's state, in [0, 1]; null until asked. */
  criticValue: number | null;
  /** The episode ended at this node (answer action, step cap, environment done). Terminal nodes are never expanded. */
  terminal: boolean;
  /** The terminal reward, when terminal. */
  reward: number | null;
  children: number[];
  data: NodeData;
}
/** Alias of MctsNode (the name used in the design notes). */
export type Node = MctsNode;

export interface Tree {
  /** `nodes[i].id === i`. */
  nodes: MctsNode[];
  nextId: number;
}

export interface ExpandCandidate {
  action: Action;
  prior: number;
  /** Samples that proposed this action (the new child's `proposals`). */
  proposals?: number;
  /** The new child's `data`. */
  data?: NodeData;
}

/**
 * Two explored siblings whose composite Q differ by at least the pair threshold: the tree's side of a DPO pair.
 * `collectPairs` (lib/search/mcts-search.ts) turns it into the learner's pair (`MctsPair`, lib/training/experience.ts).
 */
export interface NodePair {
  parentId: number;
  chosenId: number;
  rejectedId: number;
  chosenQ: number;
  rejectedQ: number;
  /** chosenQ − rejectedQ, > 0. */
  deltaQ: number;
}

export interface TreeStats {
  nodes: number;
  /** Depth of the deepest node (the root is depth 0). */
  maxDepth: number;
  /** The root's visit count: every backpropagation passes through the root, so it is the number of simulations. */
  totalVisits: number;
  /** Nodes without children. */
  leaves: number;
  terminalNodes: number;
}

/** Absolute tolerance of the pair threshold, so a gap of exactly θ in decimal still counts despite float rounding. */
const THRESHOLD_EPSILON = 1e-9;

/** A fresh tree holding only the root (id 0): the task's initial state. */
export function newTree(rootObservation?: NodeObservation): Tree {
  const root: MctsNode = {
    id: 0,
    parent: null,
    action: null,
    actionKey: null,
    depth: 0,
    visits: 0,
    valueSum: 0,
    prior: 1,
    criticValue: null,
    terminal: false,
    reward: null,
    children: [],
    data: {},
  };
  if (rootObservation) root.observationRef = { ...rootObservation };
  return { nodes: [root], nextId: 1 };
}

/** The node with this id; throws (a bug in the caller) when there is none. */
export function getNode(tree: Tree, id: number): MctsNode {
  const node = tree.nodes[id];
  if (!node || node.id !== id) throw new RangeError(`MCTS tree has no node ${id} (it has ${tree.nodes.length})`);
  return node;
}

/** Node ids from the root to `nodeId`, both included. */
export function pathTo(tree: Tree, nodeId: number): number[] {
  const ids: number[] = [];
  let node = getNode(tree, nodeId);
  ids.push(node.id);
  while (node.parent !== null) {
    if (ids.length > tree.nodes.length) throw new RangeError(`MCTS tree has a cycle through node ${nodeId}`);
    node = getNode(tree, node.parent);
    ids.push(node.id);
  }
  return ids.reverse();
}

/** The actions from the root's state to `nodeId`'s state: replaying them from the task's seed rebuilds the state. */
export function actionPath(tree: Tree, nodeId: number): Action[] {
  const actions: Action[] = [];
  for (const id of pathTo(tree, nodeId)) {
    const a = tree.nodes[id].action;
    if (a) actions.push(a);
  }
  return actions;
}

/** Mean backed-up value, Q̃_mcts = valueSum / visits; 0 while unvisited (Agent Q initialises Q to 0). */
export function qMcts(node: MctsNode): number {
  return node.visits > 0 ? node.valueSum / node.visits : 0;
}

/**
 * Composite Q = α·Q_mcts + (1−α)·Q_critic (Agent Q eq. 10).
 * Q_critic is the critic's value of the state this action leads to (`criticValue`) once the critic has
 * been asked about that state, and until then the critic's rank prior for the action among its siblings
 * (`prior`), so a child has a critic term from the moment its parent is expanded.
 */
export function compositeQ(node: MctsNode, alpha: number): number {
  const qCritic = node.criticValue ?? node.prior;
  return alpha * qMcts(node) + (1 - alpha) * qCritic;
}

/**
 * UCB1 of a child: compositeQ + c·sqrt(ln N(parent) / n(child)); +Infinity while the child is unvisited,
 * so every child is tried once before any is tried twice (ties among those: see `select`).
 */
export function ucb1(child: MctsNode, parentVisits: number, c: number, alpha: number): number {
  if (child.visits <= 0) return Infinity;
  const logN = Math.log(Math.max(parentVisits, 1));
  return compositeQ(child, alpha) + c * Math.sqrt(logN / child.visits);
}

/** A node counts as expanded when it has children or is terminal (a terminal node is never expanded further). */
export function isExpanded(node: MctsNode): boolean {
  return node.children.length > 0 || node.terminal;
}

/** Among siblings the search cannot tell apart: the one more samples proposed (the policy's preference), else the lower id. */
function preferred(a: MctsNode, b: MctsNode): boolean {
  const pa = a.proposals ?? 0;
  const pb = b.proposals ?? 0;
  return pa > pb || (pa === pb && a.id < b.id);
}

/**
 * The child to descend into: highest UCB1; ties (including all unvisited children, whose UCB1 is
 * infinite) go to the highest prior, then to the most proposed, then to the lowest id. Undefined when the
 * node has no children.
 */
export function selectChild(tree: Tree, nodeId: number, c: number, alpha: number): number | undefined {
  const parent = getNode(tree, nodeId);
  let best: MctsNode | undefined;
  let bestUcb = -Infinity;
  for (const id of parent.children) {
    const child = getNode(tree, id);
    const u = ucb1(child, parent.visits, c, alpha);
    if (best === undefined || u > bestUcb || (u === bestUcb && (child.prior > best.prior || (child.prior === best.prior && preferred(child, best))))) {
      best = child;
      bestUcb = u;
    }
  }
  return best?.id;
}

/**
 * Selection: from the root, descend by UCB1 while the node has children and is not terminal. Returns the
 * node to work on: a terminal node (backpropagate its reward again) or an unexpanded one (expand it, or
 * evaluate it when it is a freshly added, unvisited child).
 */
export function select(tree: Tree, c: number, alpha: number): number {
  let node = getNode(tree, 0);
  while (!node.terminal && node.children.length > 0) {
    node = getNode(tree, selectChild(tree, node.id, c, alpha)!);
  }
  return node.id;
}

/**
 * Expansion: adds the candidates as children of `nodeId` and returns the new child ids (highest prior first).
 * - Equivalent actions (same `actionKey`) are merged: a candidate equal to an existing child or to a
 *   higher-prior candidate is dropped (the highest prior of a group is the one kept; equal priors keep the
 *   earlier candidate).
 * - The node ends up with at most `maxChildren` children in all, existing ones included; the candidates
 *   with the highest priors fill the free slots (ties: earlier candidate first).
 * - Priors are clamped to [0, 1] (NaN counts as 0).
 * - A new child's `data` is a copy of its candidate's, its `proposals` its candidate's.
 * - A terminal node is never expanded: returns [].
 */
export function expand(tree: Tree, nodeId: number, candidates: readonly ExpandCandidate[], maxChildren: number): number[] {
  const parent = getNode(tree, nodeId);
  if (parent.terminal) return [];
  const seen = new Set<string>();
  for (const id of parent.children) {
    const key = getNode(tree, id).actionKey;
    if (key !== null) seen.add(key);
  }
  const ordered = candidates.map((c, index) => ({ ...c, prior: clamp01(c.prior), index })).sort((a, b) => b.prior - a.prior || a.index - b.index);
  const free = Math.max(0, Math.floor(maxChildren) - parent.children.length);
  const added: number[] = [];
  for (const cand of ordered) {
    if (added.length >= free) break;
    const key = actionKey(cand.action);
    if (seen.has(key)) continue;
    seen.add(key);
    const id = tree.nextId;
    if (tree.nodes.length !== id) throw new RangeError(`MCTS tree is inconsistent: nextId ${id} but ${tree.nodes.length} nodes`);
    tree.nodes.push({
      id,
      parent: parent.id,
      action: cand.action,
      actionKey: key,
      depth: parent.depth + 1,
      visits: 0,
      valueSum: 0,
      prior: cand.prior,
      ...(cand.proposals !== undefined ? { proposals: cand.proposals } : {}),
      criticValue: null,
      terminal: false,
      reward: null,
      children: [],
      data: { ...cand.data },
    });
    tree.nextId = id + 1;
    parent.children.push(id);
    added.push(id);
  }
  return added;
}

/** Backpropagation: visits + 1 and valueSum + value on `nodeId` and every ancestor up to the root. */
export function backpropagate(tree: Tree, nodeId: number, value: number): void {
  if (!Number.isFinite(value)) throw new RangeError(`MCTS backpropagate: value must be a finite number (got ${value})`);
  for (const id of pathTo(tree, nodeId)) {
    tree.nodes[id].visits += 1;
    tree.nodes[id].valueSum += value;
  }
}

/** Records the observed state of a node (after executing its action). */
export function setObservation(tree: Tree, nodeId: number, observation: NodeObservation): void {
  getNode(tree, nodeId).observationRef = { ...observation };
}

/** Records the critic's value estimate (clamped to [0, 1]) of a node's state. */
export function setCriticValue(tree: Tree, nodeId: number, value: number): void {
  getNode(tree, nodeId).criticValue = clamp01(value);
}

/** Marks a node terminal with its reward. */
export function markTerminal(tree: Tree, nodeId: number, reward: number): void {
  const node = getNode(tree, nodeId);
  node.terminal = true;
  node.reward = reward;
}

/**
 * The search's answer: from the root, repeatedly the child with the most visits (ties: higher composite
 * Q, then more proposals, then lower id) until a node without children. Returns the node ids after the root (empty when the root
 * has no children); `actionPath(tree, path[path.length - 1])` gives the actions.
 */
export function bestPath(tree: Tree, alpha: number): number[] {
  const path: number[] = [];
  let node = getNode(tree, 0);
  while (node.children.length > 0) {
    let best: MctsNode | undefined;
    let bestQ = -Infinity;
    for (const id of node.children) {
      const child = getNode(tree, id);
      const q = compositeQ(child, alpha);
      if (best === undefined || child.visits > best.visits || (child.visits === best.visits && (q > bestQ || (q === bestQ && preferred(child, best))))) {
        best = child;
        bestQ = q;
      }
    }
    node = best!;
    path.push(node.id);
  }
  return path;
}

/**
 * Step-level DPO pairs (Agent Q): for every node with at least two visited (explored) children, every pair
 * of visited siblings whose composite Q differ by at least `threshold` (within 1e-9, so decimal thresholds
 * such as 0.1 behave as written) and by more than 0; the chosen action is the one with the higher Q.
 * Unvisited children never take part. Sorted by parentId, then deltaQ descending, then chosenId, then rejectedId.
 */
export function dpoPairs(tree: Tree, alpha: number, threshold: number): NodePair[] {
  const pairs: NodePair[] = [];
  for (const parent of tree.nodes) {
    if (parent.children.length < 2) continue;
    const explored = parent.children.map((id) => getNode(tree, id)).filter((c) => c.visits > 0);
    if (explored.length < 2) continue;
    const qs = explored.map((c) => compositeQ(c, alpha));
    for (let i = 0; i < explored.length; i++) {
      for (let j = i + 1; j < explored.length; j++) {
        const delta = Math.abs(qs[i] - qs[j]);
        if (delta <= 0 || delta < threshold - THRESHOLD_EPSILON) continue;
        const [w, l] = qs[i] > qs[j] ? [i, j] : [j, i];
        pairs.push({
          parentId: parent.id,
          chosenId: explored[w].id,
          rejectedId: explored[l].id,
          chosenQ: qs[w],
          rejectedQ: qs[l],
          deltaQ: qs[w] - qs[l],
        });
      }
    }
  }
  return pairs.sort((a, b) => a.parentId - b.parentId || b.deltaQ - a.deltaQ || a.chosenId - b.chosenId || a.rejectedId - b.rejectedId);
}

export function treeStats(tree: Tree): TreeStats {
  let maxDepth = 0;
  let leaves = 0;
  let terminalNodes = 0;
  for (const n of tree.nodes) {
    if (n.depth > maxDepth) maxDepth = n.depth;
    if (n.children.length === 0) leaves++;
    if (n.terminal) terminalNodes++;
  }
  return { nodes: tree.nodes.length, maxDepth, totalVisits: tree.nodes[0]?.visits ?? 0, leaves, terminalNodes };
}

function clamp01(x: number): number {
  if (!(x > 0)) return 0; // also NaN
  return Math.min(x, 1);
}
