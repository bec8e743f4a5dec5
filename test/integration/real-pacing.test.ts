import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { chromium, type LaunchOptions } from 'playwright-core';
import type { SessionManager } from '../../activities/session';
import { AGISDK_POST_ACTION_MS, AGISDK_SLOW_MO_MS } from '../../env/real';
import type { RealScoring, StartSessionInput } from '../../lib/episode/episode-types';
import { parseRewardWeights } from '../../lib/rewards/weights';
import { realEnvOf, startRealSessions, type RealSessions } from '../../testing/real-sessions';

// agisdk runs REAL with Playwright's slow_mo of 1 s (a launch option) and a 0.5 s pause after every action; official
// scoring must hand Playwright the same, training keeps its own browser without the slow-down. What reaches
// chromium.launch is recorded (the browser itself is real), so nothing here depends on how long anything takes.

const launches: LaunchOptions[] = [];
const launch = chromium.launch.bind(chromium);
let real: RealSessions;
let manager: SessionManager;

before(async () => {
  chromium.launch = async (options?: LaunchOptions) => {
    launches.push({ ...options });
    return launch(options);
  };
  real = await startRealSessions('pacing-test');
  ({ manager } = real);
});

after(async () => {
  chromium.launch = launch;
  await real?.close();
});

function input(episodeId: string, scoring: RealScoring): StartSessionInput {
  return {
    spec: { env: 'real', task: 'gomail-18', seed: 0 },
    replay: [],
    episodeId,
    rewardWeights: parseRewardWeights({}),
    envOptions: { realRunId: '0', evaluateAtCap: false, realScoring: scoring },
  };
}

test("official scoring launches its own browser with agisdk's slow_mo and pauses 0.5 s after each action; training does not slow down", async () => {
  const training = await manager.start(input('pacing-training', 'training'));
  const official = await manager.start(input('pacing-official', 'official'));
  try {
    assert.equal(launches.length, 2, 'one browser per scoring');
    const [trainingLaunch, officialLaunch] = launches;
    assert.equal(trainingLaunch?.slowMo, undefined);
    assert.equal(officialLaunch?.slowMo, AGISDK_SLOW_MO_MS);
    assert.equal(AGISDK_SLOW_MO_MS, 1_000);
    const officialEnv = realEnvOf(manager, official.sessionId);
    const trainingEnv = realEnvOf(manager, training.sessionId);
    assert.notEqual(officialEnv.context.browser(), trainingEnv.context.browser());
    assert.equal(officialEnv.settleMs, AGISDK_POST_ACTION_MS);
    assert.equal(AGISDK_POST_ACTION_MS, 500);

    // A step runs under the pacing: the official session acts and observes as usual.
    const out = await manager.step({ sessionId: official.sessionId, index: 0, action: { type: 'scroll', direction: 'down', amount: 3 }, rewardState: official.rewardState });
    assert.equal(out.actionError, undefined);
    // Later sessions of either scoring reuse their browser.
    const again = await manager.start(input('pacing-official-2', 'official'));
    assert.equal(launches.length, 2);
    await manager.close(again.sessionId);
  } finally {
    await manager.close(training.sessionId);
    await manager.close(official.sessionId);
  }
});
