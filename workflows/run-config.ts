import { ApplicationFailure } from '@temporalio/workflow';
import type { ControlActivities } from '../activities/control';
import { ConfigError, parseConfig, type HaloConfig } from '../lib/config';

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
  if (input.state) return { cfg: parseConfig(await control.loadJson({ ref: input.state.configRef }), 'stored run config') };
  let cfg: HaloConfig;
  try {
    cfg = parseConfig(input.config ?? input, what);
  } catch (err) {
    if (err instanceof ConfigError) throw ApplicationFailure.nonRetryable(err.message, 'InvalidConfig');
    throw err;
  }
  return { cfg, stored: await control.storeJson({ value: cfg }) };
}
