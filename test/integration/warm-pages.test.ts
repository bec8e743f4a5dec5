import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { SessionManager } from '../../activities/session';
import { BlobStore } from '../../blob/store';
import { startMiniwobServer, type MiniwobServer } from '../../env/miniwob-server';
import type { Action } from '../../lib/model-io/actions';
import type { StartSessionInput } from '../../lib/episode/episode-types';
import { parseRewardWeights } from '../../lib/rewards/weights';

// A browser worker keeps the pages of closed MiniWoB++ sessions loaded (activities/warm-pages.ts), and the next
// session of the same task starts on one in place. Such a session must be indistinguishable from one that loaded
// its page: same goal, same page, same shaping state, same outcomes for the same actions.
let server: MiniwobServer;
let blobRoot: string;
let blobs: BlobStore;
before(async () => {
  server = await startMiniwobServer();
  blobRoot = await mkdtemp(join(tmpdir(), 'halo-warm-pages-'));
  blobs = new BlobStore(blobRoot);
});
after(async () => {
  await server?.close();
  if (blobRoot) await rm(blobRoot, { recursive: true, force: true });
});

const TASKS = ['click-button', 'click-collapsible-nodelay', 'enter-text', 'focus-text'];
const rewardWeights = parseRewardWeights({});
const wait: Action = { type: 'wait', seconds: 0 };

function manager(warmPages: number, warmIdleMs?: number): SessionManager {
  return new SessionManager({ blobs, miniwobBaseUrl: server.baseUrl, miniwobTasks: TASKS, workerTaskQueue: 'warm-test', workerName: 'warm-test', warmPages, warmIdleMs });
}

function input(task: string, seed: number, replay: Action[] = [], episodeId = `${task}-${seed}`): StartSessionInput {
  return { spec: { env: 'miniwob', task, seed }, replay, episodeId, rewardWeights };
}

/** What the policy and the reward see of a started session. */
async function seen(m: SessionManager, inp: StartSessionInput) {
  const s = await m.start(inp);
  return { id: s.sessionId, view: { goal: s.observation.goal, url: s.observation.url, stateKey: s.observation.stateKey, replayed: s.replayed, reward: s.rewardState } };
}

test('a session on a kept page answers as one that loaded its page, step after step', async () => {
  const warm = manager(4);
  const cold = manager(0);
  try {
    for (const [i, task] of TASKS.entries()) {
      // A first session of the task plays and closes: its page is kept.
      const pooled = warm.warmCounters().warm_pages;
      const first = await warm.start(input(task, 50 + i));
      await warm.step({ sessionId: first.sessionId, index: 0, action: wait, rewardState: first.rewardState });
      await warm.close(first.sessionId);
      const before = warm.warmCounters();
      assert.equal(before.warm_pages, pooled + 1, `${task}: the closed session's page is kept`);

      const spec = input(task, 7, [wait]);
      const w = await seen(warm, spec);
      const c = await seen(cold, spec);
      assert.deepEqual(w.view, c.view, `${task}: a start on the kept page equals a cold start`);
      assert.equal(warm.warmCounters().warm_starts, before.warm_starts + 1, `${task}: the start used the kept page`);
      assert.equal(warm.warmCounters().warm_pages, pooled, `${task}: the page left the pool`);

      // The same actions give the same outcomes.
      let [ws, cs] = [w.view.reward, c.view.reward];
      for (const [k, action] of [wait, { type: 'click', x: 500, y: 500, button: 'left', count: 1 } as Action].entries()) {
        const a = await warm.step({ sessionId: w.id, index: 1 + k, action, rewardState: ws });
        const b = await cold.step({ sessionId: c.id, index: 1 + k, action, rewardState: cs });
        assert.deepEqual(
          [a.observation.stateKey, a.done, a.success, a.reward, a.shaped],
          [b.observation.stateKey, b.done, b.success, b.reward, b.shaped],
          `${task}: after action ${k + 2}`,
        );
        [ws, cs] = [a.rewardState, b.rewardState];
      }
      await warm.close(w.id);
      await cold.close(c.id);
      assert.equal(cold.warmCounters().warm_pages, 0, 'a pool of 0 keeps nothing');
      // The next task's first start finds no page of its own: it loads one (and the kept page stays for its task).
    }
    const counts = warm.warmCounters();
    assert.equal(counts.warm_starts, TASKS.length);
    assert.equal(counts.cold_starts, TASKS.length, 'one cold start per task');
    assert.equal(cold.warmCounters().warm_starts, 0);
  } finally {
    await warm.shutdown();
    await cold.shutdown();
  }
});

test('the pool keeps at most its limit (newest pages), and closes pages idle for longer than it keeps them', async () => {
  // Long enough that the sweep cannot take a page before the counts below are read, even on a loaded machine.
  const m = manager(2, 8_000);
  try {
    const started = [];
    for (const seed of [1, 2, 3]) started.push(await m.start(input('click-button', seed)));
    for (const s of started) await m.close(s.sessionId);
    assert.equal(m.warmCounters().warm_pages, 2);
    // Another task does not take them.
    await m.close((await m.start(input('focus-text', 1))).sessionId);
    assert.equal(m.warmCounters().warm_starts, 0);
    assert.equal(m.warmCounters().warm_pages, 2, 'the newest two: the focus-text page pushed out the oldest');
    const deadline = Date.now() + 30_000;
    while (m.warmCounters().warm_pages > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 200));
    assert.equal(m.warmCounters().warm_pages, 0, 'idle pages are closed by the sweep');
    await m.start(input('click-button', 4));
    assert.equal(m.warmCounters().warm_starts, 0, 'nothing left to reuse');
  } finally {
    await m.shutdown();
  }
});

test('a kept page that was closed underneath is not used: the start loads a page', async () => {
  const m = manager(2);
  try {
    const first = await m.start(input('click-button', 1));
    await m.close(first.sessionId);
    // The browser context goes away while the page waits in the pool (as when a renderer dies).
    const kept = (m as unknown as { warm: { pages: { context: { close(): Promise<void> } }[] } }).warm.pages;
    await kept[0].context.close();
    const again = await m.start(input('click-button', 2));
    assert.match(again.observation.goal, /Click/);
    assert.deepEqual([m.warmCounters().warm_starts, m.warmCounters().warm_misses], [0, 1]);
  } finally {
    await m.shutdown();
  }
});
