/**
 * Agent-Q-style MCTS as a durable workflow (docs/mcts.md).
 *
 * `mctsSearch` (one per task): the search tree lives in workflow state (pure operations of lib/search/mcts.ts), and
 * every simulation reads top to bottom in `simulate` below:
 *
 *   1. select      UCB1 on the composite Q from the root down to a leaf (lib/search/mcts.ts `select`);
 *   2. restore     a browser session at the leaf's state: a parked one already there or up to 2 actions
 *                  short of it, or one reset in place by its worker (mcts.parkedSessions), else
 *                  `startSession` on the shared browser queue with the leaf's action path as `replay` (the
 *                  action path is the state);
 *   3. expand      the policy samples K candidate actions (colocated learner or an OpenAI-compatible server,
 *                  like the episode, under the action grammar when policy.constrained is on), equal actions
 *                  are merged (how many samples proposed each is kept: ties between siblings go to the more
 *                  proposed), the critic ranks them and values the state, the children are added with the
 *                  critic's rank priors (at most K);
 *   4. evaluate    the best new child's action runs in the session; its value is the terminal reward
 *                  (1 success, 0 otherwise), or a policy rollout to a terminal state or mcts.maxDepth
 *                  (valueMode rollout), or the critic's estimate of its state (valueMode critic);
 *   5. backup      visits and values from that node to the root (lib/search/mcts.ts `backpropagate`).
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
import { continueAsNew, defineQuery, log, patched, proxyActivities, setCurrentDetails, setHandler, upsertSearchAttributes, workflowInfo } from '@temporalio/workflow';
import type { CriticActivities, CriticConfig } from '../activities/critic';
import type { ControlActivities } from '../activities/control';
import type { MctsStoreActivities } from '../activities/mcts-store';
import { describeAction, isTerminal, isValidAction, type Action } from '../lib/model-io/actions';
import { NEUTRAL_VALUE } from '../lib/search/critic';
import type { PolicyConfig } from '../lib/config/config';
import { episodeRun, type LegacyEpisodeFields, type SessionHandle } from '../lib/episode/episode-types';
import { actionPath, getNode, select } from '../lib/search/mcts';
import { chooseParked, chooseSpare, nodeAtPath, parkedMaxAgeMs } from '../lib/search/parked-choice';
import type { MctsParams } from '../lib/search/mcts-params';
import {
  criticText,
  describeTreeNode,
  distinctActions,
  historyOf,
  proposedActions,
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
} from '../lib/search/mcts-search';
import { parseRewardWeights } from '../lib/rewards/weights';
import { clipSummary } from '../lib/model-io/text';
import type { RunContext } from '../lib/episode/run-context';
import { KIND, MODE, RUN_ID, TASK } from '../lib/episode/search-attributes';
import * as profiles from './activity-profiles';
import type { DurableSession, RebuildBudget } from './durable-session';
import { SearchSessions } from './search-sessions';
import { ParkedSessions } from './parked-sessions';
import { isSessionLost } from './session-lost';
import { sample, type SamplerSettings } from './sampler';
import { SearchState } from './search-state';
import type { SearchCandidate, Valuation, Verdict } from '../lib/search/search-tree';
import type { ServedAdapter } from '../lib/serving/iteration-policy';
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
  /** openai policy naming a served adapter: loaded again if the server restarted (lib/serving/iteration-policy.ts). */
  adapter?: ServedAdapter;
  /**
   * Actions already taken since the task's reset (test-time search inside an episode): the tree's root is
   * the state they lead to, every restore replays them first, and tree depths count from there.
   */
  rootPath?: Action[];
  /** Present on continuation only. */
  state?: MctsSearchState;
  /** Seeds the search's draws (lib/training/training-plan.ts `drawKey`); default: its workflow id. */
  drawKey?: string;
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
  sessions: SearchSessions;
  /** Sessions kept between simulations (mcts.parkedSessions); null: a new session for every simulation. */
  parked: ParkedSessions | null;
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
  const sessions = new SearchSessions(
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
  );
  // Histories recorded before sessions were parked replay with a new session per simulation.
  const parkedSessions = P.parkedSessions ?? 0;
  const search: Search = {
    state,
    params: P,
    policy: input.policy,
    run,
    sessions,
    parked:
      parkedSessions > 0 && patched('mcts-session-reuse')
        ? new ParkedSessions(sessions, parkedSessions, parkedMaxAgeMs(task.env, run.envOptions?.miniwobTimeLimit), () => state.counters.sessionReuse)
        : null,
    sampler: {
      policy: input.policy,
      adapterVersion: input.adapterVersion,
      ...(input.adapter ? { adapter: input.adapter } : {}),
      runId: run.runId,
      ...(run.baseModel ? { baseModel: run.baseModel } : {}),
      gpuTaskQueue: run.gpuTaskQueue,
      learnerHeartbeatTimeoutMs: run.learnerHeartbeatTimeoutMs,
      ...(input.drawKey ? { drawKey: input.drawKey } : {}),
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
    // The run's last simulation leaves no spare behind: its sessions are closed right after it.
    const lastOfRun = state.simulations + 1 >= P.numSimulations || sinceStart + 1 >= P.continueAsNewEvery;
    await simulate(search, state.simulations + 1, lastOfRun);
    sinceStart++;
  }

  state.phase = 'done';
  const snapshotRef = await storeSnapshot(search, `final tree: ${state.simulations} simulations, ${state.tree.nodes.length} nodes`);
  // The pairs are computed from the stored tree and stored next to it (their number grows with the tree).
  const pairs = await blobs(`DPO pairs from siblings with |ΔQ| ≥ ${P.pairThreshold}`).collectMctsPairs({ snapshot_ref: snapshotRef });
  return state.result(snapshotRef, pairs);
}

/** One simulation: select → restore → expand → evaluate → backpropagate. */
async function simulate(search: Search, sim: number, lastOfRun: boolean): Promise<void> {
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
    // A root with unvisited children left is certainly restored by the next simulation (their UCB1 is infinite);
    // anywhere deeper, the next selection depends on this simulation's value and mostly goes elsewhere.
    const again = !lastOfRun && node.parent === 0 && getNode(tree, 0).children.some((c) => c !== leaf && getNode(tree, c).visits === 0 && !getNode(tree, c).terminal);
    const s = await restore(search, node.parent, ctx, `${tag} · select ${describeTreeNode(tree, leaf, P.alpha)}: restore parent state`, again);
    let ok = false;
    try {
      v = await evaluateChild(search, leaf, s, ctx);
      ok = true;
    } finally {
      release(search, s, ok);
    }
  } else {
    // The root, or (valueMode rollout) a leaf valued before: restore its state, expand it, evaluate a new child.
    // The root's other new children will want its state next (see above).
    const s = await restore(search, leaf, ctx, `${tag} · select ${describeTreeNode(tree, leaf, P.alpha)}: restore`, !lastOfRun && leaf === 0 && P.maxChildren > 1);
    let ok = false;
    try {
      state.observed(leaf, s.observation);
      const added = await expandNode(search, leaf, s, tag);
      v = await evaluateNewChild(search, leaf, added, s, ctx);
      ok = true;
    } finally {
      release(search, s, ok);
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

/**
 * A browser session at node `id`'s state: a parked one where one serves, else a new one replaying the node's
 * action path from the task's reset (after the root path). `again`: the next simulation wants the same state,
 * so a spare is sent there in the background.
 */
async function restore(search: Search, id: number, ctx: Sim, summary: string, again: boolean): Promise<DurableSession> {
  const path = actionPath(search.state.tree, id);
  const episodeId = `${search.state.workflowId}#${ctx.sim}`;
  const parked = search.parked ? await fromParked(search, search.parked, id, path, episodeId, summary) : undefined;
  const s = parked ?? (await search.sessions.open(path, episodeId, `${summary}, replay ${path.length} actions`, { lived: search.state.livedState(id) }));
  s.rewardState = search.state.rewardStateAt(id, s.rewardState) ?? s.rewardState;
  if (search.parked && again) prepareSpare(search, search.parked, id, path, episodeId, summary);
  return s;
}

/**
 * A spare at node `id`'s state, made while this simulation runs (off its critical path): a parked session
 * reset in place, or a new session while fewer than mcts.parkedSessions are parked. MiniWoB++ only (resets in
 * place); a failure just leaves no spare.
 */
function prepareSpare(search: Search, parked: ParkedSessions, id: number, path: Action[], episodeId: string, summary: string): void {
  const { state, sessions } = search;
  if (state.spec.task.env !== 'miniwob') return;
  const index = chooseSpare(parked.spots(workflowClockMs()), id);
  const t0 = workflowClockMs();
  const replay = state.spec.rootPath.length + path.length;
  let ready: Promise<DurableSession | undefined>;
  let handle: SessionHandle | null;
  if (index >= 0) {
    const p = parked.take(index);
    handle = p.handle;
    ready = p.session.then(async (old) => {
      if (!old) return undefined;
      try {
        const s = await sessions.reset(
          old.handle,
          path,
          episodeId,
          `${summary}: spare for later simulations, parked session reset in place, replay ${replay} actions`,
          search.state.livedState(id),
        );
        sessions.began(s, t0);
        return s;
      } catch {
        sessions.closeAndForget(old.handle);
        return undefined;
      }
    });
  } else if (parked.size < parked.limit && !parked.spots(t0).some((p) => p.node === id)) {
    ready = sessions
      .openSpare(path, episodeId, `${summary}: spare for later simulations, new session, replay ${replay} actions`, search.state.livedState(id))
      .catch(() => undefined);
    handle = null;
  } else {
    return;
  }
  state.prepared();
  parked.prepare(handle, id, t0, ready);
}

/** Beyond two actions, stepping an ancestor's session forward costs about what an in-place reset does. */
const MAX_ADVANCE = 2;

/**
 * A parked session brought to node `id`'s state: one already there, one at an ancestor stepped forward, or
 * one reset in place by its worker (MiniWoB++ only: a REAL site's state is not the page's alone). Undefined
 * when none is parked or the one tried was lost (its worker's other parked sessions are dropped with it).
 */
async function fromParked(search: Search, parked: ParkedSessions, id: number, path: Action[], episodeId: string, summary: string): Promise<DurableSession | undefined> {
  const { state, sessions } = search;
  const choice = chooseParked(state.tree, parked.spots(workflowClockMs()), id, { maxAdvance: MAX_ADVANCE, canReset: state.spec.task.env === 'miniwob' });
  if (choice.kind === 'none') return undefined;
  const p = parked.take(choice.index);
  const { begunAt } = p;
  // A spare still on its way is waited for (restore time); one that failed leaves the others to try.
  const taken = p.preparing ? await state.timed('restore', () => p.session) : await p.session;
  if (!taken) return fromParked(search, parked, id, path, episodeId, summary);
  try {
    if (choice.kind === 'exact' || choice.kind === 'advance') {
      const s = sessions.adopt(taken, episodeId);
      sessions.began(s, begunAt);
      const steps = choice.kind === 'advance' ? choice.actions : [];
      if (steps.length > 0) {
        await state.timed('restore', async () => {
          for (const [i, a] of steps.entries()) await s.stepOnce(a, `${summary}: parked session steps forward ${i + 1}/${steps.length}: ${describeAction(a)}`);
        });
      }
      state.restored(steps.length, s.observation.goal, choice.kind === 'exact' ? 'reused' : 'advanced');
      return s;
    }
    const replay = state.spec.rootPath.length + path.length;
    const t0 = workflowClockMs();
    const s = await state.timed('restore', () =>
      sessions.reset(taken.handle, path, episodeId, `${summary}: parked session reset in place, replay ${replay} actions`, search.state.livedState(id)),
    );
    sessions.began(s, t0);
    state.restored(replay, s.observation.goal, 'resetInPlace');
    return s;
  } catch (err) {
    if (!isSessionLost(err)) throw err;
    sessions.closeAndForget(taken.handle);
    parked.dropQueue(taken.handle.taskQueue);
    return undefined;
  }
}

/**
 * The end of a simulation's use of its session: parked at the node its path leads to (null when the path left
 * the tree or ended there: only a reset can use it), or closed when not parking or the simulation failed.
 */
function release(search: Search, s: DurableSession, ok: boolean): void {
  if (!search.parked || !ok) {
    s.closeLater();
    return;
  }
  const tree = search.state.tree;
  const node = nodeAtPath(tree, s.path);
  search.parked.park(s, node !== null && !getNode(tree, node).terminal ? node : null, search.sessions.begunAt(s));
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
  // Searches recorded before proposals were counted replay with every child counting the same.
  const distinct = patched('mcts-proposals') ? proposedActions(candidates) : distinctActions(candidates);
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
  state.rewarded(id, out.shaped.total, s.rewardState);
  if (out.actionError) state.actionFailed(id, out.actionError);
  if (out.done || isTerminal(action)) {
    const end = await endValue(search, s, out.success, ctx.tag);
    const value = state.valueAt(id, 0, out.success, end.value);
    state.ended(id, value, end.outcome);
    return { node: id, value, how: `terminal: ${end.outcome}${shapedNote(P, value)}` };
  }
  if (node.depth >= P.maxDepth) {
    const value = state.valueAt(id, 0, false, 0);
    state.ended(id, value, 'depth cap');
    return { node: id, value, how: `depth cap ${P.maxDepth}${shapedNote(P, value)}` };
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
  let shaped = 0;
  const valued = (success: boolean, otherwise: number, how: string): Valuation => {
    const value = state.valueAt(from, shaped, success, otherwise);
    return { node: from, value, how: `rollout: ${how}${shapedNote(P, value)}` };
  };
  while (depth < P.maxDepth) {
    state.phase = `${ctx.tag}: rollout step ${steps + 1} from node ${from}`;
    const { candidates } = await sampleAt(search, s, 1, false, `${ctx.tag} · value of node ${from}: rollout step ${steps + 1} (depth ${depth + 1}/${P.maxDepth})`);
    const c = candidates[0].completion;
    if (!isValidAction(c.action)) return valued(false, 0, `unparseable output at depth ${depth + 1}`);
    const out = await step(search, s, c.action, ctx, `${ctx.tag} · rollout step ${steps + 1}: ${describeAction(c.action)}`, true);
    steps++;
    depth++;
    shaped += out.shaped.total;
    if (out.done || isTerminal(c.action)) {
      const end = await endValue(search, s, out.success, ctx.tag);
      return valued(out.success, end.value, `${end.outcome} after ${steps} steps`);
    }
  }
  return valued(false, 0, `depth cap ${P.maxDepth} after ${steps} steps`);
}

/** How a value came from the shaped return (valueMode shaped), for the simulation's log and details. */
function shapedNote(P: MctsParams, value: number): string {
  return P.valueMode === 'shaped' ? `, shaped value ${round(value)} (scale ${P.shapedScale ?? 1})` : '';
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
      candidates: candidates.map((c) => criticText(c.completion.action, c.completion.preview)),
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
      // The summary names the call's place in the search (simulation, node, rollout step): it seeds the draw.
      seedKey: summary,
    }),
  );
  return {
    promptRef: sampled.promptRef,
    candidates: sampled.candidates.map((completion) => ({ completion, refLogprob: refLogprob(completion.logprobSum, P.temperature, completion.finishReason) })),
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
  // Parked sessions do not outlive the run: a continued run starts with none.
  search.parked?.closeAll();
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
