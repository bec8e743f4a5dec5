import { condition, defineSignal, proxyActivities, setHandler } from '@temporalio/workflow';

/**
 * The code a control worker runs before an upgrade (test/integration/upgrade.test.ts): one step, then a wait for
 * `go` (where runs are in flight when the upgrade comes), then another step. Test code, not in the production bundle.
 */
export const go = defineSignal('go');

const { step } = proxyActivities<{ step(name: string): Promise<string> }>({ startToCloseTimeout: '30s' });

export async function upgradeProbe(): Promise<string[]> {
  let released = false;
  setHandler(go, () => {
    released = true;
  });
  const done = [await step('a')];
  await condition(() => released);
  done.push(await step('b'));
  return done;
}
