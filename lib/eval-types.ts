import type { PolicyConfig } from './config';
import type { EvalNote, EvalSkip } from './eval-summary';
import type { MctsParams } from './mcts-params';
import type { RunContext } from './run-context';

// The evaluation plan lives in lib because the client builds it (lib/eval-config.ts) and the `evaluate`
// workflow runs it: both import it from here, so lib never reaches up into workflows/.

export type EvalModeName = 'qwen3vl_base' | 'qwen3vl_grpo' | 'qwen3vl_mcts' | 'openai_baseline';

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
}
