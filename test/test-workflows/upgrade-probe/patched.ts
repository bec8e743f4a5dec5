import { condition, defineSignal, patched, proxyActivities, setHandler } from '@temporalio/workflow';

/** v1.ts with a new step behind patched(): runs in flight replay, and take the new step when they get there. */
export const go = defineSignal('go');

const { step } = proxyActivities<{ step(name: string): Promise<string> }>({ startToCloseTimeout: '30s' });

export async function upgradeProbe(): Promise<string[]> {
  let released = false;
  setHandler(go, () => {
    released = true;
  });
  const done = [await step('a')];
  await condition(() => released);
  if (patched('upgrade-probe-c')) done.push(await step('c'));
  done.push(await step('b'));
  return done;
}
