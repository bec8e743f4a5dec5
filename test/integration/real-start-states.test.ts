import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { SessionManager } from '../../activities/session';
import { RealStartStates, realStartStatesFromEnv } from '../../activities/real-start-states';
import type { BlobStore } from '../../blob/store';
import type { RealEnv } from '../../env/real';
import type { ClientSnapshot } from '../../env/real-snapshot';
import type { Action } from '../../lib/model-io/actions';
import type { StartSessionInput, StartSessionResult } from '../../lib/episode/episode-types';
import { parseRewardWeights } from '../../lib/rewards/weights';
import type { FakeRealSite } from '../../testing/fake-real-site';
import { parseAxtree } from '../../testing/axtree';
import { realEnvOf, startRealSessions, type RealSessions } from '../../testing/real-sessions';

const TASK = 'gomail-18';

let real: RealSessions;
let site: FakeRealSite;
let blobs: BlobStore;
let manager: SessionManager;

before(async () => {
  real = await startRealSessions('start-state-test', { realStartStates: 4 });
  ({ site, blobs, manager } = real);
});

after(async () => {
  await real?.close();
});

function input(episodeId: string, replay: Action[], o: { runId?: string; forkMode?: 'snapshot' | 'replay' } = {}): StartSessionInput {
  return {
    spec: { env: 'real', task: TASK, seed: 0 },
    replay,
    episodeId,
    rewardWeights: parseRewardWeights({}),
    envOptions: { realRunId: o.runId ?? '0', evaluateAtCap: false, ...(o.forkMode ? { realForkMode: o.forkMode } : {}) },
  };
}

function envOf(sessionId: string): RealEnv {
  return realEnvOf(manager, sessionId);
}

/** What an eval reads of a session, without the action log's timestamps (a /config visit stamps its own). */
async function evalView(sessionId: string) {
  const env = envOf(sessionId);
  const { actionhistory, ...finish } = JSON.parse(await env.finalStateText()) as Record<string, unknown>;
  const storage = await env.context.storageState();
  const local = storage.origins.find((o) => o.origin === site.origin)?.localStorage ?? [];
  return { finish, actions: (actionhistory as { type: string }[]).map((a) => a.type), url: env.page.url(), keys: local.map((e) => e.name).sort() };
}

async function sendMail(start: StartSessionResult): Promise<Action[]> {
  const path: Action[] = [];
  let rewardState = start.rewardState;
  let axtree = (await blobs.get(start.observation.axtreeRef)).toString('utf8');
  const id = (role: string, name: string) => {
    const hit = parseAxtree(axtree).find((l) => l.role === role && l.name === name);
    assert.ok(hit, `no ${role} ${name}`);
    return hit.id;
  };
  for (const pick of [
    () => ({ type: 'click_element', id: id('button', 'Compose') }),
    () => ({ type: 'type', id: id('textbox', 'To'), text: 'alex@example.com' }),
    () => ({ type: 'click_element', id: id('button', 'Send') }),
  ]) {
    const action = pick() as Action;
    const out = await manager.step({ sessionId: start.sessionId, index: path.length, action, rewardState });
    assert.equal(out.actionError, undefined, JSON.stringify(action));
    path.push(action);
    rewardState = out.rewardState;
    axtree = (await blobs.get(out.observation.axtreeRef)).toString('utf8');
  }
  return path;
}

test('later starts of a REAL task copy its start state instead of visiting /config; rebuilds replay onto the copy', async () => {
  const configs = () => site.hits('/config').length;
  const c0 = configs();
  const first = await manager.start(input('ep-1', []));
  assert.equal(first.startState, undefined, 'the first start goes through /config');
  assert.equal(configs(), c0 + 1);
  assert.equal(manager.startStateCounters().start_states, 1);
  const atStart = await evalView(first.sessionId);
  // The first episode moves on: the kept copy is its start, not where it is now.
  const path = await sendMail(first);

  const second = await manager.start(input('ep-2', []));
  assert.equal(second.startState, 'copy');
  assert.equal(second.replayed, 0);
  assert.equal(second.observation.step, 0);
  assert.equal(configs(), c0 + 1, 'a copied start does not visit /config');
  assert.deepEqual(await evalView(second.sessionId), atStart);
  assert.equal(second.observation.stateKey, first.observation.stateKey);

  // A rebuilt session (another episode's path, no live parent of the same episode) replays onto the copy.
  const wantAfter = await evalView(first.sessionId);
  const rebuilt = await manager.start(input('ep-3', path));
  assert.equal(rebuilt.startState, 'copy');
  assert.equal(rebuilt.replayed, path.length);
  assert.equal(rebuilt.observation.step, path.length);
  assert.deepEqual((await evalView(rebuilt.sessionId)).finish.differences, wantAfter.finish.differences);
  assert.equal(configs(), c0 + 1);
  // Each episode holds one of the site's slots on this worker (4).
  for (const s of [first, second, rebuilt]) await manager.close(s.sessionId);

  // The run id is /config's: another one is another start state. forkMode replay copies nothing.
  const otherRun = await manager.start(input('ep-4', [], { runId: '7' }));
  assert.equal(otherRun.startState, undefined);
  const noCopies = await manager.start(input('ep-5', [], { forkMode: 'replay' }));
  assert.equal(noCopies.startState, undefined);
  assert.equal(configs(), c0 + 3);
  assert.deepEqual(manager.startStateCounters(), { start_state_copies: 2, start_state_misses: 0, start_states: 2 });
  for (const s of [otherRun, noCopies]) await manager.close(s.sessionId);
});

test('a copy whose /finish differs (the site changed) is dropped: the task starts through /config for a while', async () => {
  const before = manager.startStateCounters();
  const configs = () => site.hits('/config').length;
  const c0 = configs();
  // /finish now also reports state held in page scripts: the kept copy's /finish no longer matches.
  site.memoryState = true;
  try {
    const a = await manager.start(input('ep-changed', []));
    assert.equal(a.startState, undefined);
    assert.equal(configs(), c0 + 1);
    const mid = manager.startStateCounters();
    assert.equal(mid.start_state_misses, before.start_state_misses + 1);
    assert.equal(mid.start_states, before.start_states - 1, 'the copy is dropped, and the start through /config keeps none');
    // No copy is tried again (each would cost a copy and a /config visit) until the refusal expires.
    const b = await manager.start(input('ep-changed-2', []));
    assert.equal(b.startState, undefined);
    assert.equal(configs(), c0 + 2);
    assert.deepEqual(manager.startStateCounters(), mid);
    for (const s of [a, b]) await manager.close(s.sessionId);
  } finally {
    site.memoryState = false;
  }
});

test('kept start states: a bounded number, only states at the start, expiry, and the worker setting', () => {
  const snap = (steps: number): ClientSnapshot => ({ storage: { cookies: [], origins: [] }, sessionStorage: {}, url: 'http://x/', steps, finish: '{}' });
  const states = new RealStartStates(2, 1_000);
  const key = (task: string, runId = '0') => states.key({ ...input('e', []), spec: { env: 'real', task, seed: 0 }, envOptions: { realRunId: runId, evaluateAtCap: false } });
  const [k1, k2, k3] = [key('a'), key('b'), key('c')] as string[];
  assert.notEqual(key('a', '1'), k1, 'the run id is part of the key');
  assert.equal(states.key({ ...input('e', []), spec: { env: 'miniwob', task: 'click-test', seed: 0 } }), undefined);
  states.put(k1, snap(3), 0);
  assert.equal(states.get(k1, 0), undefined, 'a state after actions is no start state');
  states.put(k1, snap(0), 0);
  states.put(k2, snap(0), 10);
  states.put(k3, snap(0), 20);
  assert.equal(states.size, 2);
  assert.equal(states.get(k1, 30), undefined, 'the one kept longest went');
  assert.ok(states.get(k3, 1_000));
  assert.equal(states.get(k2, 1_011), undefined, 'expired');
  states.refuse(k3, 1_000);
  assert.equal(states.get(k3, 1_000), undefined, 'a refused task has no copy');
  assert.equal(states.wants(k3, 1_500), false, 'a refused task wants no state');
  states.put(k3, snap(0), 1_500);
  assert.equal(states.get(k3, 1_500), undefined, 'nor takes one until the refusal expires');
  states.put(k3, snap(0), 2_000);
  assert.ok(states.get(k3, 2_000), 'then it does');
  assert.equal(states.wants(k3, 2_000), false, 'a task with a kept state wants none');
  assert.equal(states.wants(k1, 2_000), true);
  assert.equal(new RealStartStates(0).key(input('e', [])), undefined, '0 keeps none');
  assert.equal(realStartStatesFromEnv(undefined), 32);
  assert.equal(realStartStatesFromEnv('0'), 0);
  assert.throws(() => realStartStatesFromEnv('-1'), /HALO_REAL_START_STATES must be a whole number >= 0/);
  assert.throws(() => new RealStartStates(1.5), /whole number/);
});
