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
 * The search's state and every change of it are in `SearchState` (workflows/search-state.ts); this file holds
 * the steps that call activities: sessions (workflows/durable-session.ts), sampling (workflows/sampler.ts),
 * the critic and the blob store.
 */
import {
  continueAsNew,
  defineQuery,
  log,
  proxyActivities,
  setCurrentDetails,
  setHandler,
  upsertSearchAttributes,
  workflowInfo,
} from '@temporalio/workflow';
import type { CriticActivities, CriticConfig } from '../activities/critic';
import type { ControlActivities } from '../activities/control';
import type { MctsStoreActivities } from '../activities/mcts-store';
import { describeAction, isTerminal, isValidAction, type Action } from '../lib/actions';
import { NEUTRAL_VALUE } from '../lib/critic';
import type { PolicyConfig } from '../lib/config';
import { episodeRun, type LegacyEpisodeFields } from '../lib/episode-types';
import { actionPath, getNode, select } from '../lib/mcts';
import type { MctsParams } from '../lib/mcts-params';
import {
  criticText,
  describeNode,
  distinctActions,
  historyOf,
  isInvalidNode,
  refLogprob,
  round,
  type MctsProgress,
  type MctsSearchResult,
  type MctsSearchState,
  type MctsSnapshot,
  type MctsSnapshotChunk,
  type MctsTreeView,
  type SearchTask,
} from '../lib/mcts-search';
import { parseRewardWeights } from '../lib/rewards/weights';
import { clipSummary } from '../lib/text';
import type { RunContext } from '../lib/run-context';
import { KIND, MODE, RUN_ID, TASK } from '../lib/search-attributes';
import * as profiles from './activity-profiles';
import { DurableSession, Sessions, type RebuildBudget, type SessionSettings } from './durable-session';
import { sample, type SamplerSettings } from './sampler';
import { SearchState, type SearchCandidate, type Valuation, type Verdict } from './search-state';
import type { ServedAdapter } from '../lib/iteration-policy';
import { workflowClockMs } from './clock';

export interface MctsSearchInput extends LegacyEpisodeFields {
  /** The run's infrastructure (queues, timeouts, rewards); inputs recorded before it existed carry the flat fields. */
  run?: RunContext;
  iteration?: number;
  task: SearchTask;
  params: MctsParams;
  /** The policy of this iteration (for the openai backend, `model` names the iteration's adapter when one is served). */
  policy: PolicyConfig;
  /** Colocated: the adapter version the learner samples with (0 = base model). */
  adapterVersion: number;
  /** openai policy naming a served adapter: loaded again if the server restarted (lib/iteration-policy.ts). */
  adapter?: ServedAdapter;
  /**
   * Actions already taken since the task's reset (test-time search inside an episode): the tree's root is
   * the state they lead to, every restore replays them first, and tree depths count from there.
   */
  rootPath?: Action[];
  /** Present on continuation only. */
  state?: MctsSearchState;
}

/** The tree and its statistics (all of it; queries are not recorded in the history). */
export const mctsTreeQuery = defineQuery<MctsTreeView>('tree');
/** Small: simulation count, phase, tree statistics. */
export const mctsProgressQuery = defineQuery<MctsProgress>('progress');

/** What the steps of one search work with: its state, where its sessions and samples come from. */
interface Search {
  state: SearchState;
  params: MctsParams;
  policy: PolicyConfig;
  run: RunContext;
  sessions: Sessions;
  sampler: SamplerSettings;
}

/** One simulation's label and its budget of session rebuilds. */
interface Sim {
  sim: number;
  tag: string;
  budget: RebuildBudget;
}

export async function mctsSearch(input: MctsSearchInput): Promise<MctsSearchResult> {
  const info = workflowInfo();
  const run = episodeRun(input, info.workflowId);
  const { task, params: P } = input;
  upsertSearchAttributes([
    { key: KIND, value: 'mcts' },
    { key: MODE, value: 'mcts' },
    { key: TASK, value: `${task.env}/${task.task}` },
    { key: RUN_ID, value: run.runId },
  ]);

  const rootPath = input.rootPath ?? [];
  const state = new SearchState({ runId: run.runId, iteration: input.iteration ?? null, task, params: P, rootPath }, info.workflowId, input.state);
  setHandler(mctsProgressQuery, () => state.progress());
  setHandler(mctsTreeQuery, () => state.view());
  const search: Search = {
    state,
    params: P,
    policy: input.policy,
    run,
    sessions: new SearchSessions(
      {
        task,
        browserTaskQueue: run.browserTaskQueue,
        sessionStartTimeoutMs: run.sessionStartTimeoutMs,
        heartbeatTimeoutMs: run.heartbeatTimeoutMs,
        rewardWeights: parseRewardWeights(run.rewardWeights ?? {}),
        envOptions: run.envOptions,
        base: rootPath,
      },
      state,
    ),
    sampler: {
      policy: input.policy,
      adapterVersion: input.adapterVersion,
      ...(input.adapter ? { adapter: input.adapter } : {}),
      runId: run.runId,
      ...(run.baseModel ? { baseModel: run.baseModel } : {}),
      gpuTaskQueue: run.gpuTaskQueue,
      learnerHeartbeatTimeoutMs: run.learnerHeartbeatTimeoutMs,
    },
  };

  if (input.state) await loadSnapshot(state, input.state);
  else state.startFresh();

  let sinceStart = 0;
  while (state.simulations < P.numSimulations) {
    if (sinceStart >= P.continueAsNewEvery || (sinceStart > 0 && workflowInfo().continueAsNewSuggested)) {
      state.phase = 'continue as new';
      const nodes = state.tree.nodes.length;
      const snapshotRef = await storeSnapshot(search, `snapshot after ${state.simulations}/${P.numSimulations} simulations (${nodes} nodes) → continue as new`);
      return continueAsNew<typeof mctsSearch>({ ...input, state: state.continuation(snapshotRef) });
    }
    await simulate(search, state.simulations + 1);
    sinceStart++;
  }

  state.phase = 'done';
  const snapshotRef = await storeSnapshot(search, `final tree: ${state.simulations} simulations, ${state.tree.nodes.length} nodes`);
  // The pairs are computed from the stored tree and stored next to it (their number grows with the tree).
  const pairs = await blobs(`DPO pairs from siblings with |ΔQ| ≥ ${P.pairThreshold}`).collectMctsPairs({ snapshot_ref: snapshotRef });
  return state.result(snapshotRef, pairs);
}

/** One simulation: select → restore → expand → evaluate → backpropagate. */
async function simulate(search: Search, sim: number): Promise<void> {
  const { state, params: P } = search;
  const { tree } = state;
  const startedAt = workflowClockMs();
  const ctx = simContext(search, sim);
  const tag = ctx.tag;
  state.phase = `${tag}: select`;
  const leaf = select(tree, P.ucbConstant, P.alpha);
  const node = getNode(tree, leaf);
  let v: Valuation;
  if (node.terminal) {
    // Nothing to run: the terminal reward is backed up again.
    v = { node: leaf, value: node.reward ?? 0, how: `terminal reward ${node.reward ?? 0} backed up again` };
  } else if (node.parent !== null && node.visits === 0) {
    // A child added by an earlier expansion: restore its parent's state, run its action, value it.
    const s = await restore(search, node.parent, ctx, `${tag} · select ${describeNode(tree, leaf, P.alpha)}: restore parent state`);
    try {
      v = await evaluateChild(search, leaf, s, ctx);
    } finally {
      s.closeLater();
    }
  } else {
    // The root, or (valueMode rollout) a leaf valued before: restore its state, expand it, evaluate a new child.
    const s = await restore(search, leaf, ctx, `${tag} · select ${describeNode(tree, leaf, P.alpha)}: restore`);
    try {
      state.observed(leaf, s.observation);
      const added = await expandNode(search, leaf, s, tag);
      v = await evaluateNewChild(search, leaf, added, s, ctx);
    } finally {
      s.closeLater();
    }
  }
  state.backedUp(v, sim, startedAt);
  setCurrentDetails(state.describeSimulation(tag, leaf, v));
  log.info('mcts simulation', { workflowId: state.workflowId, sim, leaf, valueNode: v.node, value: v.value, how: v.how, nodes: tree.nodes.length });
}

function simContext(search: Search, sim: number): Sim {
  const { state } = search;
  const budget: RebuildBudget = { used: 0, max: search.run.maxSessionRebuilds, where: ` in simulation ${sim}`, onRebuild: () => state.rebuilt() };
  return { sim, tag: `sim ${sim}/${search.params.numSimulations}`, budget };
}

/** A browser session at node `id`'s state: its action path replayed from the task's reset (after the root path). */
async function restore(search: Search, id: number, ctx: Sim, summary: string): Promise<DurableSession> {
  const path = actionPath(search.state.tree, id);
  return search.sessions.open(path, `${search.state.workflowId}#${ctx.sim}`, `${summary}, replay ${path.length} actions`);
}

/** Runs `action` in the session (a lost session is rebuilt within the simulation's budget). */
async function step(search: Search, s: DurableSession, action: Action, ctx: Sim, summary: string, rollout = false) {
  const out = await search.state.timed('step', () => s.step(action, summary, ctx.budget));
  search.state.stepped(rollout);
  return out;
}

/**
 * Expansion of `id` at the session's state: K samples, equal actions merged, the critic's ranking and state
 * value, children added (at most K, by prior). Returns the new child ids, highest prior first.
 */
async function expandNode(search: Search, id: number, s: DurableSession, tag: string): Promise<number[]> {
  const { state, params: P } = search;
  state.phase = `${tag}: expand node ${id}`;
  const { promptRef, candidates } = await sampleAt(search, s, P.maxChildren, true, `${tag} · expand node ${id} (depth ${s.path.length}): sample K=${P.maxChildren}`);
  state.sampled(candidates);
  const distinct = distinctActions(candidates);
  const verdict = await rankCandidates(search, s, distinct, `${tag} · critic ranks ${distinct.length} candidates at node ${id}`);
  return state.expanded(id, promptRef, distinct, verdict);
}

/** After an expansion: the first valid new child is evaluated (all unparseable: the state is worth 0). */
async function evaluateNewChild(search: Search, leaf: number, added: number[], s: DurableSession, ctx: Sim): Promise<Valuation> {
  const tree = search.state.tree;
  const first = added.find((id) => !isInvalidNode(tree, id)) ?? added[0];
  // Cannot happen (an unexpanded node gets at least one child); back up the state's critic value.
  if (first === undefined) return { node: leaf, value: getNode(tree, leaf).criticValue ?? 0, how: 'no new child' };
  if (getNode(tree, first).terminal) return { node: first, value: 0, how: `all ${added.length} candidates unparseable` };
  return evaluateChild(search, first, s, ctx);
}

/** Runs child `id`'s action in the session (at its parent's state) and values the state it leads to. */
async function evaluateChild(search: Search, id: number, s: DurableSession, ctx: Sim): Promise<Valuation> {
  const { state, params: P } = search;
  const node = getNode(state.tree, id);
  const action = node.action as Action;
  state.phase = `${ctx.tag}: evaluate node ${id}`;
  const out = await step(search, s, action, ctx, `${ctx.tag} · evaluate node ${id}: ${describeAction(action)}`);
  state.observed(id, s.observation);
  if (out.actionError) state.actionFailed(id, out.actionError);
  if (out.done || isTerminal(action)) {
    const end = await endValue(search, s, out.success, ctx.tag);
    state.ended(id, end.value, end.outcome);
    return { node: id, value: end.value, how: `terminal: ${end.outcome}` };
  }
  if (node.depth >= P.maxDepth) {
    state.ended(id, 0, 'depth cap');
    return { node: id, value: 0, how: `depth cap ${P.maxDepth}` };
  }
  if (P.valueMode === 'critic') {
    await expandNode(search, id, s, ctx.tag);
    const value = getNode(state.tree, id).criticValue ?? 0.5;
    return { node: id, value, how: `critic value ${round(value)}` };
  }
  return rollout(search, id, s, ctx);
}

/** Rollout with the policy from node `from`'s state (the session's) to a terminal state or maxDepth. */
async function rollout(search: Search, from: number, s: DurableSession, ctx: Sim): Promise<Valuation> {
  const { state, params: P } = search;
  let depth = getNode(state.tree, from).depth;
  let steps = 0;
  while (depth < P.maxDepth) {
    state.phase = `${ctx.tag}: rollout step ${steps + 1} from node ${from}`;
    const { candidates } = await sampleAt(search, s, 1, false, `${ctx.tag} · value of node ${from}: rollout step ${steps + 1} (depth ${depth + 1}/${P.maxDepth})`);
    const c = candidates[0];
    if (!isValidAction(c.action)) return { node: from, value: 0, how: `rollout: unparseable output at depth ${depth + 1}` };
    const out = await step(search, s, c.action, ctx, `${ctx.tag} · rollout step ${steps + 1}: ${describeAction(c.action)}`, true);
    steps++;
    depth++;
    if (out.done || isTerminal(c.action)) {
      const end = await endValue(search, s, out.success, ctx.tag);
      return { node: from, value: end.value, how: `rollout: ${end.outcome} after ${steps} steps` };
    }
  }
  return { node: from, value: 0, how: `rollout: depth cap ${P.maxDepth} after ${steps} steps` };
}

/**
 * The value of a state where the episode ended (params.outcome): the environment's success (training), or
 * the critic's judgement of the final page and the actions taken (test-time search; neutral without a critic).
 */
async function endValue(search: Search, s: DurableSession, envSuccess: boolean, tag: string): Promise<{ value: number; outcome: string }> {
  const { state, params: P } = search;
  if (P.outcome !== 'self-evaluation') return { value: envSuccess ? 1 : 0, outcome: envSuccess ? 'success' : 'failure' };
  const critic = P.critic;
  if (!critic) return { value: NEUTRAL_VALUE, outcome: `ended, not judged (no critic): ${NEUTRAL_VALUE}` };
  const actions = [...state.spec.rootPath, ...s.path];
  const verdict = await state.timed('critic', () =>
    criticCall(search, critic, `${tag} · critic judges the ended episode (${actions.length} actions)`).judgeOutcome({
      critic,
      observation: state.promptObservation(s.observation, actions.length),
      actions: actions.map((a) => describeAction(a)),
    }),
  );
  state.criticAnswered(verdict.ok);
  return { value: verdict.value, outcome: `ended, critic's judgement ${round(verdict.value)}${verdict.ok ? '' : ' (unusable answer: neutral)'}` };
}

/** The critic's ranking of the candidates and value of the session's state; null without a critic. */
async function rankCandidates(search: Search, s: DurableSession, candidates: SearchCandidate[], summary: string): Promise<Verdict | null> {
  const { state } = search;
  const critic = search.params.critic;
  if (!critic) return null;
  const verdict = await state.timed('critic', () =>
    criticCall(search, critic, summary).critiqueCandidates({
      critic,
      observation: state.promptObservation(s.observation, state.spec.rootPath.length + s.path.length),
      candidates: candidates.map((c) => criticText(c.action, c.preview)),
    }),
  );
  state.criticAnswered(verdict.ok);
  return verdict;
}

/** n candidates at the session's state. `keep`: store the completions (expansions) or not (rollouts). */
async function sampleAt(search: Search, s: DurableSession, n: number, keep: boolean, summary: string): Promise<{ promptRef: string; candidates: SearchCandidate[] }> {
  const { state, params: P } = search;
  const path = [...state.spec.rootPath, ...s.path];
  const sampled = await state.timed('sample', () =>
    sample(search.sampler, {
      observation: state.promptObservation(s.observation, path.length),
      history: historyOf(path, search.policy.historyLength),
      n,
      temperature: P.temperature,
      store: keep,
      legacyStore: keep,
      summary,
    }),
  );
  return {
    promptRef: sampled.promptRef,
    candidates: sampled.candidates.map((c) => ({
      action: c.action,
      preview: c.preview,
      ...(c.completionRef ? { completionRef: c.completionRef } : {}),
      refLogprob: refLogprob(c.logprobSum ?? c.logprobs, P.temperature, c.finishReason),
    })),
  };
}

function criticCall(search: Search, critic: CriticConfig, summary: string) {
  return proxyActivities<CriticActivities>(profiles.modelCall(critic.timeoutMs, search.policy.maxAttempts, summary));
}

/** Blob-store work of the search (snapshots, pairs). */
function blobs(summary: string) {
  return proxyActivities<ControlActivities & MctsStoreActivities>({ ...profiles.runActivities('30s'), summary: clipSummary(summary) });
}

/** The tree to the blob store: its nodes in chunks, then the manifest naming them. Returns the manifest's reference. */
async function storeSnapshot(search: Search, summary: string): Promise<string> {
  await search.sessions.flush();
  const store = blobs(summary);
  const chunkRefs = await Promise.all(search.state.chunks().map(async (c) => (await store.storeJson({ value: c })).ref));
  const { ref } = await store.storeJson({ value: search.state.snapshot(chunkRefs) });
  return ref;
}

/** A continued search's tree from its snapshot (manifest first, then its chunks). */
async function loadSnapshot(state: SearchState, carried: MctsSearchState): Promise<void> {
  const load = blobs(`load tree snapshot (${carried.simulations}/${state.params.numSimulations} simulations, ${carried.stats.nodes} nodes)`);
  const snap = (await load.loadJson({ ref: carried.snapshotRef })) as MctsSnapshot;
  const chunks = (await Promise.all(snap.chunks.map((ref) => load.loadJson({ ref })))) as MctsSnapshotChunk[];
  state.restoreFrom(snap, chunks, carried.snapshotRef);
}

/** Sessions whose every opening (a restore, or a rebuild after a lost session) is timed and counted. */
class SearchSessions extends Sessions {
  constructor(
    settings: SessionSettings,
    private readonly state: SearchState,
  ) {
    super(settings);
  }

  override async open(path: readonly Action[], episodeId: string, summary: string): Promise<DurableSession> {
    const s = await this.state.timed('restore', () => super.open(path, episodeId, summary));
    this.state.restored((this.settings.base?.length ?? 0) + path.length, s.observation.goal);
    return s;
  }
}
