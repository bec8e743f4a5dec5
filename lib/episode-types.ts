import type { AgentAction, Action } from './actions';
import type { PolicyConfig } from './config';

// Payload shapes that travel through Temporal. Only references and short text: no image bytes,
// no accessibility trees (those are blobs), so an episode history stays small and readable.

export interface ObservationRef {
  goal: string;
  url: string;
  step: number;
  width: number;
  height: number;
  screenshotRef: string;
  axtreeRef: string;
}

export interface TaskRef {
  env: 'miniwob';
  task: string;
  seed: number;
}

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
}

export interface StartSessionResult extends SessionHandle {
  observation: ObservationRef;
  replayed: number;
}

export interface StepSessionInput {
  sessionId: string;
  /** Number of actions the session must already have applied; makes a retried step idempotent. */
  index: number;
  action: Action;
}

export interface StepSessionResult {
  observation: ObservationRef;
  reward: number;
  done: boolean;
  success: boolean;
  reason: string | null;
  actionError?: string;
}

export interface SampleInput {
  policy: PolicyConfig;
  observation: ObservationRef;
  history: { step: number; action: string; note?: string }[];
}

export interface Candidate {
  action: AgentAction;
  /** The first characters of the completion; the whole text is at completionRef. */
  preview: string;
  completionRef: string;
  finishReason: string | null;
}

export interface SampleResult {
  candidates: Candidate[];
  model: string;
  promptRef: string;
  latencyMs: number;
}

export interface EpisodeInput {
  task: TaskRef;
  maxSteps: number;
  policy: PolicyConfig;
  browserTaskQueue: string;
  maxSessionRebuilds?: number;
  sessionStartTimeoutMs?: number;
  heartbeatTimeoutMs?: number;
  runId?: string;
  mode?: string;
}

export interface StepRecord {
  step: number;
  observation: ObservationRef;
  completion: string;
  completionRef: string;
  action: AgentAction;
  valid: boolean;
  reward: number;
  done: boolean;
  url: string;
  actionError?: string;
}

export interface EpisodeResult {
  workflowId: string;
  task: TaskRef;
  success: boolean;
  reward: number;
  steps: number;
  actionValidity: number;
  validActions: number;
  done: boolean;
  reason: string | null;
  actionPath: Action[];
  sessionRebuilds: number;
  trajectoryRef: string;
}
