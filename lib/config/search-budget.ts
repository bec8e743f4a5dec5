import { BYTES_PER_TOKEN, EVENTS_PER_ACTIVITY, TEMPORAL_LIMITS } from './history-budget';
import { SNAPSHOT_CHUNK_NODES } from '../search/mcts-search';

/**
 * What one run of an MCTS search workflow (`mctsSearch`) puts into its history, bounded from the config before
 * anything runs. A search continues as new every `continueAsNewEvery` simulations or when the server suggests it,
 * and each run carries its tree through its own history twice: the snapshot's chunks come in as activity results
 * and go out again as activity inputs. So the tree a config allows (one expansion of up to K children per
 * simulation) and the largest simulation (a rollout to maxDepth, each step a sampled completion) must both fit
 * next to each other in 50 MB, whatever else the server suggests.
 *
 * Upper bounds, checked against the recorded search histories by test/unit/search-budget.test.ts.
 */

/** A tree node in a snapshot chunk (JSON): stats, its action with room for typed text, the prompt, completion, token and observation references. */
export const BYTES_PER_NODE = 2048;
/**
 * The server suggests continue-as-new past these (Temporal's defaults, `limit.historyCount.suggestContinueAsNew`
 * and `limit.historySize.suggestContinueAsNew`); a search checks the suggestion after each simulation.
 */
export const SUGGEST_CONTINUE_AS_NEW = { events: 4 * 1024, bytes: 4 * 1024 * 1024 } as const;
/** An action as a replayed path carries it, and a step's references, summaries and reward. */
const ACTION_BYTES = 256;
const STEP_BYTES = 4096;
/** Start, search attributes, the input (parameters, the policy, the carried state), the close, the pairs. */
const RUN_FIXED_EVENTS = 40;
const RUN_FIXED_BYTES = 128 * 1024;

export interface SearchShape {
  numSimulations: number;
  /** K: children of one expansion at most. */
  maxChildren: number;
  maxDepth: number;
  continueAsNewEvery: number;
  parkedSessions: number;
  maxTokens: number;
}

export interface SearchFootprint {
  treeNodes: number;
  treeBytes: number;
  /** The largest simulation: restore along a path of maxDepth, expand with K samples and the critic, roll out to maxDepth. */
  simulationEvents: number;
  simulationBytes: number;
  /** One workflow run: the tree loaded and stored, and the simulations between two continue-as-new. */
  runEvents: number;
  runBytes: number;
  /** The largest activity payload of the snapshot: one chunk of nodes. */
  chunkBytes: number;
}

export function searchFootprint(s: SearchShape): SearchFootprint {
  const treeNodes = 1 + s.numSimulations * s.maxChildren;
  const treeBytes = treeNodes * BYTES_PER_NODE;
  const completion = BYTES_PER_TOKEN * s.maxTokens + 512;
  // restore: open (or reset) a session and step up to maxDepth actions forward, close what is left over;
  // expand: prompt, sample K, parse, store completions, critic, step into the child; rollout: prompt, sample,
  // parse and step at every depth.
  const activities = s.maxDepth + 2 + s.parkedSessions + 6 + 4 * s.maxDepth;
  const simulationEvents = EVENTS_PER_ACTIVITY * activities;
  // The K completions travel three times (the sampler's answer, the parser's input, the critic's), a rollout's one twice.
  const simulationBytes = s.maxDepth * ACTION_BYTES + 3 * s.maxChildren * completion + s.maxDepth * (2 * completion + STEP_BYTES) + 10 * STEP_BYTES;
  const chunks = Math.ceil(treeNodes / SNAPSHOT_CHUNK_NODES) + 1; // and the manifest
  const perRun = Math.min(s.continueAsNewEvery, s.numSimulations);
  return {
    treeNodes,
    treeBytes,
    simulationEvents,
    simulationBytes,
    runEvents: RUN_FIXED_EVENTS + 2 * EVENTS_PER_ACTIVITY * chunks + Math.min(perRun * simulationEvents, SUGGEST_CONTINUE_AS_NEW.events + simulationEvents),
    runBytes: RUN_FIXED_BYTES + 2 * treeBytes + Math.min(perRun * simulationBytes, SUGGEST_CONTINUE_AS_NEW.bytes + simulationBytes),
    chunkBytes: Math.min(treeNodes, SNAPSHOT_CHUNK_NODES) * BYTES_PER_NODE,
  };
}

const mib = (b: number) => `${(b / 1024 / 1024).toFixed(1)} MiB`;

/** Why a search of this shape would pass a Temporal history limit, naming the settings to lower; empty when it fits. */
export function searchHistoryProblems(s: SearchShape): string[] {
  const f = searchFootprint(s);
  const L = TEMPORAL_LIMITS;
  const out: string[] = [];
  const treeShare = 2 * f.treeBytes;
  const simShare = f.runBytes - RUN_FIXED_BYTES - treeShare;
  const tree = `mcts.numSimulations ${s.numSimulations} × mcts.maxChildren ${s.maxChildren}`;
  const sim = `mcts.maxDepth ${s.maxDepth} × policy.maxTokens ${s.maxTokens} (mcts.maxChildren ${s.maxChildren})`;
  if (f.runBytes > L.historyBytes) {
    const detail = `a search's tree grows to ${f.treeNodes} nodes (${mib(f.treeBytes)}), loaded and stored again by each continued run, and one simulation writes up to ${mib(f.simulationBytes)}: one run's history reaches ${mib(f.runBytes)}, over Temporal's ${mib(L.historyBytes)}`;
    // Each part that takes half the limit (or the larger part) is named with what lowers it.
    if (treeShare >= simShare || treeShare > L.historyBytes / 2) out.push(`${tree}: ${detail}: lower mcts.numSimulations or mcts.maxChildren`);
    if (simShare > treeShare || simShare > L.historyBytes / 2) out.push(`${sim}: ${detail}: lower mcts.maxDepth or policy.maxTokens`);
  }
  if (f.runEvents > L.historyEvents) {
    out.push(
      `${sim}: one search run's history reaches ${f.runEvents} events (one simulation up to ${f.simulationEvents}), over Temporal's ${L.historyEvents}: lower mcts.maxDepth`,
    );
  }
  if (f.chunkBytes > L.payloadBytes) {
    out.push(`a snapshot chunk of ${SNAPSHOT_CHUNK_NODES} nodes reaches ${mib(f.chunkBytes)}, over Temporal's ${mib(L.payloadBytes)} payload limit`);
  }
  return out;
}
