import type { PolicyConfig } from '../config/config';
import type { EvalNote, EvalSkip, EvalSummary } from './eval-summary';
import type { ServedAdapter } from '../serving/iteration-policy';
import type { MctsParams } from '../search/mcts-params';
import type { RunContext } from '../episode/run-context';

// The evaluation plan lives in lib because the client builds it (lib/eval/eval-config.ts) and the `evaluate`
// workflow runs it: both import it from here, so lib never reaches up into workflows/.

export type EvalModeName = 'qwen3vl_base' | 'qwen3vl_grpo' | 'qwen3vl_mcts' | 'openai_baseline' | 'gpt5_baseline';

/** One mode as the workflow runs it: everything resolved by the client (adapter version, skip decision, sites). */
export interface EvalModePlan {
  /** Unique within the evaluation; part of every episode's workflow id. */
  label: string;
  name: EvalModeName;
  backend: 'colocated' | 'openai';
  /** Greedy: temperature 0, one sample per step. */
  policy: PolicyConfig;
  /** The episode's runId: the learner's run_id for an adapter version ≥ 1, else the eval id. */
  runId: string;
  /** Colocated: the adapter version the learner samples with (0 = base model). */
  adapterVersion: number;
  /**
   * openai backend naming a run's adapter (`<run>-v<N>`): its folder, so that a vLLM that forgot it (restarted,
   * or never loaded that version) loads it on the 404 and the request is repeated, as in training.
   */
  adapter?: ServedAdapter;
  /** One line for the summary: which model / adapter this mode evaluated. */
  describe: string;
  /** Test-time MCTS: every step of its episodes is chosen by a search with these parameters. */
  search?: MctsParams;
}

export interface EvaluateInput {
  evalId: string;
  env: 'miniwob' | 'real';
  /** Resolved task names (REAL sites already expanded into their tasks) and the site each belongs to. */
  tasks: { task: string; site: string }[];
  seeds: number[];
  maxSteps: number;
  /** Episodes running at once, over all modes. */
  parallelism: number;
  modes: EvalModePlan[];
  skipped: EvalSkip[];
  notes: EvalNote[];
  controlTaskQueue: string;
  /** Queues, timeouts and rewards of every episode; each mode runs its episodes under its own `runId`. */
  run: RunContext;
  /** Episodes per workflow run before it continues as new (default DEFAULT_EVAL_CONTINUE_AS_NEW_EVERY). */
  continueAsNewEvery?: number;
  /** Set by the workflow itself when it continues as new. */
  carry?: EvalCarry;
}

/** An evaluation runs at most this many episodes (modes × tasks × seeds); larger ones are split by the user. */
export const MAX_EVAL_EPISODES = 100_000;
/** Episodes per workflow run before `evaluate` continues as new (each child adds ~10 events to the history). */
export const DEFAULT_EVAL_CONTINUE_AS_NEW_EVERY = 500;
export const MAX_EVAL_CONTINUE_AS_NEW_EVERY = 2_000;

/** Why an evaluation of this size cannot run, or null: checked by the client and again by the workflow. */
export function evalSizeProblem(o: { modes: number; tasks: number; seeds: number; continueAsNewEvery?: number }): string | null {
  const total = o.modes * o.tasks * o.seeds;
  if (total > MAX_EVAL_EPISODES) {
    return (
      `modes × tasks × seeds = ${o.modes} × ${o.tasks} × ${o.seeds} = ${total} episodes, more than one evaluation runs (${MAX_EVAL_EPISODES}): ` +
      `use fewer seeds, tasks or modes, or split it into several evaluations`
    );
  }
  const every = o.continueAsNewEvery;
  if (every !== undefined && !(Number.isInteger(every) && every >= 1 && every <= MAX_EVAL_CONTINUE_AS_NEW_EVERY)) {
    return `continueAsNewEvery ${every}: a whole number of episodes from 1 to ${MAX_EVAL_CONTINUE_AS_NEW_EVERY}`;
  }
  return null;
}

/**
 * What one run of `evaluate` hands the next when it continues as new: small, whatever the evaluation's size
 * (the records themselves are in blobs, one per chunk).
 */
export interface EvalCarry {
  /** Index, in mode × task × seed order, of the next episode to start. */
  next: number;
  /** Blob refs of the record chunks written so far (a JSON array of EvalEpisodeRecord each), in order. */
  chunkRefs: string[];
  /** Episodes finished (recorded) and failed so far. */
  done: number;
  failed: number;
  paused: boolean;
}

/** Input of the activity that assembles an evaluation's records and summary from its chunks. */
export interface FinishEvalInput {
  evalId: string;
  env: 'miniwob' | 'real';
  modes: { label: string; name: EvalModeName; describe: string }[];
  chunkRefs: string[];
  /** Episodes the evaluation planned (modes × tasks × seeds): those without a record were not run (stop). */
  total: number;
  skipped: EvalSkip[];
  notes: EvalNote[];
}

export interface FinishEvalResult {
  summary: EvalSummary;
  /** Blob with every record, one JSON object per line (episodes.jsonl). */
  recordsRef: string;
  /** Blob with `{ evalId, modes, summary, recordsRef, episodeCount }`. */
  resultsRef: string;
  episodeCount: number;
}
