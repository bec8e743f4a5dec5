import { ApplicationFailure, patched, upsertSearchAttributes, workflowInfo } from '@temporalio/workflow';
import type { ControlActivities } from '../activities/control';
import { ConfigError, parseConfig, parseStoredConfig, type HaloConfig } from '../lib/config/config';
import { KIND, MODE, RUN_ID, TASK } from '../lib/episode/search-attributes';

/**
 * A training run's config: validated from the input on the first run of the chain (a bad config fails the
 * run at once, naming the field) and stored as a blob, or read back from that blob on a continuation, so
 * continue-as-new carries only its reference. `stored` is set on the first run only.
 */
export async function runConfig(
  input: { config?: unknown; state?: { configRef: string } },
  control: Pick<ControlActivities, 'loadJson' | 'storeJson'>,
  what: string,
): Promise<{ cfg: HaloConfig; stored?: { ref: string; hash: string } }> {
  // A stored config was validated when the run started; keys a later schema dropped are ignored (parseStoredConfig).
  if (input.state) return { cfg: parseStoredConfig(await control.loadJson({ ref: input.state.configRef })).cfg };
  let cfg: HaloConfig;
  try {
    // Every section strict (an unknown key fails the run); runs started before that dropped unknown keys, and
    // their histories must replay the same way.
    cfg = patched('strict-config-sections') ? parseConfig(input.config ?? input, what) : parseStoredConfig(input.config ?? input, what).cfg;
  } catch (err) {
    if (err instanceof ConfigError) throw ApplicationFailure.nonRetryable(err.message, 'InvalidConfig');
    throw err;
  }
  return { cfg, stored: await control.storeJson({ value: cfg }) };
}

/**
 * A training run's config (`runConfig`), its run id checked against the workflow id (one workflow per run,
 * so `halo train` with the same id attaches instead of starting a second run) and its search attributes set.
 */
export async function trainingRunConfig(
  input: { config?: unknown; state?: { configRef: string } },
  control: Pick<ControlActivities, 'loadJson' | 'storeJson'>,
  mode: 'grpo' | 'mcts',
): Promise<{ cfg: HaloConfig; stored?: { ref: string; hash: string }; runId: string }> {
  const { cfg, stored } = await runConfig(input, control, mode === 'grpo' ? 'trainGrpo input' : 'trainMcts input');
  const section = mode === 'grpo' ? cfg.train : cfg.mcts;
  const runId = section.runId;
  const workflowId = workflowInfo().workflowId;
  if (workflowId !== runId) {
    throw ApplicationFailure.nonRetryable(`workflow id ${workflowId} must equal ${mode === 'grpo' ? 'train' : 'mcts'}.runId ${runId}`, 'InvalidConfig');
  }
  upsertSearchAttributes([
    { key: RUN_ID, value: runId },
    { key: KIND, value: 'train' },
    { key: MODE, value: mode },
    { key: TASK, value: `${cfg.episode.env}/${section.tasks.join(',')}`.slice(0, 200) },
  ]);
  return { cfg, stored, runId };
}
