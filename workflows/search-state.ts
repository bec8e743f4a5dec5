import { ApplicationFailure } from '@temporalio/workflow';
import type { Action } from '../lib/model-io/actions';
import type { LivedState, ObservationRef, PromptObservationRef } from '../lib/episode/episode-types';
import { backpropagate, getNode, newTree, setObservation, treeStats, type Tree } from '../lib/search/mcts';
import type { RewardState } from '../lib/rewards/types';
import type { MctsParams } from '../lib/search/mcts-params';
import {
  bestPathView,
  collectPairs,
  emptyCounters,
  joinSnapshot,
  rootDecision,
  snapshotChunks,
  type MctsCounters,
  type SessionReuseCounters,
  type MctsPairsSummary,
  type MctsProgress,
  type MctsSearchResult,
  type MctsSearchState,
  type MctsSnapshot,
  type MctsSnapshotChunk,
  type MctsTreeView,
  type SearchTask,
} from '../lib/search/mcts-search';
import {
  addChildren,
  describeSimulation,
  markEnded,
  recordActionError,
  recordShaped,
  shapedValue,
  type SearchCandidate,
  type Valuation,
  type Verdict,
} from '../lib/search/search-tree';
import { boundTree } from '../lib/search/tree-query';
import { workflowClockMs } from './clock';

/** What a search runs on and with (from its input; the same in every run of its continue-as-new chain). */
export interface SearchSpec {
  runId: string;
  iteration: number | null;
  task: SearchTask;
  params: MctsParams;
  /** Actions taken before the root (test-time search); tree depths and paths count after them. */
  rootPath: Action[];
}

/**
 * What one `mctsSearch` run knows (workflows/mcts-search.ts): the tree, the counters, the task's goal, how many
 * simulations are done, what it is doing now. Every change of that state goes through a method here (the tree's
 * own changes are lib/search/search-tree.ts); the workflow file holds only the steps that call activities.
 */
export class SearchState {
  counters: MctsCounters = emptyCounters();
  goal = '';
  simulations: number;
  phase: string;
  /** Runs of this search's continue-as-new chain, this one included. */
  readonly runs: number;
  /** Null only while a continued run loads its snapshot. */
  private loaded: Tree | null = null;

  constructor(
    readonly spec: SearchSpec,
    readonly workflowId: string,
    private readonly carried?: MctsSearchState,
  ) {
    this.simulations = carried?.simulations ?? 0;
    this.runs = (carried?.runs ?? 0) + 1;
    this.phase = carried ? 'loading snapshot' : 'starting';
  }

  get tree(): Tree {
    if (!this.loaded) throw new Error('the search tree is not loaded yet');
    return this.loaded;
  }

  get params(): MctsParams {
    return this.spec.params;
  }

  get label(): string {
    const { task, rootPath } = this.spec;
    return `${task.env}/${task.task} seed ${task.seed}${rootPath.length ? ` after ${rootPath.length} actions` : ''}`;
  }

  // ---- loading and storing ----

  startFresh(): void {
    this.loaded = newTree();
  }

  /** The tree, counters and goal of a continued search from its snapshot (manifest and chunks). */
  restoreFrom(snap: MctsSnapshot, chunks: MctsSnapshotChunk[], ref: string): void {
    try {
      this.loaded = joinSnapshot(snap, chunks);
    } catch (err) {
      throw snapshotMismatch(`${(err as Error).message} (${ref})`);
    }
    this.counters = savedCounters(snap.counters);
    this.goal = snap.goal;
    if (snap.simulations !== this.simulations) throw snapshotMismatch(`tree snapshot ${ref} holds ${snap.simulations} simulations, the workflow state says ${this.simulations}`);
  }

  chunks(): MctsSnapshotChunk[] {
    return snapshotChunks(this.tree);
  }

  snapshot(chunkRefs: string[]): MctsSnapshot {
    const { runId, iteration, task, params } = this.spec;
    return {
      version: 1,
      runId,
      iteration,
      task,
      alpha: params.alpha,
      pairThreshold: params.pairThreshold,
      goal: this.goal,
      simulations: this.simulations,
      counters: this.counters,
      nodeCount: this.tree.nodes.length,
      nextId: this.tree.nextId,
      chunks: chunkRefs,
    };
  }

  /** What continue-as-new carries: the snapshot's reference and a few numbers. */
  continuation(snapshotRef: string): MctsSearchState {
    return { snapshotRef, simulations: this.simulations, stats: treeStats(this.tree), runs: this.runs };
  }

  result(snapshotRef: string, pairs: MctsPairsSummary): MctsSearchResult {
    const alpha = this.params.alpha;
    return {
      workflowId: this.workflowId,
      task: this.spec.task,
      goal: this.goal,
      simulations: this.simulations,
      stats: treeStats(this.tree),
      bestPath: bestPathView(this.tree, alpha),
      pairs,
      counters: this.counters,
      snapshotRef,
      runs: this.runs,
      decision: rootDecision(this.tree, alpha),
    };
  }

  // ---- queries ----

  progress(): MctsProgress {
    return {
      workflowId: this.workflowId,
      phase: this.phase,
      simulations: this.simulations,
      numSimulations: this.params.numSimulations,
      stats: this.loaded ? treeStats(this.loaded) : (this.carried?.stats ?? treeStats(newTree())),
      runs: this.runs,
    };
  }

  view(): MctsTreeView {
    const { runId, iteration, task, params } = this.spec;
    const tree = this.loaded;
    const shown = tree ? boundTree(tree) : null;
    return {
      ...this.progress(),
      runId,
      iteration,
      task,
      goal: this.goal,
      alpha: params.alpha,
      pairThreshold: params.pairThreshold,
      tree: shown?.tree ?? null,
      ...(shown?.note ? { treeNote: shown.note } : {}),
      bestPath: tree ? bestPathView(tree, params.alpha) : null,
      pairs: tree ? collectPairs(tree, params.alpha, params.pairThreshold).length : 0,
      counters: tree ? this.counters : null,
    };
  }

  // ---- bookkeeping of the steps ----

  async timed<T>(key: keyof MctsCounters['seconds'], fn: () => Promise<T>): Promise<T> {
    const t0 = workflowClockMs();
    try {
      return await fn();
    } finally {
      this.counters.seconds[key] += (workflowClockMs() - t0) / 1000;
    }
  }

  /**
   * A session is at a node's state: opened (`fresh`) or reset in place by replaying `replayed` actions from the
   * task's reset, or a parked one taken as it was (`reused`) or stepped `replayed` actions forward (`advanced`).
   */
  restored(replayed: number, goal: string, how: Exclude<keyof SessionReuseCounters, 'prepared'> = 'fresh'): void {
    this.counters.restores++;
    this.counters.replayedActions += replayed;
    this.counters.sessionReuse[how]++;
    if (!this.goal) this.goal = goal;
  }

  /** A spare session was sent to a node in the background. */
  prepared(): void {
    this.counters.sessionReuse.prepared++;
  }

  rebuilt(): void {
    this.counters.sessionRebuilds++;
  }

  stepped(rollout: boolean): void {
    this.counters.browserSteps++;
    if (rollout) this.counters.rolloutSteps++;
  }

  criticAnswered(ok: boolean): void {
    this.counters.criticCalls++;
    if (!ok) this.counters.criticFailures++;
  }

  /** The prompt's view of a state reached `depth` actions after the task's reset. */
  promptObservation(o: ObservationRef, depth: number): PromptObservationRef {
    return { goal: this.goal || o.goal, url: o.url, step: depth, screenshotRef: o.screenshotRef, axtreeRef: o.axtreeRef };
  }

  observed(id: number, o: ObservationRef): void {
    setObservation(this.tree, id, { screenshotRef: o.screenshotRef, axtreeRef: o.axtreeRef, url: o.url, stateKey: o.stateKey });
  }

  /** Counts an expansion's samples (all of them, before equal actions are merged). */
  sampled(candidates: readonly SearchCandidate[]): void {
    this.counters.candidates += candidates.length;
    this.counters.invalidCandidates += candidates.filter((c) => !c.completion.valid).length;
  }

  /** Expansion of `id` (lib/search/search-tree.ts `addChildren`): returns the new child ids, highest prior first. */
  expanded(id: number, promptRef: string, candidates: readonly SearchCandidate[], verdict: Verdict | null): number[] {
    return addChildren(this.tree, id, promptRef, candidates, verdict, this.params.maxChildren);
  }

  ended(id: number, reward: number, outcome: string): void {
    markEnded(this.tree, id, reward, outcome);
  }

  rewarded(id: number, shaped: number, rewardState: RewardState): void {
    recordShaped(this.tree, id, shaped, rewardState);
  }

  /** Node `id`'s state as it was observed when its action path was lived (undefined before it was). */
  livedState(id: number): LivedState | undefined {
    const o = getNode(this.tree, id).observationRef;
    return o ? { stateKey: o.stateKey, screenshotRef: o.screenshotRef } : undefined;
  }

  /**
   * The shaping state a session at node `id` continues from: the one recorded there, else (the root, first
   * restored) the session's own, which is then recorded. Null for a node whose state was never recorded (a tree
   * from before shaping states were kept): the session keeps its own.
   */
  rewardStateAt(id: number, session: RewardState): RewardState | null {
    const data = getNode(this.tree, id).data;
    if (data.rewardState) return data.rewardState;
    if (id !== 0) return null;
    data.rewardState = session;
    return session;
  }

  /**
   * The value of an episode that reached node `id`, then earned `more` (a rollout's shaped rewards) and ended in
   * `success` or not; `otherwise` (the outcome's value) unless the search values by shaped return.
   */
  valueAt(id: number, more: number, success: boolean, otherwise: number): number {
    const P = this.params;
    if (P.valueMode !== 'shaped') return otherwise;
    return shapedValue(this.tree, id, more, P.shapedScale ?? 1, success);
  }

  actionFailed(id: number, error: string): void {
    recordActionError(this.tree, id, error);
  }

  /** Backpropagation ends simulation `sim`: only now is it counted, so it is counted exactly once. */
  backedUp(v: Valuation, sim: number, startedAt: number): void {
    backpropagate(this.tree, v.node, v.value);
    this.simulations = sim;
    this.counters.seconds.total += (workflowClockMs() - startedAt) / 1000;
  }

  /** The Temporal UI's current details after a simulation. */
  describeSimulation(tag: string, leaf: number, v: Valuation): string {
    return describeSimulation(this.tree, this.params.alpha, { tag, label: this.label, leaf, valuation: v });
  }
}

function snapshotMismatch(message: string): ApplicationFailure {
  return ApplicationFailure.nonRetryable(message, 'MctsSnapshotMismatch');
}

/** A snapshot's counters; one stored before a counter existed reads it as 0. */
function savedCounters(saved: MctsCounters): MctsCounters {
  const empty = emptyCounters();
  return { ...empty, ...saved, sessionReuse: { ...empty.sessionReuse, ...saved.sessionReuse } };
}
