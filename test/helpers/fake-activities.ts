import { createHash } from 'node:crypto';
import { assembleEval } from '../../lib/eval/eval-records';
import type { EvalEpisodeRecord } from '../../lib/eval/eval-summary';
import type { FinishEvalInput, FinishEvalResult } from '../../lib/eval/eval-types';
import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';
import { clip, isValidAction, type Action, type AgentAction } from '../../lib/model-io/actions';
import { parseAction } from '../../lib/model-io/parse';
import type { ResetSessionInput, StartSessionInput, StartSessionResult, StepSessionInput, StepSessionResult, FinishSessionResult } from '../../lib/episode/episode-types';
import type { RewardState } from '../../lib/rewards/types';
import type { Completion } from '../../lib/training/experience';
import type { ActivityMap, TestQueues } from './workflow-env';

// In-memory stand-ins for the activities the workflows schedule, by their registered names. They record
// what they were asked, so tests assert on the payloads the workflows sent (replay prefixes, adapter
// versions, which session ran which step), and answer with shapes the workflows accept.

/** A well-formed blob reference (sha256 of `label`), as the blob store would return it. */
export function fakeRef(label: string, ext = 'json'): string {
  return `sha256:${createHash('sha256').update(label).digest('hex')}.${ext}`;
}

export const click = (x: number, y = x): Action => ({ type: 'click', x, y, button: 'left', count: 1 });

const freshRewardState = (): RewardState => ({ fired: [], visited: [], lastActionKey: null, lastStateKey: null });

function observationAt(sessionId: string, step: number) {
  return {
    url: `http://task.test/page/${step}`,
    step,
    width: 160,
    height: 210,
    screenshotRef: fakeRef(`${sessionId}:${step}:screenshot`, 'png'),
    axtreeRef: fakeRef(`${sessionId}:${step}:axtree`, 'txt'),
    stateKey: `state-${step}`,
  };
}

/** The running activity's context; none where a mock is called directly, outside a worker. */
function activityContext(): Context | undefined {
  try {
    return Context.current();
  } catch {
    return undefined;
  }
}

/**
 * Mocked calls a test holds in flight, by key (an update's version, the n-th session start): the test waits
 * until the call has `reached` the mock, acts (signals the run), then lets it go with `release`.
 */
export class Holds {
  private readonly held = new Map<number, { arrived: () => void; reached: Promise<void>; release: () => void; released: Promise<void> }>();

  hold(key: number): void {
    let arrived!: () => void;
    let release!: () => void;
    const reached = new Promise<void>((r) => (arrived = r));
    const released = new Promise<void>((r) => (release = r));
    this.held.set(key, { arrived, reached, release, released });
  }

  reached(key: number): Promise<void> {
    const h = this.held.get(key);
    if (!h) throw new Error(`call ${key} is not held`);
    return h.reached;
  }

  release(key: number): void {
    this.held.get(key)?.release();
  }

  /** Called by the mock: waits here while the test holds `key`. */
  async pass(key: number): Promise<void> {
    const h = this.held.get(key);
    if (!h) return;
    h.arrived();
    // Held, the call heartbeats as a slow real one does: on a loaded machine a hold outlasts the activity's heartbeat
    // timeout, and a timed-out call would be retried past the hold, unheld.
    const ctx = activityContext();
    const beat = ctx ? setInterval(() => ctx.heartbeat(), 1_000) : undefined;
    try {
      await h.released;
    } finally {
      clearInterval(beat);
    }
  }
}

/** What a scripted step does: its shaped reward and whether the page says the episode ended. */
export interface StepOutcome {
  shaped?: number;
  done?: boolean;
  success?: boolean;
}

export interface StepCall {
  sessionId: string;
  index: number;
  action: Action;
  /** Steps this session has run before this one. */
  sessionSteps: number;
}

export interface FakeBrowserOptions {
  /** Throw from here to make opening a session fail (e.g. a non-retryable site error). */
  start?: (input: StartSessionInput) => void;
  /** Throw from here to lose the session (a retryable failure), or answer the step's outcome. */
  step?: (call: StepCall) => StepOutcome;
  /** The task queue a new session's handle names; default the test's session queue (polled by the test). */
  sessionQueue?: (sessionNo: number) => string;
}

/**
 * Browser sessions without a browser: `startSession` on the shared browser queue hands out `s1`, `s2`, … whose
 * handles name the session queue, where `stepSession`, `finishSession` and `closeSession` run.
 */
export class FakeBrowser {
  readonly starts: { sessionId: string; replay: Action[]; episodeId: string }[] = [];
  readonly steps: { sessionId: string; index: number; action: Action; visited: string[] }[] = [];
  /** In-place resets of open sessions (MCTS parked sessions), on the session queue. */
  readonly resets: { sessionId: string; replay: Action[]; episodeId: string }[] = [];
  readonly closes: string[] = [];
  readonly finishes: string[] = [];
  /** Every call in the order the activities ran: `start s1`, `step s1 #0`, `finish s2`, `close s1`. */
  readonly events: string[] = [];
  private readonly stepsBySession = new Map<string, number>();
  /** Hold the n-th `startSession` (1-based) in flight. */
  readonly startHolds = new Holds();

  constructor(
    private readonly queues: TestQueues,
    private readonly opts: FakeBrowserOptions = {},
  ) {}

  browserActivities(): ActivityMap {
    return {
      startSession: async (input: StartSessionInput): Promise<StartSessionResult> => {
        const sessionId = `s${this.starts.length + 1}`;
        this.starts.push({ sessionId, replay: input.replay, episodeId: input.episodeId });
        this.events.push(`start ${sessionId}`);
        this.stepsBySession.set(sessionId, 0);
        const n = this.starts.length;
        await this.startHolds.pass(n);
        this.opts.start?.(input);
        return {
          sessionId,
          taskQueue: this.opts.sessionQueue?.(n) ?? this.queues.session,
          worker: 'fake-browser',
          observation: { goal: `do ${input.spec.task}`, ...observationAt(sessionId, input.replay.length) },
          replayed: input.replay.length,
          rewardState: freshRewardState(),
        };
      },
    };
  }

  sessionActivities(): ActivityMap {
    return {
      resetSession: async (input: ResetSessionInput): Promise<StartSessionResult> => {
        this.resets.push({ sessionId: input.sessionId, replay: input.replay, episodeId: input.episodeId });
        this.events.push(`reset ${input.sessionId}`);
        this.stepsBySession.set(input.sessionId, 0);
        this.opts.start?.(input);
        return {
          sessionId: input.sessionId,
          taskQueue: this.queues.session,
          worker: 'fake-browser',
          observation: { goal: `do ${input.spec.task}`, ...observationAt(input.sessionId, input.replay.length) },
          replayed: input.replay.length,
          rewardState: freshRewardState(),
        };
      },
      stepSession: async (input: StepSessionInput): Promise<StepSessionResult> => {
        const sessionSteps = this.stepsBySession.get(input.sessionId) ?? 0;
        this.steps.push({ sessionId: input.sessionId, index: input.index, action: input.action, visited: [...input.rewardState.visited] });
        this.events.push(`step ${input.sessionId} #${input.index}`);
        const out = this.opts.step?.({ sessionId: input.sessionId, index: input.index, action: input.action, sessionSteps }) ?? {};
        this.stepsBySession.set(input.sessionId, sessionSteps + 1);
        const shaped = out.shaped ?? 0.1;
        return {
          observation: observationAt(input.sessionId, input.index + 1),
          reward: out.success ? 1 : 0,
          done: out.done ?? false,
          success: out.success ?? false,
          reason: out.done ? (out.success ? 'success' : 'failure') : null,
          shaped: { total: shaped, summary: `${shaped} scripted` },
          rewardState: { ...input.rewardState, visited: [...input.rewardState.visited, `state-${input.index + 1}`] },
          resultRef: fakeRef(`${input.sessionId}:${input.index}:result`),
        };
      },
      finishSession: async (input: { sessionId: string }): Promise<FinishSessionResult> => {
        this.finishes.push(input.sessionId);
        this.events.push(`finish ${input.sessionId}`);
        return { done: false, reward: 0, success: false, reason: null, evaluated: false };
      },
      closeSession: async (input: { sessionId: string }): Promise<void> => {
        this.closes.push(input.sessionId);
        this.events.push(`close ${input.sessionId}`);
      },
    };
  }

  /** The session whose step ran `action` (forks of a step group run one candidate each). */
  sessionThatRan(action: Action, index: number): string | undefined {
    return this.steps.find((s) => s.index === index && JSON.stringify(s.action) === JSON.stringify(action))?.sessionId;
  }
}

/** A retryable failure from the session's worker: the workflow must treat the session as lost. */
export function sessionGone(message = 'page crashed'): never {
  throw ApplicationFailure.retryable(message, 'BrowserGone');
}

/** A model completion in the flat JSON shape the parser accepts. */
export function completionFor(action: Action): string {
  return JSON.stringify({ action: action.type, ...action, type: undefined });
}

/** Candidates a scripted policy proposes at a step (observation.step counts the actions taken so far). */
export type PolicyScript = (step: number, n: number) => Action[];

/** n different clicks, so candidates of one state never merge. */
export const distinctClicks: PolicyScript = (step, n) => Array.from({ length: n }, (_, i) => click(100 + 100 * i, 100 + step));

/**
 * The control worker's activities: blobs in memory, the openai-backend sampler (`samplePolicy`) and the
 * colocated path's prompt and parser activities driven by `policy`, trajectories, batches and metrics files
 * as records.
 */
export class FakeControl {
  readonly blobs = new Map<string, unknown>();
  readonly samples: { step: number; n: number; model: string }[] = [];
  /** `tokens`: each step's sampler tokens as the trajectory carries them (a reference, 'inline', or none). */
  readonly trajectories: { workflowId: string; actions: unknown[]; tokens: (string | null)[] }[] = [];
  /** Each recorded step group: its candidates' rewards, the one chosen and the first draw's size (dynamic sampling). */
  readonly groups: { rewards: number[]; chosen: number; firstDraw?: number }[] = [];
  readonly grpoBatches: { iteration: number; trajectories: number }[] = [];
  readonly grpoMetrics: number[] = [];
  /** The metrics line of each appended iteration, as the workflow computed it. */
  readonly grpoMetricLines: Record<string, unknown>[] = [];
  readonly mctsMetrics: { iteration: number; adapterVersion: number; pairs: number }[] = [];
  readonly dpoBatches: string[][] = [];
  /** Every `loadAdapterIntoVllm` call: where each new adapter was served. */
  readonly adapterLoads: { base_url: string; run_id: string; version: number; replicas?: string[] }[] = [];
  /** What `collectMctsPairs` reports for every search (tests make the update run or skip). */
  pairsPerSearch = 1;
  /** What `checkFreeDisk` reports (tests make the disk run full). */
  freeDiskBytes = 100 * 2 ** 30;
  readonly diskChecks: number[] = [];
  /** Holds the store of a pipelined run's collected iteration (keyed by that iteration) in flight. */
  readonly collectedStoreHolds = new Holds();

  constructor(private readonly policy: PolicyScript = distinctClicks) {}

  activities(): ActivityMap {
    return {
      storeJson: async (input: { value: unknown }) => {
        const v = input.value as { iteration?: unknown; sampledVersion?: unknown } | null;
        if (typeof v?.iteration === 'number' && typeof v.sampledVersion === 'number') await this.collectedStoreHolds.pass(v.iteration);
        const ref = fakeRef(JSON.stringify(input.value));
        this.blobs.set(ref, structuredClone(input.value));
        return { ref, hash: ref.slice(7, 23) };
      },
      loadJson: async (input: { ref: string }) => {
        if (!this.blobs.has(input.ref)) throw ApplicationFailure.nonRetryable(`no blob ${input.ref}`, 'BlobNotFound');
        return this.blobs.get(input.ref);
      },
      checkFreeDisk: async (input: { minFreeBytes: number }) => {
        this.diskChecks.push(this.freeDiskBytes);
        return { path: '/fake-home', freeBytes: this.freeDiskBytes, minFreeBytes: input.minFreeBytes, ok: this.freeDiskBytes >= input.minFreeBytes };
      },
      /** As activities/eval-records.ts: the chunks' records into one JSON-lines blob, and the summary. */
      finishEval: async (input: FinishEvalInput): Promise<FinishEvalResult> => {
        const chunks = input.chunkRefs.map((ref) => {
          if (!this.blobs.has(ref)) throw ApplicationFailure.nonRetryable(`no blob ${ref}`, 'BlobNotFound');
          return this.blobs.get(ref) as EvalEpisodeRecord[];
        });
        const { episodes, jsonl, summary } = assembleEval(input, chunks);
        const recordsRef = fakeRef(jsonl, 'jsonl');
        this.blobs.set(recordsRef, jsonl);
        const results = { evalId: input.evalId, modes: input.modes, summary, recordsRef, episodeCount: episodes.length };
        const resultsRef = fakeRef(JSON.stringify(results));
        this.blobs.set(resultsRef, results);
        return { summary, recordsRef, resultsRef, episodeCount: episodes.length };
      },
      samplePolicy: async (input: { policy: { n: number; model: string }; n?: number; observation: { step: number } }) => {
        const n = input.n ?? input.policy.n;
        this.samples.push({ step: input.observation.step, n, model: input.policy.model });
        const actions = this.policy(input.observation.step, n);
        return {
          candidates: actions.map(
            (a, i): Completion => ({
              ref: fakeRef(`completion:${input.observation.step}:${i}:${JSON.stringify(a)}`, 'txt'),
              preview: completionFor(a),
              finishReason: 'stop',
              action: a as AgentAction,
              valid: isValidAction(a as AgentAction),
            }),
          ),
          model: input.policy.model,
          promptRef: fakeRef(`prompt:${input.observation.step}`),
          latencyMs: 1,
        };
      },
      writePrompt: async (input: { observation: { step: number; url: string } }) => fakeRef(`prompt:${input.observation.url}`),
      parseCompletions: async (input: { texts: string[]; store: boolean }) => ({
        candidates: input.texts.map((t) => ({
          action: parseAction(t),
          preview: clip(t, 200),
          ...(input.store ? { completionRef: fakeRef(t, 'txt') } : {}),
        })),
      }),
      storeCompletions: async (input: { texts: string[] }) => ({ refs: input.texts.map((t) => fakeRef(t, 'txt')) }),
      recordTrajectory: async (input: {
        workflowId: string;
        steps: { completion: Completion; resultRef?: string }[];
        groups?: { candidates: { reward: number }[]; chosen: number; firstDraw?: number }[];
      }) => {
        for (const g of input.groups ?? []) this.groups.push({ rewards: g.candidates.map((c) => c.reward), chosen: g.chosen, ...(g.firstDraw ? { firstDraw: g.firstDraw } : {}) });
        this.trajectories.push({
          workflowId: input.workflowId,
          // A valid step's action is in its result blob; an invalid one's only in its record.
          actions: input.steps.map((s) => s.resultRef ?? s.completion.action),
          tokens: input.steps.map((s) => s.completion.tokensRef ?? null),
        });
        return fakeRef(`trajectory:${input.workflowId}`);
      },
      buildGrpoBatch: async (input: { iteration: number; trajectory_refs: string[] }) => {
        this.grpoBatches.push({ iteration: input.iteration, trajectories: input.trajectory_refs.length });
        return {
          batch_ref: fakeRef(`grpo-batch:${input.iteration}`),
          items: input.trajectory_refs.length,
          group_rewards: [input.trajectory_refs.map((_, i) => i)],
          no_signal: false,
        };
      },
      // One metrics row for every algorithm (activities/metrics.ts); MCTS rows carry their section under `mcts`.
      appendIterationMetrics: async (input: { iteration: number; metrics: { algorithm?: string; adapter_version: number | null; mcts?: { pairs: number } } }) => {
        if (input.metrics.algorithm === 'mcts') {
          this.mctsMetrics.push({ iteration: input.iteration, adapterVersion: input.metrics.adapter_version ?? 0, pairs: input.metrics.mcts?.pairs ?? 0 });
        } else {
          this.grpoMetrics.push(input.iteration);
        }
        this.grpoMetricLines.push(input.metrics as Record<string, unknown>);
        return { appended: true };
      },
      // As activities/adapters.ts: a pool's load reports what each replica did.
      loadAdapterIntoVllm: async (input: { base_url: string; run_id: string; version: number; replicas?: string[] }) => {
        this.adapterLoads.push({ base_url: input.base_url, run_id: input.run_id, version: input.version, ...(input.replicas ? { replicas: input.replicas } : {}) });
        const name = `${input.run_id}-v${input.version}`;
        const pool = input.replicas?.map((url) => ({ url, requests: input.version, failures: 0, adapter_loads: input.version, healthy: true }));
        return { name, loaded: true, unloaded: [], run_adapters: [name], ...(pool ? { pool } : {}) };
      },
      collectMctsPairs: async (input: { snapshot_ref: string }) => ({
        ref: this.pairsPerSearch > 0 ? fakeRef(`pairs:${input.snapshot_ref}`) : null,
        count: this.pairsPerSearch,
        meanAbsDeltaQ: this.pairsPerSearch > 0 ? 1 : null,
        withRefLogprobs: 0,
      }),
      writeMctsDpoBatch: async (input: { pairs_refs: string[] }) => {
        this.dpoBatches.push(input.pairs_refs);
        return { batch_ref: fakeRef(`dpo-batch:${input.pairs_refs.join(',')}`), pairs: input.pairs_refs.length };
      },
    };
  }
}

/**
 * The Python learner's activities on the gpu queue (snake_case payloads, answers in the contract's shapes).
 * `updateHolds` keeps an update running until the test releases it, so a test can signal a run while an
 * iteration is in flight.
 */
export class FakeLearner {
  readonly samples: { version: number; n: number; run_id: string; storeTokens: boolean }[] = [];
  readonly updates: { kind: 'grpo' | 'dpo'; version: number; run_id: string }[] = [];
  /** Hold the update to a version in flight. */
  readonly updateHolds = new Holds();

  constructor(private readonly policy: PolicyScript = distinctClicks) {}

  private async update(kind: 'grpo' | 'dpo', input: { run_id: string; version: number }) {
    this.updates.push({ kind, version: input.version, run_id: input.run_id });
    await this.updateHolds.pass(input.version);
    return {
      run_id: input.run_id,
      version: input.version,
      adapter_path: `/checkpoints/${input.run_id}/v${input.version}`,
      loss: 0.5,
      grad_norm: 1,
      tokens: 10,
      seconds: 0.01,
      reused: false,
    };
  }

  activities(): ActivityMap {
    return {
      sample_actions: async (input: { run_id: string; version: number; n: number; prompt_ref: string; store_tokens?: boolean }) => {
        this.samples.push({ version: input.version, n: input.n, run_id: input.run_id, storeTokens: input.store_tokens ?? false });
        const step = this.samples.length;
        const actions = this.policy(step, input.n);
        // As the learner answers: tokens by reference when asked to store them, inline otherwise.
        const tokens = (i: number) => (input.store_tokens ? { tokens_ref: fakeRef(`tokens:${step}:${i}`) } : { token_ids: [1, 2, 3], logprobs: [-0.1, -0.2, -0.3] });
        return {
          completions: actions.map((a, i) => ({ text: completionFor(a), ...tokens(i), finish_reason: 'stop' })),
          model: 'fake',
          version: input.version,
          seconds: 0.01,
        };
      },
      update_policy: async (input: { run_id: string; version: number }) => ({
        ...(await this.update('grpo', input)),
        retokenized: 0,
        token_mismatch_rate: 0,
      }),
      update_dpo: async (input: { run_id: string; version: number }) => ({
        ...(await this.update('dpo', input)),
        reward_margin: 0.1,
        accuracy: 1,
      }),
    };
  }
}
