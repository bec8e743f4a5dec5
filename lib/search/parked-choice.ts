import { actionKey, type Action } from '../model-io/actions';
import { MINIWOB_RAISED_TIME_LIMIT_MS, type MiniwobConfig } from '../config/config';
import { getNode, pathTo, type Tree } from './mcts';

/**
 * Which parked browser session (workflows/parked-sessions.ts) serves a restore of a tree node. A session is
 * at a node when its action path is that node's; null when it went past the tree (a rollout) or its episode
 * ended, so only an in-place reset can use it.
 */
export interface ParkedSpot {
  node: number | null;
}

export type ParkedChoice =
  /** The session is at the node already. */
  | { kind: 'exact'; index: number }
  /** The session is at an ancestor: run `actions` (the rest of the node's path) in it. */
  | { kind: 'advance'; index: number; actions: Action[] }
  /** Reset the session in place and replay the node's whole path. */
  | { kind: 'reset'; index: number }
  | { kind: 'none' };

export interface ParkedChoiceOptions {
  /** Most actions an ancestor's session may be stepped forward; further than that a reset is as cheap. */
  maxAdvance: number;
  /** Whether the environment resets a session in place (MiniWoB++ does, REAL does not). */
  canReset: boolean;
}

/**
 * The cheapest way to a session at `target`, from sessions listed least recently used first: one exactly
 * there; else the closest ancestor within `maxAdvance` actions (the most recently used among equals); else
 * one reset in place (the least recently used at no node, else the least recently used); else none (open a
 * new session).
 */
export function chooseParked(tree: Tree, parked: readonly ParkedSpot[], target: number, opts: ParkedChoiceOptions): ParkedChoice {
  if (parked.length === 0) return { kind: 'none' };
  const line = pathTo(tree, target);
  let best: { index: number; missing: number } | undefined;
  for (let i = parked.length - 1; i >= 0; i--) {
    const node = parked[i].node;
    if (node === null) continue;
    const at = line.indexOf(node);
    if (at < 0) continue;
    const missing = line.length - 1 - at;
    if (missing === 0) return { kind: 'exact', index: i };
    if (missing <= opts.maxAdvance && (!best || missing < best.missing)) best = { index: i, missing };
  }
  if (best) {
    const actions = line.slice(line.length - best.missing).map((id) => getNode(tree, id).action as Action);
    return { kind: 'advance', index: best.index, actions };
  }
  if (!opts.canReset) return { kind: 'none' };
  // Sessions at no node are good for nothing else; sessions at nodes may still be hit exactly later.
  const idle = parked.findIndex((p) => p.node === null);
  return { kind: 'reset', index: Math.max(idle, 0) };
}

/**
 * The parked session to bring to `target` in the background (a spare for the next simulation that needs the
 * same state), or -1: none when one is at `target` already or being brought there, else the least recently
 * used at no node, else the least recently used, never one still busy with another background reset.
 */
export function chooseSpare(parked: readonly (ParkedSpot & { busy: boolean })[], target: number): number {
  if (parked.some((p) => p.node === target)) return -1;
  const idle = parked.findIndex((p) => !p.busy && p.node === null);
  return idle >= 0 ? idle : parked.findIndex((p) => !p.busy);
}

/**
 * How long after its episode began a parked session may still be used at its node: a MiniWoB++ episode's
 * time limit keeps running while the session is parked, and one that ran out would end differently from a new
 * session's. Half the limit; `official` limits are the tasks' own (10 s for most): never, only resets.
 */
export function parkedMaxAgeMs(env: string, timeLimit: MiniwobConfig['timeLimit'] | undefined): number {
  if (env !== 'miniwob') return Infinity;
  if (timeLimit === 'official') return 0;
  return (timeLimit === undefined || timeLimit === 'raised' ? MINIWOB_RAISED_TIME_LIMIT_MS : timeLimit) / 2;
}

/** The node whose action path is `path` (from the root), or null when the path leaves the tree. */
export function nodeAtPath(tree: Tree, path: readonly Action[]): number | null {
  let id = 0;
  for (const action of path) {
    const key = actionKey(action);
    const next = getNode(tree, id).children.find((c) => getNode(tree, c).actionKey === key);
    if (next === undefined) return null;
    id = next;
  }
  return id;
}
