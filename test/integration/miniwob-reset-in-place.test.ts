import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import type { Browser } from 'playwright-core';
import { BlobStore } from '../../blob/store';
import { DEFAULT_VIEWPORT, launchChromium } from '../../env/browser';
import { MiniWobEnv } from '../../env/miniwob';
import { startMiniwobServer, type MiniwobServer } from '../../env/miniwob-server';
import type { Observation } from '../../env/types';
import type { Action } from '../../lib/model-io/actions';
import { stateKey } from '../../lib/rewards/shaping';
import { clickableElements } from '../../testing/axtree';

// An in-place reset (a new episode on the loaded task page, no navigation) must leave the page exactly as a
// fresh page's reset does: MCTS reuses sessions this way (activities/session.ts `resetSession`), and the
// tree assumes an action path from a seed always leads to the same state.
let browser: Browser;
let server: MiniwobServer;
let blobRoot: string;
let blobs: BlobStore;
before(async () => {
  server = await startMiniwobServer();
  browser = await launchChromium();
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-reset-in-place-'));
  blobs = new BlobStore(blobRoot);
});
after(async () => {
  await browser?.close().catch(() => undefined);
  await server?.close();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

async function newEnv(): Promise<MiniWobEnv> {
  const context = await browser.newContext({ viewport: DEFAULT_VIEWPORT });
  return new MiniWobEnv({ page: await context.newPage(), baseUrl: server.baseUrl, blobs });
}

async function closeEnv(env: MiniWobEnv): Promise<void> {
  const context = env.page.context();
  await env.close().catch(() => undefined);
  await context.close().catch(() => undefined);
}

/** What the tree and the policy see of a state. */
function seen(o: Observation) {
  return { goal: o.goal, url: o.url, axtree: o.axtree, step: o.step, stateKey: stateKey({ url: o.url, axtree: o.axtree }) };
}

/** A few actions that change the page: click what is clickable, type into the first textbox. */
function actionsFor(o: Observation, n: number): Action[] {
  const els = clickableElements(o.axtree);
  const box = els.find((e) => e.role === 'textbox');
  const out: Action[] = [];
  if (box) out.push({ type: 'type', id: box.id, text: 'hello' } as Action);
  for (const e of els.slice(1)) out.push({ type: 'click_element', id: e.id });
  return out.slice(0, n);
}

const TASKS = ['click-button', 'enter-text', 'click-checkboxes', 'focus-text', 'click-tab-2', 'login-user', 'choose-list'];

test('an in-place reset then a replay gives the observations of a fresh page (goal, url, axtree, state key)', async () => {
  const reused = await newEnv();
  try {
    for (const [i, task] of TASKS.entries()) {
      // The reused page first plays another episode of the task (done or not), then resets in place.
      const first = await reused.reset({ env: 'miniwob', task, seed: 100 + i });
      for (const a of actionsFor(first, 3)) await reused.step(a);
      for (const round of [0, 1]) {
        const spec = { env: 'miniwob' as const, task, seed: 7 + round };
        const fresh = await newEnv();
        try {
          const want = await fresh.reset(spec);
          const got = await reused.resetInPlace(spec);
          assert.ok(got, `${task}: the loaded page resets in place`);
          assert.deepEqual(seen(got), seen(want), `${task} seed ${spec.seed}: after the reset`);
          for (const [k, a] of actionsFor(want, 3).entries()) {
            const w = await fresh.step(a);
            const g = await reused.step(a);
            assert.deepEqual(seen(g.observation), seen(w.observation), `${task} seed ${spec.seed}: after action ${k + 1} ${JSON.stringify(a)}`);
            assert.deepEqual([g.done, g.success, g.reward], [w.done, w.success, w.reward], `${task}: same outcome after action ${k + 1}`);
          }
        } finally {
          await closeEnv(fresh);
        }
      }
    }
  } finally {
    await closeEnv(reused);
  }
});

test('another task or a page that navigated away is not reset in place (the caller reloads)', async () => {
  const env = await newEnv();
  try {
    await env.reset({ env: 'miniwob', task: 'click-button', seed: 1 });
    assert.equal(await env.resetInPlace({ env: 'miniwob', task: 'enter-text', seed: 1 }), undefined);
    await env.page.goto(`${server.baseUrl}/miniwob/click-link.html`);
    assert.equal(await env.resetInPlace({ env: 'miniwob', task: 'click-button', seed: 1 }), undefined);
    // The full reset still works on that page.
    assert.match((await env.reset({ env: 'miniwob', task: 'click-button', seed: 1 })).goal, /Click/);
  } finally {
    await closeEnv(env);
  }
});

test('resetSession on the worker: the session answers as a new one at the replayed path; a missing session is lost', async () => {
  const { SessionManager } = await import('../../activities/session');
  const { parseRewardWeights } = await import('../../lib/rewards/weights');
  const manager = new SessionManager({ blobs, miniwobBaseUrl: server.baseUrl, miniwobTasks: ['click-button'], workerTaskQueue: 'reset-test', workerName: 'reset-test' });
  const rewardWeights = parseRewardWeights({});
  const start = (seed: number, replay: Action[]) => manager.start({ spec: { env: 'miniwob', task: 'click-button', seed }, replay, episodeId: `fresh-${seed}`, rewardWeights });
  try {
    const first = await start(3, []);
    const wait: Action = { type: 'wait', seconds: 0 };
    await manager.step({ sessionId: first.sessionId, index: 0, action: wait, rewardState: first.rewardState });

    // The same session, reset to seed 4 with one action replayed, against a new session there.
    const reset = await manager.reset({ sessionId: first.sessionId, spec: { env: 'miniwob', task: 'click-button', seed: 4 }, replay: [wait], episodeId: 'reset-4', rewardWeights });
    const fresh = await start(4, [wait]);
    assert.equal(reset.sessionId, first.sessionId, 'the same page and context');
    assert.equal(reset.replayed, 1);
    assert.equal(reset.observation.goal, fresh.observation.goal);
    assert.equal(reset.observation.stateKey, fresh.observation.stateKey);
    assert.deepEqual(reset.rewardState, fresh.rewardState);

    // Its steps count from the replayed path: index 1 runs, a stale index 0 is a lost session.
    const stepped = await manager.step({ sessionId: reset.sessionId, index: 1, action: wait, rewardState: reset.rewardState });
    assert.equal(stepped.done, false);
    await assert.rejects(
      manager.step({ sessionId: reset.sessionId, index: 0, action: wait, rewardState: reset.rewardState }),
      (e: Error & { type?: string }) => e.type === 'SessionLost',
    );

    await manager.close(first.sessionId);
    await assert.rejects(
      manager.reset({ sessionId: first.sessionId, spec: { env: 'miniwob', task: 'click-button', seed: 4 }, replay: [], episodeId: 'gone', rewardWeights }),
      (e: Error & { type?: string }) => e.type === 'SessionLost',
    );
  } finally {
    await manager.shutdown();
  }
});
