import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { SessionManager } from '../../activities/session';
import { fastReplayFromEnv, Replays } from '../../activities/session-replay';
import { BlobStore } from '../../blob/store';
import { DEFAULT_SETTLE_MS, settleMsFromEnv } from '../../env/miniwob';
import { startMiniwobServer, type MiniwobServer } from '../../env/miniwob-server';
import type { Action } from '../../lib/model-io/actions';
import type { LivedState, ObservationRef, StartSessionInput } from '../../lib/episode/episode-types';
import { parseRewardWeights } from '../../lib/rewards/weights';
import { clickableElements } from '../../testing/axtree';

// A restore or fork that knows the state its path reached when it was lived (`lived`) replays
// MiniWoB++ actions without the settle wait after each, and keeps that only if it reaches the same state;
// otherwise it replays again with the waits (activities/session-replay.ts). Kept, it keeps the lived screenshot.
let server: MiniwobServer;
let blobRoot: string;
let blobs: BlobStore;
before(async () => {
  server = await startMiniwobServer();
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-fast-replay-'));
  blobs = new BlobStore(blobRoot);
});
after(async () => {
  await server?.close();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

const TASKS = ['click-button', 'enter-text', 'click-checkboxes', 'focus-text', 'click-tab-2', 'login-user', 'choose-list'];
const rewardWeights = parseRewardWeights({});

function manager(warmPages = 0, fastReplay?: boolean): SessionManager {
  return new SessionManager({
    blobs,
    miniwobBaseUrl: server.baseUrl,
    miniwobTasks: TASKS,
    workerTaskQueue: 'fast-replay-test',
    workerName: 'fast-replay-test',
    warmPages,
    ...(fastReplay === undefined ? {} : { fastReplay }),
  });
}

function input(task: string, replay: Action[], lived?: LivedState): StartSessionInput {
  return {
    spec: { env: 'miniwob', task, seed: 3 },
    replay,
    episodeId: `${task}-3`,
    rewardWeights,
    ...(lived ? { lived: { stateKey: lived.stateKey, screenshotRef: lived.screenshotRef } } : {}),
  };
}

/** Up to three actions that change the page: type into the first textbox, click what is clickable. */
function actionsFor(o: ObservationRef, axtree: string): Action[] {
  const els = clickableElements(axtree);
  const box = els.find((e) => e.role === 'textbox');
  const out: Action[] = [];
  if (box) out.push({ type: 'type', id: box.id, text: 'hello' } as Action);
  for (const e of els.slice(1)) out.push({ type: 'click_element', id: e.id });
  assert.ok(out.length > 0, `${o.url}: nothing to act on`);
  return out.slice(0, 3);
}

async function axtreeOf(o: ObservationRef): Promise<string> {
  return (await blobs.get(o.axtreeRef)).toString('utf8');
}

test('a replay without settle waits that reaches the lived state is kept, on a loaded page, a kept page and in place', async () => {
  for (const warmPages of [0, 1]) {
    const m = manager(warmPages);
    try {
      for (const task of TASKS) {
        const first = await m.start(input(task, []));
        const path = actionsFor(first.observation, await axtreeOf(first.observation));
        await m.close(first.sessionId);
        // The lived state: the path replayed with the settle waits, as every step was taken.
        const lived = await m.start(input(task, path));
        assert.equal(lived.fastReplay, undefined, `${task}: no fast replay without an expected state`);
        const fast = await m.start(input(task, path, lived.observation));
        assert.equal(fast.fastReplay, 'fast', `${task}: a new session (warm pages ${warmPages}) kept its fast replay`);
        assert.equal(await axtreeOf(fast.observation), await axtreeOf(lived.observation), `${task}: the same page as lived`);
        assert.equal(fast.observation.screenshotRef, lived.observation.screenshotRef, `${task}: the lived screenshot`);
        assert.deepEqual([fast.observation.width, fast.observation.height], [lived.observation.width, lived.observation.height]);
        const again = await m.reset({ ...input(task, path, lived.observation), sessionId: fast.sessionId });
        assert.equal(again.fastReplay, 'fast', `${task}: an in-place reset kept its fast replay`);
        assert.equal(again.observation.stateKey, lived.observation.stateKey, `${task}: the same state after the reset in place`);
        const step = await m.step({ sessionId: again.sessionId, index: path.length, action: { type: 'wait', seconds: 0 }, rewardState: again.rewardState });
        assert.equal(step.observation.stateKey, lived.observation.stateKey, `${task}: the session goes on from the lived state`);
        for (const s of [lived, fast]) await m.close(s.sessionId);
      }
      assert.deepEqual({ ...m.replays }, { fast_replays: 2 * TASKS.length, fast_replay_fallbacks: 0 });
    } finally {
      await m.shutdown();
    }
  }
});

test('restarts without the frame wait and the pointer reset still reach the lived state', async () => {
  const m = manager(1);
  try {
    for (const task of TASKS) {
      const first = await m.start(input(task, []));
      const els = clickableElements(await axtreeOf(first.observation));
      // A click on empty page space first (grid 900,500 is right of the task area), then the task's own elements.
      const path: Action[] = [{ type: 'click', x: 900, y: 500, button: 'left', count: 1 }, ...els.slice(0, 2).map((e): Action => ({ type: 'click_element', id: e.id }))];
      assert.deepEqual(new Replays(true).restartOptions(input(task, path, first.observation)), { frame: false, pointer: false }, `${task}: a quick restart`);
      const lived = await m.start(input(task, path));
      // The kept page of `first` (warm pages) and then `lived`'s own page in place: both restart quickly.
      await m.close(first.sessionId);
      const kept = await m.start(input(task, path, lived.observation));
      assert.equal(kept.fastReplay, 'fast', `${task}: a kept page restarted quickly kept its fast replay`);
      assert.equal(await axtreeOf(kept.observation), await axtreeOf(lived.observation), `${task}: the same page as lived`);
      const again = await m.reset({ ...input(task, path, lived.observation), sessionId: lived.sessionId });
      assert.equal(again.fastReplay, 'fast', `${task}: a page restarted quickly in place kept its fast replay`);
      assert.equal(again.observation.stateKey, lived.observation.stateKey, `${task}: the same state after the quick restart`);
      for (const s of [again, kept]) await m.close(s.sessionId);
    }
    assert.deepEqual({ ...m.replays }, { fast_replays: 2 * TASKS.length, fast_replay_fallbacks: 0 });
  } finally {
    await m.shutdown();
  }
});

test('a restart before a fast replay skips the frame wait, and the pointer reset when the first action moves the pointer', () => {
  const lived = { stateKey: 'k', screenshotRef: 'r' } as unknown as ObservationRef;
  const click: Action = { type: 'click', x: 1, y: 2, button: 'left', count: 1 };
  for (const first of [
    click,
    { type: 'double_click', x: 1, y: 2 },
    { type: 'move', x: 1, y: 2 },
    { type: 'click_element', id: 3 },
    { type: 'scroll', direction: 'down', amount: 300, x: 5, y: 5 },
  ] as Action[]) {
    assert.deepEqual(new Replays(true).restartOptions(input('click-button', [first], lived)), { frame: false, pointer: false }, first.type);
  }
  // `type` into an element clicks it, but not a <select>: the pointer goes back as on every restart.
  for (const first of [
    { type: 'scroll', direction: 'down', amount: 300 },
    { type: 'type', text: 'a', id: 4 },
    { type: 'key', keys: ['Tab'] },
    { type: 'wait', seconds: 0 },
  ] as Action[]) {
    assert.deepEqual(new Replays(true).restartOptions(input('click-button', [first, click], lived)), { frame: false, pointer: true }, first.type);
  }
  assert.deepEqual(new Replays(true).restartOptions(input('click-button', [click])), {}, 'no lived state to check the end against');
  assert.deepEqual(new Replays(true).restartOptions(input('click-button', [], lived)), {}, 'nothing replayed');
  assert.deepEqual(new Replays(false).restartOptions(input('click-button', [click], lived)), {}, 'HALO_FAST_REPLAY=0');
});

test('a fast replay that ends in another state is replayed again with the settle waits', async () => {
  const m = manager(1);
  try {
    const task = 'enter-text';
    const first = await m.start(input(task, []));
    const path = actionsFor(first.observation, await axtreeOf(first.observation));
    const lived = await m.start(input(task, path));
    // A state key this path never reaches: as a task whose state depends on the waits would look.
    const other = await m.start(input(task, path, { stateKey: `${lived.observation.stateKey}-elsewhere`, screenshotRef: first.observation.screenshotRef }));
    assert.equal(other.fastReplay, 'settled');
    assert.equal(other.observation.stateKey, lived.observation.stateKey, 'the settled replay reaches the lived state');
    assert.equal(other.observation.screenshotRef, lived.observation.screenshotRef, 'with a screenshot of its own, not the one it was given');
    const reset = await m.reset({ ...input(task, path, { stateKey: 'no such state', screenshotRef: first.observation.screenshotRef }), sessionId: first.sessionId });
    assert.equal(reset.fastReplay, 'settled');
    assert.equal(reset.observation.stateKey, lived.observation.stateKey);
    assert.deepEqual({ ...m.replays }, { fast_replays: 0, fast_replay_fallbacks: 2 });
  } finally {
    await m.shutdown();
  }
});

test('HALO_FAST_REPLAY=0 replays every action with its settle wait', async () => {
  assert.equal(fastReplayFromEnv(undefined), true);
  assert.equal(fastReplayFromEnv('1'), true);
  assert.equal(fastReplayFromEnv('0'), false);
  assert.throws(() => fastReplayFromEnv('off'), /HALO_FAST_REPLAY must be 0 or 1/);
  const m = manager(0, false);
  try {
    const first = await m.start(input('click-button', []));
    const path = actionsFor(first.observation, await axtreeOf(first.observation));
    const settled = await m.start(input('click-button', path, first.observation));
    assert.equal(settled.fastReplay, undefined);
    assert.deepEqual({ ...m.replays }, { fast_replays: 0, fast_replay_fallbacks: 0 });
  } finally {
    await m.shutdown();
  }
});

test('HALO_MINIWOB_SETTLE_MS sets the wait after each action; anything but a whole number of ms up to 10 s is an error', () => {
  assert.equal(settleMsFromEnv(undefined), DEFAULT_SETTLE_MS);
  assert.equal(settleMsFromEnv('400'), 400);
  assert.equal(settleMsFromEnv('0'), 0);
  for (const bad of ['-1', '2.5', 'slow', '20000']) assert.throws(() => settleMsFromEnv(bad), /HALO_MINIWOB_SETTLE_MS must be a whole number/);
});
