import type { PolicyConfig } from '../config/config';
import { fnv1a32 } from '../rewards/shaping';

/**
 * Which policy a run samples from. One rule for every caller (GRPO iterations and their greedy evaluations,
 * MCTS searches, `evaluate` modes, test-time search): the adapter written by the run's latest update.
 *
 * - openai backend with adapters served (a vLLM that the run loads its adapters into): the request's model
 *   names the adapter, `<run>-v<N>`; version 0 is the base model (`policy.model`). The adapter's folder
 *   travels along, so a serving process that restarted (and forgot its runtime-loaded adapters) gets it
 *   loaded again before it is asked for it.
 * - colocated backend: the learner samples with adapter version N of the run (0 = base model); the model
 *   name stays what the config says.
 * - openai backend without served adapters (an OpenAI model, or a server the run does not load into): the
 *   configured model, always.
 */
export interface SamplingPolicy {
  policy: PolicyConfig;
  /** The adapter version the colocated learner samples with; 0 on the openai backend. */
  adapterVersion: number;
  /** The served adapter the policy names, for loading it again into a restarted server. */
  adapter?: ServedAdapter;
}

/** A runtime-loaded LoRA adapter of a vLLM server (snake_case: it travels to activities as is). */
export interface ServedAdapter {
  base_url: string;
  lora_name: string;
  /** The version folder as the serving process sees it. */
  lora_path: string;
}

/** Where a run's adapters are served: the vLLM it loads them into, and the newest adapter's folder if known. */
export interface Serving {
  baseUrl: string;
  adapterPath?: string;
}

/** Where a run's adapters are served: only on the openai backend, into the vLLM the run loads them into. */
export function servingOf(policy: PolicyConfig, vllmBaseUrl: string | undefined, adapterPath?: string): Serving | undefined {
  if (policy.backend !== 'openai' || !vllmBaseUrl) return undefined;
  return { baseUrl: vllmBaseUrl, ...(adapterPath ? { adapterPath } : {}) };
}

/** The name under which adapter v<N> of a run is served (vLLM's `lora_name`, the chat request's `model`). */
export function servedAdapterName(runId: string, version: number): string {
  return `${runId}-v${version}`;
}

export function samplingPolicy(input: { policy: PolicyConfig; runId: string; adapterVersion: number; serving?: Serving }): SamplingPolicy {
  const { policy, runId, adapterVersion, serving } = input;
  if (policy.backend === 'colocated') return { policy, adapterVersion };
  if (!serving || adapterVersion <= 0) return { policy, adapterVersion: 0 };
  const name = servedAdapterName(runId, adapterVersion);
  return {
    policy: { ...policy, model: name },
    adapterVersion: 0,
    ...(serving.adapterPath ? { adapter: { base_url: serving.baseUrl, lora_name: name, lora_path: serving.adapterPath } } : {}),
  };
}

/** Greedy decoding of the same policy: temperature 0 (evaluations sample once per step). */
export function greedy(policy: PolicyConfig): PolicyConfig {
  return { ...policy, temperature: 0 };
}

/**
 * Whether an iteration ends with the greedy held-out evaluation: every `evalEvery` iterations (the iteration
 * number a multiple of it), or when the iteration's environment steps take the run's total past a multiple
 * of `evalEverySteps` (`stepsBefore`: the steps of the iterations before it; `stepsAfter`: with its own). An
 * iteration due by both evaluates once; 0 turns either off, so a config without evalEverySteps decides as before.
 */
export function evaluationDue(o: { iteration: number; evalEvery: number; evalEverySteps: number; stepsBefore: number; stepsAfter: number }): boolean {
  const byIteration = o.evalEvery > 0 && o.iteration % o.evalEvery === 0;
  const bySteps = o.evalEverySteps > 0 && Math.floor(o.stepsAfter / o.evalEverySteps) > Math.floor(o.stepsBefore / o.evalEverySteps);
  return byIteration || bySteps;
}

/**
 * How many updates behind the on-policy adapter an iteration's samples are: iteration i is on-policy when it
 * samples from v<i − 1> (the adapter its predecessor wrote). With train.maxStaleness 1, iteration i's rollouts
 * run while the update on iteration i − 1 writes v<i − 1>, so they sample from v<i − 2>: staleness 1.
 */
export function staleness(iteration: number, sampledVersion: number): number {
  return Math.max(0, iteration - 1 - sampledVersion);
}

/**
 * The colocated sampler's seed for one call: fixed by the workflow (run, iteration, episode or search), the call's
 * place in it (step and draw, or search node) and n. A retried call draws the same completions, and a run replays
 * the same samples whatever order its parallel episodes reach the learner in. The prompt's bytes stay out: they
 * carry ports and pixels that differ between stacks, and the same run must draw the same samples on every stack.
 * Histories from before call keys existed passed the prompt's hash as the key.
 */
export function samplingSeed(workflowId: string, callKey: string, n: number): number {
  return parseInt(fnv1a32(`${workflowId}|${callKey}|${n}`), 16);
}

/** An adapter version and what the run's greedy held-out evaluation scored it. */
export interface BestEval {
  version: number;
  iteration: number;
  success: number;
}

/** The better of the best so far and a new evaluation: a later adapter that scores as well replaces it (the latest of equals). */
export function betterEval(best: BestEval | undefined, next: BestEval): BestEval {
  return best === undefined || next.success >= best.success ? next : best;
}

/** What a finished run says about its best-evaluated adapter: nothing when that is the latest one. */
export function bestNote(r: { adapterVersion: number; best?: BestEval }): string | null {
  const b = r.best;
  if (!b || b.version === r.adapterVersion) return null;
  return `note: held-out evaluation scored adapter v${b.version} (iteration ${b.iteration}) best, success ${b.success.toFixed(2)}, above the latest v${r.adapterVersion}; both are kept in the run's checkpoints`;
}
