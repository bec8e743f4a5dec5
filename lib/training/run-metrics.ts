import { z } from 'zod';

// The run's metrics file, `<runsRoot>/<run_id>/metrics.jsonl`: one JSON object per line, one line per
// iteration, for every training algorithm (GRPO and MCTS alike), written by the `appendIterationMetrics`
// activity (activities/metrics.ts) and read by the CLI, the curves writers (host/curves.ts,
// workers/learner/halo_learner/curves.py) and the workflows' status query. Pure: no I/O, so workflows and
// tests can use it too. The rows are built by lib/training/training-metrics.ts.
//
// Line: `{ run_id, iteration, time, ...TrainingMetrics }` (snake_case, like the learner payloads):
//   - `algorithm` ('grpo' | 'mcts'; absent in rows written before MCTS shared this file: read as 'grpo');
//   - the keys every algorithm has (success_rate, mean_return, loss, grad_norm, adapter_version,
//     num_episodes, seconds, the browser work env_steps / sessions_opened / replayed_actions, and eval /
//     failed_episodes / staleness when they apply);
//   - GRPO's own keys at the top level (mean_reward, reward_std, …: where they always were), required in a
//     GRPO row;
//   - MCTS's own keys in the `mcts` section, required in an MCTS row.
// Reading:
//   - blank lines are skipped;
//   - a complete line (ending with a newline) that is not a valid line is an error naming its line number;
//   - a last line without a newline that does not parse is a torn write (the process died mid-append) and
//     is ignored; the next append truncates it away;
//   - should an iteration appear twice (only two processes racing on one file could do that), the first
//     line wins, as it does for the writer;
//   - a line of the old MCTS file, `mcts-metrics.jsonl` (MCTS runs wrote their own file with their own flat
//     schema before this one), is converted into this shape (`fromLegacyMctsLine` below), so reports and status of
//     runs from before still read. Readers open that file only when the run has no metrics.jsonl.
// Unknown keys are dropped (not rejected), so files written by a newer version with extra metrics still read.

const finite = z.number(); // zod 4 rejects NaN and ±Infinity
const int = z.number().int();
const fraction = finite.min(0).max(1);

/** The run's metrics file in its folder, and the one MCTS runs wrote before they shared it. */
export const METRICS_FILE = 'metrics.jsonl';
export const LEGACY_MCTS_METRICS_FILE = 'mcts-metrics.jsonl';

export const ALGORITHMS = ['grpo', 'mcts'] as const;
export type Algorithm = (typeof ALGORITHMS)[number];

export const RUN_ID_PATTERN = /^[A-Za-z0-9._-]+$/;
export const MAX_RUN_ID_LENGTH = 200;

/** Why a run id cannot name a folder under the runs root, or null when it can. */
export function runIdProblem(runId: unknown): string | null {
  if (typeof runId !== 'string' || runId.length === 0) return 'run_id must be a non-empty string';
  if (runId.length > MAX_RUN_ID_LENGTH) return `run_id is longer than ${MAX_RUN_ID_LENGTH} characters`;
  if (!RUN_ID_PATTERN.test(runId)) {
    return `run_id ${JSON.stringify(runId)} may contain only letters, digits, ".", "_" and "-" (no path separators)`;
  }
  if (runId.includes('..') || runId === '.') return `run_id ${JSON.stringify(runId)} must not be "." or contain ".."`;
  return null;
}

/** Returns the run id, or throws an Error saying what is wrong with it. */
export function validateRunId(runId: unknown): string {
  const problem = runIdProblem(runId);
  if (problem !== null) throw new Error(problem);
  return runId as string;
}

export const RunIdSchema = z.string().superRefine((v, ctx) => {
  const problem = runIdProblem(v);
  if (problem !== null) ctx.addIssue({ code: 'custom', message: problem });
});

/** Greedy evaluation on held-out tasks, on the iterations that ran one (train.evalEvery, mcts.evalEvery). */
export const EvalMetricsSchema = z.object({ success_rate: fraction, mean_return: finite, episodes: int.min(0) });

/** What every training iteration reports, whatever the algorithm. */
const commonShape = {
  algorithm: z.enum(ALGORITHMS).default('grpo'),
  /**
   * GRPO: fraction of the iteration's episodes that succeeded. MCTS: fraction of the searches whose best path
   * ends in a successful terminal state (what the search found for its task, the analogue of an episode).
   */
  success_rate: fraction,
  /**
   * GRPO: mean shaped return per episode. MCTS: mean over the searches of their best path's terminal reward
   * (0 when the best path does not end in a terminal state); terminal rewards are 0 or 1, or the critic's
   * judgement in [0, 1] with `mcts.outcome: self-evaluation`.
   */
  mean_return: finite,
  /** The update's loss (GRPO's surrogate, MCTS's DPO loss); null when no update ran this iteration. */
  loss: finite.nullable(),
  /** The update's gradient norm before clipping; null when no update ran. */
  grad_norm: finite.min(0).nullable(),
  /** The adapter version the update wrote; null when no update ran. */
  adapter_version: int.min(0).nullable(),
  /** Episodes (GRPO) or searches (MCTS) the iteration's numbers are over. */
  num_episodes: int.min(0),
  /**
   * REAL runs: how the iteration's episodes and its held-out evaluation were judged (`real.scoring`), since a
   * success under training scoring need not be one agisdk counts; absent for MiniWoB++ and older rows.
   */
  scoring: z.enum(['official', 'training']).optional(),
  /**
   * The browser work of the iteration's training rollouts (not its evaluation), so that methods compare on
   * it; absent from rows written before it was counted.
   * env_steps: actions the policy chose that a browser executed. GRPO: every step in every session of its
   * episodes, so with `train.grouping: step` each candidate is one (an episode recorded before this was
   * counted stands for its own steps). MCTS: the steps of its simulations (a new child's action, rollout
   * steps); bringing a session to a node is replaying, not stepping.
   */
  env_steps: int.min(0).optional(),
  /**
   * Browser sessions started, each a new browser context and page load. GRPO: each episode's first one, its
   * step groups' forks, rebuilds of lost ones. MCTS: restores and rebuilds that opened a new session, and
   * spares that did (`mcts.parkedSessions`; a parked session reused or reset in place is not one). Absent
   * when some episode or search of the iteration did not count it.
   */
  sessions_opened: int.min(0).optional(),
  /**
   * Actions replayed to bring sessions to a state: every start's replay (none for a REAL fork from a state
   * copy) and every reset in place's; MCTS also parked sessions stepped forward to a node. GRPO: absent when
   * some episode of the iteration did not count it.
   */
  replayed_actions: int.min(0).optional(),
  /** Wall-clock seconds per phase (`rollout`, `search`, `update`, `eval`, …). */
  seconds: z.record(z.string(), finite.min(0)),
  eval: EvalMetricsSchema.optional(),
  /** With an evaluation: the adapter the run's evaluations scored best so far (the latest of equals), and its score. */
  best_adapter_version: int.min(0).optional(),
  best_eval_success: fraction.optional(),
  /** Episodes (MCTS: searches) of the iteration that failed, left out of the batch and the other numbers. */
  failed_episodes: int.min(1).optional(),
  /** Pipelined runs (maxStaleness ≥ 1): the adapter the batch sampled from, updates behind the on-policy one. */
  sampled_adapter_version: int.min(0).optional(),
  /**
   * A pool of policy servers (policy.baseUrls): what each replica did in the control worker that loaded this
   * iteration's adapter, counted since that worker started (requests, retryable failures, mean latency of its
   * answers, adapter loads, whether it takes requests).
   */
  policy_replicas: z
    .array(
      z.object({
        url: z.string(),
        requests: int.min(0),
        failures: int.min(0),
        mean_latency_ms: finite.min(0).optional(),
        adapter_loads: int.min(0),
        healthy: z.boolean(),
      }),
    )
    .optional(),
  staleness: int.min(0).optional(),
  /**
   * train.rollout stream: the stream as this update took its batch: episodes in flight and queued, complete
   * groups left buffered, groups dropped since the previous row (sampled more than maxStaleness updates before
   * use; failed past train.stream.episodeRetries), episodes started again in a fresh session, and the batch's
   * lowest and highest sampled adapter version.
   */
  stream: z
    .object({
      in_flight: int.min(0),
      queued: int.min(0),
      buffered: int.min(0),
      groups_dropped_stale: int.min(0),
      groups_dropped_failed: int.min(0),
      episodes_retried: int.min(0),
      min_sampled_version: int.min(0),
      max_sampled_version: int.min(0),
    })
    .optional(),
};

/** GRPO's own keys (top level, as in every metrics.jsonl written so far). */
const grpoShape = {
  /** Mean / population std of every candidate's reward over all groups. */
  mean_reward: finite.optional(),
  reward_std: finite.min(0).optional(),
  /** Fraction of groups whose rewards are all equal (no learning signal). */
  frac_reward_zero_std: fraction.optional(),
  /** Mean steps per episode. */
  episode_length: finite.min(0).optional(),
  /** Valid actions / steps over all episodes. */
  action_validity: fraction.optional(),
  /** Completion tokens the update trained on (0 without update). */
  tokens: int.min(0).optional(),
  num_groups: int.min(0).optional(),
  /** Items the update retokenised (no sampler token ids) and the share of them that may differ from what was sampled. */
  retokenized: int.min(0).optional(),
  token_mismatch_rate: fraction.optional(),
  /** Tokens whose sampler log-prob was unknown (dropped from the loss), and the share of completions sampled on other prompt ids. */
  unknown_logprobs: int.min(0).optional(),
  prompt_mismatch_rate: fraction.optional(),
  /** The update's KL to the reference, clipped-token share, mean importance ratio and entropy, when measured. */
  kl: finite.optional(),
  clip_fraction: fraction.optional(),
  mean_ratio: finite.optional(),
  entropy: finite.optional(),
  /** Grouping `anchor`: step groups of ≥ 2 members, their mean / max size, and the share of steps in one. */
  anchor_groups: int.min(0).optional(),
  anchor_group_size_mean: finite.min(0).optional(),
  anchor_group_size_max: int.min(0).optional(),
  step_signal_share: fraction.optional(),
  /** Dynamic sampling: groups that drew more candidates, the candidates added, the zero-std share before they were. */
  groups_resampled: int.min(0).optional(),
  extra_candidates: int.min(0).optional(),
  frac_reward_zero_std_first_draw: fraction.optional(),
  /** 1 when every group of the iteration scored alike, so its update had no policy gradient. */
  update_without_signal: int.min(0).max(1).optional(),
  /** REAL step groups (`real.forkMode: snapshot`): forks from a state copy, and copies that differed and replayed. */
  fork_snapshots: int.min(0).optional(),
  fork_replay_fallbacks: int.min(0).optional(),
};

/** The GRPO keys every GRPO row has (the others are there when they apply). */
export const GRPO_REQUIRED_KEYS = ['mean_reward', 'reward_std', 'frac_reward_zero_std', 'episode_length', 'action_validity', 'tokens', 'num_groups'] as const;

/**
 * MCTS's own keys, the `mcts` section of an MCTS row. The searches and their best-path success rate are the
 * common `num_episodes` and `success_rate`, the DPO update's loss, gradient norm and adapter the common
 * `loss`, `grad_norm` and `adapter_version`.
 */
export const MctsMetricsSchema = z.object({
  /** Simulations over all searches (each counted once), and the nodes of their trees. */
  simulations: int.min(0),
  nodes: int.min(0),
  /** Step-level DPO pairs collected. */
  pairs: int.min(0),
  /** Mean composite-Q gap of the pairs; null without pairs. */
  mean_abs_delta_q: finite.min(0).nullable(),
  /** Pairs that carry the sampler's reference log-probs (the others use the adapter-disabled reference). */
  pairs_with_ref_logprobs: int.min(0),
  /** The DPO update's reward margin and preference accuracy; null when no update ran. */
  reward_margin: finite.nullable(),
  accuracy: fraction.nullable(),
  /** True when no pair was collected, so no update ran (the adapter stays what it was). */
  update_skipped: z.boolean(),
  candidates: int.min(0),
  /** Unparseable candidates (terminal children with reward 0). */
  invalid_candidates: int.min(0),
  critic_calls: int.min(0),
  /** Critic answers that were unusable (neutral verdict, `ok: false`). */
  critic_failures: int.min(0),
  session_rebuilds: int.min(0),
  /**
   * Rows converted from mcts-metrics.jsonl only: that file recorded the greedy evaluation's success rate alone
   * (no return, no episode count), so it stays here instead of in `eval`.
   */
  eval_success_rate: fraction.optional(),
});

const sectionShape = { mcts: MctsMetricsSchema.optional() };

/** A GRPO row without GRPO's keys, or an MCTS row without its section, is not a row. */
function checkAlgorithmKeys(m: { algorithm: Algorithm; mcts?: unknown } & Record<string, unknown>, ctx: z.RefinementCtx): void {
  if (m.algorithm === 'grpo') {
    for (const key of GRPO_REQUIRED_KEYS) {
      if (m[key] === undefined) ctx.addIssue({ code: 'custom', path: [key], message: 'required when algorithm is grpo' });
    }
  } else if (m.algorithm === 'mcts' && m.mcts === undefined) {
    ctx.addIssue({ code: 'custom', path: ['mcts'], message: 'required when algorithm is mcts' });
  }
}

/** One iteration's metrics, as the builders (lib/training/training-metrics.ts) return them and the activity takes them. */
export const TrainingMetricsSchema = z.object({ ...commonShape, ...grpoShape, ...sectionShape }).superRefine(checkAlgorithmKeys);

export type TrainingMetrics = z.output<typeof TrainingMetricsSchema>;
export type MctsMetrics = z.output<typeof MctsMetricsSchema>;
export type EvalMetrics = z.output<typeof EvalMetricsSchema>;
/** A GRPO row: GRPO's keys are there. */
export type GrpoTrainingMetrics = TrainingMetrics & { algorithm: 'grpo' } & { [K in (typeof GRPO_REQUIRED_KEYS)[number]]-?: NonNullable<TrainingMetrics[K]> };
/** An MCTS row: its section is there. */
export type MctsTrainingMetrics = TrainingMetrics & { algorithm: 'mcts'; mcts: MctsMetrics };

/** Narrows a row to GRPO's (the schema guarantees its keys). */
export function isGrpoMetrics<M extends TrainingMetrics>(m: M): m is M & GrpoTrainingMetrics {
  return m.algorithm === 'grpo';
}

/** Narrows a row to MCTS's (the schema guarantees its section). */
export function isMctsMetrics<M extends TrainingMetrics>(m: M): m is M & MctsTrainingMetrics {
  return m.algorithm === 'mcts';
}

export const MetricsLineSchema = z
  .object({
    run_id: RunIdSchema,
    iteration: int.min(0),
    /** ISO 8601, supplied by the writer (the activity's clock, or workflow time passed in). */
    time: z.iso.datetime({ offset: true }),
    ...commonShape,
    ...grpoShape,
    ...sectionShape,
  })
  .superRefine(checkAlgorithmKeys);

export type MetricsLine = z.output<typeof MetricsLineSchema>;

// ---- mcts-metrics.jsonl, the MCTS runs' own file before this one ----------------------------------------

/** A line of the old mcts-metrics.jsonl: flat, with no `algorithm`. */
const LegacyMctsLineSchema = MctsMetricsSchema.omit({ eval_success_rate: true }).extend({
  run_id: RunIdSchema,
  iteration: int.min(0),
  time: z.iso.datetime({ offset: true }),
  searches: int.min(0),
  best_path_success_rate: fraction,
  dpo_loss: finite.nullable(),
  grad_norm: finite.min(0).nullable(),
  /** The adapter after the iteration, also when the update was skipped. */
  adapter_version: int.min(0),
  eval_success_rate: fraction.nullable(),
  failed_searches: int.min(1).optional(),
  seconds: z.record(z.string(), finite.min(0)),
});

/** A parsed JSON value that looks like an old mcts-metrics.jsonl line (no algorithm, MCTS's flat keys). */
function isLegacyMctsValue(value: unknown): boolean {
  return typeof value === 'object' && value !== null && !('algorithm' in value) && 'searches' in value && 'best_path_success_rate' in value;
}

/**
 * An old mcts-metrics.jsonl line in this file's shape. Its mean_return is the best-path success rate: those
 * lines did not record the best paths' rewards, which are 0 or 1 unless the critic judged the outcomes
 * (`mcts.outcome: self-evaluation`). Its adapter_version is null when the update was skipped (that file kept
 * the unchanged version there).
 */
function fromLegacyMctsLine(l: z.output<typeof LegacyMctsLineSchema>): MetricsLine {
  return {
    run_id: l.run_id,
    iteration: l.iteration,
    time: l.time,
    algorithm: 'mcts',
    success_rate: l.best_path_success_rate,
    mean_return: l.best_path_success_rate,
    loss: l.dpo_loss,
    grad_norm: l.grad_norm,
    adapter_version: l.update_skipped ? null : l.adapter_version,
    num_episodes: l.searches,
    seconds: l.seconds,
    ...(l.failed_searches !== undefined ? { failed_episodes: l.failed_searches } : {}),
    mcts: {
      simulations: l.simulations,
      nodes: l.nodes,
      pairs: l.pairs,
      mean_abs_delta_q: l.mean_abs_delta_q,
      pairs_with_ref_logprobs: l.pairs_with_ref_logprobs,
      reward_margin: l.reward_margin,
      accuracy: l.accuracy,
      update_skipped: l.update_skipped,
      candidates: l.candidates,
      invalid_candidates: l.invalid_candidates,
      critic_calls: l.critic_calls,
      critic_failures: l.critic_failures,
      session_rebuilds: l.session_rebuilds,
      ...(l.eval_success_rate !== null ? { eval_success_rate: l.eval_success_rate } : {}),
    },
  };
}

/** A bad line of a metrics file: `metrics.jsonl line 3: not JSON (…)`. */
export class MetricsParseError extends Error {
  constructor(
    readonly line: number,
    detail: string,
    source = METRICS_FILE,
  ) {
    super(`${source} line ${line}: ${detail}`);
    this.name = 'MetricsParseError';
  }
}

function describeIssues(err: z.ZodError): string {
  return err.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join('.') : '(root)'}: ${i.message}`)
    .join('; ');
}

/** One line (without its newline), validated; throws MetricsParseError naming the line number. */
export function parseMetricsLine(text: string, lineNumber: number, source?: string): MetricsLine {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new MetricsParseError(lineNumber, `not JSON (${(err as Error).message})`, source);
  }
  if (isLegacyMctsValue(value)) {
    const legacy = LegacyMctsLineSchema.safeParse(value);
    if (!legacy.success) throw new MetricsParseError(lineNumber, `not an MCTS metrics line (${LEGACY_MCTS_METRICS_FILE}): ${describeIssues(legacy.error)}`, source);
    return fromLegacyMctsLine(legacy.data);
  }
  const parsed = MetricsLineSchema.safeParse(value);
  if (!parsed.success) throw new MetricsParseError(lineNumber, `not a metrics line: ${describeIssues(parsed.error)}`, source);
  return parsed.data;
}

/**
 * The lines of a metrics file, in file order (see the reading rules at the top of this file: blank lines
 * skipped, a torn last line ignored, first line per iteration wins). Throws MetricsParseError on a bad
 * complete line. `source` names the file in error messages.
 */
export function parseMetricsJsonl(text: string, source?: string): MetricsLine[] {
  const rows = text.split('\n');
  const last = rows.length - 1; // text.split: the part after the last newline ('' when text ends with one)
  const out: MetricsLine[] = [];
  const seen = new Set<number>();
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i].trim();
    if (row === '') continue;
    let line: MetricsLine;
    if (i === last) {
      try {
        line = parseMetricsLine(row, i + 1, source);
      } catch {
        continue; // torn write: no newline yet, so never a finished line
      }
    } else {
      line = parseMetricsLine(row, i + 1, source);
    }
    if (seen.has(line.iteration)) continue;
    seen.add(line.iteration);
    out.push(line);
  }
  return out;
}

/** The line of the highest iteration, or null when there is none. */
export function latestMetrics(lines: readonly MetricsLine[]): MetricsLine | null {
  let best: MetricsLine | null = null;
  for (const l of lines) if (best === null || l.iteration > best.iteration) best = l;
  return best;
}

/** The text of one line, newline included: exactly what the writer appends (the schema's keys, in its order). Throws on an invalid line. */
export function formatMetricsLine(line: MetricsLine): string {
  return JSON.stringify(MetricsLineSchema.parse(line)) + '\n';
}
