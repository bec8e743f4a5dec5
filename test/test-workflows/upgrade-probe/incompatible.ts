import { condition, defineSignal, proxyActivities, setHandler } from '@temporalio/workflow';

/** v1.ts with its first activity replaced and no patch: runs already past it cannot replay. */
export const go = defineSignal('go');

const { step, warmUp } = proxyActivities<{ step(name: string): Promise<string>; warmUp(): Promise<string> }>({ startToCloseTimeout: '30s' });

export async function upgradeProbe(): Promise<string[]> {
  let released = false;
  setHandler(go, () => {
    released = true;
  });
  const done = [await warmUp()];
  await condition(() => released);
  done.push(await step('b'));
  return done;
}
