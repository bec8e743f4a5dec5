import type { MctsParams } from '../search/mcts-params';
import type { Action } from '../model-io/actions';
import type { MiniwobConfig, PolicyConfig } from '../config/config';
import type { RewardBreakdown, RewardState } from '../rewards/types';
import type { RewardWeights } from '../rewards/weights';
import type { RunContext } from './run-context';
import type { SamplingPolicy, ServedAdapter } from '../serving/iteration-policy';
import type { Completion, ObservationRef, ShapedSummary, TaskRef } from '../training/experience';

// Payload shapes that travel through Temporal. Only references and short text: no image bytes,
// no accessibility trees (those are blobs), so an episode history stays small and readable.
// What an episode records for training (trajectory, step groups, the sampler's tokens) is lib/training/experience.ts.
export type {
  GroupCandidate,
  ObservationRef,
  SampledTokens,
  ShapedSummary,
  StepGroup,
  StepObservationRef,
  StepRecord,
  TaskRef,
  TrajectoryInput,
  TrajectoryStepInput,
} from '../training/experience';

/** Environment options that travel with an episode. */
export interface EnvOptions {
  /** Sent to REAL's /config as run_id; "0" means "not a leaderboard run". */
  realRunId: string;
  /** At the step cap, evaluate the final state instead of the official reward 0. */
  evaluateAtCap: boolean;
  /** MiniWoB++ episode time limit (config `miniwob.timeLimit`); absent: raised. */
  miniwobTimeLimit?: MiniwobConfig['timeLimit'];
  /** MiniWoB++ reward reported (config `miniwob.reward`); absent: raw. */
  miniwobReward?: MiniwobConfig['reward'];
  /** How a REAL fork gets its parent's state (config `real.forkMode`); absent: snapshot. */
  realForkMode?: 'snapshot' | 'replay';
  /** How REAL episodes run and are judged (config `real.scoring`); absent: training. */
  realScoring?: RealScoring;
}

/** `official`: agisdk 0.3.5's harness rules; `training`: the faster, more lenient settings training runs under. */
export type RealScoring = 'official' | 'training';

export interface SessionHandle {
  sessionId: string;
  /** The worker-specific task queue of the browser worker that holds the session. */
  taskQueue: string;
  worker: string;
}

export interface StartSessionInput {
  spec: TaskRef;
  /** Actions to replay after the reset: rebuilds the state of a session that was lost. */
  replay: Action[];
  episodeId: string;
  /** Held by the session for shaping every step's reward. */
  rewardWeights: RewardWeights;
  envOptions?: EnvOptions;
  /**
   * The state `replay` led to when it was lived. A MiniWoB++ replay then skips the settle wait after each
   * action and keeps its result only if it reaches `lived.stateKey`, with the lived screenshot (no new one);
   * otherwise the page is reset and replayed again with the waits. Absent: every replayed action settles.
   */
  lived?: LivedState;
}

/** A state as it was observed when it was lived: its key (`stateKey` of lib/rewards/shaping.ts) and screenshot. */
export interface LivedState {
  stateKey: string;
  screenshotRef: string;
}

/** A new episode in an open session, on the worker that holds it: its page is reset in place, then `replay` runs. */
export interface ResetSessionInput extends StartSessionInput {
  sessionId: string;
}

export interface StartSessionResult extends SessionHandle {
  observation: ObservationRef;
  replayed: number;
  /** Shaping state at reset (milestones already shown by the start page count as fired). */
  rewardState: RewardState;
  /**
   * A start whose parent session was on this worker: `snapshot` copied its client state (nothing replayed),
   * `replay-fallback` tried that, found the state differed, and replayed. Absent: a plain reset + replay.
   */
  fork?: 'snapshot' | 'replay-fallback';
  /**
   * With `lived`: `fast` kept the replay without settle waits (it reached the key), `settled` found
   * another state that way and replayed again with them. Absent: no fast replay was tried.
   */
  fastReplay?: 'fast' | 'settled';
  /** `copy`: a REAL start from a copy of its task's start state kept by the worker (no /config visit). */
  startState?: 'copy';
}

export interface StepSessionInput {
  sessionId: string;
  /** Number of actions the session must already have applied; makes a retried step idempotent. */
  index: number;
  action: Action;
  rewardState: RewardState;
}

export interface StepSessionResult {
  /** The page after the step; the goal is the episode's and is not repeated here. */
  observation: Omit<ObservationRef, 'goal'>;
  reward: number;
  done: boolean;
  success: boolean;
  reason: string | null;
  actionError?: string;
  /** The dense (shaped) reward of this step (its full breakdown is in the result blob), and the shaping state after it. */
  shaped: ShapedSummary;
  rewardState: RewardState;
  /** Blob holding this whole result: trajectories reference it instead of copying it through Temporal. */
  resultRef: string;
  /** REAL: the /finish state the eval script judged. */
  finalStateRef?: string;
}

/** The end of an episode that stopped at the step cap (REAL evaluates there only when asked to). */
export interface FinishSessionResult {
  done: boolean;
  reward: number;
  success: boolean;
  reason: string | null;
  evaluated: boolean;
  finalStateRef?: string;
}

/** What the step activity writes to its result blob: the result plus the full reward breakdown. */
export interface StepResultBlob extends Omit<StepSessionResult, 'resultRef'> {
  index: number;
  action: Action;
  breakdown: RewardBreakdown;
}

/** The part of an observation the prompt needs: what the policy activity receives. */
export type PromptObservationRef = Pick<ObservationRef, 'goal' | 'url' | 'step' | 'screenshotRef' | 'axtreeRef'>;

/**
 * The policy as an episode and its sampling calls carry it. `tokenIdsOptional`: the samples are not trained on (a
 * single episode, an evaluation), so token ids are asked for and used when they come back, and a server that gives
 * none (or refuses the fields) is answered without them; absent, as in training, such a server fails the call
 * non-retryably (`policy.tokenIds`). It rides on the policy so every sampling call of the episode gets it: step
 * groups and test-time searches included.
 */
export type SamplingPolicyConfig = PolicyConfig & { tokenIdsOptional?: boolean };

export interface SampleInput {
  policy: SamplingPolicyConfig;
  /** The served adapter `policy.model` names: loaded again when a restarted server no longer has it. */
  adapter?: ServedAdapter;
  /** Samples in one request (a step group's N, an expansion's K); 1 when absent. */
  n?: number;
  observation: PromptObservationRef;
  history: { step: number; action: string; note?: string }[];
  /** vLLM's per-request `seed` (workflows/sampler.ts derives it as for the colocated sampler); absent: unseeded. */
  seed?: number;
}

export interface SampleResult {
  /** One record per sample (lib/training/experience.ts `Completion`); histories from before hold the flat shape. */
  candidates: Completion[];
  model: string;
  promptRef: string;
  /** Constrained decoding (`policy.constrained`): the grammar blob the request was constrained with. */
  grammarRef?: string;
  latencyMs: number;
  /** Token ids and log-probs were asked for (`policy.tokenIds`); candidates without them were not given any. */
  askedForTokens?: boolean;
  /** Adapter loads this call made (`input.adapter`): requests, milliseconds, and whether vLLM had forgotten it. */
  adapterLoad?: { requests: number; ms: number; reloaded: boolean };
  /** A pool of servers (`policy.baseUrls`): the replica that answered. */
  replica?: string;
}

export interface EpisodeInput extends LegacyEpisodeFields {
  task: TaskRef;
  maxSteps: number;
  /** The policy to sample from, already resolved for the run's iteration (lib/serving/iteration-policy.ts). */
  policy: SamplingPolicyConfig;
  /** The run's infrastructure (queues, timeouts, rewards). Inputs written by hand may give the flat fields instead. */
  run?: RunContext;
  /** Shown in the Temporal UI (search attribute HaloMode); the model name when absent. */
  mode?: string;
  /**
   * GRPO step grouping: at each state, N candidates each executed from that state in a forked session. With
   * `maxCandidates`, a group whose candidates all scored the same draws N more (at exploration `explore`) until
   * the scores differ or it holds that many (train.dynamicSampling).
   */
  grouping?: { n: number; choose: 'best' | 'sampled'; maxCandidates?: number; explore?: number };
  /**
   * Test-time MCTS (Agent Q at inference): before every step an `mctsSearch` child workflow searches from the
   * current state (its action path as the root) and the episode plays the search's decision at the root.
   * The search values ended states by self-evaluation, never by the environment's success.
   */
  search?: { params: MctsParams };
  /** Colocated policy: the adapter version the learner samples with (0 = base model). */
  adapterVersion?: number;
  /** openai policy naming a served adapter: loaded again if the server restarted (lib/serving/iteration-policy.ts). */
  adapter?: ServedAdapter;
  /** Seeds the episode's draws and choices (lib/training/training-plan.ts `drawKey`); default: its workflow id. */
  drawKey?: string;
}

/**
 * The run context as flat fields: how `episode` inputs looked before `run` existed (recorded histories), and
 * the short form for inputs written by hand (`temporal workflow start --type episode`).
 */
export interface LegacyEpisodeFields {
  runId?: string;
  browserTaskQueue?: string;
  maxSessionRebuilds?: number;
  sessionStartTimeoutMs?: number;
  heartbeatTimeoutMs?: number;
  rewardWeights?: RewardWeights;
  envOptions?: EnvOptions;
  gpuTaskQueue?: string;
  learnerHeartbeatTimeoutMs?: number;
}

/** The run context of an episode's (or a search's) input, the flat fields' defaults filled in. */
export function episodeRun(input: LegacyEpisodeFields & { run?: RunContext }, workflowId: string): RunContext {
  if (input.run) return input.run;
  return {
    runId: input.runId ?? workflowId,
    browserTaskQueue: input.browserTaskQueue ?? 'halo-browser',
    gpuTaskQueue: input.gpuTaskQueue ?? 'gpu',
    learnerHeartbeatTimeoutMs: input.learnerHeartbeatTimeoutMs ?? 60_000,
    maxSessionRebuilds: input.maxSessionRebuilds ?? 5,
    sessionStartTimeoutMs: input.sessionStartTimeoutMs ?? 20_000,
    heartbeatTimeoutMs: input.heartbeatTimeoutMs ?? 10_000,
    ...(input.rewardWeights ? { rewardWeights: input.rewardWeights } : {}),
    ...(input.envOptions ? { envOptions: input.envOptions } : {}),
  };
}

/** The one builder of an episode's input from a run's pieces (GRPO, MCTS evaluation, `evaluate`). */
export function episodeInput(p: {
  run: RunContext;
  task: TaskRef;
  maxSteps: number;
  sampling: SamplingPolicy;
  mode: string;
  grouping?: EpisodeInput['grouping'];
  search?: EpisodeInput['search'];
  drawKey?: string;
}): EpisodeInput {
  return {
    task: p.task,
    maxSteps: p.maxSteps,
    policy: p.sampling.policy,
    run: p.run,
    mode: p.mode,
    adapterVersion: p.sampling.adapterVersion,
    ...(p.sampling.adapter ? { adapter: p.sampling.adapter } : {}),
    ...(p.grouping ? { grouping: p.grouping } : {}),
    ...(p.search ? { search: p.search } : {}),
    ...(p.drawKey ? { drawKey: p.drawKey } : {}),
  };
}

/** Browser work, counted where the sessions are (workflows/durable-session.ts `Sessions`). */
export interface BrowserWork {
  /** Sessions started: the first, forks, rebuilds of lost ones. */
  sessions: number;
  /** Actions the policy chose that a browser executed as steps (every candidate of a step group included). */
  steps: number;
  /** Actions replayed to start or reset sessions (0 for a fork from a state copy). */
  replayedActions: number;
}

export interface EpisodeResult {
  workflowId: string;
  task: TaskRef;
  success: boolean;
  reward: number;
  /** Sum of the shaped step rewards. */
  shapedReturn: number;
  /** Step groups recorded in the trajectory (GRPO step grouping); 0 otherwise. */
  groups: number;
  steps: number;
  actionValidity: number;
  validActions: number;
  done: boolean;
  reason: string | null;
  actionPath: Action[];
  sessionRebuilds: number;
  /** REAL step groups (real.forkMode snapshot): forks from a state copy, and copies that differed and replayed. */
  forkSnapshots?: number;
  forkReplayFallbacks?: number;
  /** The episode's browser work; absent from results recorded before it was counted. */
  browser?: BrowserWork;
  /** `policy.tokenIdsOptional`: steps whose sample came back without token ids (absent when every one had them). */
  tokenIdsMissing?: number;
  trajectoryRef: string;
}
