/**
 * Agent-Q-style MCTS as durable workflows (DESIGN.md, notes/real-benchmark.md §8).
 *
 * `mctsSearch` (one per task): the search tree lives in workflow state (pure operations of lib/mcts.ts), and
 * every simulation reads top to bottom in `simulate` below:
 *
 *   1. select      UCB1 on the composite Q from the root down to a leaf (lib/mcts.ts `select`);
 *   2. restore     a browser session at the leaf's state: `startSession` on the shared browser queue with
 *                  the leaf's action path as `replay` (the action path is the state);
 *   3. expand      the policy samples K candidate actions (colocated learner or an OpenAI-compatible server,
 *                  like the episode), equal actions are merged, the critic ranks them and values the state,
 *                  the children are added with the critic's rank priors (at most K);
 *   4. evaluate    the best new child's action runs in the session; its value is the terminal reward
 *                  (1 success, 0 otherwise), or a policy rollout to a terminal state or mcts.maxDepth
 *                  (valueMode rollout), or the critic's estimate of its state (valueMode critic);
 *   5. backup      visits and values from that node to the root (lib/mcts.ts `backpropagate`).
 *
 * A leaf that is a child never evaluated skips step 3: its parent's state is restored and its action run.
 * A terminal leaf needs no browser: its reward is backed up again.
 *
 * Durability: the simulation counter lives in workflow state and advances only after backpropagation, so
 * a simulation is counted exactly once whatever dies in between (activities are retried, a lost session is
 * rebuilt by replaying the simulation's own action path). Every `continueAsNewEvery` simulations (or when
 * Temporal suggests it) the tree goes to the blob store (`storeJson`) and the workflow continues as new
 * carrying only that reference, the simulation count and a few numbers; the tree never travels as
 * workflow input.
 *
 * At the end the tree is stored once more and the step-level DPO pairs (explored siblings whose composite
 * Q differ by at least mcts.pairThreshold; chosen = higher Q; the parent's prompt, both completions and,
 * where the colocated sampler gave them, reference log-probs logged at collection time) are computed from
 * it by an activity and stored as a blob: the result carries their reference and summary only.
 *
 * `trainMcts` (one per run, id = mcts.runId) mirrors `trainGrpo`: per iteration one search per task as
 * child workflows, the DPO pairs of all searches → `writeDpoBatch` → learner `update_dpo` (adapter
 * v<N> of the run, the `qwen3vl_mcts` adapter) → into vLLM when serving from one → optional greedy
 * evaluation → one metrics line (`runs/<run>/mcts-metrics.jsonl`) → continue-as-new with a small state.
 */
import {
  ApplicationFailure,
  condition,
  continueAsNew,
  defineQuery,
  executeChild,
  log,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
  type RetryPolicy,
} from '@temporalio/workflow';
import { pool } from './pool';
import { isSessionLost } from './session-lost';
import { runConfig } from './run-config';
import type { ControlActivities } from '../activities/control';
import type { SessionActivities } from '../activities/session';
import type { CriticActivities, CriticConfig } from '../activities/critic';
import type { LearnerBatchActivities } from '../activities/learner-batches';
import type { AdapterActivities } from '../activities/adapters';
import type { MctsStoreActivities } from '../activities/mcts-store';
import type { MctsIterationMetrics, MctsMetricsActivities } from '../activities/mcts-metrics';
import { actionKey, clip, describeAction, isTerminal, isValidAction, type Action, type AgentAction } from '../lib/actions';
import type { HaloConfig, PolicyConfig } from '../lib/config';
import type { EnvOptions, EpisodeInput, EpisodeResult, ObservationRef as EpisodeObservation, SessionHandle } from '../lib/episode-types';
import {
  actionPath,
  backpropagate,
  bestPath,
  compositeQ,
  dpoPairs,
  expand,
  getNode,
  markTerminal,
  newTree,
  pathTo,
  qMcts,
  select,
  setCriticValue,
  setObservation,
  treeStats,
  type ObservationRef as TreeObservation,
  type Tree,
  type TreeStats,
} from '../lib/mcts';
import { parseAction } from '../lib/parse';
import { NEUTRAL_VALUE } from '../lib/critic';
import { mctsParams, type MctsParams } from '../lib/mcts-params';
import type { RewardState } from '../lib/rewards/types';
import { parseRewardWeights, type RewardWeights } from '../lib/rewards/weights';
import { fnv1a32 } from '../lib/rewards/shaping';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import { episode } from './episode';
import { learnerActivities } from './learner';
import { pauseSignal, resumeSignal, stopSignal } from './train-grpo';

// ---------------------------------------------------------------------------------------------------
// Types
// ---------------------------------------------------------------------------------------------------

export type { MctsParams } from '../lib/mcts-params';
export { mctsParams } from '../lib/mcts-params';

export interface MctsSearchInput {
  runId: string;
  iteration?: number;
  task: { env: 'miniwob' | 'real'; task: string; seed: number };
  params: MctsParams;
  /** The policy of this iteration (for the openai backend, `model` names the iteration's adapter when one is served). */
  policy: PolicyConfig;
  /** Colocated: the adapter version the learner samples with (0 = base model). */
  adapterVersion: number;
  browserTaskQueue: string;
  gpuTaskQueue: string;
  learnerHeartbeatTimeoutMs: number;
  maxSessionRebuilds: number;
  sessionStartTimeoutMs: number;
  heartbeatTimeoutMs: number;
  rewardWeights?: RewardWeights;
  envOptions?: EnvOptions;
  /**
   * Actions already taken since the task's reset (test-time search inside an episode): the tree's root is
   * the state they lead to, every restore replays them first, and tree depths count from there.
   */
  rootPath?: Action[];
  /** Present on continuation only. */
  state?: MctsSearchState;
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

/**
 * Per-node data that lib/mcts.ts's nodes do not hold; `meta[id]` belongs to node `id`. Completions and
 * prompts are blob references (no large text in workflow state).
 */
export interface NodeMeta {
  /** The completion that proposed this node's action (text blob): a DPO pair's chosen/rejected text. */
  completionRef?: string;
  /** First characters of that completion. */
  preview?: string;
  /** The sampler's log-prob sum of that completion, when usable as the DPO reference (see `refLogprob`); else null. */
  refLogprob?: number | null;
  /** The prompt at this node's state, from which its children were sampled (a DPO pair's prompt). */
  promptRef?: string;
  /** The critic's answer at this node's state was unusable (neutral verdict). */
  criticOk?: boolean;
  /** Why the node is terminal: `success`, `failure` (environment outcomes), `ended, …` (self-evaluated), `unparseable`, `depth cap`. */
  outcome?: string;
  /** The environment's complaint when the action could not be applied (the state did not change). */
  actionError?: string;
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
  /** Workflow-clock seconds per phase (restore = startSession with replay). */
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
  task: MctsSearchInput['task'];
  alpha: number;
  pairThreshold: number;
  goal: string;
  simulations: number;
  counters: MctsCounters;
  nodeCount: number;
  nextId: number;
  chunks: string[];
}

/** Nodes `from .. from + nodes.length - 1` and their meta. */
export interface MctsSnapshotChunk {
  from: number;
  nodes: Tree['nodes'];
  meta: NodeMeta[];
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
export interface MctsPair {
  prompt_ref: string;
  chosen_ref: string;
  rejected_ref: string;
  ref_chosen_logprob: number | null;
  ref_rejected_logprob: number | null;
  delta_q: number;
  chosen_q: number;
  rejected_q: number;
  parent: number;
  chosen: number;
  rejected: number;
}

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
  /** The completion that proposed it, and the prompt at the root it was sampled from. */
  completionRef?: string;
  preview?: string;
  promptRef: string;
  visits: number;
  q: number;
}

export interface MctsSearchResult {
  workflowId: string;
  task: MctsSearchInput['task'];
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
  task: MctsSearchInput['task'];
  goal: string;
  alpha: number;
  pairThreshold: number;
  /** Null only while a continued run loads its snapshot. */
  tree: Tree | null;
  meta: NodeMeta[] | null;
  bestPath: BestPathView | null;
  pairs: number;
  counters: MctsCounters | null;
}

/** The tree and its statistics (all of it; queries are not recorded in the history). */
export const mctsTreeQuery = defineQuery<MctsTreeView>('tree');
/** Small: simulation count, phase, tree statistics. */
export const mctsProgressQuery = defineQuery<MctsProgress>('progress');

// ---------------------------------------------------------------------------------------------------
// Pure helpers (no workflow APIs; unit-tested in test/unit/mcts-search.test.ts)
// ---------------------------------------------------------------------------------------------------

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
    seconds: { restore: 0, sample: 0, critic: 0, step: 0, total: 0 },
  };
}

/**
 * Unparseable candidates. Decision: an unparseable completion becomes a child like any other, whose
 * "action" is the parser's InvalidAction (`{type: 'invalid', reason, excerpt}`), marked terminal with
 * reward 0 as soon as it is added, and keeping its completion (meta.completionRef) and log-prob sum.
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
 *   of a node whose state is restored. (lib/mcts.ts types actions as `Action`; the cast is confined to
 *   `asTreeAction`.)
 */
export function asTreeAction(a: AgentAction): Action {
  return a as Action;
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
export function refLogprob(logprobs: readonly number[] | undefined, temperature: number, finishReason: string | null | undefined): number | null {
  if (!logprobs || logprobs.length === 0) return null;
  if (Math.abs(temperature - 1) > 1e-9 || finishReason !== 'stop') return null;
  let s = 0;
  for (const x of logprobs) s += x;
  return Number.isFinite(s) ? s : null;
}

/** Step-level DPO pairs with their texts' references; pairs whose prompt or texts are missing are left out. */
export function collectPairs(tree: Tree, meta: readonly NodeMeta[], alpha: number, threshold: number): MctsPair[] {
  const out: MctsPair[] = [];
  for (const p of dpoPairs(tree, alpha, threshold)) {
    const prompt = meta[p.parentId]?.promptRef;
    const c = meta[p.chosenId];
    const r = meta[p.rejectedId];
    if (!prompt || !c?.completionRef || !r?.completionRef) continue;
    const both = c.refLogprob != null && r.refLogprob != null;
    out.push({
      prompt_ref: prompt,
      chosen_ref: c.completionRef,
      rejected_ref: r.completionRef,
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

/** The tree's nodes and meta in chunks of `size` nodes, in id order. */
export function snapshotChunks(tree: Tree, meta: readonly NodeMeta[], size = SNAPSHOT_CHUNK_NODES): MctsSnapshotChunk[] {
  const out: MctsSnapshotChunk[] = [];
  for (let from = 0; from < tree.nodes.length; from += size) {
    out.push({ from, nodes: tree.nodes.slice(from, from + size), meta: Array.from({ length: Math.min(size, tree.nodes.length - from) }, (_, i) => meta[from + i] ?? {}) });
  }
  return out;
}

/** The tree and meta back from a snapshot's chunks (in the manifest's order); throws when they do not fit together. */
export function joinSnapshot(snap: Pick<MctsSnapshot, 'nodeCount' | 'nextId'>, chunks: readonly MctsSnapshotChunk[]): { tree: Tree; meta: NodeMeta[] } {
  const nodes: Tree['nodes'] = [];
  const meta: NodeMeta[] = [];
  for (const c of chunks) {
    if (c.from !== nodes.length || c.nodes.length !== c.meta.length) {
      throw new Error(`MCTS snapshot chunk starting at node ${c.from} does not follow node ${nodes.length - 1}`);
    }
    nodes.push(...c.nodes);
    meta.push(...c.meta);
  }
  if (nodes.length !== snap.nodeCount || snap.nextId !== nodes.length || nodes.some((n, i) => n.id !== i)) {
    throw new Error(`MCTS snapshot is inconsistent: ${nodes.length} nodes in its chunks, manifest says ${snap.nodeCount} (nextId ${snap.nextId})`);
  }
  return { tree: { nodes, nextId: snap.nextId }, meta };
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
export function rootDecision(tree: Tree, meta: readonly NodeMeta[], alpha: number): RootDecision | null {
  const [first] = bestPath(tree, alpha);
  if (first === undefined) return null;
  const node = getNode(tree, first);
  const m = meta[first] ?? {};
  const promptRef = meta[0]?.promptRef;
  if (!promptRef) return null;
  return {
    nodeId: first,
    action: node.action as AgentAction,
    ...(m.completionRef ? { completionRef: m.completionRef } : {}),
    ...(m.preview !== undefined ? { preview: m.preview } : {}),
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
export function searchWorkflowId(runId: string, iteration: number, task: string): string {
  return `${runId}-it${iteration}-${task}`;
}

/** The task's seed in an iteration: derived from run id, iteration and task (deterministic). */
export function searchSeed(runId: string, iteration: number, task: string): number {
  return parseInt(fnv1a32(`${runId}:${iteration}:${task}`), 16) % 100_000;
}

function treeObservation(o: EpisodeObservation): TreeObservation {
  return { screenshotRef: o.screenshotRef, axtreeRef: o.axtreeRef, url: o.url, stateKey: o.stateKey };
}

const round = (x: number, d = 3) => Math.round(x * 10 ** d) / 10 ** d;

/** One line per node for logs and the UI: `[4] click (500, 300) N=3 Q=0.62`. */
export function describeNode(tree: Tree, id: number, alpha: number): string {
  const n = getNode(tree, id);
  const what = n.action ? describeAction(n.action as AgentAction) : 'root';
  return `[${id}] ${clip(what, 60)} (depth ${n.depth}, N=${n.visits}, Q=${round(compositeQ(n, alpha))})`;
}

// ---------------------------------------------------------------------------------------------------
// mctsSearch
// ---------------------------------------------------------------------------------------------------

interface Candidate {
  action: AgentAction;
  completionRef?: string;
  preview: string;
  refLogprob: number | null;
}

/** One simulation's bookkeeping: its number, the label of its activities, session rebuilds so far. */
interface SimContext {
  sim: number;
  tag: string;
  rebuilds: { n: number };
}

/** A browser session positioned at the end of `path` (the actions applied since the task's reset). */
interface SimSession {
  handle: SessionHandle;
  path: Action[];
  observation: EpisodeObservation;
  rewardState: RewardState;
}

export async function mctsSearch(input: MctsSearchInput): Promise<MctsSearchResult> {
  const info = workflowInfo();
  const P = input.params;
  const { task, policy } = input;
  const rootPath: Action[] = input.rootPath ?? [];
  const label = `${task.env}/${task.task} seed ${task.seed}${rootPath.length ? ` after ${rootPath.length} actions` : ''}`;
  const rewardWeights = parseRewardWeights(input.rewardWeights ?? {});

  upsertSearchAttributes([
    { key: KIND, value: 'mcts' },
    { key: MODE, value: 'mcts' },
    { key: TASK, value: `${task.env}/${task.task}` },
    { key: RUN_ID, value: input.runId },
  ]);

  // ---- state ----
  let tree: Tree | null = null;
  let meta: NodeMeta[] = [];
  let counters = emptyCounters();
  let goal = '';
  let simulations = input.state?.simulations ?? 0;
  const runs = (input.state?.runs ?? 0) + 1;
  let phase = input.state ? 'loading snapshot' : 'starting';
  const progress = (): MctsProgress => ({
    workflowId: info.workflowId,
    phase,
    simulations,
    numSimulations: P.numSimulations,
    stats: tree ? treeStats(tree) : (input.state?.stats ?? treeStats(newTree())),
    runs,
  });
  setHandler(mctsProgressQuery, progress);
  setHandler(mctsTreeQuery, () => ({
    ...progress(),
    runId: input.runId,
    iteration: input.iteration ?? null,
    task,
    goal,
    alpha: P.alpha,
    pairThreshold: P.pairThreshold,
    tree,
    meta: tree ? meta : null,
    bestPath: tree ? bestPathView(tree, P.alpha) : null,
    pairs: tree ? collectPairs(tree, meta, P.alpha, P.pairThreshold).length : 0,
    counters: tree ? counters : null,
  }));

  // ---- activity proxies ----
  const retry: RetryPolicy = { initialInterval: '1s', backoffCoefficient: 2, maximumInterval: '30s', maximumAttempts: policy.maxAttempts };
  const quick = (summary: string) =>
    proxyActivities<ControlActivities & MctsStoreActivities>({ summary, startToCloseTimeout: '30s', retry });
  // The model clients time out on their own (timeoutMs); the margin covers blob reads and writes, and bounds
  // how long a call that died with its worker waits before it is retried.
  const policyCall = (summary: string) =>
    proxyActivities<ControlActivities>({ summary, startToCloseTimeout: policy.timeoutMs + 10_000, retry });
  const criticCall = (summary: string, critic: CriticConfig) =>
    proxyActivities<CriticActivities>({ summary, startToCloseTimeout: critic.timeoutMs + 10_000, retry });
  const opener = (summary: string) =>
    proxyActivities<SessionActivities>({
      summary,
      taskQueue: input.browserTaskQueue,
      startToCloseTimeout: '5m',
      heartbeatTimeout: input.heartbeatTimeoutMs,
      retry: { maximumAttempts: 3, initialInterval: '1s' },
    });
  const onSession = (s: SessionHandle, summary: string) =>
    proxyActivities<SessionActivities>({
      summary,
      taskQueue: s.taskQueue,
      scheduleToStartTimeout: input.sessionStartTimeoutMs,
      startToCloseTimeout: '2m',
      heartbeatTimeout: input.heartbeatTimeoutMs,
      retry: { maximumAttempts: 1 },
    });
  const learner = (summary: string) =>
    learnerActivities({
      taskQueue: input.gpuTaskQueue,
      summary,
      startToCloseTimeout: '30m',
      heartbeatTimeout: input.learnerHeartbeatTimeoutMs,
    });
  const now = () => new Date().getTime();
  const timed = async <T>(key: keyof MctsCounters['seconds'], fn: () => Promise<T>): Promise<T> => {
    const t0 = now();
    try {
      return await fn();
    } finally {
      counters.seconds[key] += (now() - t0) / 1000;
    }
  };

  // ---- load the tree ----
  if (input.state) {
    const load = quick(`load tree snapshot (${input.state.simulations}/${P.numSimulations} simulations, ${input.state.stats.nodes} nodes)`);
    const snap = (await load.loadJson({ ref: input.state.snapshotRef })) as MctsSnapshot;
    const chunks = (await Promise.all(snap.chunks.map((ref) => load.loadJson({ ref })))) as MctsSnapshotChunk[];
    try {
      ({ tree, meta } = joinSnapshot(snap, chunks));
    } catch (err) {
      throw ApplicationFailure.nonRetryable(`${(err as Error).message} (${input.state.snapshotRef})`, 'MctsSnapshotMismatch');
    }
    counters = snap.counters;
    goal = snap.goal;
    if (snap.simulations !== simulations) {
      throw ApplicationFailure.nonRetryable(
        `tree snapshot ${input.state.snapshotRef} holds ${snap.simulations} simulations, the workflow state says ${simulations}`,
        'MctsSnapshotMismatch',
      );
    }
  } else {
    tree = newTree();
    meta = [{}];
  }
  const T: Tree = tree;

  // ---- browser sessions ----
  const pendingCloses: Promise<void>[] = [];
  function closeLater(s: SessionHandle): void {
    pendingCloses.push(
      onSession(s, 'close session')
        .closeSession({ sessionId: s.sessionId })
        .catch(() => {
          // The session's worker is gone: nothing is left to free.
        }),
    );
  }
  async function flushCloses(): Promise<void> {
    await Promise.all(pendingCloses.splice(0));
  }

  async function openAt(path: Action[], sim: number, summary: string): Promise<SimSession> {
    const started = await timed('restore', () =>
      opener(summary).startSession({
        spec: task,
        replay: [...rootPath, ...path],
        episodeId: `${info.workflowId}#${sim}`,
        rewardWeights,
        envOptions: input.envOptions,
      }),
    );
    counters.restores++;
    counters.replayedActions += rootPath.length + path.length;
    if (!goal) goal = started.observation.goal;
    return { handle: started, path: [...path], observation: started.observation, rewardState: started.rewardState };
  }

  /** Runs `action` in the session; a lost session is rebuilt from its own path (bounded per simulation). */
  async function stepIn(s: SimSession, action: Action, ctx: SimContext, summary: string) {
    const { sim, rebuilds } = ctx;
    for (;;) {
      try {
        const out = await timed('step', () =>
          onSession(s.handle, summary).stepSession({ sessionId: s.handle.sessionId, index: rootPath.length + s.path.length, action, rewardState: s.rewardState }),
        );
        counters.browserSteps++;
        s.path.push(action);
        s.observation = { ...out.observation, goal: s.observation.goal };
        s.rewardState = out.rewardState;
        return out;
      } catch (err) {
        if (!isSessionLost(err)) throw err;
        if (rebuilds.n >= input.maxSessionRebuilds) {
          throw ApplicationFailure.nonRetryable(
            `browser session lost ${rebuilds.n + 1} times in simulation ${sim}; giving up (last: ${(err as Error).message})`,
            'SessionLost',
          );
        }
        rebuilds.n++;
        counters.sessionRebuilds++;
        closeLater(s.handle);
        const fresh = await openAt(s.path, sim, `sim ${sim} · session lost: rebuild by replaying ${s.path.length} actions`);
        s.handle = fresh.handle;
        s.observation = fresh.observation;
        s.rewardState = fresh.rewardState;
      }
    }
  }

  // ---- policy and critic ----
  function promptObservation(o: EpisodeObservation, depth: number) {
    return { goal: goal || o.goal, url: o.url, step: depth, screenshotRef: o.screenshotRef, axtreeRef: o.axtreeRef };
  }

  /** n candidates at the session's state. `keep`: store the completions (expansions) or not (rollouts). */
  async function sampleAt(s: SimSession, n: number, keep: boolean, summary: string): Promise<{ promptRef: string; candidates: Candidate[] }> {
    const observation = promptObservation(s.observation, rootPath.length + s.path.length);
    const history = historyOf([...rootPath, ...s.path], policy.historyLength);
    return timed('sample', async () => {
      if (policy.backend === 'colocated') {
        const promptRef = await quick(`${summary}: prompt`).writePrompt({ observation, history, historyLength: policy.historyLength });
        const out = await learner(`${summary} (${policy.model} v${input.adapterVersion}, n=${n})`).sampleActions({
          run_id: input.runId,
          version: input.adapterVersion,
          prompt_ref: promptRef,
          n,
          temperature: P.temperature,
          max_tokens: policy.maxTokens,
        });
        const refs = keep ? (await quick(`${summary}: store ${out.completions.length} completions`).storeCompletions({ texts: out.completions.map((c) => c.text) })).refs : [];
        return {
          promptRef,
          candidates: out.completions.map((c, i) => ({
            action: parseAction(c.text),
            preview: clip(c.text, 200),
            ...(keep ? { completionRef: refs[i] } : {}),
            refLogprob: refLogprob(c.logprobs, P.temperature, c.finish_reason),
          })),
        };
      }
      const res = await policyCall(`${summary} (${policy.model}, n=${n})`).samplePolicy({
        policy: { ...policy, n, temperature: P.temperature },
        observation,
        history,
      });
      return {
        promptRef: res.promptRef,
        candidates: res.candidates.map((c) => ({ action: c.action, preview: c.preview, completionRef: c.completionRef, refLogprob: null })),
      };
    });
  }

  /**
   * Expansion of `id` at the session's state: K samples, equal actions merged, the critic's ranking and
   * state value, children added (at most K, by prior). Unparseable candidates become terminal children
   * with reward 0 (see `asTreeAction`). Returns the new child ids, highest prior first.
   */
  async function expandAt(id: number, s: SimSession, tag: string): Promise<number[]> {
    phase = `${tag}: expand node ${id}`;
    const { promptRef, candidates } = await sampleAt(s, P.maxChildren, true, `${tag} · expand node ${id} (depth ${s.path.length}): sample K=${P.maxChildren}`);
    const seen = new Map<string, number>();
    const unique: Candidate[] = [];
    for (const c of candidates) {
      const key = actionKey(asTreeAction(c.action));
      if (seen.has(key)) continue;
      seen.set(key, unique.length);
      unique.push(c);
    }
    counters.candidates += candidates.length;
    counters.invalidCandidates += candidates.filter((c) => !isValidAction(c.action)).length;
    let priors = unique.map(() => 0.5);
    if (P.critic) {
      const critic = P.critic;
      const verdict = await timed('critic', () =>
        criticCall(`${tag} · critic ranks ${unique.length} candidates at node ${id}`, critic).critiqueCandidates({
          critic,
          observation: { ...promptObservation(s.observation, rootPath.length + s.path.length) },
          candidates: unique.map((c) => criticText(c.action, c.preview)),
        }),
      );
      counters.criticCalls++;
      if (!verdict.ok) counters.criticFailures++;
      priors = verdict.priors;
      setCriticValue(T, id, verdict.value);
      meta[id] = { ...meta[id], criticOk: verdict.ok };
    }
    meta[id] = { ...meta[id], promptRef };
    const added = expand(
      T,
      id,
      unique.map((c, i) => ({ action: asTreeAction(c.action), prior: priors[i] ?? 0 })),
      P.maxChildren,
    );
    for (const child of added) {
      const c = unique[seen.get(getNode(T, child).actionKey!)!];
      meta[child] = { completionRef: c.completionRef, preview: clip(c.preview, 120), refLogprob: c.refLogprob };
      if (!isValidAction(c.action)) {
        markTerminal(T, child, 0);
        meta[child].outcome = 'unparseable';
      }
    }
    return added;
  }

  /**
   * The value of a state where the episode ended (params.outcome): the environment's success (training), or
   * the critic's judgement of the final page and the actions taken (test-time search; neutral without a critic).
   */
  async function endValue(s: SimSession, envSuccess: boolean, tag: string): Promise<{ value: number; outcome: string }> {
    if (P.outcome !== 'self-evaluation') return { value: envSuccess ? 1 : 0, outcome: envSuccess ? 'success' : 'failure' };
    if (!P.critic) return { value: NEUTRAL_VALUE, outcome: `ended, not judged (no critic): ${NEUTRAL_VALUE}` };
    const critic = P.critic;
    const verdict = await timed('critic', () =>
      criticCall(`${tag} · critic judges the ended episode (${rootPath.length + s.path.length} actions)`, critic).judgeOutcome({
        critic,
        observation: promptObservation(s.observation, rootPath.length + s.path.length),
        actions: [...rootPath, ...s.path].map((a) => describeAction(a)),
      }),
    );
    counters.criticCalls++;
    if (!verdict.ok) counters.criticFailures++;
    return { value: verdict.value, outcome: `ended, critic's judgement ${round(verdict.value)}${verdict.ok ? '' : ' (unusable answer: neutral)'}` };
  }

  /** Rollout with the policy from the session's state (node at `depth`) to a terminal state or maxDepth. */
  async function rollout(s: SimSession, from: number, ctx: SimContext): Promise<{ value: number; how: string }> {
    const { tag } = ctx;
    let depth = getNode(T, from).depth;
    let steps = 0;
    while (depth < P.maxDepth) {
      phase = `${tag}: rollout step ${steps + 1} from node ${from}`;
      const { candidates } = await sampleAt(s, 1, false, `${tag} · value of node ${from}: rollout step ${steps + 1} (depth ${depth + 1}/${P.maxDepth})`);
      const c = candidates[0];
      if (!isValidAction(c.action)) return { value: 0, how: `rollout: unparseable output at depth ${depth + 1}` };
      const out = await stepIn(s, c.action, ctx, `${tag} · rollout step ${steps + 1}: ${describeAction(c.action)}`);
      counters.rolloutSteps++;
      steps++;
      depth++;
      if (out.done || isTerminal(c.action)) {
        const end = await endValue(s, out.success, tag);
        return { value: end.value, how: `rollout: ${end.outcome} after ${steps} steps` };
      }
    }
    return { value: 0, how: `rollout: depth cap ${P.maxDepth} after ${steps} steps` };
  }

  /** Runs child `id`'s action in the session (at its parent's state) and values the state it leads to. */
  async function evaluateChild(id: number, s: SimSession, ctx: SimContext): Promise<{ value: number; how: string }> {
    const { tag } = ctx;
    const node = getNode(T, id);
    const action = node.action as Action;
    phase = `${tag}: evaluate node ${id}`;
    const out = await stepIn(s, action, ctx, `${tag} · evaluate node ${id}: ${describeAction(action)}`);
    setObservation(T, id, treeObservation(s.observation));
    if (out.actionError) meta[id] = { ...meta[id], actionError: clip(out.actionError, 200) };
    if (out.done || isTerminal(action)) {
      const end = await endValue(s, out.success, tag);
      markTerminal(T, id, end.value);
      meta[id] = { ...meta[id], outcome: end.outcome };
      return { value: end.value, how: `terminal: ${end.outcome}` };
    }
    if (node.depth >= P.maxDepth) {
      markTerminal(T, id, 0);
      meta[id] = { ...meta[id], outcome: 'depth cap' };
      return { value: 0, how: `depth cap ${P.maxDepth}` };
    }
    if (P.valueMode === 'critic') {
      await expandAt(id, s, tag);
      const v = getNode(T, id).criticValue ?? 0.5;
      return { value: v, how: `critic value ${round(v)}` };
    }
    return rollout(s, id, ctx);
  }

  /** One simulation: select → restore → expand → evaluate → backpropagate. */
  async function simulate(sim: number): Promise<void> {
    const tag = `sim ${sim}/${P.numSimulations}`;
    const t0 = now();
    phase = `${tag}: select`;
    const leaf = select(T, P.ucbConstant, P.alpha);
    const node = getNode(T, leaf);
    let valueNode = leaf;
    let value: number;
    let how: string;
    const ctx: SimContext = { sim, tag, rebuilds: { n: 0 } };
    if (node.terminal) {
      value = node.reward ?? 0;
      how = `terminal reward ${value} backed up again`;
    } else if (node.parent !== null && node.visits === 0) {
      // A child added by an earlier expansion: restore its parent's state, run its action, value it.
      const parentPath = actionPath(T, node.parent);
      const s = await openAt(parentPath, sim, `${tag} · select ${describeNode(T, leaf, P.alpha)}: restore parent state, replay ${parentPath.length} actions`);
      try {
        ({ value, how } = await evaluateChild(leaf, s, ctx));
      } finally {
        closeLater(s.handle);
      }
    } else {
      // The root, or (valueMode rollout) a leaf valued before: restore its state and expand it.
      const path = actionPath(T, leaf);
      const s = await openAt(path, sim, `${tag} · select ${describeNode(T, leaf, P.alpha)}: restore, replay ${path.length} actions`);
      try {
        setObservation(T, leaf, treeObservation(s.observation));
        const added = await expandAt(leaf, s, tag);
        const first = added.find((id) => !isInvalidNode(T, id)) ?? added[0];
        if (first === undefined) {
          // Cannot happen (an unexpanded node gets at least one child); back up the state's critic value.
          value = getNode(T, leaf).criticValue ?? 0;
          how = 'no new child';
        } else if (getNode(T, first).terminal) {
          valueNode = first;
          value = 0;
          how = `all ${added.length} candidates unparseable`;
        } else {
          valueNode = first;
          ({ value, how } = await evaluateChild(first, s, ctx));
        }
      } finally {
        closeLater(s.handle);
      }
    }
    backpropagate(T, valueNode, value);
    simulations = sim;
    counters.seconds.total += (now() - t0) / 1000;
    const st = treeStats(T);
    const root = getNode(T, 0);
    const bp = bestPathView(T, P.alpha);
    const details =
      `${tag} · ${label}\n` +
      `selected ${describeNode(T, leaf, P.alpha)}\n` +
      (valueNode !== leaf ? `expanded: ${getNode(T, leaf).children.length} children; evaluated ${describeNode(T, valueNode, P.alpha)}\n` : '') +
      `value ${round(value)} (${how}), backed up over ${pathTo(T, valueNode).length} nodes\n` +
      `root N=${root.visits} Q̃=${round(qMcts(root))} · ${st.nodes} nodes, depth ${st.maxDepth}, ${st.terminalNodes} terminal\n` +
      `best path: ${bp.actions.join(' → ') || '(none)'}${bp.success ? ' ✓' : ''}`;
    setCurrentDetails(details);
    log.info('mcts simulation', { workflowId: info.workflowId, sim, leaf, valueNode, value, how, nodes: st.nodes });
  }

  async function snapshot(summary: string): Promise<string> {
    await flushCloses();
    const store = quick(summary);
    const chunks = await Promise.all(snapshotChunks(T, meta).map(async (c) => (await store.storeJson({ value: c })).ref));
    const snap: MctsSnapshot = {
      version: 1,
      runId: input.runId,
      iteration: input.iteration ?? null,
      task,
      alpha: P.alpha,
      pairThreshold: P.pairThreshold,
      goal,
      simulations,
      counters,
      nodeCount: T.nodes.length,
      nextId: T.nextId,
      chunks,
    };
    const { ref } = await store.storeJson({ value: snap });
    return ref;
  }

  // ---- the search ----
  let sinceStart = 0;
  while (simulations < P.numSimulations) {
    if (sinceStart >= P.continueAsNewEvery || (sinceStart > 0 && workflowInfo().continueAsNewSuggested)) {
      phase = 'continue as new';
      const st = treeStats(T);
      const snapshotRef = await snapshot(`snapshot after ${simulations}/${P.numSimulations} simulations (${st.nodes} nodes) → continue as new`);
      return continueAsNew<typeof mctsSearch>({ ...input, state: { snapshotRef, simulations, stats: st, runs } });
    }
    await simulate(simulations + 1);
    sinceStart++;
  }

  phase = 'done';
  const snapshotRef = await snapshot(`final tree: ${simulations} simulations, ${treeStats(T).nodes} nodes`);
  // The pairs are computed from the stored tree and stored next to it (their number grows with the tree).
  const pairs = await quick(`DPO pairs from siblings with |ΔQ| ≥ ${P.pairThreshold}`).collectMctsPairs({ snapshot_ref: snapshotRef });
  return {
    workflowId: info.workflowId,
    task,
    goal,
    simulations,
    stats: treeStats(T),
    bestPath: bestPathView(T, P.alpha),
    pairs,
    counters,
    snapshotRef,
    runs,
    decision: rootDecision(T, meta, P.alpha),
  };
}

// ---------------------------------------------------------------------------------------------------
// trainMcts
// ---------------------------------------------------------------------------------------------------

/** What continue-as-new carries: small, no config body, no trees. */
export interface TrainMctsState {
  iteration: number;
  adapterVersion: number;
  configRef: string;
  configHash: string;
  paused: boolean;
  lastMetrics?: MctsIterationMetrics | null;
}

export interface TrainMctsInput {
  /** The run's config; absent on continuation, where `state.configRef` holds it. */
  config?: unknown;
  state?: TrainMctsState;
}

export interface TrainMctsStatus {
  runId: string;
  mode: 'mcts';
  iteration: number;
  iterations: number;
  adapterVersion: number;
  phase: string;
  paused: boolean;
  stopping: boolean;
  /** Workflow ids of this iteration's searches. */
  searches: string[];
  lastMetrics: MctsIterationMetrics | null;
}

export interface TrainMctsResult {
  runId: string;
  iterations: number;
  adapterVersion: number;
  stoppedEarly: boolean;
}

/** Same name as trainGrpo's query, so `halo status` and the pause/resume/stop signals work for MCTS runs too. */
export const trainMctsStatusQuery = defineQuery<TrainMctsStatus>('status');

/** The vLLM name of adapter v<N> of a run (activities/adapters.ts `adapterName`). */
export function servedAdapterName(runId: string, version: number): string {
  return `${runId}-v${version}`;
}

/** The iteration's sampling policy: the run's newest adapter where one is served, else the configured model. */
export function iterationPolicy(cfg: HaloConfig, runId: string, version: number): PolicyConfig {
  if (cfg.policy.backend === 'openai' && cfg.mcts.vllmBaseUrl && version > 0) return { ...cfg.policy, model: servedAdapterName(runId, version) };
  return cfg.policy;
}

/** The iteration's metrics from its searches, the update and the evaluation (pure). */
export function mctsIterationMetrics(input: {
  searches: Pick<MctsSearchResult, 'simulations' | 'stats' | 'bestPath' | 'pairs' | 'counters'>[];
  update: { loss: number; reward_margin: number; accuracy: number; grad_norm: number } | null;
  adapterVersion: number;
  evalSuccessRate: number | null;
  seconds: Record<string, number>;
}): MctsIterationMetrics {
  const s = input.searches;
  const sum = (f: (r: (typeof s)[number]) => number) => s.reduce((a, r) => a + f(r), 0);
  const pairs = sum((r) => r.pairs.count);
  const sumAbsDeltaQ = sum((r) => (r.pairs.meanAbsDeltaQ ?? 0) * r.pairs.count);
  return {
    searches: s.length,
    simulations: sum((r) => r.simulations),
    nodes: sum((r) => r.stats.nodes),
    best_path_success_rate: s.length ? s.filter((r) => r.bestPath.success).length / s.length : 0,
    pairs,
    mean_abs_delta_q: pairs > 0 ? sumAbsDeltaQ / pairs : null,
    pairs_with_ref_logprobs: sum((r) => r.pairs.withRefLogprobs),
    dpo_loss: input.update?.loss ?? null,
    reward_margin: input.update?.reward_margin ?? null,
    accuracy: input.update ? Math.min(1, Math.max(0, input.update.accuracy)) : null,
    grad_norm: input.update?.grad_norm ?? null,
    adapter_version: input.adapterVersion,
    update_skipped: input.update === null,
    candidates: sum((r) => r.counters.candidates),
    invalid_candidates: sum((r) => r.counters.invalidCandidates),
    critic_calls: sum((r) => r.counters.criticCalls),
    critic_failures: sum((r) => r.counters.criticFailures),
    session_rebuilds: sum((r) => r.counters.sessionRebuilds),
    eval_success_rate: input.evalSuccessRate,
    seconds: input.seconds,
  };
}

const seconds = (t0: number) => (new Date().getTime() - t0) / 1000;

/**
 * Agent Q's "MCTS-guided DPO", one iteration per workflow run: searches (child workflows, bounded
 * parallelism) → step-level pairs → `writeDpoBatch` → learner `update_dpo` (v<N>; the reference policy is
 * the one that sampled, through the logged log-probs) → adapter into vLLM → optional greedy evaluation →
 * metrics appended once → continue-as-new.
 */
export async function trainMcts(input: TrainMctsInput): Promise<TrainMctsResult> {
  const info = workflowInfo();
  const control = proxyActivities<ControlActivities & LearnerBatchActivities & MctsStoreActivities & MctsMetricsActivities & AdapterActivities>({
    startToCloseTimeout: '10m',
    retry: { initialInterval: '1s', maximumInterval: '30s', maximumAttempts: 20 },
  });

  const { cfg, stored } = await runConfig(input, control, 'trainMcts input');
  const state: TrainMctsState = input.state ?? { iteration: 1, adapterVersion: 0, configRef: stored!.ref, configHash: stored!.hash, paused: false };
  const m = cfg.mcts;
  const runId = m.runId;
  if (info.workflowId !== runId) {
    throw ApplicationFailure.nonRetryable(`workflow id ${info.workflowId} must equal mcts.runId ${runId}`, 'InvalidConfig');
  }
  upsertSearchAttributes([
    { key: RUN_ID, value: runId },
    { key: KIND, value: 'train' },
    { key: MODE, value: 'mcts' },
    { key: TASK, value: `${cfg.episode.env}/${m.tasks.join(',')}`.slice(0, 200) },
  ]);

  let paused = state.paused;
  let stopping = false;
  let phase = 'starting';
  let searches: string[] = [];
  let lastMetrics: MctsIterationMetrics | null = state.lastMetrics ?? null;
  setHandler(pauseSignal, () => void (paused = true));
  setHandler(resumeSignal, () => void (paused = false));
  setHandler(stopSignal, () => void (stopping = true));
  setHandler(trainMctsStatusQuery, () => ({
    runId,
    mode: 'mcts' as const,
    iteration: state.iteration,
    iterations: m.iterations,
    adapterVersion: state.adapterVersion,
    phase,
    paused,
    stopping,
    searches,
    lastMetrics,
  }));

  if (paused) {
    phase = 'paused';
    await condition(() => !paused || stopping);
  }
  if (stopping) return { runId, iterations: state.iteration - 1, adapterVersion: state.adapterVersion, stoppedEarly: true };

  const it = state.iteration;
  const phaseSeconds: Record<string, number> = {};
  const gpuTaskQueue = cfg.train.gpuTaskQueue;
  const learnerHeartbeatTimeoutMs = cfg.train.learnerHeartbeatTimeoutS * 1000;

  // 1. One search per task, with the current policy (adapter v<N-1>).
  phase = 'search';
  let t0 = new Date().getTime();
  const params = mctsParams(cfg);
  const policy = iterationPolicy(cfg, runId, state.adapterVersion);
  const picks = m.tasks.map((task) => ({ task, seed: searchSeed(runId, it, task), id: searchWorkflowId(runId, it, task) }));
  searches = picks.map((p) => p.id);
  const results = await pool(picks, m.parallelism, (p) =>
    executeChild(mctsSearch, {
      workflowId: p.id,
      taskQueue: cfg.temporal.controlTaskQueue,
      staticSummary: `${runId} iteration ${it}: MCTS on ${cfg.episode.env}/${p.task} seed ${p.seed} (${params.numSimulations} simulations)`,
      args: [
        {
          runId,
          iteration: it,
          task: { env: cfg.episode.env, task: p.task, seed: p.seed },
          params,
          policy,
          adapterVersion: state.adapterVersion,
          browserTaskQueue: cfg.temporal.browserTaskQueue,
          gpuTaskQueue,
          learnerHeartbeatTimeoutMs,
          maxSessionRebuilds: cfg.episode.maxSessionRebuilds,
          sessionStartTimeoutMs: cfg.episode.sessionStartTimeoutMs,
          heartbeatTimeoutMs: cfg.episode.heartbeatTimeoutMs,
          rewardWeights: cfg.rewards,
          envOptions: { realRunId: cfg.real.runId, evaluateAtCap: cfg.real.evaluateAtCap },
        } satisfies MctsSearchInput,
      ],
    }),
  );
  phaseSeconds.search = seconds(t0);

  // 2. Step-level DPO on all pairs of the iteration: adapter v<N>.
  const pairRefs = results.flatMap((r) => (r.pairs.ref && r.pairs.count > 0 ? [r.pairs.ref] : []));
  const pairCount = results.reduce((n, r) => n + r.pairs.count, 0);
  let version = state.adapterVersion;
  let update: { loss: number; reward_margin: number; accuracy: number; grad_norm: number } | null = null;
  if (pairCount > 0) {
    phase = 'update';
    t0 = new Date().getTime();
    // writeDpoBatch (validated against the learner's schema) over the searches' pair blobs.
    const { batch_ref: batchRef } = await control.writeMctsDpoBatch({ pairs_refs: pairRefs });
    phaseSeconds.batch = seconds(t0);
    t0 = new Date().getTime();
    const next = version + 1;
    const out = await learnerActivities({
      taskQueue: gpuTaskQueue,
      heartbeatTimeout: learnerHeartbeatTimeoutMs,
      summary: `update_dpo ${runId} v${next} (${pairCount} pairs)`,
    }).updateDpo({
      run_id: runId,
      version: next,
      batch_ref: batchRef,
      hyperparameters: { learning_rate: m.learningRate, beta: m.beta, max_grad_norm: m.maxGradNorm },
    });
    phaseSeconds.update = seconds(t0);
    update = { loss: out.loss, reward_margin: out.reward_margin, accuracy: out.accuracy, grad_norm: out.grad_norm };
    version = next;
    // 3. Serve it (colocated: the learner already holds it).
    if (cfg.policy.backend === 'openai' && m.vllmBaseUrl) {
      phase = 'load adapter';
      t0 = new Date().getTime();
      await control.loadAdapterIntoVllm({ base_url: m.vllmBaseUrl, run_id: runId, version, adapter_path: out.adapter_path, keep: 1 });
      phaseSeconds.load = seconds(t0);
    }
  } else {
    log.warn('no DPO pairs in this iteration: update skipped, adapter unchanged', { runId, iteration: it });
  }

  // 4. Greedy evaluation with the new policy, every evalEvery iterations.
  let evalSuccessRate: number | null = null;
  if (m.evalEvery > 0 && it % m.evalEvery === 0) {
    phase = 'evaluate';
    t0 = new Date().getTime();
    const greedy: PolicyConfig = { ...iterationPolicy(cfg, runId, version), n: 1, temperature: 0 };
    const runsEval = m.tasks.flatMap((task) => m.evalSeeds.map((seed) => ({ task, seed })));
    const evals: EpisodeResult[] = await pool(runsEval, m.parallelism, (e) =>
      executeChild(episode, {
        workflowId: `${runId}-it${it}-eval-${e.task}-s${e.seed}`,
        taskQueue: cfg.temporal.controlTaskQueue,
        staticSummary: `${runId} iteration ${it}: greedy evaluation of v${version} on ${cfg.episode.env}/${e.task} seed ${e.seed}`,
        args: [
          {
            task: { env: cfg.episode.env, task: e.task, seed: e.seed },
            maxSteps: cfg.episode.maxSteps,
            policy: greedy,
            browserTaskQueue: cfg.temporal.browserTaskQueue,
            maxSessionRebuilds: cfg.episode.maxSessionRebuilds,
            sessionStartTimeoutMs: cfg.episode.sessionStartTimeoutMs,
            heartbeatTimeoutMs: cfg.episode.heartbeatTimeoutMs,
            runId,
            mode: 'mcts-eval',
            rewardWeights: cfg.rewards,
            envOptions: { realRunId: cfg.real.runId, evaluateAtCap: cfg.real.evaluateAtCap },
            adapterVersion: version,
            gpuTaskQueue,
            learnerHeartbeatTimeoutMs,
          } satisfies EpisodeInput,
        ],
      }),
    );
    evalSuccessRate = evals.length ? evals.filter((e) => e.success).length / evals.length : null;
    phaseSeconds.eval = seconds(t0);
  }

  // 5. Metrics, once per iteration.
  phase = 'metrics';
  const metrics = mctsIterationMetrics({ searches: results, update, adapterVersion: version, evalSuccessRate, seconds: phaseSeconds });
  lastMetrics = metrics;
  await control.appendMctsMetrics({ run_id: runId, iteration: it, metrics, time: new Date().toISOString() });

  const nextState: TrainMctsState = { ...state, iteration: it + 1, adapterVersion: version, paused, lastMetrics: metrics };
  if (stopping || it >= m.iterations) {
    return { runId, iterations: it, adapterVersion: version, stoppedEarly: it < m.iterations };
  }
  phase = 'continue';
  return continueAsNew<typeof trainMcts>({ state: nextState });
}
