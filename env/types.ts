import type { Action } from '../lib/model-io/actions';

/** What the policy sees after a reset or a step. Only references travel: the image is in the blob store. */
export interface Observation {
  goal: string;
  url: string;
  /** Compact accessibility tree, one element per line, each with an element id usable by click_element. */
  axtree: string;
  screenshotRef: string;
  width: number;
  height: number;
  step: number;
}

export interface StepOutcome {
  observation: Observation;
  /** The environment's own reward (MiniWoB: raw reward in [-1, 1], no time decay). */
  reward: number;
  done: boolean;
  success: boolean;
  /** Why the environment ended or rewarded, e.g. MiniWoB's WOB_REWARD_REASON. */
  reason: string | null;
  /** Set when the action could not be executed (element missing, navigation blocked...). */
  actionError?: string;
}

export interface MiniWobTaskSpec {
  env: 'miniwob';
  task: string;
  seed: number;
}

/** REAL v2 tasks are deterministic clones; the seed is carried for uniformity and ignored. */
export interface RealTaskSpec {
  env: 'real';
  /** A v2 task id, e.g. `gomail-18` (or `v2.gomail-18`). */
  task: string;
  seed: number;
}

export type TaskSpec = MiniWobTaskSpec | RealTaskSpec;

/** Result of executing an action, before (or without) taking a new observation. */
export type ApplyResult = Omit<StepOutcome, 'observation'>;

export interface Environment {
  reset(spec: TaskSpec): Promise<Observation>;
  /** Execute one action and read the reward; no screenshot (used to replay an action prefix fast). */
  apply(action: Action): Promise<ApplyResult>;
  /** Take the current observation: screenshot into the blob store, URL, accessibility tree. */
  observe(): Promise<Observation>;
  /** apply + observe. */
  step(action: Action): Promise<StepOutcome>;
  close(): Promise<void>;
}
