import { parseConfig, type EpisodeConfig, type HaloConfig, type PolicyConfig, type TrainConfig } from '../lib/config/config';
import type { TestStack } from './stack';

export interface StackGrpoOptions {
  runId: string;
  iterations: number;
  maxSteps: number;
  /** Fields that replace the defaults below, section by section. */
  policy?: Partial<PolicyConfig>;
  episode?: Partial<EpisodeConfig>;
  train?: Partial<TrainConfig>;
}

/**
 * A GRPO run on a test stack's queues with the learner's tiny-random model: step grouping with N = 2, one
 * episode per iteration on click-button, candidates sampled by the learner itself (colocated, with a
 * generous timeout: the first call builds the model), and a learning rate large enough to move it.
 */
export function stackGrpoConfig(stack: TestStack, o: StackGrpoOptions): HaloConfig {
  return parseConfig({
    temporal: { controlTaskQueue: stack.controlQueue, browserTaskQueue: stack.browserQueue },
    policy: { backend: 'colocated', model: 'tiny-random', temperature: 1, maxTokens: 24, timeoutMs: 120_000, ...o.policy },
    episode: { env: 'miniwob', maxSteps: o.maxSteps, ...o.episode },
    train: {
      runId: o.runId,
      iterations: o.iterations,
      episodesPerIteration: 1,
      parallelism: 1,
      tasks: ['click-button'],
      grouping: 'step',
      numGenerations: 2,
      learningRate: 1e-3,
      gpuTaskQueue: stack.gpuQueue,
      ...o.train,
    },
  });
}

/**
 * The policy override that samples from the scripted fake model (testing/fake-policy-server.ts) at `url`
 * instead: its answers parse into valid actions, so every candidate of a step group opens a fork.
 */
export const scriptedPolicy = (url: string): Partial<PolicyConfig> => ({ backend: 'openai', baseUrl: url, model: 'scripted' });
