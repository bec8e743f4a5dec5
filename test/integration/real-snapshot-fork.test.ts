import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import type { SessionManager } from '../../activities/session';
import type { BlobStore } from '../../blob/store';
import { readSessionStorage } from '../../env/real-snapshot';
import type { RealEnv } from '../../env/real';
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
  real = await startRealSessions('fork-test');
  ({ site, blobs, manager } = real);
});

after(async () => {
  await real?.close();
});

const rewardWeights = parseRewardWeights({});

function input(episodeId: string, replay: Action[], forkMode?: 'snapshot' | 'replay'): StartSessionInput {
  return {
    spec: { env: 'real', task: TASK, seed: 0 },
    replay,
    episodeId,
    rewardWeights,
    envOptions: { realRunId: '0', evaluateAtCap: false, ...(forkMode ? { realForkMode: forkMode } : {}) },
  };
}

async function axtreeOf(ref: string): Promise<string> {
  return (await blobs.get(ref)).toString('utf8');
}

function find(axtree: string, role: string, name: string | RegExp): number {
  const hit = parseAxtree(axtree).find((l) => l.role === role && (typeof name === 'string' ? l.name === name : name.test(l.name)));
  assert.ok(hit, `no ${role} ${String(name)} in\n${axtree}`);
  return hit.id;
}

/** Runs actions chosen from each observation on a session; returns the path taken. */
async function drive(start: StartSessionResult, choose: ((axtree: string) => Action)[]): Promise<Action[]> {
  const path: Action[] = [];
  let axtree = await axtreeOf(start.observation.axtreeRef);
  let rewardState = start.rewardState;
  for (const pick of choose) {
    const action = pick(axtree);
    const out = await manager.step({ sessionId: start.sessionId, index: path.length, action, rewardState });
    assert.equal(out.actionError, undefined, JSON.stringify(action));
    path.push(action);
    rewardState = out.rewardState;
    axtree = await axtreeOf(out.observation.axtreeRef);
  }
  return path;
}

function envOf(sessionId: string): RealEnv {
  return realEnvOf(manager, sessionId);
}

async function clientState(sessionId: string) {
  const env = envOf(sessionId);
  const finish = JSON.parse(await env.finalStateText()) as Record<string, unknown>;
  const storage = await env.context.storageState();
  return {
    finish,
    url: env.page.url(),
    localStorage: storage.origins.find((o) => o.origin === site.origin)?.localStorage ?? [],
    cookies: storage.cookies,
    sessionStorage: await readSessionStorage(env.page),
  };
}

test('a fork after 4 state-changing actions copies the parent: same /finish, URL and storage, nothing replayed', async () => {
  site.memoryState = false;
  const parent = await manager.start(input('ep-snapshot', []));
  assert.equal(parent.fork, undefined);
  const path = await drive(parent, [
    (t) => ({ type: 'click_element', id: find(t, 'button', 'Compose') }),
    (t) => ({ type: 'type', id: find(t, 'textbox', 'To'), text: 'alex@example.com' }),
    (t) => ({ type: 'type', id: find(t, 'textbox', 'Subject'), text: 'Meeting notes' }),
    (t) => ({ type: 'type', id: find(t, 'textbox', 'Body'), text: 'Could you send me the meeting notes?' }),
    (t) => ({ type: 'click_element', id: find(t, 'button', 'Send') }),
    (t) => ({ type: 'click_element', id: find(t, 'link', 'Sent mail') }),
  ]);
  const want = await clientState(parent.sessionId);
  // The actions changed the state the eval reads, and the tab's sessionStorage.
  assert.equal((want.finish.differences as { emails: { added: unknown[] } }).emails.added.length, 1);
  assert.ok(want.sessionStorage['fake-gomail-draft'], 'the draft is in sessionStorage');
  assert.match(want.url, /folder=sent/);

  const before = manager.forkCounters();
  const configsBefore = site.hits('/config').length;
  // A step group's forks start together and share one snapshot.
  const forks = await Promise.all([0, 1, 2].map(() => manager.start(input('ep-snapshot', path))));
  const after = manager.forkCounters();
  assert.equal(after.fork_snapshots - before.fork_snapshots, 3);
  assert.equal(after.fork_replay_fallbacks, before.fork_replay_fallbacks);
  assert.equal(site.hits('/config').length, configsBefore, 'a snapshot fork never resets the site');
  for (const f of forks) {
    assert.equal(f.fork, 'snapshot');
    assert.equal(f.replayed, 0);
    assert.equal(f.observation.step, path.length);
    const got = await clientState(f.sessionId);
    assert.deepEqual(got.finish, want.finish);
    assert.equal(got.url, want.url);
    assert.deepEqual(got.localStorage, want.localStorage);
    assert.deepEqual(got.cookies, want.cookies);
    assert.deepEqual(got.sessionStorage, want.sessionStorage);
  }

  // A fork goes on as its own session: its step index continues the path, and it does not touch the parent.
  const f0 = forks[0]!;
  const out = await manager.step({
    sessionId: f0.sessionId,
    index: path.length,
    action: { type: 'goto', url: `${site.origin}/` },
    rewardState: f0.rewardState,
  });
  assert.equal(out.actionError, undefined);
  assert.equal((await clientState(parent.sessionId)).url, want.url);

  // forkMode replay: the same start replays.
  const replayed = await manager.start(input('ep-snapshot', path, 'replay'));
  assert.equal(replayed.fork, undefined);
  assert.equal(replayed.replayed, path.length);
  assert.deepEqual(manager.forkCounters(), after);

  for (const s of [parent, ...forks, replayed]) await manager.close(s.sessionId);
});

test('state only page scripts hold is not copied: the fork replays, and the fallback is counted', async () => {
  site.memoryState = true;
  try {
    const parent = await manager.start(input('ep-memory', []));
    const bump = (t: string): Action => ({ type: 'click_element', id: find(t, 'button', /^Bump counter/) });
    const path = await drive(parent, [bump, bump, bump]);
    const want = await clientState(parent.sessionId);
    assert.deepEqual(want.finish.memory, { bumps: 3 });

    const before = manager.forkCounters();
    const fork = await manager.start(input('ep-memory', path));
    const after = manager.forkCounters();
    assert.equal(fork.fork, 'replay-fallback');
    assert.equal(fork.replayed, path.length);
    assert.equal(after.fork_replay_fallbacks - before.fork_replay_fallbacks, 1);
    assert.equal(after.fork_snapshots, before.fork_snapshots);
    // A replay rebuilds the state, not its timestamps (the /config record is new).
    const got = (await clientState(fork.sessionId)).finish;
    assert.deepEqual(got.memory, want.finish.memory);
    assert.deepEqual(got.differences, want.finish.differences);

    // Another episode's path, or a parent on another worker: a plain replay, neither counter moves.
    const other = await manager.start(input('ep-other', path));
    assert.equal(other.fork, undefined);
    assert.deepEqual(manager.forkCounters(), after);
    for (const s of [parent, fork, other]) await manager.close(s.sessionId);
  } finally {
    site.memoryState = false;
  }
});
