import { patched, proxyActivities, workflowInfo } from '@temporalio/workflow';
import type { ControlActivities } from '../activities/control';
import type { MctsStoreActivities } from '../activities/mcts-store';
import { clip } from '../lib/model-io/actions';
import type { PolicyConfig } from '../lib/config/config';
import { samplingSeed, type ServedAdapter } from '../lib/serving/iteration-policy';
import type { PromptObservationRef } from '../lib/episode/episode-types';
import type { Completion } from '../lib/training/experience';
import { asCompletion, PREVIEW_CHARS } from '../lib/training/completion';
import { parseAction } from '../lib/model-io/parse';
import { learnerActivities } from './learner-calls';
import * as profiles from './activity-profiles';

/**
 * N candidate actions for one state from the run's policy: the colocated learner (`sample_actions` on the gpu
 * queue, its token ids and log-probs written as blobs) or an OpenAI-compatible server (`samplePolicy`). Model output is
 * parsed in an activity on both paths, so a workflow's replayed state never depends on the parser's version.
 */

export interface SamplerSettings {
  /** The iteration's sampling policy (lib/serving/iteration-policy.ts): model name and adapter version resolved. */
  policy: PolicyConfig;
  adapterVersion: number;
  /** openai backend: the served adapter `policy.model` names, reloaded into a server that restarted. */
  adapter?: ServedAdapter;
  runId: string;
  /** The learner's base model (colocated): a learner holding another one refuses. */
  baseModel?: string;
  gpuTaskQueue: string;
  learnerHeartbeatTimeoutMs: number;
  /**
   * What seeds this workflow's draws besides each call's place in it: the run's seed (or id), iteration and
   * episode or search, so runs with one config and seed draw alike whatever their ids. Default: the workflow id.
   */
  drawKey?: string;
}

export interface Sampled {
  promptRef: string;
  /** Constrained decoding: the grammar blob every candidate was sampled under. */
  grammarRef?: string;
  /** The completion records (lib/training/experience.ts), read from any shape the activities' results ever had. */
  candidates: Completion[];
}

export interface SampleRequest {
  observation: PromptObservationRef;
  history: { step: number; action: string; note?: string }[];
  n: number;
  /** Overrides the policy's temperature (MCTS expansions sample at mcts.temperature). */
  temperature?: number;
  /**
   * Where this call sits in its workflow (`step 2 draw 0`, `expand 5`): with the workflow id and n it seeds the
   * sampler (colocated, or vLLM's per-request `seed`), so a run draws the same samples on any stack. Absent: the
   * prompt's hash (older histories) colocated, and no seed served.
   */
  seedKey?: string;
  /** Colocated only: ε of an exploring draw (train.dynamicSampling.explore); a served policy draws plainly. */
  explore?: number;
  /** Keep the completions as blobs (references in the candidates); rollouts that are never trained on need not. */
  store: boolean;
  /** Replay of histories from before 'parse-in-activity': whether this call stored its texts then (search expansions). */
  legacyStore?: boolean;
  summary: string;
}

export async function sample(s: SamplerSettings, req: SampleRequest): Promise<Sampled> {
  const policy = req.temperature === undefined ? s.policy : { ...s.policy, temperature: req.temperature };
  const control = (summary: string) => proxyActivities<ControlActivities & MctsStoreActivities>(profiles.modelCall(policy.timeoutMs, policy.maxAttempts, summary));
  if (policy.backend !== 'colocated') {
    const res = await control(req.summary).samplePolicy({
      policy,
      n: req.n,
      observation: req.observation,
      history: req.history,
      ...(s.adapter ? { adapter: s.adapter } : {}),
      // The prompt is written inside the activity, so a call without a key has nothing stable to seed from.
      ...(req.seedKey !== undefined ? { seed: samplingSeed(s.drawKey ?? workflowInfo().workflowId, req.seedKey, req.n) } : {}),
    });
    return { promptRef: res.promptRef, candidates: res.candidates.map(asCompletion), ...(res.grammarRef ? { grammarRef: res.grammarRef } : {}) };
  }
  const promptInput = { observation: req.observation, history: req.history, historyLength: policy.historyLength };
  // Runs recorded before constrained decoding never set `constrained`, so they replay the plain prompt activity.
  const { promptRef, grammarRef } = policy.constrained
    ? await control(`${req.summary}: prompt and grammar`).writePromptAndGrammar({
        ...promptInput,
        maxTokens: policy.maxTokens,
        ...(policy.actions ? { actions: policy.actions } : {}),
      })
    : { promptRef: await control(`${req.summary}: prompt`).writePrompt(promptInput), grammarRef: undefined };
  const out = await learnerActivities({
    taskQueue: s.gpuTaskQueue,
    summary: `${req.summary} (${policy.model} v${s.adapterVersion}, n=${req.n})`,
    startToCloseTimeout: profiles.LEARNER_SAMPLE_TIMEOUT,
    heartbeatTimeout: s.learnerHeartbeatTimeoutMs,
  }).sampleActions({
    run_id: s.runId,
    version: s.adapterVersion,
    prompt_ref: promptRef,
    n: req.n,
    temperature: policy.temperature,
    max_tokens: policy.maxTokens,
    ...(s.baseModel ? { base_model: s.baseModel } : {}),
    ...(grammarRef ? { grammar_ref: grammarRef } : {}),
    store_tokens: true,
    seed: samplingSeed(s.drawKey ?? workflowInfo().workflowId, req.seedKey ?? promptRef, req.n),
    ...(req.explore ? { explore: req.explore } : {}),
  });
  const texts = out.completions.map((c) => c.text);
  // The training path always asks for the tokens by reference (`store_tokens` above); only histories recorded before
  // the learner stored them as blobs carry them inline, and both shapes stay readable (recordTrajectory stores those).
  const fromSampler = out.completions.map((c) => ({
    ...(c.tokens_ref ? { tokensRef: c.tokens_ref } : {}),
    ...(c.token_ids ? { tokenIds: c.token_ids } : {}),
    ...(c.logprobs ? { logprobs: c.logprobs } : {}),
    ...(c.logprob_sum != null ? { logprobSum: c.logprob_sum } : {}),
    finishReason: c.finish_reason ?? null,
  }));
  if (patched('parse-in-activity')) {
    const parsed = await control(`${req.summary}: parse ${texts.length} completions`).parseCompletions({ texts, store: req.store });
    return { promptRef, ...(grammarRef ? { grammarRef } : {}), candidates: parsed.candidates.map((p, i) => asCompletion({ ...p, ...fromSampler[i] })) };
  }
  // Histories recorded before parsing moved into an activity: the text was parsed here, and only a search's
  // expansions stored their texts (`storeCompletions`); kept so those histories replay.
  const refs = req.legacyStore ? (await control(`${req.summary}: store ${texts.length} completions`).storeCompletions({ texts })).refs : [];
  return {
    promptRef,
    candidates: texts.map((text, i) =>
      asCompletion({
        action: parseAction(text),
        preview: clip(text, PREVIEW_CHARS),
        ...(req.legacyStore ? { completionRef: refs[i] } : { completion: text }),
        ...fromSampler[i],
      }),
    ),
  };
}
